"""The scheduler: a pure function from a pool's queue and agents to placements and preemptions.

Allocations are placed whole (gang) on one agent, in priority order (1 is the highest, as in
Determined) then submission order. Placement is best-fit — the agent with the fewest free slots
that still fit — which keeps large holes free for large gangs. A pending allocation that fits
nowhere does not block smaller ones behind it (backfill); the autoscaler sees it as demand.
With preemption on, a pending allocation that cannot fit may evict strictly lower-priority
running allocations from one agent, choosing the agent that needs the fewest evictions."""

from __future__ import annotations

from collections.abc import Sequence

from control_plane.core.scheduling.policy import (
    AgentSlots,
    Assignment,
    PendingAllocation,
    RunningAllocation,
    ScheduleDecision,
    SchedulingPolicy,
)

__all__ = [
    "POLICY",
    "AgentSlots",
    "Assignment",
    "PendingAllocation",
    "RunningAllocation",
    "ScheduleDecision",
    "schedule",
]


def schedule(
    pending: Sequence[PendingAllocation],
    running: Sequence[RunningAllocation],
    agents: Sequence[AgentSlots],
    *,
    preemption: bool = True,
) -> ScheduleDecision:
    free: dict[str, list[str]] = {}
    for a in agents:
        if a.schedulable:
            free[a.agent_id] = [s for s in a.slot_ids if s not in a.used_slot_ids]
    largest = max((len(a.slot_ids) for a in agents if a.schedulable), default=0)
    by_agent: dict[str, list[RunningAllocation]] = {}
    for r in running:
        by_agent.setdefault(r.agent_id, []).append(r)
    preempting: set[str] = set()
    assignments: list[Assignment] = []
    unplaced: list[str] = []
    reasons: dict[str, str] = {}

    for p in sorted(pending, key=lambda p: (p.priority, p.order, p.id)):
        agent_id = _best_fit(free, p.slots)
        if agent_id is not None:
            taken = tuple(free[agent_id][: p.slots])
            free[agent_id] = free[agent_id][p.slots :]
            assignments.append(Assignment(p.id, agent_id, taken))
            continue
        unplaced.append(p.id)
        if p.slots > largest:
            reasons[p.id] = f"needs {p.slots} slots on one agent; the largest agent has {largest}"
            continue
        reasons[p.id] = f"waiting for {p.slots} free slots"
        if preemption:
            victims = _victims(p, free, by_agent, preempting)
            if victims:
                preempting.update(victims)
                reasons[p.id] = f"preempting {len(victims)} lower-priority allocation(s)"
    return ScheduleDecision(tuple(assignments), tuple(sorted(preempting)), tuple(unplaced), reasons)


def _best_fit(free: dict[str, list[str]], slots: int) -> str | None:
    best: tuple[int, str] | None = None
    for agent_id, ids in free.items():
        if len(ids) >= slots and (best is None or (len(ids), agent_id) < best):
            best = (len(ids), agent_id)
    return best[1] if best else None


def _victims(
    p: PendingAllocation,
    free: dict[str, list[str]],
    by_agent: dict[str, list[RunningAllocation]],
    already: set[str],
) -> list[str]:
    """The fewest strictly-lower-priority allocations on one agent whose eviction fits `p`."""
    best: list[str] | None = None
    for agent_id, ids in free.items():
        on_agent = by_agent.get(agent_id, [])
        # Slots that allocations already stopping will free count as available, so repeated
        # ticks do not evict more than needed.
        have = len(ids) + sum(len(r.slot_ids) for r in on_agent if r.stopping or r.id in already)
        if have >= p.slots:
            return []
        candidates = sorted(
            (r for r in on_agent
             if r.preemptible and not r.stopping and r.priority > p.priority and r.id not in already),
            key=lambda r: (-r.priority, -len(r.slot_ids), r.id),
        )
        chosen: list[str] = []
        for r in candidates:
            if have >= p.slots:
                break
            chosen.append(r.id)
            have += len(r.slot_ids)
        if have >= p.slots and chosen and (best is None or len(chosen) < len(best)):
            best = chosen
    return best or []


POLICY = SchedulingPolicy(name="priority", schedule=schedule)
