"""The `fair_share` policy: the pool's slots split across jobs by weighted max-min fairness.

Each job's demand is what it holds plus what it waits for, capped by its `max_slots`; its share is
the weighted max-min share of the pool's slots (`weighted_max_min`): no job gets more than it asks
for, and what some do not need is split among the others in proportion to their weights. Slots go
one allocation at a time to the job furthest below its share (then queue order), as whole gangs
(gang.py), so every job ends within one allocation of its share when the pool is full. With
preemption on, a job below its share that cannot start has preemptible work of jobs above their
share yield — the newest first, only as much as needed, never taking a job below its share."""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

from control_plane.core.scheduling.gang import PoolState, unschedulable_reason
from control_plane.core.scheduling.policy import (
    AgentSlots,
    Assignment,
    Fitting,
    PendingAllocation,
    RunningAllocation,
    ScheduleDecision,
    SchedulingPolicy,
)

__all__ = ["POLICY", "schedule", "weighted_max_min"]

_EPS = 1e-9


def weighted_max_min(capacity: float, demands: Mapping[Hashable, tuple[float, float]]) -> dict[Hashable, float]:
    """Water-filling: job -> share, for `demands` job -> (demand, weight > 0)."""
    shares: dict[Hashable, float] = {}
    items = sorted(demands.items(), key=lambda kv: kv[1][0] / kv[1][1])
    remaining = float(capacity)
    wsum = sum(w for _, (_, w) in items)
    for n, (job, (demand, weight)) in enumerate(items):
        level = remaining / wsum if wsum > 0 else 0.0
        if demand <= weight * level:
            shares[job] = float(demand)
            remaining -= demand
            wsum -= weight
            continue
        for job2, (_, w2) in items[n:]:
            shares[job2] = w2 * level
        break
    return shares


@dataclass
class _Job:
    weight: float
    max_slots: int | None
    held: int = 0
    pending: list[PendingAllocation] = field(default_factory=list)


def _shares(jobs: Mapping[str, _Job], capacity: int) -> dict[Hashable, float]:
    """Each job's share: its demand is what it holds plus what it waits for, capped by its max_slots."""
    demand = {}
    for name, j in jobs.items():
        want = j.held + sum(p.slots for p in j.pending)
        demand[name] = (min(want, j.max_slots) if j.max_slots is not None else want, max(j.weight, _EPS))
    return weighted_max_min(capacity, demand)


def schedule(
    pending: Sequence[PendingAllocation],
    running: Sequence[RunningAllocation],
    agents: Sequence[AgentSlots],
    *,
    preemption: bool = True,
    fitting: Fitting = "best",
) -> ScheduleDecision:
    pool = PoolState(agents, running)
    jobs: dict[str, _Job] = {}
    for r in running:
        j = jobs.setdefault(r.job, _Job(r.weight, r.max_slots))
        if not r.stopping:
            j.held += r.slots
    for p in sorted(pending, key=lambda p: p.queue_key):
        jobs.setdefault(p.job, _Job(p.weight, p.max_slots)).pending.append(p)
    share = _shares(jobs, sum(pool.total))
    preemption = preemption and any(r.preemptible and not r.stopping for r in running)

    assignments: list[Assignment] = []
    preemptions: list[str] = []
    reasons: dict[str, str] = {}
    unplaced: list[str] = []
    capped: list[str] = []

    def above_share(r: RunningAllocation) -> bool:
        """May yield (to another job): preemptible, and its job stays at or above its share without it."""
        return r.preemptible and jobs[r.job].held - r.slots >= share[r.job] - _EPS

    def wait_rest(j: _Job, start: int, why: str, *, cap: bool = False) -> None:
        for q in j.pending[start:]:
            unplaced.append(q.id)
            reasons[q.id] = why
            if cap:
                capped.append(q.id)

    heap = [(j.held - share[name], j.pending[0].queue_key, name, 0) for name, j in jobs.items() if j.pending]
    heapq.heapify(heap)
    while heap:
        _, _, name, n = heapq.heappop(heap)
        j = jobs[name]
        p = j.pending[n]
        k = p.slots
        if j.max_slots is not None and j.held + k > j.max_slots:
            wait_rest(j, n, f"its job holds {j.held} slots of its max_slots {j.max_slots}", cap=True)
            continue
        parts = pool.place(k, fitting) if k > 0 else None
        if k <= 0:
            i = pool.find_one(0, fitting)
            parts = (pool.take(i, 0),) if i is not None else None
        if parts is not None:
            assignments.append(Assignment(p.id, parts))
            j.held += k
            if pool.preemptible is not None:  # its work may now yield
                pool.preemptible.recheck_job(name)
            if n + 1 < len(j.pending):
                heapq.heappush(heap, (j.held - share[name], j.pending[n + 1].queue_key, name, n + 1))
            continue
        if k > 0 and not pool.shapes(k) or not pool.ids:
            unplaced.append(p.id)
            reasons[p.id] = unschedulable_reason(k, pool.sizes)
            if n + 1 < len(j.pending):
                heapq.heappush(heap, (j.held - share[name], j.pending[n + 1].queue_key, name, n + 1))
            continue
        why = pool.waiting_reason(k) + f"; its job holds {j.held} of its fair share {share[name]:.1f}"
        if preemption and j.held + k <= share[name] + _EPS:
            index = pool.track_preemptible(above_share)
            got = pool.preempt_for(k, p.priority, exclude_job=name)
            if got is not None:
                for r in got[1]:
                    jobs[r.job].held -= r.slots
                    preemptions.append(r.id)
                for job in {r.job for r in got[1]}:  # their work may no longer yield
                    index.recheck_job(job)
                if got[1]:
                    why = f"preempting {len(got[1])} allocation(s) of jobs above their fair share"
        unplaced.append(p.id)
        reasons[p.id] = why
        wait_rest(j, n + 1, f"waiting behind {p.id} of the same job")
    return ScheduleDecision(tuple(assignments), tuple(preemptions), tuple(unplaced), reasons, tuple(capped))


POLICY = SchedulingPolicy(name="fair_share", schedule=schedule)
