"""A pool's `provider:` section, typed and built: `resolve` is the one reader of the section.

The section holds the elastic settings common to every provider (`shipyard_common.pool_settings`,
the one home of their defaults) beside the provider's own fields, checked by the config model its
module declares (provisioners/registry.py finds the module by `type`). `resolve` reads both,
collecting every problem with its path, and applies the defaults a provider derives from its own
section (a static pool keeps all its hosts). The autoscaler builds providers from it, and the
API, CLI and web UI show the effective settings it returns, so all of them agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from provisioners import registry
from provisioners.base import InstanceSummary, Provider, ProviderContext, ProviderType, UserDataKind
from shipyard_common.pool_settings import COMMON_KEYS, DEFAULT_LIST_MISS_GRACE, ElasticSettings
from shipyard_common.settings import Problem, SettingsError, validate

__all__ = ["COMMON_KEYS", "InstanceSummary", "PoolConfigError", "PoolProvider", "PoolSettings", "build_provider", "elastic_settings",
           "resolve"]


class PoolConfigError(SettingsError):
    """The pool's provider section is unusable; every problem is named with its field."""


@dataclass(frozen=True)
class PoolSettings:
    """A pool's effective settings: the elastic part and the provider's own config, typed."""

    elastic: ElasticSettings
    provider: Any  # the provider type's config model (ProviderType.config)
    provider_type: ProviderType


def _provider_type(section: Any) -> ProviderType:
    if not isinstance(section, Mapping):
        raise PoolConfigError([("", f"must be a mapping, got {type(section).__name__}")])
    kind = section.get("type")
    if kind not in registry.provider_types():
        raise PoolConfigError([("type", f"must be one of {', '.join(registry.provider_types())} (got {kind!r})")])
    return registry.get(kind)


def _with_provider_defaults(ptype: ProviderType, section: Mapping[str, Any]) -> dict[str, Any]:
    defaults = ptype.settings_defaults(section) if ptype.settings_defaults is not None else {}
    return {**defaults, **section}


def _elastic(section: Mapping[str, Any], problems: list[Problem]) -> ElasticSettings | None:
    try:
        return validate(ElasticSettings, {k: v for k, v in section.items() if k in COMMON_KEYS})
    except SettingsError as e:
        problems.extend(e.problems)
        return None


def elastic_settings(section: Mapping[str, Any]) -> ElasticSettings:
    """Only the elastic part of a section, with the provider's defaults; PoolConfigError otherwise."""
    ptype = _provider_type(section)
    problems: list[Problem] = []
    settings = _elastic(_with_provider_defaults(ptype, section), problems)
    if settings is None:
        raise PoolConfigError(problems)
    return settings


def resolve(section: Mapping[str, Any]) -> PoolSettings:
    """The effective settings of a pool's `provider:` section; PoolConfigError lists every problem
    of both parts, with paths relative to the section."""
    ptype = _provider_type(section)
    section = _with_provider_defaults(ptype, section)
    problems: list[Problem] = []
    elastic = _elastic(section, problems)
    own = {k: v for k, v in section.items() if k not in COMMON_KEYS}
    provider_cfg = None
    try:
        provider_cfg = ptype.config.from_dict(own)
    except SettingsError as e:
        problems.extend(e.problems)
    except ValueError as e:  # a provider config that reports one problem in its message
        problems.append(("", str(e)))
    if elastic is not None and elastic.agent and ptype.takes_agent_options:
        # agent_bootstrap renders the options into the agent's config: it knows which exist.
        from agent_bootstrap.cloud_init import validate_agent_options

        try:
            validate_agent_options(elastic.agent)
        except ValueError as e:
            problems.append(("agent", str(e)))
    if elastic is not None and elastic.warm_pool_size and not ptype.parks:
        problems.append(("warm_pool_size", f"the {ptype.name} provider cannot stop and start instances: a warm "
                                           f"pool needs aws or gcp (set 0)"))
    if elastic is not None and elastic.warm_pool_size and getattr(provider_cfg, "keep_stopped_disks", False):
        problems.append(("warm_pool_size", "cannot be used with keep_stopped_disks: true, which would keep the disks "
                                           "of every parked instance the warm pool terminates"))
    if problems or elastic is None:
        raise PoolConfigError(problems)
    if elastic.list_miss_grace is None:  # a consistent list is proof at once; a cloud's lags
        grace = timedelta(0) if ptype.consistent_list else DEFAULT_LIST_MISS_GRACE
        elastic = elastic.model_copy(update={"list_miss_grace": grace})
    return PoolSettings(elastic, provider_cfg, ptype)


@dataclass
class PoolProvider:
    settings: ElasticSettings
    provider: Provider
    slots_per_instance: int
    provider_type: ProviderType


def build_provider(provider_cfg: Mapping[str, Any], *, pool: str, cluster_id: str, master_url: str,
                   state_dir: Path) -> PoolProvider:
    """Raises PoolConfigError (bad config) or provisioners.base.ProviderError (e.g. AWS auth while
    resolving the instance type's GPUs)."""
    resolved = resolve(provider_cfg)
    settings, ptype = resolved.elastic, resolved.provider_type
    if ptype.user_data is UserDataKind.CLOUD_INIT and ptype.user_data_limit is not None:
        _check_user_data_size(settings, ptype.user_data_limit, pool, master_url)
    ctx = ProviderContext(cluster_id=cluster_id, pool=pool, master_url=settings.master_url or master_url,
                          state_dir=state_dir, agent_options=dict(settings.agent))
    try:
        built = ptype.build(resolved.provider, ctx)
    except PoolConfigError:
        raise
    except ValueError as e:  # a config problem only the build sees names its field
        raise PoolConfigError([("", str(e))]) from None
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
        raise PoolConfigError([("startup_script", f"the rendered user-data would be {size} bytes, over the "
                                                  f"{settings.type} limit of {limit} bytes; shorten the startup script")])
