"""The scale decider with several instance types: the cheapest combination that fits (bin packing by
cost), capacities, gangs on whole instances of one type, instances of different sizes absorbing
demand, and fallbacks. The properties are checked against a brute force on small cases."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from control_plane.core.scaling import (
    InstanceOption,
    InstanceView,
    PendingDemand,
    PoolLimits,
    decide,
    summarize,
)
from control_plane.core.states import InstanceState

NOW = datetime(2024, 5, 1, 12, 0, 0)
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def limits(*options: InstanceOption, **kw: object) -> PoolLimits:
    return PoolLimits(kw.pop("min_instances", 0), kw.pop("max_instances", 10**6),  # type: ignore[arg-type]
                      max(o.slots for o in options), options=options, **kw)  # type: ignore[arg-type]


def fits(tasks: list[int], bins: list[int]) -> bool:
    """Whether the tasks (slot sizes) can all be placed on instances of the given slots (backtracking)."""
    tasks = sorted(tasks, reverse=True)
    free = sorted(bins, reverse=True)

    def go(i: int) -> bool:
        if i == len(tasks):
            return True
        seen = set()
        for j, f in enumerate(free):
            if f >= tasks[i] and f not in seen:
                seen.add(f)
                free[j] -= tasks[i]
                if go(i + 1):
                    return True
                free[j] += tasks[i]
        return False

    return go(0)


def brute_cheapest(tasks: list[int], options: list[InstanceOption]) -> float:
    """The cheapest multiset of instances (at most one per task) on which every task fits."""
    best = float("inf")
    for counts in itertools.product(range(len(tasks) + 1), repeat=len(options)):
        if not 0 < sum(counts) <= len(tasks):
            continue
        price = sum(n * (o.usd_per_hour or 0) for n, o in zip(counts, options, strict=True))
        if price < best and fits(tasks, [o.slots for n, o in zip(counts, options, strict=True) for _ in range(n)]):
            best = price
    return best


def launched_slots(decision) -> list[int]:  # noqa: ANN001
    return [p.option.slots for p in decision.launches for _ in range(p.count)]


# -------------------------------------------------------------------------------------- examples


def test_cheaper_per_slot_big_instance_beats_many_small() -> None:
    small, big = InstanceOption("g.1", 1, 1.0), InstanceOption("g.4", 4, 3.0)
    d = decide([PendingDemand(1, 4)], [], limits(small, big), NOW)
    assert [(p.option.instance_type, p.count) for p in d.launches] == [("g.4", 1)]
    assert d.launch == 1 and d.usd_per_hour == pytest.approx(3.0)


def test_mix_of_types_when_cheaper_than_either_alone() -> None:
    # 5 one-slot tasks: five small ($5) or two big ($6) or one big + one small ($4).
    small, big = InstanceOption("g.1", 1, 1.0), InstanceOption("g.4", 4, 3.0)
    d = decide([PendingDemand(1, 5)], [], limits(small, big), NOW)
    assert sorted((p.option.instance_type, p.count) for p in d.launches) == [("g.1", 1), ("g.4", 1)]
    assert d.usd_per_hour == pytest.approx(4.0)
    assert "cheapest fit: " in summarize(d) and "est. $4/h" in summarize(d)


def test_spot_chosen_when_cheaper_and_on_demand_is_its_fallback() -> None:
    od, spot = InstanceOption("g.4", 4, 3.0), InstanceOption("g.4", 4, 1.0, spot=True)
    d = decide([PendingDemand(4, 2)], [], limits(od, spot), NOW)
    (plan,) = d.launches
    assert plan.option == spot and plan.count == 2 and plan.fallbacks == (od,)


def test_fallbacks_are_the_next_cheapest_that_fit_the_largest_task() -> None:
    a, b, c = InstanceOption("a", 2, 1.0), InstanceOption("b", 4, 1.5), InstanceOption("c", 8, 1.2)
    d = decide([PendingDemand(3, 1)], [], limits(a, b, c), NOW)
    (plan,) = d.launches
    # a (2 slots) cannot host the 3-slot task: it is no fallback.
    assert plan.option == c and plan.fallbacks == (b,)


def test_a_type_out_of_capacity_everywhere_is_planned_around() -> None:
    small, big = InstanceOption("s", 1, 1.0), InstanceOption("b", 4, 3.0)
    # Cheapest: 1 big + 1 small. With the small type out of capacity: 2 big, not 5 small that would
    # each fail over to a big one.
    d = decide([PendingDemand(1, 5)], [], limits(small, big, out_of_capacity=frozenset({small})), NOW)
    assert [(p.option.instance_type, p.count, p.fallbacks) for p in d.launches] == [("b", 2, ())]
    # Every type out: planned as usual (the launch reports the error and the pool backs off).
    d = decide([PendingDemand(1, 5)], [], limits(small, big, out_of_capacity=frozenset({small, big})), NOW)
    assert d.usd_per_hour == pytest.approx(4.0)
    # A task only the out-of-capacity type can host: planned on it still (the launch reports it).
    d = decide([PendingDemand(4, 1)], [], limits(small, big, out_of_capacity=frozenset({big})), NOW)
    assert [(p.option.instance_type, p.count) for p in d.launches] == [("b", 1)]


def test_gang_takes_whole_instances_of_one_type() -> None:
    a, b = InstanceOption("a", 8, 10.0), InstanceOption("b", 8, 9.0)
    d = decide([PendingDemand(8, 1, instances=3)], [], limits(a, b), NOW)
    assert [(p.option.instance_type, p.count) for p in d.launches] == [("b", 3)]


def test_open_instances_absorb_by_their_own_slots() -> None:
    small, big = InstanceOption("s", 2, 1.0), InstanceOption("b", 8, 3.0)
    booting = InstanceView("i-1", InstanceState.STARTING, NOW - timedelta(minutes=1), slots=8, instance_type="b")
    d = decide([PendingDemand(2, 4)], [booting], limits(small, big), NOW)
    assert d.launch == 0 and d.launches == ()
    assert any("1 starting instance absorb 4 pending tasks" in r for r in d.reasons)


def test_unpriced_option_used_only_when_nothing_priced_fits() -> None:
    priced, unknown = InstanceOption("p", 2, 5.0), InstanceOption("u", 8, None)
    d = decide([PendingDemand(2, 1), PendingDemand(8, 1)], [], limits(priced, unknown), NOW)
    # The 8-slot task has only the unpriced type; the 2-slot one goes to the priced type, not a second one.
    assert sorted((p.option.instance_type, p.count) for p in d.launches) == [("p", 1), ("u", 1)]
    assert d.usd_per_hour is None and "price partly unknown" in summarize(d)


def test_caps_truncate_the_plan_and_min_instances_takes_the_cheapest() -> None:
    small, big = InstanceOption("s", 1, 1.0), InstanceOption("b", 4, 3.5)
    d = decide([PendingDemand(4, 3)], [], limits(small, big, max_instances=2), NOW)
    assert d.launch == 2 and sum(p.count for p in d.launches) == 2
    d = decide([], [], limits(small, big, min_instances=2), NOW)
    assert [(p.option.instance_type, p.count) for p in d.launches] == [("s", 2)]


def test_many_tasks_are_fast_and_cost_no_more_than_one_type_alone() -> None:
    opts = (InstanceOption("g1", 1, 0.53), InstanceOption("g4", 4, 3.9), InstanceOption("g8", 8, 5.5),
            InstanceOption("g8", 8, 1.9, spot=True))
    demand = [PendingDemand(1, 3001), PendingDemand(2, 2002), PendingDemand(3, 1003), PendingDemand(8, 100)]
    d = decide(demand, [], limits(*opts, max_instances=10**6), NOW)
    assert d.launch == sum(p.count for p in d.launches)
    slots = launched_slots(d)
    assert sum(slots) >= 3001 + 2 * 2002 + 3 * 1003 + 800
    # Spot 8-slot instances alone: 3 tasks of 3 fit 2 per instance, ...: never cheaper than the mix.
    assert d.usd_per_hour is not None and d.usd_per_hour <= 1.9 * (100 + 1003 // 2 + 1 + 2002 // 4 + 3001 // 8 + 2)


def test_single_option_decides_like_the_one_type_pool() -> None:
    demand = [PendingDemand(3, 3), PendingDemand(1, 2)]
    one = decide(demand, [], PoolLimits(0, 50, 4), NOW)
    typed = decide(demand, [], limits(InstanceOption("t", 4, 1.0)), NOW)
    assert typed.launch == one.launch == 3 and typed.launches[0].count == 3


def test_options_must_agree_with_slots_per_instance() -> None:
    with pytest.raises(ValueError, match="largest option"):
        PoolLimits(0, 4, 2, options=(InstanceOption("a", 4, 1.0),))


# -------------------------------------------------------------------------------------- properties

option = st.builds(InstanceOption, st.sampled_from(["a", "b", "c", "d"]), st.integers(1, 8),
                   st.integers(1, 40).map(lambda c: c / 4), st.booleans())


@FAST
@given(options=st.lists(option, min_size=1, max_size=3, unique=True),
       tasks=st.lists(st.integers(1, 8), min_size=1, max_size=6))
def test_the_choice_fits_and_no_cheaper_combination_exists(options: list[InstanceOption], tasks: list[int]) -> None:
    biggest = max(o.slots for o in options)
    tasks = [t for t in tasks if t <= biggest] or [1]
    demand = [PendingDemand(s, tasks.count(s)) for s in set(tasks)]
    d = decide(demand, [], limits(*options), NOW)
    assert d.launch == sum(p.count for p in d.launches)
    assert fits(tasks, launched_slots(d)), (tasks, d.launches)
    assert d.usd_per_hour == pytest.approx(brute_cheapest(tasks, options)), (tasks, options, d.launches)
    for plan in d.launches:
        assert plan.option not in plan.fallbacks
        assert [f.usd_per_hour for f in plan.fallbacks] == sorted(f.usd_per_hour for f in plan.fallbacks)


@FAST
@given(options=st.lists(option, min_size=1, max_size=4, unique=True),
       shapes=st.lists(st.tuples(st.integers(1, 8), st.integers(0, 400)), min_size=1, max_size=4))
def test_large_demands_fit_within_the_best_single_type(options: list[InstanceOption],
                                                      shapes: list[tuple[int, int]]) -> None:
    biggest = max(o.slots for o in options)
    demand = [PendingDemand(s, c) for s, c in shapes if s <= biggest]
    d = decide(demand, [], limits(*options), NOW)
    need = sum(p.slots * p.count for p in demand)
    assert sum(launched_slots(d)) >= need
    largest = max((p.slots for p in demand if p.count), default=0)
    alone = [decide(demand, [], limits(o), NOW).usd_per_hour for o in options if o.slots >= largest]
    assert d.usd_per_hour is not None and d.usd_per_hour <= min(alone) + 1e-6


@FAST
@given(options=st.lists(option, min_size=2, max_size=4, unique=True), data=st.data(),
       tasks=st.lists(st.integers(1, 8), min_size=1, max_size=12))
def test_with_types_out_of_capacity_the_choice_still_fits(options: list[InstanceOption], data: st.DataObject,
                                                          tasks: list[int]) -> None:
    out = frozenset(data.draw(st.lists(st.sampled_from(options), unique=True)))
    biggest = max(o.slots for o in options)
    tasks = [t for t in tasks if t <= biggest] or [1]
    demand = [PendingDemand(s, tasks.count(s)) for s in set(tasks)]
    d = decide(demand, [], limits(*options, out_of_capacity=out), NOW)
    assert fits(tasks, launched_slots(d))
    usable = [o for o in options if o not in out]
    if usable and max(o.slots for o in usable) >= max(tasks):
        assert all(p.option not in out for p in d.launches)
