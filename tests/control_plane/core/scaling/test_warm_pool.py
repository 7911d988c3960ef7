"""The scale decider's warm pool (`warm_pool_size`): idle on-demand instances are parked (stopped,
disks kept) instead of terminated while the warm pool has room, and parked instances are started
again instead of launches."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from control_plane.core.scaling import (
    Arrival,
    InstanceOption,
    InstanceView,
    PendingDemand,
    PoolLimits,
    decide,
    summarize,
)
from control_plane.core.states import InstanceState

NOW = datetime(2024, 5, 1, 12, 0, 0)
MIN = timedelta(minutes=1)
LIMITS = PoolLimits(min_instances=0, max_instances=4, slots_per_instance=8, max_idle_agent_period=5 * MIN,
                    warm_pool_size=2)


def idle(iid: str, idle_for: timedelta, **kw: object) -> InstanceView:
    return InstanceView(iid, InstanceState.RUNNING, NOW - 60 * MIN, True, NOW - 58 * MIN, None, busy_slots=0,
                        idle_since=NOW - idle_for, **kw)  # type: ignore[arg-type]


def busy(iid: str, slots: int = 8) -> InstanceView:
    return InstanceView(iid, InstanceState.RUNNING, NOW - 60 * MIN, True, NOW - 58 * MIN, None, busy_slots=slots)


def parked(iid: str, ago: timedelta = 10 * MIN, state: InstanceState = InstanceState.PARKED, **kw: object) -> InstanceView:
    return InstanceView(iid, state, NOW - 120 * MIN, parked_at=NOW - ago, **kw)  # type: ignore[arg-type]


def test_an_idle_instance_past_its_period_is_parked_while_the_warm_pool_has_room() -> None:
    d = decide([], [idle("i-1", 6 * MIN)], LIMITS, NOW)
    assert d.terminate == () and [p.id for p in d.park] == ["i-1"]
    assert "parked in the warm pool (1 of warm_pool_size 2)" in d.park[0].reason
    assert any(r.startswith("park i-1: idle for 6m") for r in d.reasons)
    assert "park 1" in summarize(d)


def test_without_a_warm_pool_the_idle_instance_is_terminated() -> None:
    d = decide([], [idle("i-1", 6 * MIN)], replace(LIMITS, warm_pool_size=0), NOW)
    assert d.park == () and [t.id for t in d.terminate] == ["i-1"]


def test_a_full_warm_pool_parks_no_more() -> None:
    d = decide([], [idle("i-1", 6 * MIN), parked("p-1"), parked("p-2", state=InstanceState.PARKING)], LIMITS, NOW)
    assert d.park == () and [t.id for t in d.terminate] == ["i-1"]


def test_two_idle_instances_and_room_for_one_park_one_and_terminate_the_other() -> None:
    d = decide([], [idle("i-1", 6 * MIN), idle("i-2", 7 * MIN), parked("p-1")], LIMITS, NOW)
    assert len(d.park) == 1 and len(d.terminate) == 1
    assert {d.park[0].id, d.terminate[0].id} == {"i-1", "i-2"}


def test_spot_and_disabled_instances_are_terminated_not_parked() -> None:
    d = decide([], [idle("spot", 6 * MIN, spot=True), idle("off", 6 * MIN, accepts_work=False)], LIMITS, NOW)
    assert d.park == () and {t.id for t in d.terminate} == {"spot", "off"}


def test_pending_demand_starts_a_parked_instance_instead_of_launching() -> None:
    d = decide([PendingDemand(8, 2)], [parked("p-old", 30 * MIN), parked("p-new", 5 * MIN)], LIMITS, NOW)
    assert d.launch == 0 and sorted(a.id for a in d.start) == ["p-new", "p-old"]
    assert any(r.startswith("start 2 parked instances from the warm pool") for r in d.reasons)


def test_the_most_recently_parked_is_started_first_and_the_rest_is_launched() -> None:
    d = decide([PendingDemand(8, 1)], [parked("p-old", 30 * MIN), parked("p-new", 5 * MIN)], LIMITS, NOW)
    assert d.launch == 0 and [a.id for a in d.start] == ["p-new"]
    d = decide([PendingDemand(8, 3)], [parked("p-1")], LIMITS, NOW)
    assert d.launch == 2 and [a.id for a in d.start] == ["p-1"]
    assert any(r.startswith("start 1 parked instance from the warm pool (p-1) and launch 2") for r in d.reasons)


def test_an_instance_still_being_powered_off_is_not_started() -> None:
    d = decide([PendingDemand(8, 1)], [parked("p-1", state=InstanceState.PARKING)], LIMITS, NOW)
    assert d.start == () and d.launch == 1


def test_parked_instances_are_outside_max_instances_and_a_start_is_within_it() -> None:
    # max 1, one busy: neither a launch nor a start for the pending task; the parked one leaves no gap.
    d = decide([PendingDemand(8, 1)], [busy("b-1"), parked("p-1")], replace(LIMITS, max_instances=1), NOW)
    assert d.launch == 0 and d.start == () and d.terminate == ()
    # max 2: the start takes the room a launch would.
    d = decide([PendingDemand(8, 2)], [busy("b-1"), parked("p-1")], replace(LIMITS, max_instances=2), NOW)
    assert d.launch == 0 and [a.id for a in d.start] == ["p-1"]


def test_min_instances_are_met_by_starting_parked_ones_first() -> None:
    d = decide([], [parked("p-1")], replace(LIMITS, min_instances=2), NOW)
    assert [a.id for a in d.start] == ["p-1"] and d.launch == 1


def test_a_parked_instance_past_warm_pool_max_age_is_terminated() -> None:
    d = decide([], [parked("p-1", 25 * 60 * MIN), parked("p-2", 60 * MIN)], LIMITS, NOW)
    assert [t.id for t in d.terminate] == ["p-1"] and "warm_pool_max_age 24h" in d.terminate[0].reason
    assert not d.terminate[0].presumes_idle


def test_a_lowered_warm_pool_size_terminates_the_longest_parked() -> None:
    views = [parked("p-1", 50 * MIN), parked("p-2", 40 * MIN), parked("p-3", 30 * MIN)]
    d = decide([], views, replace(LIMITS, warm_pool_size=1), NOW)
    assert sorted(t.id for t in d.terminate) == ["p-1", "p-2"]
    assert all("beyond warm_pool_size 1" in t.reason for t in d.terminate)


def test_several_types_start_a_parked_instance_of_the_planned_type_or_at_most_twice_its_slots() -> None:
    one, four, eight = (InstanceOption(f"t{n}", n, 1.0 * n) for n in (1, 4, 8))
    spot_four = InstanceOption("t4", 4, 0.3 * 4, spot=True)
    lim = replace(LIMITS, options=(one, four, eight), max_instances=10)
    views = [parked("p8", instance_type="t8", slots=8), parked("p1", instance_type="t1", slots=1)]
    d = decide([PendingDemand(4, 1)], views, lim, NOW)  # a 4-slot task: the 8-slot one (2x) starts
    assert [a.id for a in d.start] == ["p8"] and d.launch == 0
    d = decide([PendingDemand(1, 1)], [views[0]], lim, NOW)  # a 1-slot task: not on 8 slots, launched
    assert d.start == () and d.launch == 1 and d.launches[0].option == one
    # A spot launch is cheaper than the parked on-demand instance: not replaced by it.
    d = decide([PendingDemand(4, 1)], [views[0]], replace(lim, options=(one, spot_four, eight)), NOW)
    assert d.start == () and d.launches[0].option == spot_four


def test_the_idle_cost_policy_weighs_a_start_when_the_instance_would_be_parked() -> None:
    lim = replace(LIMITS, boot_times=(5 * MIN,) * 3, start_times=(timedelta(seconds=40),) * 3,
                  arrival_window=30 * MIN)
    arrivals = [Arrival(NOW - 15 * MIN, 8)]  # one arrival in 30 minutes: next expected in ~30 min
    d = decide([], [idle("i-1", 6 * MIN)], lim, NOW, arrivals)
    assert [p.id for p in d.park] == ["i-1"] and "start from the warm pool 40s" in d.park[0].reason
    # With the warm pool full the same instance would be terminated, and its relaunch is a boot.
    d = decide([], [idle("i-1", 6 * MIN), parked("p-1"), parked("p-2")], lim, NOW, arrivals)
    assert [t.id for t in d.terminate] == ["i-1"] and "boot 5m" in d.terminate[0].reason


def test_steady_mentions_the_parked_instances() -> None:
    d = decide([], [busy("b-1"), parked("p-1")], LIMITS, NOW)
    assert d.reasons == ("steady: 1 instance (1 busy, 0 idle, 0 starting, 0 disconnected, 1 parked in the warm "
                         "pool), no pending demand",)


def test_an_instance_being_parked_still_bills_and_leaves_no_room_under_max_instances() -> None:
    views = [parked("p-1", state=InstanceState.PARKING)]
    d = decide([PendingDemand(8, 1)], views, replace(LIMITS, max_instances=1), NOW)
    assert d.launch == 0 and d.start == ()
    assert any("capped by max_instances 1 with 0 live and 1 stopping" in r for r in d.reasons), d.reasons
    d = decide([PendingDemand(8, 1)], [parked("p-1")], replace(LIMITS, max_instances=1), NOW)
    assert [a.id for a in d.start] == ["p-1"]  # once parked it bills no compute: it is started
