"""Build a pool's provider from its `provider:` section. The common elastic settings are taken
out here; the rest is the provider's own config, checked by the config model its module declares
(provisioners/registry.py finds the module by `type`)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from provisioners import registry
from provisioners.base import Provider, ProviderContext, ProviderType, UserDataKind

COMMON_KEYS = {
    "type", "min_instances", "max_instances", "max_idle_agent_period", "max_agent_starting_period",
    "max_disconnected_period", "launch_error_backoff", "launch_error_backoff_max", "master_url",
    "startup_script", "agent", "max_launch_per_decision", "bootstrap_token_ttl", "list_miss_grace",
    "launch_probe_interval", "arrival_window",
}


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
    # How long an instance may be missing from the cloud's lists before it is presumed gone; None:
    # 3m, or at once for providers whose list is consistent (ProviderType.consistent_list).
    list_miss_grace: timedelta | None = None
    # During a long launch backoff (quota), one instance is launched this often to see whether the
    # error is over, rather than waiting for the whole backoff.
    launch_probe_interval: timedelta = timedelta(minutes=5)
    # Scale-down hysteresis: the demand arrivals of this window predict the next one, and an idle
    # instance the next arrival is expected to use is kept (up to twice max_idle_agent_period).
    # 0 turns the hysteresis off: idle instances go after max_idle_agent_period.
    arrival_window: timedelta = timedelta(minutes=30)


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
    if kind not in registry.provider_types():
        raise PoolConfigError(f"type: must be one of {', '.join(registry.provider_types())} (got {kind!r})")
    mins = _int(provider_cfg, "min_instances", 0)
    maxs = _int(provider_cfg, "max_instances", 5)
    assert mins is not None and maxs is not None
    if mins > maxs:
        raise PoolConfigError(f"min_instances ({mins}) is greater than max_instances ({maxs})")
    durations = {}
    for key in ("max_idle_agent_period", "max_agent_starting_period", "max_disconnected_period",
                "launch_error_backoff", "launch_error_backoff_max", "bootstrap_token_ttl", "list_miss_grace",
                "launch_probe_interval", "arrival_window"):
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
    provider_type: ProviderType


def build_provider(provider_cfg: dict[str, Any], *, pool: str, cluster_id: str, master_url: str,
                   state_dir: Path) -> PoolProvider:
    """Raises PoolConfigError (bad config) or provisioners.base.ProviderError (e.g. AWS auth while
    resolving the instance type's GPUs)."""
    declared = provider_cfg.get("type")
    if declared in registry.provider_types():
        defaults = registry.get(declared).settings_defaults
        if defaults is not None:
            provider_cfg = {**defaults(provider_cfg), **provider_cfg}
    settings = elastic_settings(provider_cfg)
    ptype = registry.get(settings.type)
    if settings.agent and ptype.takes_agent_options:
        from agent_bootstrap.cloud_init import validate_agent_options

        try:
            validate_agent_options(settings.agent)
        except ValueError as e:
            raise PoolConfigError(f"agent: {e}") from None
    if ptype.user_data is UserDataKind.CLOUD_INIT and ptype.user_data_limit is not None:
        _check_user_data_size(settings, ptype.user_data_limit, pool, master_url)
    own = {k: v for k, v in provider_cfg.items() if k not in COMMON_KEYS}
    ctx = ProviderContext(cluster_id=cluster_id, pool=pool, master_url=settings.master_url or master_url,
                          state_dir=state_dir, agent_options=dict(settings.agent))
    try:
        built = ptype.build(ptype.config.from_dict(own), ctx)
    except PoolConfigError:
        raise
    except ValueError as e:  # the provider's own config errors name their field
        raise PoolConfigError(str(e)) from None
    return PoolProvider(settings, built.provider, built.slots_per_instance, ptype)


def _check_user_data_size(settings: ElasticSettings, limit: int, pool: str, master_url: str) -> None:
    """Refuse a pool whose user-data (mostly its startup_script) the cloud would refuse anyway."""
    from agent_bootstrap.cloud_init import BootstrapParams, render_user_data

    sample = render_user_data(BootstrapParams(
        master_url=settings.master_url or master_url, pool=pool, bootstrap_token="x" * 43,
        provider=settings.type, launch_id="0" * 32, startup_script=settings.startup_script,  # type: ignore[arg-type]
        agent_options=dict(settings.agent)))
    size = len(sample.encode())
    if size > limit:
        raise PoolConfigError(f"startup_script: the rendered user-data would be {size} bytes, over the "
                              f"{settings.type} limit of {limit} bytes; shorten the startup script")
