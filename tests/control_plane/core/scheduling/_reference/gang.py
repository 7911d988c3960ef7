"""Reference copy (issue 28) of control_plane/core/scheduling/gang.py at 8c7da37, before the indexes:
`PoolState` with the methods issue 28 changed as they were — `place` and `reserve_for` without the
memory of sizes that failed, `preempt_for` scanning every agent with running work for each gang (the
rest of the class, the buckets of free and reservable slots, did not change)."""

from __future__ import annotations

from collections.abc import Callable

from control_plane.core.scheduling import gang
from control_plane.core.scheduling.gang import unschedulable_reason
from control_plane.core.scheduling.policy import Fitting, Part, RunningAllocation

__all__ = ["PoolState", "unschedulable_reason"]


class PoolState(gang.PoolState):
    def place(self, slots: int, fitting: Fitting) -> tuple[Part, ...] | None:
        """Place a gang now, whole: on one agent when one holds it, else on whole agents."""
        if slots <= 0:
            return ()
        i = self.find_one(slots, fitting)
        if i is not None:
            return (self.take(i, slots),)
        if slots <= self.m:
            return None
        for t, n in self.shapes(slots):
            agents = self.find_whole(t, n)
            if agents is not None:
                return tuple(self.take(a, t) for a in agents)
        return None

    def reserve_for(self, slots: int, priority: int) -> list[int] | None:
        """Reserve, for a gang that cannot start now, the agents closest to holding it (the most
        placeable slots: nothing else goes there, so they stay the closest until it starts)."""
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

    def preempt_for(  # type: ignore[override]
            self, slots: int, priority: int, eligible: Callable[[RunningAllocation], bool],
    ) -> tuple[list[int], list[RunningAllocation]] | None:
        """The agents a gang could have once the fewest eligible running allocations stop (newest
        first, only as many as needed; slots of allocations already stopping count as coming free),
        and those victims; None when no eviction makes room. The agents are reserved for it."""
        if slots <= self.m:
            best: tuple[tuple[int, int, int], int, list[RunningAllocation]] | None = None
            # An agent with no running work that could hold it would have taken it already.
            for i in self.running_on:
                if self.total[i] - self.reserved[i] < slots:
                    continue
                have = self.nfree[i] + self.soon[i]
                chosen: list[RunningAllocation] = []
                if have < slots:
                    cands = sorted((r for r in self.running_on.get(i, ())
                                    if not r.stopping and r.id not in self.victims and eligible(r)),
                                   key=lambda r: (-r.order, r.id))
                    for r in cands:
                        if have >= slots:
                            break
                        chosen.append(r)
                        have += sum(len(p.slot_ids) for p in r.parts if p.agent_id == self.ids[i])
                    if have < slots:
                        continue
                cost = (len(chosen), sum(r.slots for r in chosen), i)
                if best is None or cost < best[0]:
                    best = (cost, i, chosen)
                    if not chosen:
                        break
            if best is None:
                return None
            self._evict(best[2])
            self.reserve(best[1], slots, priority)
            return [best[1]], best[2]
        for t, n in self.shapes(slots):
            options: list[tuple[tuple[int, int], int, list[RunningAllocation]]] = []
            for (size, _f), b in self.unres.items():
                if size != t:
                    continue
                for i in b:
                    live = [r for r in self.running_on.get(i, ())
                            if not r.stopping and r.id not in self.victims]
                    if all(eligible(r) for r in live):
                        options.append(((len(live), i), i, live))
            if len(options) >= n:
                options.sort(key=lambda o: o[0])
                victims: dict[str, RunningAllocation] = {}
                for _, _, live in options[:n]:
                    victims.update((r.id, r) for r in live)
                self._evict(list(victims.values()))
                agents = [o[1] for o in options[:n]]
                for i in agents:
                    self.reserve(i, t, priority)
                return agents, list(victims.values())
        return None
