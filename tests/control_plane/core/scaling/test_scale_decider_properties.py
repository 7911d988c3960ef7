"""Property tests of the scale decider and of its bin packing."""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import replace
from datetime import datetime, timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from control_plane.core.scaling import (
    InstanceView,
    PendingDemand,
    PoolLimits,
    decide,
    instances_needed,
    lower_bound_instances,
)

NOW = datetime(2024, 5, 1, 12, 0, 0)
MINUTE = timedelta(minutes=1)
FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ------------------------------------------------------------------------------------- strategies


@st.composite
def pool_limits(draw: st.DrawFn) -> PoolLimits:
    spi = draw(st.sampled_from([1, 2, 4, 8, 8, 8]) | st.integers(0, 12))
    lo = draw(st.integers(0, 4))
    hi = draw(st.integers(lo, 12))
    return PoolLimits(
        min_instances=lo,
        max_instances=hi,
        slots_per_instance=spi,
        max_idle_agent_period=draw(st.integers(1, 30)) * MINUTE,
        max_agent_starting_period=draw(st.integers(1, 30)) * MINUTE,
        max_disconnected_period=draw(st.integers(1, 30)) * MINUTE,
        max_launch_per_decision=draw(st.none() | st.integers(0, 5)),
    )


def minutes_ago(draw: st.DrawFn, hi: int = 90) -> datetime:
    return NOW - timedelta(seconds=draw(st.integers(0, hi * 60)))


@st.composite
def instance(draw: st.DrawFn, iid: str, spi: int) -> InstanceView:
    launched = minutes_ago(draw)
    kind = draw(st.sampled_from(["booting", "idle", "busy", "disconnected", "gone"]))
    if kind == "booting":
        state = draw(st.sampled_from(["requested", "starting", "running"]))
        return InstanceView(iid, state, launched)
    if kind == "gone":
        return InstanceView(iid, draw(st.sampled_from(["stopping", "terminated"])), launched)
    connected_at = launched + (NOW - launched) * draw(st.floats(0, 1))
    if kind == "disconnected":
        since = draw(st.none() | st.just(connected_at + (NOW - connected_at) * draw(st.floats(0, 1))))
        return InstanceView(iid, "running", launched, False, connected_at, since, draw(st.integers(0, spi)))
    if kind == "idle":
        idle_since = connected_at + (NOW - connected_at) * draw(st.floats(0, 1))
        return InstanceView(iid, "running", launched, True, connected_at, None, 0, idle_since)
    busy_slots = draw(st.integers(0, spi))  # 0 busy slots + idle_since None = a zero-slot task runs
    return InstanceView(iid, "running", launched, True, connected_at, None, busy_slots, None)


@st.composite
def world(draw: st.DrawFn) -> tuple[list[PendingDemand], list[InstanceView], PoolLimits]:
    limits = draw(pool_limits())
    spi = limits.slots_per_instance
    n = draw(st.integers(0, 16))
    instances = [draw(instance(f"i{k:02d}", spi)) for k in range(n)]
    demand = draw(st.lists(st.builds(PendingDemand, st.integers(0, spi + 3), st.integers(0, 40)), max_size=6))
    return demand, instances, limits


def live(instances: list[InstanceView]) -> list[InstanceView]:
    return [i for i in instances if i.state not in ("stopping", "terminated")]


def is_busy(i: InstanceView) -> bool:
    return i.agent_connected and (i.busy_slots > 0 or i.idle_since is None)


# ------------------------------------------------------------------------------------- decisions


@FAST
@given(world())
def test_never_above_max(w: tuple[list[PendingDemand], list[InstanceView], PoolLimits]) -> None:
    demand, instances, limits = w
    d = decide(demand, instances, limits, NOW)
    survivors = [i for i in live(instances) if i.id not in d.terminate_ids]
    if len(survivors) + d.launch > limits.max_instances:
        # Only possible when busy instances alone exceed max: nothing launched, all else shed.
        assert d.launch == 0
        assert all(is_busy(i) for i in survivors)


