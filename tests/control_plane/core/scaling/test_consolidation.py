"""The consolidation core: which instance to empty, under the disruption budget, decided by the
scheduling policy's own placement over the pool without it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from control_plane.core.scaling.consolidation import (
    DOLLARS,
    SLOTS,
    Budget,
    InstanceSlots,
    decide,
    moves_left,
)
from control_plane.core.scaling.model import InstanceOption
from control_plane.core.scheduling import AgentSlots, Part, PendingAllocation, RunningAllocation
from shipyard_common.consolidation_settings import DEFAULT_MAX_MOVES_PER_HOUR, DEFAULT_MIN_RUN_TIME

NOW = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
LONG_AGO = (NOW - timedelta(hours=2)).timestamp()
BUDGET = Budget(max_moves_per_hour=2, min_run_time=timedelta(minutes=30))


def inst(name: str, slots: int, used: int = 0, price: float | None = None, schedulable: bool = True) -> InstanceSlots:
    ids = tuple(f"{name}-{i}" for i in range(slots))
    return InstanceSlots(name, AgentSlots(f"agent-{name}", ids, frozenset(ids[:used]), schedulable), price)


def run(alloc: str, on: InstanceSlots, n: int, first: int = 0, **kw: object) -> RunningAllocation:
    kw.setdefault("order", LONG_AGO)
    return RunningAllocation.on(alloc, on.agent.agent_id, on.agent.slot_ids[first:first + n], **kw)


def test_two_half_used_instances_become_one() -> None:
    a, b = inst("a", 8, used=4), inst("b", 8, used=4)
    running = [run("t1", a, 4), run("t2", b, 4)]
    d = decide([a, b], running, [], BUDGET, [], NOW)
    assert d.plan is not None
    assert d.plan.instance == "a"  # equal savings: the first by id
    assert d.plan.allocations == ("t1",) and d.plan.destinations == {"t1": ("agent-b",)}
    assert d.plan.unit == SLOTS and d.plan.saving == 8
    assert "saves 8 slot-hours per hour" in d.plan.reason


def test_work_never_moves_onto_an_idle_instance() -> None:
    a, idle = inst("a", 8, used=4), inst("b", 8)
    d = decide([a, idle], [run("t1", a, 4)], [], BUDGET, [], NOW)
    assert d.plan is None and "does not fit on the other instances' free slots" in dict(d.refused)["a"]


def test_the_instance_whose_removal_saves_most_is_emptied() -> None:
    a, b, c = inst("a", 8, used=2, price=1.0), inst("b", 8, used=2, price=3.0), inst("c", 8, used=2, price=2.0)
    running = [run("t1", a, 2), run("t2", b, 2), run("t3", c, 2)]
    d = decide([a, b, c], running, [], BUDGET, [], NOW)
    assert d.plan is not None and d.plan.instance == "b"
    assert (d.plan.saving, d.plan.unit) == (3.0, DOLLARS) and "$3.00/h" in d.plan.reason


def test_work_that_does_not_fit_elsewhere_is_not_moved() -> None:
    a, b = inst("a", 8, used=6), inst("b", 8, used=6)
    d = decide([a, b], [run("t1", a, 6), run("t2", b, 6)], [], BUDGET, [], NOW)
    assert d.plan is None
    assert dict(d.refused)["a"].startswith("allocation t1 (6 slots) does not fit on the other instances' free slots")


def test_non_preemptible_work_is_never_moved() -> None:
    a, b = inst("a", 8, used=2), inst("b", 8, used=2)
    d = decide([a, b], [run("t1", a, 2, preemptible=False), run("t2", b, 2, preemptible=False)], [], BUDGET, [], NOW)
    assert d.plan is None and dict(d.refused) == {"a": "allocation t1 is not preemptible",
                                                   "b": "allocation t2 is not preemptible"}


def test_min_run_time_since_start_or_last_move() -> None:
    a, b = inst("a", 8, used=2), inst("b", 8, used=2)
    recent = (NOW - timedelta(minutes=10)).timestamp()
    d = decide([a, b], [run("t1", a, 2, order=recent), run("t2", b, 2)], [], BUDGET, [], NOW)
    assert d.plan is not None and d.plan.instance == "b"  # t1 resumed 10 minutes ago: it stays
    assert dict(d.refused)["a"] == "allocation t1 has run 600s since it started or last moved (min_run_time 1800s)"


def test_the_budget_of_moves_per_hour() -> None:
    a, b = inst("a", 8, used=2), inst("b", 8, used=2)
    running = [run("t1", a, 1), run("t1b", a, 1, first=1), run("t2", b, 2)]
    moved = [NOW - timedelta(minutes=50)]  # one move in the last hour: one left
    d = decide([a, b], running, [], BUDGET, moved, NOW)
    assert d.plan is not None and d.plan.instance == "b"
    assert "exceeds the 1 move left this hour (max_moves_per_hour 2)" in dict(d.refused)["a"]
    # Two in the last hour: none left; one older than an hour no longer counts.
    d = decide([a, b], running, [], BUDGET, [NOW - timedelta(minutes=5), NOW - timedelta(minutes=1)], NOW)
    assert d.plan is None and "0 moves left this hour" in d.reason
    assert moves_left(BUDGET, [NOW - timedelta(minutes=61), NOW - timedelta(minutes=1)], NOW) == 1


def test_waiting_work_of_higher_priority_keeps_the_slots() -> None:
    a, b = inst("a", 8, used=4), inst("b", 8, used=4)
    running = [run("t1", a, 4, priority=50), run("t2", b, 4, priority=50)]
    urgent = PendingAllocation("p", 8, priority=10, order=NOW.timestamp())  # fits on no agent now
    d = decide([a, b], running, [urgent], BUDGET, [], NOW)
    assert d.plan is None and "pending allocation p (priority 10) waits" in dict(d.refused)["a"]
    # Lower-priority waiting work does not hold the move back.
    d = decide([a, b], running, [PendingAllocation("p", 8, priority=90)], BUDGET, [], NOW)
    assert d.plan is not None


def test_moved_work_never_takes_slots_pending_work_is_placed_on() -> None:
    a, b = inst("a", 8, used=4), inst("b", 8, used=4)
    running = [run("t1", a, 4, priority=30), run("t2", b, 4, priority=30)]
    # A pending allocation the pool places now, on the 4 free slots of a or b: either move would take them.
    pending = [PendingAllocation("p", 4, priority=60)]
    d = decide([a, b], running, pending, BUDGET, [], NOW)
    assert d.plan is None
    assert dict(d.refused) == {i: "moving its work would keep pending allocation p from being placed" for i in "ab"}
    # With a third instance holding room for both, the move goes ahead.
    c = inst("c", 8, used=4)
    d = decide([a, b, c], [*running, run("t3", c, 4, priority=30)], pending, BUDGET, [], NOW)
    assert d.plan is not None


def test_min_instances_and_cordoned_instances() -> None:
    a, b = inst("a", 8, used=2), inst("b", 8, used=2)
    running = [run("t1", a, 2), run("t2", b, 2)]
    assert decide([a, b], running, [], Budget(2, timedelta(0), min_instances=2), [], NOW).reason == \
        "the pool keeps min_instances 2"
    # A cordoned (unschedulable) instance is neither emptied again nor a destination.
    c = inst("c", 8, used=2, schedulable=False)
    d = decide([a, c], [run("t1", a, 2), run("t3", c, 2)], [], BUDGET, [], NOW)
    assert d.plan is None and "does not fit" in dict(d.refused)["a"]


def test_a_gang_across_instances_moves_whole() -> None:
    a, b, c = inst("a", 4, used=4), inst("b", 4, used=4), inst("c", 16, used=2)
    gang = RunningAllocation("g", (run("x", a, 4).parts[0], run("y", b, 4).parts[0]), order=LONG_AGO)
    d = decide([a, b, c], [gang, run("t3", c, 2)], [], BUDGET, [], NOW)
    assert d.plan is not None and d.plan.allocations == ("g",)
    assert d.plan.destinations == {"g": ("agent-c",)}


# -- properties -----------------------------------------------------------------------------------

@st.composite
def pools(draw: st.DrawFn) -> tuple[list[InstanceSlots], list[RunningAllocation], list[PendingAllocation],
                                     list[datetime], Budget]:
    n = draw(st.integers(2, 5))
    instances: list[InstanceSlots] = []
    running: list[RunningAllocation] = []
    for i in range(n):
        size = draw(st.sampled_from([1, 2, 4, 8]))
        used = 0
        name = f"i{i}"
        shell = inst(name, size, price=draw(st.none() | st.floats(0.1, 10)))
        for k in range(draw(st.integers(0, 3))):
            want = draw(st.integers(1, max(1, size // 2)))
            if used + want > size:
                break
            running.append(run(f"{name}-r{k}", shell, want, first=used,
                               priority=draw(st.integers(1, 99)), preemptible=draw(st.integers(0, 5)) > 0,
                               order=(NOW - timedelta(minutes=draw(st.integers(0, 120)))).timestamp()))
            used += want
        instances.append(inst(name, size, used=used, price=shell.price_per_hour,
                              schedulable=draw(st.integers(0, 5)) > 0 or i == 0))
    pending = [PendingAllocation(f"p{k}", draw(st.integers(1, 8)), priority=draw(st.integers(1, 99)))
               for k in range(draw(st.sampled_from([0, 0, 0, 1, 2])))]
    recent = [NOW - timedelta(minutes=draw(st.integers(0, 90))) for _ in range(draw(st.integers(0, 4)))]
    budget = Budget(draw(st.integers(0, 4)), timedelta(minutes=draw(st.sampled_from([0, 15, 30]))))
    return instances, running, pending, recent, budget


@settings(max_examples=300, deadline=None)
@given(pools())
def test_a_plan_respects_the_budget_and_places_validly(case: tuple) -> None:
    instances, running, pending, recent, budget = case
    d = decide(instances, running, pending, budget, recent, NOW)
    if d.plan is None:
        return
    plan = d.plan
    by_id = {r.id: r for r in running}
    moved = [by_id[a] for a in plan.allocations]
    # The budget: no more moves this hour than allowed, none before min_run_time, never non-preemptible.
    assert len(moved) <= moves_left(budget, recent, NOW)
    assert all(r.preemptible and not r.stopping for r in moved)
    assert all(NOW.timestamp() - r.order >= budget.min_run_time.total_seconds() for r in moved)
    # All of the instance's work moves, and lands on other schedulable agents' free slots, within capacity.
    emptied = next(i for i in instances if i.id == plan.instance)
    assert emptied.agent.schedulable
    assert {r.id for r in running if any(p.agent_id == emptied.agent.agent_id for p in r.parts)} == set(plan.allocations)
    agents = {i.agent.agent_id: i.agent for i in instances}
    room = {a: len(s.slot_ids) - len(s.used_slot_ids) for a, s in agents.items()}
    busy = {p.agent_id for r in running if r.id not in plan.allocations for p in r.parts}
    for r in moved:
        dest = plan.destinations[r.id]
        assert dest and emptied.agent.agent_id not in dest and all(agents[a].schedulable for a in dest)
        assert set(dest) <= busy  # never onto an idle instance
        for a in dest:
            room[a] -= r.slots // len(dest)
    assert all(v >= 0 for v in room.values())
    # No waiting allocation at least as important as the moved work.
    assert plan.unit in (DOLLARS, SLOTS) and plan.saving > 0


@pytest.mark.parametrize("bad", [Budget(0, timedelta(0))])
def test_a_zero_budget_moves_nothing(bad: Budget) -> None:
    a, b = inst("a", 8, used=1), inst("b", 8, used=1)
    d = decide([a, b], [run("t1", a, 1), run("t2", b, 1)], [], bad, [], NOW)
    assert d.plan is None and all("0 moves left" in why for _, why in d.refused)


def test_the_default_budget_empties_an_instance_running_several_trials() -> None:
    """The pool default (shipyard_common/consolidation_settings.py) moves the four 1-slot trials of
    a half-used instance onto another (whose own trial may not move); the old default of 2 moves an
    hour could not, which is what kept provisioned/used at 1.26-1.29 in benchmarks/elastic_trace.py."""
    a, b = inst("a", 8, used=4), inst("b", 8, used=4)
    running = [*(run(f"t{k}", a, 1, first=k) for k in range(4)), run("big", b, 4, first=0, preemptible=False)]
    d = decide([a, b], running, [], Budget(DEFAULT_MAX_MOVES_PER_HOUR, DEFAULT_MIN_RUN_TIME), [], NOW)
    assert d.plan is not None and d.plan.instance == "a" and len(d.plan.allocations) == 4
    old = decide([a, b], running, [], Budget(2, DEFAULT_MIN_RUN_TIME), [], NOW)
    assert old.plan is None and "exceeds the 2 moves left this hour" in dict(old.refused)["a"]


# ---- replacement by a cheaper option ----------------------------------------------------------------

ONE, FOUR, EIGHT = (InstanceOption(f"a2-highgpu-{n}g", n, 3.67 * n) for n in (1, 4, 8))


def test_an_instance_whose_work_fits_a_cheaper_option_is_replaced() -> None:
    a = inst("a", 8, used=3, price=EIGHT.usd_per_hour)
    d = decide([a], [run("t1", a, 2), run("t2", a, 1, first=2)], [], BUDGET, [], NOW, options=(ONE, FOUR, EIGHT))
    assert d.plan is not None and d.plan.replacement == FOUR  # the cheapest that holds 3 slots
    assert d.plan.instance == "a" and d.plan.allocations == ("t1", "t2") and d.plan.unit == DOLLARS
    assert d.plan.saving == pytest.approx(3.67 * 4)
    assert d.plan.reason.startswith("replacing: 2 allocations (3 slots) of instance a (8 slots) fit one a2-highgpu-4g")


def test_emptying_onto_others_comes_before_a_replacement_and_the_budget_holds_both() -> None:
    a, b = inst("a", 8, used=2, price=EIGHT.usd_per_hour), inst("b", 8, used=4, price=EIGHT.usd_per_hour)
    d = decide([a, b], [run("t1", a, 2), run("t2", b, 4)], [], BUDGET, [], NOW, options=(ONE, FOUR, EIGHT))
    assert d.plan is not None and d.plan.replacement is None and d.plan.instance == "a"  # fits on b
    young = (NOW - timedelta(minutes=5)).timestamp()
    d = decide([a], [run("t1", a, 2, order=young)], [], BUDGET, [], NOW, options=(ONE, FOUR, EIGHT))
    assert d.plan is None and "min_run_time" in dict(d.refused)["a"]
    d = decide([a], [run("t1", a, 2, preemptible=False)], [], BUDGET, [], NOW, options=(ONE, FOUR, EIGHT))
    assert d.plan is None


def test_no_replacement_without_a_cheaper_option_for_a_gang_or_where_pending_work_goes() -> None:
    a = inst("a", 4, used=3, price=FOUR.usd_per_hour)
    assert decide([a], [run("t1", a, 3)], [], BUDGET, [], NOW, options=(ONE, FOUR)).plan is None  # none cheaper fits
    b, c = inst("b", 8, used=1, price=EIGHT.usd_per_hour), inst("c", 8, used=8, price=EIGHT.usd_per_hour)
    c = inst("c", 8, used=1, price=EIGHT.usd_per_hour)  # a 2-slot gang, one slot on each: either fits a 1g alone
    gang = RunningAllocation("g", (Part("agent-b", ("b-0",)), Part("agent-c", ("c-0",))), order=LONG_AGO)
    assert decide([b, c], [gang], [], BUDGET, [], NOW, options=(ONE, FOUR, EIGHT)).plan is None
    d = inst("d", 8, used=1, price=EIGHT.usd_per_hour)
    waiting = [PendingAllocation("p1", 4, order=LONG_AGO)]  # placed today on d's free slots
    assert decide([d], [run("t1", d, 1)], waiting, BUDGET, [], NOW, options=(ONE, FOUR, EIGHT)).plan is None
    unpriced = inst("e", 8, used=1)
    assert decide([unpriced], [run("t1", unpriced, 1)], [], BUDGET, [], NOW, options=(ONE, FOUR)).plan is None


def test_a_replacement_keeps_the_instance_count_so_min_instances_allows_it_and_a_cooling_one_is_skipped() -> None:
    a = inst("a", 8, used=1, price=EIGHT.usd_per_hour)
    at_min = Budget(2, timedelta(minutes=30), min_instances=1)
    d = decide([a], [run("t1", a, 1)], [], at_min, [], NOW, options=(ONE, FOUR, EIGHT))
    assert d.plan is not None and d.plan.replacement == ONE
    assert decide([a], [run("t1", a, 1)], [], at_min, [], NOW).reason == "the pool keeps min_instances 1"
    d = decide([a], [run("t1", a, 1)], [], at_min, [], NOW, options=(ONE, FOUR, EIGHT), not_replaced={"a"})
    assert d.plan is None and "min_instances 1" in d.reason
    b = inst("b", 8, used=2, price=EIGHT.usd_per_hour)
    d = decide([a, b], [run("t1", a, 1), run("t2", b, 2)], [], BUDGET, [], NOW, options=(ONE, FOUR, EIGHT),
               not_replaced={"a", "b"})
    assert d.plan is not None and d.plan.replacement is None  # emptying onto the other is not held back
