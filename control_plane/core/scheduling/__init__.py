"""Scheduling policies: pure functions from a pool's queue and agents to placements."""

from control_plane.core.scheduling.priority import (  # noqa: F401
    AgentSlots,
    Assignment,
    PendingAllocation,
    RunningAllocation,
    ScheduleDecision,
    schedule,
)
