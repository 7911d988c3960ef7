"""What the autoscaler keeps in memory per pool, all of it safe to lose: when each instance was
first missed from a list (a restart starts the grace window again), the terminate attempts (a
restart sends them again at once) and when the last launch failed (a restart starts the probe
interval again)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from provisioners.factory import PoolProvider


@dataclass
class Attempts:
    """Terminate (or warm pool stop / start) calls sent for one instance by this process."""

    count: int = 0
    last_at: datetime | None = None
    last_error: str | None = None


@dataclass
class PoolMemory:
    """One elastic pool as the autoscaler holds it: its provider (None, with `error`, when the
    pool's configuration does not build one) and what it remembers between ticks."""

    provider: PoolProvider | None
    error: str | None = None
    # launch id -> when a list first missed its instance (in a row)
    first_missed: dict[str, datetime] = field(default_factory=dict)
    # instance id -> terminate attempts, for rows in `stopping` and orphans
    terminations: dict[str, Attempts] = field(default_factory=dict)
    last_launch_failure_at: datetime | None = None
    # instance id -> stop calls for rows `parking` / start calls for rows started from the warm pool
    parking: dict[str, Attempts] = field(default_factory=dict)
    starting: dict[str, Attempts] = field(default_factory=dict)

    def list_miss_grace(self) -> timedelta:
        assert self.provider is not None
        grace = self.provider.settings.list_miss_grace
        assert grace is not None  # provisioners.factory.resolve sets it, by the provider's list
        return grace
