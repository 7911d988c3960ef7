from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as hs

from control_plane.core.scheduling.priority import AgentSlots, PendingAllocation, RunningAllocation, schedule


def agents(*sizes: int, used: dict[str, set[str]] | None = None) -> list[AgentSlots]:
    used = used or {}
    return [AgentSlots(f"a{i}", tuple(str(j) for j in range(n)), frozenset(used.get(f"a{i}", set())))
            for i, n in enumerate(sizes)]


def test_places_whole_never_partially() -> None:
    d = schedule([PendingAllocation("big", 4)], [], agents(2, 2))
    assert d.assignments == () and d.unplaced == ("big",)
    assert "largest agent has 2" in d.reasons["big"]


def test_priority_then_submission_order() -> None:
    pending = [PendingAllocation("late-high", 2, priority=10, order=5), PendingAllocation("early-low", 2, priority=50, order=1),
               PendingAllocation("early-high", 2, priority=10, order=1)]
    d = schedule(pending, [], agents(4), preemption=False)
    assert [a.allocation_id for a in d.assignments] == ["early-high", "late-high"]
    assert d.unplaced == ("early-low",)


def test_best_fit_keeps_big_holes() -> None:
    d = schedule([PendingAllocation("one", 1), PendingAllocation("four", 4)], [], agents(4, 1))
    placed = {a.allocation_id: a.agent_id for a in d.assignments}
    assert placed == {"one": "a1", "four": "a0"}


def test_backfill_small_behind_unfittable() -> None:
    d = schedule([PendingAllocation("huge", 8, order=0), PendingAllocation("small", 1, order=1)], [], agents(2))
    assert [a.allocation_id for a in d.assignments] == ["small"]


def test_preempts_fewest_lower_priority() -> None:
    running = [RunningAllocation("low1", "a0", ("0",), priority=60), RunningAllocation("low2", "a0", ("1",), priority=60),
               RunningAllocation("low3", "a1", ("0", "1"), priority=60)]
    d = schedule([PendingAllocation("high", 2, priority=10)], running,
                 agents(2, 2, used={"a0": {"0", "1"}, "a1": {"0", "1"}}))
    assert d.preemptions == ("low3",)
    # never preempts equal or higher priority
    d2 = schedule([PendingAllocation("same", 2, priority=60)], running,
                  agents(2, 2, used={"a0": {"0", "1"}, "a1": {"0", "1"}}))
    assert d2.preemptions == ()
    # no extra evictions while an earlier victim is still stopping
    stopping = [RunningAllocation(r.id, r.agent_id, r.slot_ids, r.priority, stopping=r.id == "low3") for r in running]
    d3 = schedule([PendingAllocation("high", 2, priority=10)], stopping,
                  agents(2, 2, used={"a0": {"0", "1"}, "a1": {"0", "1"}}))
    assert d3.preemptions == ()
    assert schedule([PendingAllocation("high", 2, priority=10)], running,
                    agents(2, 2, used={"a0": {"0", "1"}, "a1": {"0", "1"}}), preemption=False).preemptions == ()


def test_unschedulable_agents_are_skipped() -> None:
    ag = [AgentSlots("gone", ("0", "1"), schedulable=False)]
    assert schedule([PendingAllocation("x", 1)], [], ag).assignments == ()


@settings(max_examples=200, deadline=None)
@given(
    sizes=hs.lists(hs.integers(0, 8), min_size=0, max_size=6),
    demands=hs.lists(hs.tuples(hs.integers(0, 9), hs.integers(1, 99)), max_size=30),
)
def test_no_slot_is_double_booked_and_gangs_stay_whole(sizes: list[int], demands: list[tuple[int, int]]) -> None:
    ags = agents(*sizes)
    pending = [PendingAllocation(f"p{i}", slots, prio, i) for i, (slots, prio) in enumerate(demands)]
    d = schedule(pending, [], ags)
    seen: set[tuple[str, str]] = set()
    want = {p.id: p.slots for p in pending}
    for a in d.assignments:
        assert len(a.slot_ids) == want[a.allocation_id]
        for sl in a.slot_ids:
            assert (a.agent_id, sl) not in seen
            seen.add((a.agent_id, sl))
    assert {a.allocation_id for a in d.assignments} | set(d.unplaced) == set(want)
    # anything left unplaced really did not fit in what remained
    free = {ag.agent_id: len(ag.slot_ids) for ag in ags}
    for a in d.assignments:
        free[a.agent_id] -= len(a.slot_ids)
    for pid in d.unplaced:
        assert all(f < want[pid] for f in free.values())
