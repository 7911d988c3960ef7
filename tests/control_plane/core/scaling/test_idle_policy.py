"""The idle policy's cost path (core/scaling/idle.py): with measured boot times, an instance idle past
max_idle_agent_period is kept only while idling until the next arrival that fits it costs less than
a relaunch, never past twice that period; the reasons state the numbers. Unit tests with explicit
times and prices, and properties over random pools."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from hypothesis import given
from hypothesis import strategies as st

from control_plane.core.scaling import Arrival, InstanceView, PendingDemand, PoolLimits, decide
from control_plane.core.scaling.idle import hard_bound
from control_plane.core.scaling.model import InstanceOption
from tests.control_plane.core.scaling.test_scale_decider import LIMITS, MIN, NOW, busy, idle, limits
from tests.control_plane.core.scaling.test_scale_decider_properties import FAST, world

SLOW_BOOT = limits(boot_times=(3 * MIN, 2 * MIN, 4 * MIN))  # median 3 min
FAST_BOOT = limits(boot_times=(timedelta(seconds=20),))


def every(gap: timedelta, slots: int = 1, last_ago: timedelta = timedelta(0), n: int = 200) -> list[Arrival]:
    return [Arrival(NOW - last_ago - k * gap, slots) for k in range(n)]


def reasons_about(d_reasons: tuple[str, ...], iid: str) -> list[str]:
    return [r for r in d_reasons if r.startswith(f"keeping {iid} ")]


def test_within_max_idle_agent_period_an_idle_instance_stays_whatever_the_forecast() -> None:
    d = decide([], [idle("i1", 5 * MIN)], FAST_BOOT, NOW, arrivals=[])
    assert d.terminate == ()


def test_frequent_arrivals_and_a_slow_boot_keep_it_with_the_numbers() -> None:
    # 1-slot arrivals every minute: 30 in the window, the next expected in 1m. Idling 1 min of an
    # 8-slot instance: 8/60 = 0.133 slot-h; a relaunch: 3 min x (8 billed + 1 waiting) = 0.45 slot-h.
    d = decide([], [idle("i1", 6 * MIN)], SLOW_BOOT, NOW, every(MIN))
    assert d.terminate == ()
    [kept] = reasons_about(d.reasons, "i1")
    assert kept == ("keeping i1 idle for 6m (max_idle_agent_period 5m): the next arrival that fits is expected "
                    "in 1m (30 arrivals that fit in the last 30m); idling 0.133 slot-h < a relaunch 0.45 slot-h "
                    "(boot 3m, median of 3 measured boots, billed, and waited for by 1.0 slots); at most 10m idle")


def test_a_fast_boot_makes_the_relaunch_cheaper_than_idling() -> None:
    # Same arrivals, a 20 s boot: a relaunch costs 20 s x 9 slots = 0.05 slot-h < idling 0.133.
    d = decide([], [idle("i1", 6 * MIN)], FAST_BOOT, NOW, every(MIN))
    [t] = d.terminate
    assert t.presumes_idle and t.reason == (
        "idle for 6m (max_idle_agent_period 5m): the next arrival that fits is expected in 1m (30 arrivals that "
        "fit in the last 30m); idling 0.133 slot-h >= a relaunch 0.05 slot-h (boot 20s, median of 1 measured boot, "
        "billed, and waited for by 1.0 slots)")


def test_without_an_arrival_that_fits_idling_never_pays_back() -> None:
    too_big = every(MIN, slots=16)
    [t] = decide([], [idle("i1", 5 * MIN + timedelta(seconds=1))], SLOW_BOOT, NOW, too_big).terminate
    assert t.reason.startswith("idle for 5m1s (max_idle_agent_period 5m): no arrival that fits in the last 30m; "
                               "idling never pays back a relaunch ")


def test_never_kept_past_twice_max_idle_agent_period() -> None:
    arrivals = every(timedelta(seconds=10))
    assert decide([], [idle("i1", 10 * MIN)], SLOW_BOOT, NOW, arrivals).terminate == ()
    [t] = decide([], [idle("i1", 10 * MIN + timedelta(seconds=1))], SLOW_BOOT, NOW, arrivals).terminate
    assert t.reason == "idle for 10m1s (max_idle_agent_period 5m): past the hard bound 10m"
    assert hard_bound(SLOW_BOOT) == 10 * MIN


def test_the_arrivals_keep_as_many_instances_as_they_fill_the_most_recently_idle_first() -> None:
    # 2-slot arrivals every 40 s: 90 slots per 30 min, a slot every 20 s. The most recently idle
    # instance expects one in 40 s; the next has its 8 slots ahead (+2m40s: 3m20s), the third 16.
    insts = [idle("old", 9 * MIN), idle("mid", 7 * MIN), idle("new", 6 * MIN)]
    d = decide([], insts, SLOW_BOOT, NOW, every(timedelta(seconds=40), slots=2))
    assert d.terminate_ids == ("old",)
    assert "expected in 40s (45 arrivals that fit in the last 30m)" in reasons_about(d.reasons, "new")[0]
    assert "expected in 3m20s (45 arrivals that fit in the last 30m, 8 free slots ahead of it)" in (
        reasons_about(d.reasons, "mid")[0])
    assert "expected in 6m, " not in d.terminate[0].reason and "16 free slots ahead of it" in d.terminate[0].reason


def test_starting_instances_take_the_next_arrivals_first() -> None:
    starting = InstanceView("s1", "starting", NOW - MIN)  # type: ignore[arg-type]
    alone = decide([], [idle("i1", 6 * MIN)], SLOW_BOOT, NOW, every(MIN))
    assert alone.terminate == ()
    behind = decide([], [starting, idle("i1", 6 * MIN)], SLOW_BOOT, NOW, every(MIN))
    assert behind.terminate_ids == ("i1",)  # 8 slots ahead: the next 1-slot arrival for it is 9 min away
    assert "expected in 9m (30 arrivals that fit in the last 30m, 8 free slots ahead of it)" in (
        behind.terminate[0].reason)


def test_priced_in_dollars_from_the_pools_options() -> None:
    """Idling costs the instance's price; a waiting slot is worth the on-demand price of a slot of
    its type (the instance's own price per slot when only spot is listed). 8-slot type at $8/h on
    demand, $2/h spot; 4-slot arrivals every 3 min; boot 3 min. Idling 3 min: $0.4 on demand; a
    relaunch 3 min x ($8 + 4 slots x $1) = $0.6. Spot only: $0.1 against 3 min x ($2 + 4 x $0.25) = $0.15."""
    inst = replace(idle("i1", 6 * MIN), slots=8, instance_type="g.8x")
    on_demand = replace(SLOW_BOOT, options=(InstanceOption("g.8x", 8, 8.0),))
    spot = replace(SLOW_BOOT, options=(InstanceOption("g.8x", 8, 2.0, spot=True),))
    d = decide([], [inst], on_demand, NOW, every(3 * MIN, slots=4))
    assert d.terminate == () and "idling $0.4 < a relaunch $0.6 " in reasons_about(d.reasons, "i1")[0]
    d = decide([], [inst], spot, NOW, every(3 * MIN, slots=4))
    assert d.terminate == () and "idling $0.1 < a relaunch $0.15 " in reasons_about(d.reasons, "i1")[0]
    # Both listed (spot-then-on-demand): the instance is priced on demand, the conservative guess.
    both = replace(SLOW_BOOT, options=(InstanceOption("g.8x", 8, 2.0, spot=True), InstanceOption("g.8x", 8, 8.0)))
    assert "idling $0.4 < a relaunch $0.6 " in reasons_about(decide([], [inst], both, NOW, every(3 * MIN, 4)).reasons,
                                                             "i1")[0]
    # Arrivals every 6 min: idling ($0.8, $0.2) no longer pays.
    [t] = decide([], [inst], on_demand, NOW, every(6 * MIN, slots=4)).terminate
    assert "idling $0.8 >= a relaunch $0.6 " in t.reason
    assert decide([], [inst], spot, NOW, every(6 * MIN, slots=4)).terminate_ids == ("i1",)
    # A type the options do not price: slot-hours.
    other = replace(inst, instance_type="unlisted")
    assert "slot-h" in reasons_about(decide([], [other], on_demand, NOW, every(3 * MIN, 4)).reasons, "i1")[0]


def test_pending_demand_and_min_instances_hold_idle_instances_first() -> None:
    insts = [idle("i1", 30 * MIN), idle("i2", 11 * MIN), busy("b1", slots=8)]
    d = decide([PendingDemand(8, 1)], insts, SLOW_BOOT, NOW, [])
    assert d.launch == 0 and d.terminate_ids == ("i1",)
    assert "keeping 1 idle instance for pending demand" in d.reasons
    d = decide([], insts, replace(SLOW_BOOT, min_instances=2), NOW, [])
    assert d.terminate_ids == ("i1",) and "keeping 1 idle instance for min_instances 2" in d.reasons


def test_a_zero_arrival_window_keeps_the_plain_bound() -> None:
    off = replace(SLOW_BOOT, arrival_window=timedelta(0))
    [t] = decide([], [idle("i1", 6 * MIN)], off, NOW, every(MIN)).terminate
    assert t.reason == "idle for 6m (max_idle_agent_period 5m)"
    assert hard_bound(off) == 5 * MIN and hard_bound(LIMITS) == 10 * MIN


# ------------------------------------------------------------------------------------- properties


@st.composite
def measured_world(draw: st.DrawFn) -> tuple[list[PendingDemand], list[InstanceView], PoolLimits, list[Arrival]]:
    demand, instances, lim = draw(world())
    boots = tuple(timedelta(seconds=s) for s in draw(st.lists(st.integers(1, 900), min_size=1, max_size=5)))
    lim = replace(lim, boot_times=boots, arrival_window=draw(st.integers(1, 60)) * MIN)
    arrivals = [Arrival(NOW - timedelta(seconds=s), k)
                for s, k in draw(st.lists(st.tuples(st.integers(0, 3600), st.integers(0, 12)), max_size=60))]
    return demand, instances, lim, arrivals


def idle_for(i: InstanceView) -> timedelta | None:
    live = i.state not in ("stopping", "terminated") and i.agent_connected
    return NOW - i.idle_since if live and i.idle_since is not None and i.busy_slots == 0 else None


World = tuple[list[PendingDemand], list[InstanceView], PoolLimits, list[Arrival]]


@FAST
@given(measured_world())
def test_never_terminates_an_instance_the_pending_demand_was_packed_onto(w: World) -> None:
    demand, instances, lim, arrivals = w
    d = decide(demand, instances, lim, NOW, arrivals)
    if not any(t.reason.startswith("idle for") for t in d.terminate):
        return
    assert d.launch == 0
    # Without the reaped instances, and no cap in the way, the demand still needs no new instance.
    survivors = [i for i in instances if i.id not in d.terminate_ids]
    uncapped = replace(lim, min_instances=0, max_instances=10**6, max_launch_per_decision=None)
    assert decide(demand, survivors, uncapped, NOW, arrivals).launch == 0


def kept_past_the_bound(instances: list[InstanceView], terminated: tuple[str, ...], lim: PoolLimits) -> list[str]:
    return [i.id for i in instances if i.id not in terminated and (idle_for(i) or timedelta(0)) > hard_bound(lim)]


@FAST
@given(measured_world())
def test_never_keeps_one_past_the_hard_bound_nor_reaps_one_within_the_grace(w: World) -> None:
    demand, instances, lim, arrivals = w
    d = decide(demand, instances, lim, NOW, arrivals)
    idle_reaped = {t.id for t in d.terminate if t.reason.startswith("idle for")}
    assert all(idle_for(i) and idle_for(i) > lim.max_idle_agent_period  # type: ignore[operator]
               for i in instances if i.id in idle_reaped)
    if kept_past_the_bound(instances, d.terminate_ids, lim):  # only pending demand or min_instances keeps one
        assert any(r.endswith("for pending demand") or "for min_instances" in r for r in d.reasons)
    # With nothing holding them, none stays past the bound.
    free = decide([], instances, replace(lim, min_instances=0), NOW, arrivals)
    assert kept_past_the_bound(instances, free.terminate_ids, lim) == []
