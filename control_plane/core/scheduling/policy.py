"""What a scheduling policy is: a pure function from a pool's snapshot (pending allocations, running
allocations, agents and their slots) to a decision (assignments, preemptions, what waits and why),
registered under the name pools select it by (`scheduler.type` in the master config)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class AgentSlots:
    agent_id: str
    slot_ids: tuple[str, ...]  # every slot of the agent
    used_slot_ids: frozenset[str] = frozenset()
    schedulable: bool = True  # connected and enabled


@dataclass(frozen=True)
class PendingAllocation:
    id: str
    slots: int
    priority: int = 42
    order: float = 0.0  # submission order (e.g. created timestamp)


@dataclass(frozen=True)
class RunningAllocation:
    id: str
    agent_id: str
    slot_ids: tuple[str, ...]
    priority: int = 42
    preemptible: bool = True
    stopping: bool = False  # already asked to stop: its slots are about to free up


@dataclass(frozen=True)
class Assignment:
    allocation_id: str
    agent_id: str
    slot_ids: tuple[str, ...]


@dataclass(frozen=True)
class ScheduleDecision:
    assignments: tuple[Assignment, ...] = ()
    preemptions: tuple[str, ...] = ()  # running allocation ids to stop gracefully
    unplaced: tuple[str, ...] = ()  # pending allocation ids left waiting (the pool's demand)
    reasons: dict[str, str] = field(default_factory=dict)  # allocation id -> why it waits


class ScheduleFunction(Protocol):
    def __call__(
        self,
        pending: Sequence[PendingAllocation],
        running: Sequence[RunningAllocation],
        agents: Sequence[AgentSlots],
        *,
        preemption: bool = True,
    ) -> ScheduleDecision: ...


@dataclass(frozen=True)
class SchedulingPolicy:
    """A policy as the registry knows it: the name a pool's `scheduler.type` names, and its function."""

    name: str
    schedule: ScheduleFunction
