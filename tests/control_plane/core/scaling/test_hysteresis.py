"""Scale-down hysteresis of the pure decider (issue 10, item 8), with explicit times: an idle
instance past max_idle_agent_period is kept while the recent arrivals say the next task is due
before it reaches twice that period; and which terminations presume an idle instance."""

from __future__ import annotations

from datetime import timedelta

import pytest

from control_plane.core.scaling import Arrival, PendingDemand, PoolLimits, decide
from tests.control_plane.core.scaling.test_scale_decider import (
    LIMITS,
    MIN,
    NOW,
    booting,
    busy,
    disconnected,
    idle,
    limits,
    terminated_reasons,
)


def every(gap: timedelta, last_ago: timedelta, slots: int = 1, n: int = 100) -> list[Arrival]:
    """Arrivals `gap` apart, the last one `last_ago` before NOW (older ones fall out of the window)."""
    return [Arrival(NOW - last_ago - k * gap, slots) for k in range(n)]


def test_without_arrivals_an_idle_instance_goes_after_max_idle_agent_period() -> None:
    d = decide([], [idle("i1", 6 * MIN)], LIMITS, NOW, arrivals=[])
    assert terminated_reasons(d) == {"i1": "idle for 6m (max_idle_agent_period 5m)"}


def test_a_steady_trickle_of_arrivals_keeps_it_with_the_reason() -> None:
    # One arrival every 5 min over the 30 min window: the next is due 5 min after the last (2 min ago).
    arrivals = every(5 * MIN, last_ago=2 * MIN)
    d = decide([], [idle("i1", 6 * MIN)], LIMITS, NOW, arrivals)
    assert d.terminate == () and d.launch == 0
    assert ("keeping 1 idle instance past max_idle_agent_period 5m for expected arrivals: 6 arrivals in the "
            "last 30m (one every 5m), next due in 3m; at most 10m idle") in d.reasons


def test_an_overdue_arrival_is_due_now() -> None:
    d = decide([], [idle("i1", 7 * MIN)], LIMITS, NOW, every(4 * MIN, last_ago=9 * MIN))
    assert d.terminate == ()
    assert any("next due now (overdue)" in r for r in d.reasons)


def test_never_kept_beyond_twice_max_idle_agent_period() -> None:
    arrivals = every(1 * MIN, last_ago=2 * MIN)  # the next is due now (overdue)
    assert decide([], [idle("i1", 10 * MIN)], LIMITS, NOW, arrivals).terminate == ()
    d = decide([], [idle("i1", 10 * MIN + timedelta(seconds=1))], LIMITS, NOW, arrivals)
    assert terminated_reasons(d) == {"i1": "idle for 10m1s (max_idle_agent_period 5m)"}


def test_kept_only_if_the_next_arrival_is_due_before_the_bound() -> None:
    # Idle 6 min; next due 5 min from now: at 11 min idle, past the 10 min bound.
    late = every(10 * MIN, last_ago=5 * MIN)  # 3 arrivals in 30 min: one every 10 min
    assert decide([], [idle("i1", 6 * MIN)], LIMITS, NOW, late).terminate_ids == ("i1",)
    # Idle 5m30s: the next arrival (due at 10m30s idle) is still past the bound...
    assert decide([], [idle("i1", 5 * MIN + timedelta(seconds=30))], LIMITS, NOW, late).terminate_ids == ("i1",)
    # ...but with a shorter gap it is not.
    assert decide([], [idle("i1", 6 * MIN)], LIMITS, NOW, every(6 * MIN, last_ago=5 * MIN)).terminate == ()


def test_sparse_arrivals_do_not_keep_it() -> None:
    d = decide([], [idle("i1", 6 * MIN)], LIMITS, NOW, [Arrival(NOW - 20 * MIN, 1)])
    assert d.terminate_ids == ("i1",)  # one arrival in 30 min: the next is due in 40 min


def test_arrivals_outside_the_window_or_no_instance_can_host_do_not_count() -> None:
    old = every(1 * MIN, last_ago=31 * MIN)
    too_big = every(1 * MIN, last_ago=0 * MIN, slots=16)
    assert decide([], [idle("i1", 6 * MIN)], LIMITS, NOW, old + too_big).terminate_ids == ("i1",)
    # A wider window sees the old ones.
    assert decide([], [idle("i1", 6 * MIN)], limits(arrival_window=60 * MIN), NOW, old).terminate == ()


def test_keeps_as_many_instances_as_the_arrivals_need_the_most_recently_idle_ones() -> None:
    insts = [idle("i1", 9 * MIN), idle("i2", 7 * MIN), idle("i3", 6 * MIN)]
    # 1-slot trials, one a minute: 5 slots per 5 min, one 8-slot instance.
    d = decide([], insts, LIMITS, NOW, every(1 * MIN, last_ago=0 * MIN))
    assert d.terminate_ids == ("i1", "i2")
    # 4-slot trials, one a minute: 20 slots per 5 min, three instances.
    assert decide([], insts, LIMITS, NOW, every(1 * MIN, last_ago=0 * MIN, slots=4)).terminate == ()


def test_hysteresis_does_not_change_what_pending_demand_or_min_instances_keep() -> None:
    insts = [idle("i1", 30 * MIN), idle("i2", 6 * MIN), idle("i3", 20 * MIN)]
    d = decide([], insts, limits(min_instances=1), NOW, every(2 * MIN, last_ago=1 * MIN))
    # min_instances keeps the most recently idle (i2); the arrivals would keep i3 but it is past
    # the 10 min bound: i1 and i3 go.
    assert sorted(d.terminate_ids) == ["i1", "i3"]
    d = decide([PendingDemand(8, 1)], insts, LIMITS, NOW, every(2 * MIN, last_ago=1 * MIN))
    assert d.launch == 0 and "i2" not in d.terminate_ids


def test_terminations_that_presume_an_idle_instance_are_marked() -> None:
    idle_reap = decide([], [idle("i1", 6 * MIN)], LIMITS, NOW)
    assert [t.presumes_idle for t in idle_reap.terminate] == [True]
    lost = decide([], [disconnected("d1", 11 * MIN)], LIMITS, NOW)
    assert [t.presumes_idle for t in lost.terminate] == [False]
    stuck = decide([], [booting("b1", age=21 * MIN)], LIMITS, NOW)
    assert [t.presumes_idle for t in stuck.terminate] == [False]
    shed = decide([], [busy("b"), idle("i", 1 * MIN), booting("s"), disconnected("d", 1 * MIN)],
                  limits(max_instances=1), NOW)
    assert {t.id: t.presumes_idle for t in shed.terminate} == {"d": False, "s": True, "i": True}


def test_bad_arrival_window() -> None:
    with pytest.raises(ValueError, match="arrival_window"):
        PoolLimits(0, 1, 8, arrival_window=timedelta(seconds=-1))


def test_a_zero_arrival_window_turns_the_hysteresis_off() -> None:
    """0 is the pool setting that turns it off: arrivals passed anyway keep nothing."""
    arrivals = every(gap=2 * MIN, last_ago=MIN)
    kept = decide([], [idle("i-1", 6 * MIN)], limits(), NOW, arrivals)
    assert kept.terminate_ids == ()  # the hysteresis keeps it for the next arrival
    off = decide([], [idle("i-1", 6 * MIN)], limits(arrival_window=timedelta(0)), NOW, arrivals)
    assert off.terminate_ids == ("i-1",)
