"""Scheduling policies: pure functions from a pool's queue and agents to placements.

The registry below is the one list of policies. A pool runs the policy its `scheduler.type`
names; the master config accepts only registered names. Adding a policy is a module here that
defines `POLICY = SchedulingPolicy(name=..., schedule=...)` and one entry in `_REGISTERED`.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from control_plane.core.scheduling import fair_share, priority
from control_plane.core.scheduling.policy import (
    AgentSlots,
    Assignment,
    Fitting,
    Part,
    PendingAllocation,
    RunningAllocation,
    ScheduleDecision,
    ScheduleFunction,
    SchedulingPolicy,
)

__all__ = [
    "DEFAULT_POLICY",
    "POLICIES",
    "AgentSlots",
    "Assignment",
    "Fitting",
    "Part",
    "PendingAllocation",
    "RunningAllocation",
    "ScheduleDecision",
    "ScheduleFunction",
    "SchedulingPolicy",
    "UnknownPolicy",
    "policy_names",
    "scheduling_policy",
]

_REGISTERED: tuple[SchedulingPolicy, ...] = (priority.POLICY, fair_share.POLICY)

POLICIES: Mapping[str, SchedulingPolicy] = MappingProxyType({p.name: p for p in _REGISTERED})
DEFAULT_POLICY = priority.POLICY.name


class UnknownPolicy(ValueError):
    """A scheduler type no registered policy has."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"unknown scheduler type {name!r}; expected one of: {', '.join(policy_names())}")


def policy_names() -> tuple[str, ...]:
    return tuple(POLICIES)


def scheduling_policy(name: str | None = None) -> SchedulingPolicy:
    """The policy registered as `name` (None: the default one); `UnknownPolicy` otherwise."""
    try:
        return POLICIES[name or DEFAULT_POLICY]
    except KeyError:
        raise UnknownPolicy(str(name)) from None