@FAST
@given(world())
def test_never_launches_above_max_counting_instances_being_stopped(
    w: tuple[list[PendingDemand], list[InstanceView], PoolLimits],
) -> None:
    """A stopping instance bills until the cloud says it is gone: launches never take the pool's
    billed instances (live, stopping, launched now) above max_instances."""
    demand, instances, limits = w
    d = decide(demand, instances, limits, NOW)
    billed = {i.id for i in instances if i.state != "terminated"}
    if d.launch:
        assert len(billed) + d.launch <= limits.max_instances


@FAST
@given(world())
def test_never_below_min(w: tuple[list[PendingDemand], list[InstanceView], PoolLimits]) -> None:
    demand, instances, limits = w
    d = decide(demand, instances, limits, NOW)
    survivors = [i for i in live(instances) if i.id not in d.terminate_ids]
    idle_reaped = [t for t in d.terminate if t.reason.startswith("idle for")]
    if idle_reaped:
        assert len(survivors) >= limits.min_instances
    if limits.max_launch_per_decision is None:
        # Instances being stopped (before or by this decision) still bill: the floor is met as far as
        # max_instances leaves room.
        stopping = sum(1 for i in instances if i.state == "stopping") + len(d.terminate)
        assert len(survivors) + d.launch >= min(limits.min_instances, limits.max_instances - stopping)


@FAST
@given(world())
def test_never_terminates_a_busy_instance(
    w: tuple[list[PendingDemand], list[InstanceView], PoolLimits],
) -> None:
    demand, instances, limits = w
    d = decide(demand, instances, limits, NOW)
    by_id = {i.id: i for i in instances}
    assert not any(is_busy(by_id[t]) for t in d.terminate_ids)
    assert all(t.reason for t in d.terminate)
    assert len(set(d.terminate_ids)) == len(d.terminate)
    assert all(by_id[t].state not in ("stopping", "terminated") for t in d.terminate_ids)


@FAST
@given(world())
def test_never_terminates_idle_capacity_the_pending_demand_could_use(
    w: tuple[list[PendingDemand], list[InstanceView], PoolLimits],
) -> None:
    demand, instances, limits = w
    d = decide(demand, instances, limits, NOW)
    if not any(t.reason.startswith("idle for") for t in d.terminate):
        return
    assert d.launch == 0
    # Without the reaped instances, and with no cap in the way, the demand still needs no new instance:
    # the reaped ones could not have absorbed any of it.
    survivors = [i for i in instances if i.id not in d.terminate_ids]
    uncapped = replace(limits, min_instances=0, max_instances=10**6, max_launch_per_decision=None)
    assert decide(demand, survivors, uncapped, NOW).launch == 0


@FAST
@given(world())
def test_decisions_are_idempotent(w: tuple[list[PendingDemand], list[InstanceView], PoolLimits]) -> None:
    """Applying the terminations and deciding again on the same snapshot changes nothing more."""
    demand, instances, limits = w
    d = decide(demand, instances, limits, NOW)
    # A terminated instance is stopping until the cloud says it is gone.
    applied = [replace(i, state="stopping") if i.id in d.terminate_ids else i for i in instances]
    again = decide(demand, applied, limits, NOW)
    assert again.terminate == ()
    assert again.launch == d.launch


@FAST
@given(world(), st.randoms(use_true_random=False))
def test_order_and_grouping_of_inputs_do_not_matter(
    w: tuple[list[PendingDemand], list[InstanceView], PoolLimits], rnd: random.Random
) -> None:
    demand, instances, limits = w
    d = decide(demand, instances, limits, NOW)
    per_task = [PendingDemand(x.slots, 1) for x in demand for _ in range(x.count)]
    rnd.shuffle(per_task)
    shuffled = list(instances)
    rnd.shuffle(shuffled)
    e = decide(per_task, shuffled, limits, NOW)
    assert e.launch == d.launch
    assert sorted(e.terminate, key=lambda t: t.id) == sorted(d.terminate, key=lambda t: t.id)


# ------------------------------------------------------------------------------------- packing


