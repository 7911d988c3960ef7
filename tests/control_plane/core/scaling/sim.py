"""A small pool simulator for the scale decider's convergence tests.

Each tick: instances boot (requested -> starting -> agent connected after their boot delay), a
best-fit scheduler places pending tasks whole on connected instances, the unplaced remainder becomes
the demand, `decide` runs, and its launches and terminations are applied.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from control_plane.core.scaling import InstanceView, PendingDemand, PoolLimits, ScaleDecision, decide


@dataclass
class SimInstance:
    id: str
    launched_at: datetime
    boot_ticks: int
    state: str = "requested"
    connected_at: datetime | None = None
    tasks: list[int] = field(default_factory=list)  # slot sizes of the tasks running here
    idle_since: datetime | None = None

    def busy_slots(self) -> int:
        return sum(self.tasks)

    def view(self) -> InstanceView:
        return InstanceView(
            id=self.id,
            state=self.state,  # type: ignore[arg-type]
            launched_at=self.launched_at,
            agent_connected=self.connected_at is not None,
            agent_first_connected_at=self.connected_at,
            agent_disconnected_since=None,
            busy_slots=self.busy_slots(),
            idle_since=None if self.tasks else self.idle_since,
        )


@dataclass
class PoolSim:
    limits: PoolLimits
    boot_ticks: list[int]  # boot delay of the n-th launched instance (cycled)
    tick: timedelta = timedelta(seconds=5)
    now: datetime = datetime(2024, 1, 1)
    instances: dict[str, SimInstance] = field(default_factory=dict)
    pending: list[int] = field(default_factory=list)  # slot sizes of tasks waiting
    launched: int = 0
    history: list[ScaleDecision] = field(default_factory=list)

    def submit(self, shapes: Counter[int]) -> None:
        for size, count in shapes.items():
            self.pending += [size] * count

    def _boot(self) -> None:
        for inst in self.instances.values():
            if inst.connected_at is not None:
                continue
            age = (self.now - inst.launched_at) // self.tick
            if age >= 1:
                inst.state = "starting"
            if age >= inst.boot_ticks:
                inst.state = "running"
                inst.connected_at = self.now
                inst.idle_since = self.now

    def _schedule(self) -> None:
        capacity = self.limits.slots_per_instance
        still: list[int] = []
        connected = sorted(
            (i for i in self.instances.values() if i.connected_at is not None), key=lambda i: i.id
        )
        for size in sorted(self.pending, reverse=True):
            fitting = [i for i in connected if capacity - i.busy_slots() >= size]
            if not fitting:
                still.append(size)
                continue
            best = min(fitting, key=lambda i: capacity - i.busy_slots())
            best.tasks.append(size)
            best.idle_since = None
        self.pending = still

    def demand(self) -> list[PendingDemand]:
        return [PendingDemand(slots=s, count=c) for s, c in sorted(Counter(self.pending).items())]

    def step(self) -> ScaleDecision:
        self.now += self.tick
        self._boot()
        self._schedule()
        decision = decide(self.demand(), [i.view() for i in self.instances.values()], self.limits, self.now)
        for t in decision.terminate:
            gone = self.instances.pop(t.id)
            self.pending += gone.tasks  # a terminated instance's tasks go back to the queue
        for _ in range(decision.launch):
            boot = self.boot_ticks[self.launched % len(self.boot_ticks)]
            self.launched += 1
            iid = f"i-{self.launched:04d}"
            self.instances[iid] = SimInstance(iid, self.now, boot)
        self.history.append(decision)
        return decision
