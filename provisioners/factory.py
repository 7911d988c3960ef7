"""Build a pool's provider from its `provider:` section. The common elastic settings are taken
out here; the rest is the provider's own config, checked by its own class."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from provisioners.base import Provider

COMMON_KEYS = {
    "type", "min_instances", "max_instances", "max_idle_agent_period", "max_agent_starting_period",
    "max_disconnected_period", "launch_error_backoff", "launch_error_backoff_max", "master_url",
    "startup_script", "agent", "max_launch_per_decision", "bootstrap_token_ttl", "slots_per_host",
}
# AWS refuses user-data over 16 KiB (before base64); GCE metadata values allow 256 KiB.
USER_DATA_LIMITS = {"aws": 16 * 1024, "gcp": 256 * 1024}


class PoolConfigError(ValueError):
    """The pool's provider section is unusable; the message names the field."""


@dataclass(frozen=True)
class ElasticSettings:
    type: str
    min_instances: int = 0
    max_instances: int = 5
    max_idle_agent_period: timedelta = timedelta(minutes=5)
    max_agent_starting_period: timedelta = timedelta(minutes=20)
    max_disconnected_period: timedelta = timedelta(minutes=10)
    launch_error_backoff: timedelta = timedelta(seconds=30)
    launch_error_backoff_max: timedelta = timedelta(minutes=30)
    master_url: str | None = None
    startup_script: str = ""
    agent: dict[str, Any] = field(default_factory=dict)
    max_launch_per_decision: int | None = None
    bootstrap_token_ttl: timedelta = timedelta(minutes=30)


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


def parse_duration(value: Any, name: str) -> timedelta:
    """Seconds as a number, or a string like "90s", "5m", "1h"."""
    if isinstance(value, bool):
        raise PoolConfigError(f"{name}: expected a duration like 300 or '5m', got {value!r}")
    if isinstance(value, int | float):
        if value < 0:
            raise PoolConfigError(f"{name}: must not be negative")
        return timedelta(seconds=value)
    m = _DURATION.match(str(value))
    if not m:
        raise PoolConfigError(f"{name}: expected a duration like 300 or '5m', got {value!r}")
    return timedelta(seconds=float(m.group(1)) * _UNITS[m.group(2)])


def _int(data: dict[str, Any], key: str, default: int | None, minimum: int = 0) -> int | None:
    value = data.get(key, default)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise PoolConfigError(f"{key}: must be an integer >= {minimum}, got {value!r}")
    return value


def elastic_settings(provider_cfg: dict[str, Any]) -> ElasticSettings:
    kind = provider_cfg.get("type")
    if kind not in ("aws", "gcp", "local", "static"):
        raise PoolConfigError(f"type: must be one of aws, gcp, local, static (got {kind!r})")
    mins = _int(provider_cfg, "min_instances", 0)
    maxs = _int(provider_cfg, "max_instances", 5)
    assert mins is not None and maxs is not None
    if mins > maxs:
        raise PoolConfigError(f"min_instances ({mins}) is greater than max_instances ({maxs})")
    durations = {}
    for key in ("max_idle_agent_period", "max_agent_starting_period", "max_disconnected_period",
                "launch_error_backoff", "launch_error_backoff_max", "bootstrap_token_ttl"):
        if key in provider_cfg:
            durations[key] = parse_duration(provider_cfg[key], key)
    agent = provider_cfg.get("agent") or {}
    if not isinstance(agent, dict):
        raise PoolConfigError("agent: must be a mapping of agent options")
    return ElasticSettings(
        type=kind, min_instances=mins, max_instances=maxs,
        master_url=provider_cfg.get("master_url"), startup_script=str(provider_cfg.get("startup_script") or ""),
        agent=agent, max_launch_per_decision=_int(provider_cfg, "max_launch_per_decision", None, 1),
        **durations,
    )


@dataclass
class PoolProvider:
    settings: ElasticSettings
    provider: Provider
    slots_per_instance: int


def build_provider(provider_cfg: dict[str, Any], *, pool: str, cluster_id: str, master_url: str,
                   state_dir: Path) -> PoolProvider:
    """Raises PoolConfigError (bad config) or provisioners.base.ProviderError (e.g. AWS auth while
    resolving the instance type's GPUs)."""
    if provider_cfg.get("type") == "static":
        # A static pool keeps all its hosts unless told otherwise.
        hosts = provider_cfg.get("hosts")
        n = len(hosts) if isinstance(hosts, list) else 0
        provider_cfg = {"min_instances": n, "max_instances": n, **provider_cfg}
    settings = elastic_settings(provider_cfg)
    if settings.agent and settings.type in ("aws", "gcp", "static"):
        from agent_bootstrap.cloud_init import validate_agent_options

        try:
            validate_agent_options(settings.agent)
        except ValueError as e:
            raise PoolConfigError(f"agent: {e}") from None
    if settings.type in USER_DATA_LIMITS:
        _check_user_data_size(settings, pool, master_url)
    own = {k: v for k, v in provider_cfg.items() if k not in COMMON_KEYS}
    url = settings.master_url or master_url
    try:
        if settings.type == "local":
            from provisioners.local import LocalPoolConfig, LocalProvider

            lcfg = LocalPoolConfig.from_dict(own)
            return PoolProvider(settings, LocalProvider(lcfg, cluster_id=cluster_id, pool=pool, master_url=url,
                                                         state_dir=state_dir), lcfg.slots_per_instance)
        if settings.type == "aws":
            from provisioners.aws import AwsPoolConfig, AwsProvider

            acfg = AwsPoolConfig.from_dict(own)
            aws = AwsProvider(acfg, cluster_id=cluster_id, pool=pool, master_url=url)
            return PoolProvider(settings, aws, aws.resolve_instance_slots())
        if settings.type == "gcp":
            from provisioners.gcp import GcpPoolConfig, GcpProvider

            gcfg = GcpPoolConfig.from_dict(own)
            slots = gcfg.instance_slots if gcfg.instance_slots is not None else gcfg.gpu_num
            return PoolProvider(settings, GcpProvider(gcfg, cluster_id=cluster_id, pool=pool, master_url=url), slots)
        if settings.type == "static":
            from provisioners.static import StaticPoolConfig, StaticProvider

            scfg = StaticPoolConfig.from_dict({**own, "agent": settings.agent or None})
            slots = _int(provider_cfg, "slots_per_host", 1, 1)
            assert slots is not None
            return PoolProvider(settings, StaticProvider(scfg, cluster_id=cluster_id, pool=pool, master_url=url), slots)
    except PoolConfigError:
        raise
    except ValueError as e:  # the provider's own config errors name their field
        raise PoolConfigError(str(e)) from None
    raise PoolConfigError(f"type: {settings.type!r} has no provider")


def _check_user_data_size(settings: ElasticSettings, pool: str, master_url: str) -> None:
    """Refuse a pool whose user-data (mostly its startup_script) the cloud would refuse anyway."""
    from agent_bootstrap.cloud_init import BootstrapParams, render_user_data

    sample = render_user_data(BootstrapParams(
        master_url=settings.master_url or master_url, pool=pool, bootstrap_token="x" * 43,
        provider=settings.type, launch_id="0" * 32, startup_script=settings.startup_script,  # type: ignore[arg-type]
        agent_options=dict(settings.agent)))
    size, limit = len(sample.encode()), USER_DATA_LIMITS[settings.type]
    if size > limit:
        raise PoolConfigError(f"startup_script: the rendered user-data would be {size} bytes, over the "
                              f"{settings.type} limit of {limit} bytes; shorten the startup script")