def reference_bfd(sizes: list[int], capacity: int) -> int:
    """Item-by-item best-fit decreasing, the obvious way."""
    bins: list[int] = []
    for size in sorted((s for s in sizes if 0 < s <= capacity), reverse=True):
        fitting = [k for k, free in enumerate(bins) if free >= size]
        if fitting:
            best = min(fitting, key=lambda k: bins[k])
            bins[best] -= size
        else:
            bins.append(capacity - size)
    if not bins and any(s == 0 for s in sizes):
        return 1
    return len(bins)


def optimum(sizes: list[int], capacity: int) -> int:
    """Exact bin packing by search (tiny inputs only)."""
    items = sorted((s for s in sizes if 0 < s <= capacity), reverse=True)
    best = len(items)

    def place(k: int, bins: list[int]) -> None:
        nonlocal best
        if len(bins) >= best:
            return
        if k == len(items):
            best = len(bins)
            return
        tried: set[int] = set()
        for b, free in enumerate(bins):
            if free >= items[k] and free not in tried:
                tried.add(free)
                bins[b] -= items[k]
                place(k + 1, bins)
                bins[b] += items[k]
        bins.append(capacity - items[k])
        place(k + 1, bins)
        bins.pop()

    place(0, [])
    return best


def expand(demand: list[PendingDemand]) -> list[int]:
    return [d.slots for d in demand for _ in range(d.count)]


@st.composite
def shapes(draw: st.DrawFn, max_count: int = 60) -> tuple[list[PendingDemand], int]:
    capacity = draw(st.integers(1, 12))
    demand = draw(
        st.lists(
            st.builds(PendingDemand, st.integers(0, capacity + 2), st.integers(0, max_count)), max_size=6
        )
    )
    return demand, capacity


@FAST
@given(shapes())
def test_packing_within_bounds(case: tuple[list[PendingDemand], int]) -> None:
    demand, capacity = case
    n = instances_needed(demand, capacity)
    assert (
        n
        >= lower_bound_instances(demand, capacity)
        >= math.ceil(sum(d.slots * d.count for d in demand if d.slots <= capacity) / capacity)
    )
    # Never worse than packing each shape on its own instances.
    per_shape = Counter[int]()
    for d in demand:
        if 0 < d.slots <= capacity:
            per_shape[d.slots] += d.count
    assert n <= max(sum(math.ceil(c / (capacity // s)) for s, c in per_shape.items()), 1)


@FAST
@given(shapes(max_count=12))
def test_packing_over_counts_is_exactly_item_by_item_best_fit_decreasing(
    case: tuple[list[PendingDemand], int],
) -> None:
    demand, capacity = case
    assert instances_needed(demand, capacity) == reference_bfd(expand(demand), capacity)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 10), st.lists(st.integers(1, 10), max_size=8))
def test_packing_is_near_optimal(capacity: int, sizes: list[int]) -> None:
    demand = [PendingDemand(s, c) for s, c in Counter(sizes).items()]
    opt = optimum(sizes, capacity)
    n = instances_needed(demand, capacity)
    assert opt <= n <= math.floor(11 / 9 * opt + 1)


@FAST
@given(
    st.sampled_from([1, 2, 4, 8, 16]).flatmap(
        lambda cap: st.tuples(
            st.just(cap),
            st.dictionaries(
                st.sampled_from([s for s in (1, 2, 4, 8, 16) if s <= cap]), st.integers(1, 3000), max_size=5
            ),
        )
    )
)
def test_gpu_shapes_pack_to_the_lower_bound(case: tuple[int, dict[int, int]]) -> None:
    """Power-of-two shapes on power-of-two instances: <= lower bound + one per shape, in fact equal."""
    capacity, counts = case
    demand = [PendingDemand(s, c) for s, c in counts.items()]
    lower = lower_bound_instances(demand, capacity)
    n = instances_needed(demand, capacity)
    assert lower <= n <= lower + len(counts)
    assert n == lower


def test_lower_bound_plus_shapes_cannot_hold_for_arbitrary_shapes() -> None:
    # Ten 5-slot tasks on 8-slot instances: no two share an instance, so the optimum is 10, while
    # ceil(50 / 8) + 1 shape = 8. The packing finds the optimum.
    demand = [PendingDemand(5, 10)]
    assert lower_bound_instances(demand, 8) + 1 == 8
    assert instances_needed(demand, 8) == optimum([5] * 10, 8) == 10
