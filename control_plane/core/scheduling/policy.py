"""What a scheduling policy is: a pure function from a pool's snapshot (waiting allocations, running
allocations, agents and their slots) to a decision (placements, preemptions, why each waiting
allocation waits), registered under the name pools select it by (`scheduler.type` in the master
config). Time never enters: submission times and queue positions come in the snapshot."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal, Protocol

Fitting = Literal["best", "worst"]
DEFAULT_PRIORITY = 42


@dataclass(frozen=True)
class AgentSlots:
    agent_id: str
    slot_ids: tuple[str, ...]  # every slot of the agent
    used_slot_ids: frozenset[str] = frozenset()
    schedulable: bool = True  # connected, enabled and not draining


@dataclass(frozen=True)
class Part:
    """The slots one agent brings to an allocation (a gang across agents has several parts)."""

    agent_id: str
    slot_ids: tuple[str, ...]


@dataclass(frozen=True)
class PendingAllocation:
    id: str
    slots: int
    priority: int = DEFAULT_PRIORITY  # 1..99, lower first
    order: float = 0.0  # submission time (seconds); the tie-breaker after the queue position
    job_id: str = ""  # "" : the allocation is a job of its own
    weight: float = 1.0  # fair share weight of the job
    queue_position: float | None = None  # set: orders the job in its priority, in place of `order`
    max_slots: int | None = None  # the job's cap on slots held at once (None: no cap)

    @property
    def job(self) -> str:
        return self.job_id or self.id

    @property
    def queue_key(self) -> tuple[int, float, float, str]:
        pos = self.order if self.queue_position is None else self.queue_position
        return (self.priority, pos, self.order, self.id)


@dataclass(frozen=True)
class RunningAllocation:
    id: str
    parts: tuple[Part, ...]
    priority: int = DEFAULT_PRIORITY
    preemptible: bool = True
    stopping: bool = False  # already asked to stop: its slots are about to free up
    job_id: str = ""
    weight: float = 1.0
    order: float = 0.0  # when it started (preemption takes the newest first)
    max_slots: int | None = None

    @classmethod
    def on(cls, id: str, agent_id: str, slot_ids: Sequence[str], **kw: object) -> RunningAllocation:
        return cls(id, (Part(agent_id, tuple(slot_ids)),), **kw)  # type: ignore[arg-type]

    @property
    def job(self) -> str:
        return self.job_id or self.id

    @cached_property
    def slots(self) -> int:
        return sum(len(p.slot_ids) for p in self.parts)


@dataclass(frozen=True)
class Assignment:
    allocation_id: str
    parts: tuple[Part, ...]  # one part on one agent; several for a gang across agents (chief first)

    @property
    def agent_id(self) -> str:
        return self.parts[0].agent_id

    @property
    def slot_ids(self) -> tuple[str, ...]:
        return self.parts[0].slot_ids


@dataclass(frozen=True)
class ScheduleDecision:
    assignments: tuple[Assignment, ...] = ()
    preemptions: tuple[str, ...] = ()  # running allocation ids to stop gracefully
    unplaced: tuple[str, ...] = ()  # pending allocation ids left waiting (the pool's demand)
    reasons: dict[str, str] = field(default_factory=dict)  # every waiting allocation id -> why it waits
    #: Of `unplaced`, those waiting for their own job's slots under its max_slots: no new instance
    #: helps them (the autoscaler launches nothing for them).
    capped: tuple[str, ...] = ()


class ScheduleFunction(Protocol):
    def __call__(
        self,
        pending: Sequence[PendingAllocation],
        running: Sequence[RunningAllocation],
        agents: Sequence[AgentSlots],
        *,
        preemption: bool = True,
        fitting: Fitting = "best",
    ) -> ScheduleDecision: ...


@dataclass(frozen=True)
class SchedulingPolicy:
    """A policy as the registry knows it: the name a pool's `scheduler.type` names, and its function."""

    name: str
    schedule: ScheduleFunction
