"""Reference copy (issue 28) of control_plane/core/scheduling/priority.py at 8c7da37, before the indexes.

The `priority` policy (the default): a queue ordered by priority (1..99, lower first, default 42),
then queue position (a job moved in the queue), then submission time.

Allocations start in queue order, each as a whole gang (gang.py): on one agent when one holds it
(best fit packs, worst fit spreads), else across whole agents. One that cannot start now reserves
the agents closest to holding it, so nothing behind it in the queue takes the slots it waits for;
smaller work behind it backfills only onto slots no reservation needs, so a large gang is not
starved by a stream of small ones. With preemption on, one that cannot start has strictly lower
priority preemptible work yield — the newest first, only as much as needed, counting slots of
work already stopping. Every allocation left waiting gets a reason."""

from __future__ import annotations

from collections.abc import Sequence

from control_plane.core.scheduling.policy import (
    AgentSlots,
    Assignment,
    Fitting,
    PendingAllocation,
    RunningAllocation,
    ScheduleDecision,
)
from control_plane.core.scheduling.priority import _behind, _plural
from tests.control_plane.core.scheduling._reference.gang import PoolState, unschedulable_reason

__all__ = ["schedule"]


def schedule(
    pending: Sequence[PendingAllocation],
    running: Sequence[RunningAllocation],
    agents: Sequence[AgentSlots],
    *,
    preemption: bool = True,
    fitting: Fitting = "best",
) -> ScheduleDecision:
    pool = PoolState(agents, running)
    held: dict[str, int] = {}
    for r in running:
        if not r.stopping:
            held[r.job] = held.get(r.job, 0) + r.slots
    # The lowest priority (highest number) of work that could yield: nothing at or above it preempts.
    lowest = max((r.priority for r in running if r.preemptible and not r.stopping), default=0)
    assignments: list[Assignment] = []
    preemptions: list[str] = []
    unplaced: list[str] = []
    reasons: dict[str, str] = {}
    waiting_jobs: set[str] = set()  # jobs with an allocation waiting ahead (holding the queue)
    higher_waiting = 0  # of those, jobs of strictly higher priority than the current one
    current: int | None = None
    no_eviction_from = 1 << 62  # a gang this large or larger found nothing to preempt: neither will later ones

    order = sorted(pending, key=lambda p: (p.priority, p.order if p.queue_position is None else p.queue_position,
                                           p.order, p.id))
    for p in order:
        if p.priority != current:
            current, higher_waiting = p.priority, len(waiting_jobs)
        job, k = p.job, p.slots
        if p.max_slots is not None and held.get(job, 0) + k > p.max_slots:
            unplaced.append(p.id)
            reasons[p.id] = f"its job holds {held.get(job, 0)} slots of its max_slots {p.max_slots}"
            continue
        if k <= 0:
            i = pool.find_one(0, fitting)
            if i is not None:
                assignments.append(Assignment(p.id, (pool.take(i, 0),)))
                continue
            parts = None
        else:
            parts = pool.place(k, fitting)
        if parts is not None:
            assignments.append(Assignment(p.id, parts))
            held[job] = held.get(job, 0) + k
            continue
        unplaced.append(p.id)
        if k > 0 and not pool.shapes(k) or not pool.ids:
            reasons[p.id] = unschedulable_reason(k, pool.sizes)
            continue
        ahead_same = len(waiting_jobs) - higher_waiting - (job in waiting_jobs)
        blocker = pool.blocked_by_reservation(k)
        at_most, whole = (pool.max_cap(), None) if k <= pool.m else (None, pool.whole_free(k))
        reason: str | None = None
        if preemption and p.priority < lowest and k < no_eviction_from:
            got = pool.preempt_for(k, p.priority, lambda r, mine=p.priority: r.preemptible and r.priority > mine)
            if got is None:
                no_eviction_from = k
            else:
                victims = got[1]
                preemptions.extend(r.id for r in victims)
                reason = (f"preempting {_plural(len(victims), 'lower-priority allocation')}" if victims
                          else "waiting for slots of allocations already stopping")
        if reason is None:
            if pool.reserve_for(k, p.priority) is not None:
                if blocker is not None:
                    reason = ("reserved slots for a higher-priority job" if blocker[1] < p.priority
                              else "reserved slots for a job ahead in the queue")
                else:
                    reason = pool.waiting_reason(k, at_most, whole)
            else:
                reason = _behind(higher_waiting, ahead_same)
        reasons[p.id] = reason
        waiting_jobs.add(job)
    return ScheduleDecision(tuple(assignments), tuple(preemptions), tuple(unplaced), reasons)

