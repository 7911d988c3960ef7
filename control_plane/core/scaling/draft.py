"""The decision being built: the census of a pool's instances and the draft each stage of
`decider.decide` adds its part to, with the wording helpers the stages share."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from control_plane.core.scaling.model import (
    InstanceAction,
    InstanceView,
    LaunchPlan,
    ScaleDecision,
    Termination,
)


def fmt_duration(d: timedelta) -> str:
    total = max(0, int(d.total_seconds()))
    hours, rem = divmod(total, 3600)
    minutes, seconds = divmod(rem, 60)
    parts = [f"{hours}h" if hours else "", f"{minutes}m" if minutes else "", f"{seconds}s" if seconds else ""]
    return "".join(parts) or "0s"


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


@dataclass
class Census:
    booting: list[InstanceView] = field(default_factory=list)
    idle: list[InstanceView] = field(default_factory=list)
    busy: list[InstanceView] = field(default_factory=list)
    disconnected: list[InstanceView] = field(default_factory=list)
    stopping: list[InstanceView] = field(default_factory=list)  # billed, no capacity
    #: The warm pool: parking (being powered off) or parked (powered off); outside max_instances.
    parked: list[InstanceView] = field(default_factory=list)

    @property
    def live(self) -> int:
        return len(self.booting) + len(self.idle) + len(self.busy) + len(self.disconnected)


@dataclass
class Draft:
    """The decision being built: each stage of `decide` reads what the earlier ones left here and
    adds its own part. Only `decide` makes one, so the stages stay pure functions of their inputs."""

    census: Census
    terminations: list[Termination] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    launch: int = 0
    #: Which instance types the launch is made of (a pool with `PoolLimits.options`).
    launches: tuple[LaunchPlan, ...] = ()
    #: Idle instances the pending demand was packed onto (set by the launch stage; kept by the reap).
    idle_absorbing: int = 0
    #: Instances billed while stopping when the launch was sized: the census's and those this
    #: decision had terminated by then (broken, shed).
    stopping: int = 0
    #: Parked instances started again, each instead of a launch (the launch stage).
    starts: list[InstanceAction] = field(default_factory=list)
    #: Idle instances stopped into the warm pool instead of terminated (the idle stage).
    parks: list[InstanceAction] = field(default_factory=list)
    #: How many more instances the warm pool takes (set by the census stage); 0: idle ones go.
    warm_room: int = 0
    warm_pool_size: int = 0

    def terminate(self, inst: InstanceView, why: str, presumes_idle: bool = False) -> None:
        self.terminations.append(Termination(inst.id, why, presumes_idle))

    def parks_instead(self, inst: InstanceView) -> bool:
        """Whether an idle instance going for idleness is parked rather than terminated: the warm
        pool has room, it is on demand, and its agent takes work (an admin's disable is kept)."""
        return self.warm_room > 0 and not inst.spot and inst.accepts_work

    def retire_idle(self, inst: InstanceView, why: str) -> None:
        """An idle instance goes: parked in the warm pool while it has room (`parks_instead`),
        terminated otherwise. Either presumes it idle (the shell checks it still is)."""
        if not self.parks_instead(inst):
            self.terminate(inst, why, presumes_idle=True)
            return
        self.warm_room -= 1
        kept = self.warm_pool_size - self.warm_room
        self.parks.append(InstanceAction(inst.id, f"{why}; parked in the warm pool ({kept} of warm_pool_size "
                                                  f"{self.warm_pool_size}): started again before any launch"))

    def decision(self) -> ScaleDecision:
        return ScaleDecision(launch=self.launch, terminate=tuple(self.terminations), reasons=tuple(self.reasons),
                             launches=self.launches, start=tuple(self.starts), park=tuple(self.parks))


def is_busy(inst: InstanceView) -> bool:
    return inst.busy_slots > 0 or inst.idle_since is None
