"""The decision being built: the census of a pool's instances and the draft each stage of
`decider.decide` adds its part to, with the wording helpers the stages share."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from control_plane.core.scaling.model import InstanceView, LaunchPlan, ScaleDecision, Termination


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

    def terminate(self, inst: InstanceView, why: str, presumes_idle: bool = False) -> None:
        self.terminations.append(Termination(inst.id, why, presumes_idle))

    def decision(self) -> ScaleDecision:
        return ScaleDecision(launch=self.launch, terminate=tuple(self.terminations), reasons=tuple(self.reasons),
                             launches=self.launches)


def is_busy(inst: InstanceView) -> bool:
    return inst.busy_slots > 0 or inst.idle_since is None
