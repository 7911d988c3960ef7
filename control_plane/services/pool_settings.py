"""What a pool's configuration means: its effective settings, as the autoscaler acts on them.

Every reader of a pool's settings — the API (and the CLI through it), the web UI, the capacity
check of new experiments — goes through `effective_pool`, which reads the `provider:` section only
through `provisioners.factory.resolve` (via `ResourcePoolConfig.settings`). The defaults live in
`shipyard_common/pool_settings.py`; nothing here has a fallback of its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from control_plane.config import ResourcePoolConfig
from provisioners.factory import InstanceSummary, PoolConfigError, PoolSettings
from shipyard_common.pool_settings import ElasticSettings
from shipyard_common.settings import StrictSettings

#: Settings shown nowhere: the startup script and the agents' options may carry credentials.
UNSHOWN = frozenset({"agent", "startup_script"})


@dataclass(frozen=True)
class EffectivePool:
    config: ResourcePoolConfig
    settings: PoolSettings | None  # None: no provider (agents join by themselves), or an unusable one
    error: str | None = None  # why the provider section is unusable

    @property
    def elastic(self) -> ElasticSettings | None:
        return self.settings.elastic if self.settings is not None else None

    @property
    def provider(self) -> str | None:
        """The provider type; None for a pool whose agents join by themselves."""
        if self.settings is not None:
            return self.settings.provider_type.name
        kind = (self.config.provider or {}).get("type") if isinstance(self.config.provider, dict) else None
        return str(kind) if kind is not None else None

    @property
    def min_instances(self) -> int:
        return self.elastic.min_instances if self.elastic is not None else 0

    @property
    def max_instances(self) -> int:
        return self.elastic.max_instances if self.elastic is not None else 0

    @property
    def instances(self) -> InstanceSummary:
        """Location, image, type, market and slots of the pool's instances, as its provider says."""
        return self.settings.provider.summary() if self.settings is not None else InstanceSummary()

    def shown_settings(self) -> Iterator[tuple[str, Any]]:
        """(name, value) of every elastic setting but the unshown ones, in the model's order."""
        if self.elastic is None:
            return
        for name in ElasticSettings.model_fields:
            if name not in UNSHOWN and name != "type":  # the type is the pool's `provider`
                value = getattr(self.elastic, name)
                if isinstance(value, StrictSettings):  # a nested section (consolidation): each field
                    yield from ((f"{name}_{sub}", getattr(value, sub)) for sub in type(value).model_fields)
                else:
                    yield name, value


def effective_pool(cfg: ResourcePoolConfig) -> EffectivePool:
    try:
        return EffectivePool(cfg, cfg.settings())
    except PoolConfigError as e:
        return EffectivePool(cfg, None, f"pool {cfg.name!r} is not usable: {e}")


def seconds(value: Any) -> Any:
    """A setting as the wire and the pages show it: durations in seconds."""
    return value.total_seconds() if isinstance(value, timedelta) else value
