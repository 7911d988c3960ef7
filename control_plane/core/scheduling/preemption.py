"""The index of preemptible work one scheduling pass keeps (pure), so that finding what to preempt
for a waiting gang looks at the few best agents instead of scanning every agent.

What it answers is exactly what a scan over the pool's agents would (gang.py `PoolState.preempt_for`):

* a gang on one agent (`k` slots, no more than an agent has): an agent with running work whose
  reservable slots (`total - reserved`) hold `k` and whose free slots plus slots of work already
  stopping (`soon`) do too, the first in the running work's order, with no eviction; else the agent
  where the fewest evictions make room, the newest eligible allocation first, only as many as
  needed — the fewest victims, then the fewest victim slots, then the agent's place in the pool;
* a gang across whole agents of `t` slots: the `n` unreserved agents of that size all of whose live
  work may yield, the least live work first, then the agent's place.

Per agent it keeps its live work newest first; per queried `k` a heap of (victims, victim slots,
agent) costs; per free-plus-stopping count a heap of agents by running order (the no-eviction
case); per agent size a heap of (live allocations, agent) for whole-agent gangs. Entries carry the
agent's stamp: an agent changed by the pass (placed on, reserved, its work evicted, its work's
eligibility changed) gets a new stamp and new entries when the next query comes, and old entries
are dropped as they surface. Which work may yield is the policy's (`eligible`, re-read for the
allocations the policy names in `recheck`); `exclude` keeps the requester's own job out."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from control_plane.core.scheduling.policy import RunningAllocation

if TYPE_CHECKING:
    from control_plane.core.scheduling.gang import PoolState

__all__ = ["PreemptibleWork"]


class PreemptibleWork:
    def __init__(self, pool: PoolState, running: Iterable[RunningAllocation],
                 eligible: Callable[[RunningAllocation], bool]) -> None:
        self.pool = pool
        self.eligible = eligible
        self.ok: dict[str, bool] = {}  # live allocation id -> may yield now (False once a victim)
        self.agents_of: dict[str, list[int]] = {}  # live allocation id -> the pool's agents of its parts
        self.by_job: dict[str, list[RunningAllocation]] = {}
        # Agent -> its live work, newest first, with the slots each brings there.
        self.newest: dict[int, list[tuple[RunningAllocation, int]]] = {}
        self.rank = {i: n for n, i in enumerate(pool.running_on)}  # the scan's order of agents
        self.stamp = [0] * len(pool.ids)
        self.dirty: set[int] = set()
        self.costs: dict[int, list[tuple[int, int, int, int]]] = {}  # k -> (victims, slots, agent, stamp)
        self.zero: list[list[tuple[int, int, int]]] = [[] for _ in range(pool.m + 1)]  # -> (rank, agent, stamp)
        self.whole: dict[int, list[tuple[int, int, int]]] = {}  # t -> (live, agent, stamp)
        index = pool.index
        for r in sorted((r for r in running if not r.stopping), key=lambda r: (-r.order, r.id)):
            on = [(i, len(p.slot_ids)) for p in r.parts if (i := index.get(p.agent_id)) is not None]
            if not on:
                continue
            there: dict[int, int] = {}
            for i, n in on:
                there[i] = there.get(i, 0) + n
            for i, _ in on:  # once per part, as the pool's running work per agent lists it
                self.newest.setdefault(i, []).append((r, there[i]))
            if r.id not in self.ok:
                self.ok[r.id] = eligible(r)
                self.by_job.setdefault(r.job, []).append(r)
                self.agents_of[r.id] = list(there)
        for i in self.rank:
            self._push_zero(i)

    # -- upkeep
    def changed(self, i: int) -> None:
        self.dirty.add(i)

    def recheck(self, allocations: Iterable[RunningAllocation]) -> None:
        """Re-read the policy's `eligible` for these allocations (what it depends on changed)."""
        for r in allocations:
            was = self.ok.get(r.id)
            if was is None or r.id in self.pool.victims:
                continue
            now = self.eligible(r)
            if now != was:
                self.ok[r.id] = now
                self.dirty.update(self.agents_of[r.id])

    def recheck_job(self, job: str) -> None:
        self.recheck(self.by_job.get(job, ()))

    def evicted(self, r: RunningAllocation) -> None:
        if r.id in self.ok:
            self.ok[r.id] = False
            self.dirty.update(self.agents_of[r.id])

    def _refresh(self) -> None:
        if not self.dirty:
            return
        pool = self.pool
        ks = sorted(self.costs)
        for i in self.dirty:
            self.stamp[i] += 1
            if i in self.rank:
                self._push_zero(i)
                for k, cost in self._costs(i, ks).items():
                    heapq.heappush(self.costs[k], (*cost, i, self.stamp[i]))
            h = self.whole.get(pool.total[i])
            if h is not None:
                self._push_whole(h, i)
        self.dirty.clear()

    def _push_zero(self, i: int) -> None:
        pool = self.pool
        z = min(pool.total[i] - pool.reserved[i], pool.nfree[i] + pool.soon[i])
        if z > 0:
            heapq.heappush(self.zero[z], (self.rank[i], i, self.stamp[i]))

    def _push_whole(self, h: list[tuple[int, int, int]], i: int) -> None:
        if self.pool.reserved[i]:
            return
        live = [r for r, _ in self.newest.get(i, ()) if r.id not in self.pool.victims]
        if all(self.ok[r.id] for r in live):
            heapq.heappush(h, (len(live), i, self.stamp[i]))

    # -- costs
    def _walk(self, i: int, k: int, exclude: str | None) -> list[RunningAllocation] | None:
        """The victims on agent `i` that make room for `k` (newest eligible first, only as many as
        needed); None when its reservable slots cannot hold `k` or no eviction makes room."""
        pool = self.pool
        if pool.total[i] - pool.reserved[i] < k:
            return None
        have = pool.nfree[i] + pool.soon[i]
        chosen: list[RunningAllocation] = []
        ok = self.ok
        for r, n in self.newest.get(i, ()):
            if have >= k:
                break
            if ok[r.id] and r.job != exclude:
                chosen.append(r)
                have += n
        return chosen if have >= k else None

    def _costs(self, i: int, ks: list[int]) -> dict[int, tuple[int, int]]:
        """What evictions on agent `i` make room for each of `ks` (ascending) costs — (victims, their
        slots), the policy's eligible work newest first — where evictions are needed and make room:
        one walk of the agent's work for all of them."""
        pool = self.pool
        have = pool.nfree[i] + pool.soon[i]
        ks = [k for k in ks if have < k <= pool.total[i] - pool.reserved[i]]
        out: dict[int, tuple[int, int]] = {}
        if not ks:
            return out
        ok = self.ok
        c = slots = 0
        for r, n in self.newest.get(i, ()):
            if ok[r.id]:
                c, slots, have = c + 1, slots + r.slots, have + n
                while ks and have >= ks[0]:
                    out[ks.pop(0)] = (c, slots)
                if not ks:
                    break
        return out

    def _cost(self, i: int, k: int, exclude: str | None) -> tuple[int, int] | None:
        chosen = self._walk(i, k, exclude)
        if not chosen:  # None, or no eviction needed (the no-eviction heap has it)
            return None
        return len(chosen), sum(r.slots for r in chosen)

    def _valid_top(self, h: list, at: int) -> tuple | None:
        while h and h[0][-1] != self.stamp[h[0][at]]:
            heapq.heappop(h)
        return h[0] if h else None

    def _excluded_agents(self, exclude: str | None) -> set[int]:
        """The agents whose entries may be wrong for a requester of job `exclude`: those with work of
        that job that could yield (elsewhere the job's work could not yield anyway)."""
        if exclude is None:
            return set()
        ok = self.ok
        return {a for r in self.by_job.get(exclude, ()) if ok[r.id] for a in self.agents_of[r.id]}

    # -- queries
    def on_one(self, k: int, exclude: str | None = None) -> tuple[int, list[RunningAllocation]] | None:
        """The agent a gang of `k` slots (at most an agent's) gets by preemption, and its victims."""
        self._refresh()
        first: tuple[int, int, int] | None = None
        for z in range(k, self.pool.m + 1):
            top = self._valid_top(self.zero[z], 1)
            if top is not None and (first is None or top < first):
                first = top
        if first is not None:
            return first[1], []
        h = self.costs.get(k)
        if h is None:
            h = self.costs[k] = []
            for i in self.rank:
                got = self._costs(i, [k]).get(k)
                if got is not None:
                    h.append((*got, i, self.stamp[i]))
            heapq.heapify(h)
        skip = self._excluded_agents(exclude)
        aside: list[tuple[int, int, int, int]] = []
        best: tuple[int, int, int] | None = None
        while (top := self._valid_top(h, 2)) is not None:
            if top[2] not in skip:
                best = top[:3]
                break
            aside.append(heapq.heappop(h))
        for e in aside:
            heapq.heappush(h, e)
        for i in skip:
            if i in self.rank and (got := self._cost(i, k, exclude)) is not None and (best is None or (*got, i) < best):
                best = (*got, i)
        if best is None:
            return None
        return best[2], self._walk(best[2], k, exclude) or []

    def on_whole(self, t: int, n: int, exclude: str | None = None) -> tuple[list[int], list[RunningAllocation]] | None:
        """`n` unreserved agents of `t` slots all of whose live work may yield (the least first), and
        that work in the scan's order; None when fewer than `n` qualify."""
        self._refresh()
        h = self.whole.get(t)
        if h is None:
            h = self.whole[t] = []
            for i in range(len(self.pool.ids)):
                if self.pool.total[i] == t:
                    self._push_whole(h, i)
        skip = self._excluded_agents(exclude)
        popped: list[tuple[int, int, int]] = []
        chosen: list[int] = []
        while len(chosen) < n and (top := self._valid_top(h, 1)) is not None:
            popped.append(heapq.heappop(h))
            if top[1] not in skip:
                chosen.append(top[1])
        for e in popped:
            heapq.heappush(h, e)
        if len(chosen) < n:
            return None
        victims: dict[str, RunningAllocation] = {}
        for i in chosen:
            victims.update((r.id, r) for r in self.pool.running_on.get(i, ())
                           if not r.stopping and r.id not in self.pool.victims)
        return chosen, list(victims.values())
