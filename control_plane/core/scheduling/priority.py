"""The `priority` policy (the default): a queue ordered by priority (1..99, lower first, default 42),
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

__all__ = ["POLICY", "schedule"]


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _behind(n_higher: int, n_same: int) -> str:
    if n_higher and n_same:
        return f"behind {_plural(n_higher, 'higher-priority job')} and {n_same} earlier of the same priority"
    if n_higher:
        return f"behind {_plural(n_higher, 'higher-priority job')}"
    return f"behind {_plural(n_same, 'earlier job')} of the same priority"


class _Sweep:
    """What may yield to the allocation being placed: preemptible work of strictly lower priority
    (a higher number). The queue is walked by priority, so work leaves the index of preemptible work
    as the walk reaches its priority, each allocation once."""

    def __init__(self, pool: PoolState, running: Sequence[RunningAllocation], priority: int) -> None:
        self.level = priority
        self.index = pool.track_preemptible(lambda r: r.preemptible and r.priority > self.level)
        self.queue = sorted((r for r in running if r.preemptible and not r.stopping), key=lambda r: r.priority)
        self.n = 0

    def to(self, priority: int) -> None:
        self.level, start = priority, self.n
        while self.n < len(self.queue) and self.queue[self.n].priority <= priority:
            self.n += 1
        self.index.recheck(self.queue[start:self.n])


def _reserve(pool: PoolState, k: int, priority: int) -> str | None:
    """Reserve for a gang that cannot start now; why it waits, or None when nothing is left to reserve.
    The reason speaks of the pool as it was before (a failed preemption changed nothing)."""
    if k in pool.unreservable:
        return None
    blocker = pool.blocked_by_reservation(k)
    at_most, whole = (pool.max_cap(), None) if k <= pool.m else (None, pool.whole_free(k))
    if pool.reserve_for(k, priority) is None:
        return None
    if blocker is not None:
        return ("reserved slots for a higher-priority job" if blocker[1] < priority
                else "reserved slots for a job ahead in the queue")
    return pool.waiting_reason(k, at_most, whole)


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
    capped: list[str] = []
    reasons: dict[str, str] = {}
    waiting_jobs: set[str] = set()  # jobs with an allocation waiting ahead (holding the queue)
    higher_waiting = 0  # of those, jobs of strictly higher priority than the current one
    current: int | None = None
    no_eviction_from = 1 << 62  # a gang this large or larger found nothing to preempt: neither will later ones
    sweep: _Sweep | None = None

    order = sorted(pending, key=lambda p: (p.priority, p.order if p.queue_position is None else p.queue_position,
                                           p.order, p.id))
    for p in order:
        if p.priority != current:
            current, higher_waiting = p.priority, len(waiting_jobs)
        job, k = p.job, p.slots
        if p.max_slots is not None and held.get(job, 0) + k > p.max_slots:
            unplaced.append(p.id)
            capped.append(p.id)
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
        reason: str | None = None
        if preemption and p.priority < lowest and k < no_eviction_from:
            sweep = sweep or _Sweep(pool, running, p.priority)
            sweep.to(p.priority)
            got = pool.preempt_for(k, p.priority)
            if got is None:
                no_eviction_from = k
            else:
                victims = got[1]
                preemptions.extend(r.id for r in victims)
                reason = (f"preempting {_plural(len(victims), 'lower-priority allocation')}" if victims
                          else "waiting for slots of allocations already stopping")
        reasons[p.id] = reason or _reserve(pool, k, p.priority) or _behind(higher_waiting, ahead_same)
        waiting_jobs.add(job)
    return ScheduleDecision(tuple(assignments), tuple(preemptions), tuple(unplaced), reasons, tuple(capped))


POLICY = SchedulingPolicy(name="priority", schedule=schedule)
