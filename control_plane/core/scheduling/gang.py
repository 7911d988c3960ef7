"""Gang placement over a pool's agents: the shared machinery of the policies (pure).

An allocation starts only when all its slots are available. It goes on one agent when one can
host it; otherwise across agents in equal parts of whole agents (`slots` a multiple of the agents'
slot count, as in Determined: a part is a whole agent of that size), never partially.

`PoolState` keeps, per schedulable agent: its slots `total`, its `free` slot ids, `reserved`
(slots promised this pass to waiting allocations ahead in the queue) and `backfilled` (slots placed
there this pass after its first reservation: work behind a reservation). Work placed behind a
reservation may run long, so all of it together must leave the reserved slots to free up once the
work that ran before and the work placed ahead ends: what may be placed on an agent now is
`cap = max(0, min(free, total - reserved - backfilled))` (not `total - reserved` again for each
allocation that backfills); what may still be reserved is `room = total - reserved`. Agents sit in
buckets by (cap, room) and, while unreserved, by (total, free), so each decision costs a scan over
slot counts (a handful), not over agents. Within a pass cap and room only shrink (nothing is freed or
unreserved), so a gang size that failed to be placed or reserved fails at once for the rest of it.
Preemption asks the index of preemptible work (preemption.py), not every agent."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from control_plane.core.scheduling.policy import AgentSlots, Fitting, Part, RunningAllocation
from control_plane.core.scheduling.preemption import PreemptibleWork


def whole_agent_parts(slots: int, agent_slots: int) -> int | None:
    """How many whole agents of `agent_slots` slots a gang of `slots` spans (1 when it fits on one),
    or None when it cannot be split into equal whole agents."""
    if agent_slots <= 0:
        return None
    if slots <= agent_slots:
        return 1
    return slots // agent_slots if slots % agent_slots == 0 else None


def shapes(slots: int, sizes: dict[int, int]) -> list[tuple[int, int]]:
    """The shapes (part slots, parts) a gang of `slots` can take on agents whose sizes are counted in
    `sizes` (slots per agent -> agents): one agent when any is large enough, else whole agents of one
    size, the fewest agents first."""
    if any(t >= slots for t in sizes):
        return [(slots, 1)]
    out = [(t, slots // t) for t in sorted(sizes, reverse=True)
           if t > 0 and slots % t == 0 and sizes[t] >= slots // t]
    return out


def unschedulable_reason(slots: int, sizes: dict[int, int]) -> str:
    if not sizes:
        return "unschedulable: the pool has no schedulable agents"
    largest = max(sizes)
    return (f"unschedulable: needs {slots} slots; the largest schedulable agent has {largest}, and a gang "
            f"across agents needs whole agents of equal size (agents: "
            + ", ".join(f"{n}x{t} slots" for t, n in sorted(sizes.items(), reverse=True)) + ")")


class PoolState:
    def __init__(self, agents: Sequence[AgentSlots], running: Sequence[RunningAllocation]) -> None:
        ags = sorted((a for a in agents if a.schedulable), key=lambda a: a.agent_id)
        self.ids = [a.agent_id for a in ags]
        self.index = {a: i for i, a in enumerate(self.ids)}
        self.total = [len(a.slot_ids) for a in ags]
        self.free = [[s for s in a.slot_ids if s not in a.used_slot_ids] for a in ags]
        self.nfree = [len(f) for f in self.free]
        self.reserved = [0] * len(ags)
        self.backfilled = [0] * len(ags)  # slots placed since the agent's first reservation this pass
        self.sizes: dict[int, int] = {}
        for t in self.total:
            self.sizes[t] = self.sizes.get(t, 0) + 1
        self.m = max(self.total, default=0)
        w = self.m + 1
        self.w = w
        self.by_cr: list[dict[int, None]] = [{} for _ in range(w * w)]
        self.cnt_c = [0] * w
        self.cnt_r = [0] * w
        self.unres: dict[tuple[int, int], dict[int, None]] = {}
        self.cnt_f = [0] * w
        self.reserved_priorities: tuple[int, int] | None = None  # (best, worst) of reservations
        self._shapes: dict[int, list[tuple[int, int]]] = {}
        # Gangs that failed to be placed / reserved this pass: they fail for the rest of it, as placeable
        # and reservable slots only shrink within a pass (nothing is freed, nothing unreserved).
        self.unplaceable: set[int] = set()
        self.unreservable: set[int] = set()
        self.preemptible: PreemptibleWork | None = None  # the index of preemptible work, once asked for
        for i in range(len(ags)):
            self._add(i)
        # Running work per agent (for preemption) and slots about to free up (stopping allocations).
        self.running_on: dict[int, list[RunningAllocation]] = {}
        self.soon = [0] * len(ags)
        self.victims: set[str] = set()
        self.running = running
        for r in running:
            for p in r.parts:
                i = self.index.get(p.agent_id)
                if i is None:
                    continue
                self.running_on.setdefault(i, []).append(r)
                if r.stopping:
                    self.soon[i] += len(p.slot_ids)

    # -- index upkeep
    def _key(self, i: int) -> tuple[int, int]:
        room = self.total[i] - self.reserved[i]
        return max(0, min(self.nfree[i], room - self.backfilled[i])), room

    def _add(self, i: int) -> None:
        c, r = self._key(i)
        self.by_cr[c * self.w + r][i] = None
        self.cnt_c[c] += 1
        self.cnt_r[r] += 1
        self.cnt_f[self.nfree[i]] += 1
        if self.reserved[i] == 0:
            self.unres.setdefault((self.total[i], self.nfree[i]), {})[i] = None

    def _remove(self, i: int) -> None:
        c, r = self._key(i)
        del self.by_cr[c * self.w + r][i]
        self.cnt_c[c] -= 1
        self.cnt_r[r] -= 1
        self.cnt_f[self.nfree[i]] -= 1
        if self.reserved[i] == 0:
            del self.unres[(self.total[i], self.nfree[i])][i]

    def max_cap(self) -> int:
        for c in range(self.m, -1, -1):
            if self.cnt_c[c]:
                return c
        return 0

    def max_free(self) -> int:
        for c in range(self.m, -1, -1):
            if self.cnt_f[c]:
                return c
        return 0

    def max_room(self) -> int:
        for r in range(self.m, -1, -1):
            if self.cnt_r[r]:
                return r
        return 0

    def whole_free(self, slots: int) -> int:
        sh = self.shapes(slots)
        return len(self.unres.get((sh[0][0], sh[0][0]), ())) if sh else 0

    def shapes(self, slots: int) -> list[tuple[int, int]]:
        got = self._shapes.get(slots)
        if got is None:
            got = self._shapes[slots] = shapes(slots, self.sizes)
        return got

    # -- placing
    def take(self, i: int, k: int) -> Part:
        self._remove(i)
        ids = self.free[i]
        taken, self.free[i] = tuple(ids[:k]), ids[k:]
        self.nfree[i] -= k
        if self.reserved[i]:  # behind a reservation: it holds these slots however long it runs
            self.backfilled[i] += k
        self._add(i)
        if self.preemptible is not None:
            self.preemptible.changed(i)
        return Part(self.ids[i], taken)

    def reserve(self, i: int, k: int, priority: int) -> None:
        self._remove(i)
        self.reserved[i] += k
        rp = self.reserved_priorities
        self.reserved_priorities = (priority, priority) if rp is None else (min(rp[0], priority), max(rp[1], priority))
        self._add(i)
        if self.preemptible is not None:
            self.preemptible.changed(i)

    def find_one(self, k: int, fitting: Fitting) -> int | None:
        """An agent whose placeable slots hold `k`: best fit (fewest that hold it) or worst (most)."""
        if k > self.m:
            return None
        w, by, cnt = self.w, self.by_cr, self.cnt_c
        cs = range(k, self.m + 1) if fitting == "best" else range(self.m, k - 1, -1)
        for c in cs:
            if cnt[c]:
                for r in range(c, self.m + 1):
                    b = by[c * w + r]
                    if b:
                        return next(iter(b))
        return None

    def find_whole(self, t: int, n: int) -> list[int] | None:
        """`n` wholly free, unreserved agents of `t` slots."""
        b = self.unres.get((t, t))
        if not b or len(b) < n:
            return None
        it = iter(b)
        return [next(it) for _ in range(n)]

    def place(self, slots: int, fitting: Fitting) -> tuple[Part, ...] | None:
        """Place a gang now, whole: on one agent when one holds it, else on whole agents."""
        if slots <= 0:
            return ()
        if slots in self.unplaceable:
            return None
        i = self.find_one(slots, fitting)
        if i is not None:
            return (self.take(i, slots),)
        if slots > self.m:
            for t, n in self.shapes(slots):
                agents = self.find_whole(t, n)
                if agents is not None:
                    return tuple(self.take(a, t) for a in agents)
        self.unplaceable.add(slots)
        return None

    # -- reserving (the head of the queue keeps the slots it waits for)
    def reserve_for(self, slots: int, priority: int) -> list[int] | None:
        """Reserve, for a gang that cannot start now, the agents closest to holding it (the most
        placeable slots: nothing else goes there, so they stay the closest until it starts)."""
        if slots in self.unreservable:
            return None
        got = self._reserve_for(slots, priority)
        if got is None:
            self.unreservable.add(slots)
        return got

    def _reserve_for(self, slots: int, priority: int) -> list[int] | None:
        if slots <= self.m:
            if not any(self.cnt_r[r] for r in range(slots, self.m + 1)):
                return None
            w, by = self.w, self.by_cr
            for c in range(self.m, -1, -1):
                if self.cnt_c[c]:
                    for r in range(max(c, slots), self.m + 1):
                        b = by[c * w + r]
                        if b:
                            i = next(iter(b))
                            self.reserve(i, slots, priority)
                            return [i]
            return None
        for t, n in self.shapes(slots):
            chosen: list[int] = []
            for f in range(t, -1, -1):
                b = self.unres.get((t, f))
                if b:
                    it = iter(b)
                    while len(chosen) < n:
                        i = next(it, None)
                        if i is None:
                            break
                        chosen.append(i)
                if len(chosen) == n:
                    for i in chosen:
                        self.reserve(i, t, priority)
                    return chosen
        return None

    def blocked_by_reservation(self, slots: int) -> tuple[int, int] | None:
        """When `slots` would fit in free slots but reservations hold them: the best and worst
        priority of the reservations made so far (all for allocations ahead in the queue)."""
        if not self.reserved_priorities or slots > self.max_free():
            return None
        return self.reserved_priorities

    # -- preempting
    def track_preemptible(self, eligible: Callable[[RunningAllocation], bool]) -> PreemptibleWork:
        """Start the index of preemptible work (preemption.py) with the policy's `eligible`; the policy
        names the allocations whose eligibility may have changed since (`preemptible.recheck`)."""
        if self.preemptible is None:
            self.preemptible = PreemptibleWork(self, self.running, eligible)
        return self.preemptible

    def preempt_for(self, slots: int, priority: int, exclude_job: str | None = None,
                    ) -> tuple[list[int], list[RunningAllocation]] | None:
        """The agents a gang could have once the fewest eligible running allocations stop (newest
        first, only as many as needed; slots of allocations already stopping count as coming free),
        and those victims; None when no eviction makes room. The agents are reserved for it.
        Eligible: as `track_preemptible` was told, and not of `exclude_job`."""
        index = self.preemptible
        assert index is not None, "track_preemptible first"
        if slots <= self.m:
            got = index.on_one(slots, exclude_job)
            if got is None:
                return None
            self._evict(got[1])
            self.reserve(got[0], slots, priority)
            return [got[0]], got[1]
        for t, n in self.shapes(slots):
            whole = index.on_whole(t, n, exclude_job)
            if whole is not None:
                agents, victims = whole
                self._evict(victims)
                for i in agents:
                    self.reserve(i, t, priority)
                return agents, victims
        return None

    def _evict(self, victims: Iterable[RunningAllocation]) -> None:
        for r in victims:
            self.victims.add(r.id)
            if self.preemptible is not None:
                self.preemptible.evicted(r)
            for p in r.parts:
                i = self.index.get(p.agent_id)
                if i is not None:
                    self.soon[i] += len(p.slot_ids)

    def waiting_reason(self, slots: int, at_most: int | None = None, whole: int | None = None) -> str:
        """Why a gang that can take a shape waits for it; `at_most` / `whole`: the pool's most placeable
        slots on one agent / wholly free agents of the shape's size, as they were (default: now)."""
        n = len(self.ids)
        if slots <= self.m:
            cap = self.max_cap() if at_most is None else at_most
            return (f"waiting for {slots} slot{'s' if slots != 1 else ''} on one agent; {n} agent"
                    f"{'s have' if n != 1 else ' has'} at most {cap} free")
        t, parts = self.shapes(slots)[0]
        if whole is None:
            whole = self.whole_free(slots)
        return (f"waiting for {parts} whole agents of {t} slots ({slots} slots); {whole} "
                f"{'is' if whole == 1 else 'are'} free")
