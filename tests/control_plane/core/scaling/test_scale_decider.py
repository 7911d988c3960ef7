"""Unit tests: one or more per rule of the scale decider."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from control_plane.core.scaling import (
    InstanceView,
    PendingDemand,
    PoolLimits,
    ScaleDecision,
    decide,
    instances_needed,
    lower_bound_instances,
    summarize,
)

NOW = datetime(2024, 5, 1, 12, 0, 0)
MIN = timedelta(minutes=1)
LIMITS = PoolLimits(
    min_instances=0,
    max_instances=10,
    slots_per_instance=8,
    max_idle_agent_period=5 * MIN,
    max_agent_starting_period=20 * MIN,
    max_disconnected_period=10 * MIN,
)


def limits(**kw: object) -> PoolLimits:
    base = {f: getattr(LIMITS, f) for f in LIMITS.__dataclass_fields__}
    base.update(kw)
    return PoolLimits(**base)  # type: ignore[arg-type]


def booting(iid: str, age: timedelta = MIN, state: str = "starting", busy: int = 0) -> InstanceView:
    return InstanceView(iid, state, NOW - age, busy_slots=busy)  # type: ignore[arg-type]


def idle(iid: str, idle_for: timedelta, age: timedelta = 60 * MIN) -> InstanceView:
    return InstanceView(
        iid, "running", NOW - age, True, NOW - age + 2 * MIN, None, busy_slots=0, idle_since=NOW - idle_for
    )


def busy(iid: str, slots: int = 8, age: timedelta = 60 * MIN) -> InstanceView:
    return InstanceView(iid, "running", NOW - age, True, NOW - age + 2 * MIN, None, busy_slots=slots)


def disconnected(iid: str, since: timedelta | None, busy_slots: int = 0) -> InstanceView:
    return InstanceView(
        iid,
        "running",
        NOW - 60 * MIN,
        False,
        NOW - 58 * MIN,
        None if since is None else NOW - since,
        busy_slots=busy_slots,
    )


def terminated_reasons(d: ScaleDecision) -> dict[str, str]:
    return {t.id: t.reason for t in d.terminate}


# ---------------------------------------------------------------------------------------- packing


class TestInstancesNeeded:
    def test_no_demand_needs_nothing(self) -> None:
        assert instances_needed([], 8) == 0
        assert instances_needed([PendingDemand(4, 0)], 8) == 0

    def test_power_of_two_shapes_pack_perfectly(self) -> None:
        demand = [PendingDemand(8, 2), PendingDemand(4, 3), PendingDemand(2, 3), PendingDemand(1, 2)]
        # 16 + 12 + 6 + 2 = 36 slots -> 5 instances of 8.
        assert instances_needed(demand, 8) == 5 == lower_bound_instances(demand, 8)

    def test_fragmentation_is_counted_not_summed(self) -> None:
        # Summing slots (Determined's calculateDesiredNewAgentNum) would say ceil(15/4) = 4 instances
        # for 5 tasks of 3 slots; each 4-slot instance holds only one of them.
        assert instances_needed([PendingDemand(3, 5)], 4) == 5
        assert instances_needed([PendingDemand(5, 10)], 8) == 10
        # The 3-slot holes left by 5-slot tasks are filled by the 3-slot and smaller tasks.
        assert instances_needed([PendingDemand(5, 4), PendingDemand(3, 4)], 8) == 4
        assert instances_needed([PendingDemand(5, 4), PendingDemand(3, 4), PendingDemand(1, 1)], 8) == 5

    def test_repeated_entries_are_aggregated(self) -> None:
        per_trial = [PendingDemand(2, 1)] * 9 + [PendingDemand(8, 1)] * 3
        assert instances_needed(per_trial, 8) == instances_needed(
            [PendingDemand(2, 9), PendingDemand(8, 3)], 8
        )

    def test_huge_counts_cost_nothing(self) -> None:
        # One entry per shape, never one per task: a billion tasks are four shapes.
        demand = [PendingDemand(s, 10**9) for s in (1, 2, 4, 8)]
        assert instances_needed(demand, 8) == 15 * 10**9 // 8
        assert instances_needed([*demand, PendingDemand(1, 1)], 8) == 15 * 10**9 // 8 + 1

    def test_unschedulable_shapes_need_no_instance(self) -> None:
        assert instances_needed([PendingDemand(16, 5)], 8) == 0
        assert instances_needed([PendingDemand(16, 5), PendingDemand(8, 1)], 8) == 1

    def test_zero_slot_tasks_need_one_instance_only_when_alone(self) -> None:
        assert instances_needed([PendingDemand(0, 50)], 8) == 1
        assert instances_needed([PendingDemand(0, 50), PendingDemand(4, 3)], 8) == 2
        assert instances_needed([PendingDemand(0, 3)], 0) == 1
        assert instances_needed([PendingDemand(1, 3)], 0) == 0


# ---------------------------------------------------------------------------------------- scale up


class TestLaunch:
    def test_nothing_to_do_is_steady(self) -> None:
        d = decide([], [busy("a")], LIMITS, NOW)
        assert d.launch == 0 and d.terminate == ()
        assert d.reasons[0].startswith("steady: 1 instance (1 busy")

    def test_launches_for_unplaced_demand(self) -> None:
        d = decide([PendingDemand(4, 5)], [busy("a")], LIMITS, NOW)
        assert d.launch == 3
        assert "launch 3: 5 pending tasks need 3 instances" in d.reasons

    def test_booting_instances_absorb_by_free_slots_not_by_count(self) -> None:
        # Two 8-slot instances booting, three 5-slot tasks pending: only two fit (one each), so one
        # more instance is needed. "ceil(15/8) - 2 booting" would launch none and strand a task.
        d = decide([PendingDemand(5, 3)], [booting("b1"), booting("b2", state="requested")], LIMITS, NOW)
        assert d.launch == 1
        assert "2 starting instances absorb 2 pending tasks (10 slots)" in d.reasons
        assert "launch 1: 3 pending tasks need 3 instances, 2 starting" in d.reasons

    def test_booting_instances_absorb_many_small_tasks(self) -> None:
        d = decide([PendingDemand(1, 16)], [booting("b1"), booting("b2")], LIMITS, NOW)
        assert d.launch == 0
        d = decide([PendingDemand(1, 17)], [booting("b1"), booting("b2")], LIMITS, NOW)
        assert d.launch == 1

    def test_booting_instance_with_busy_slots_absorbs_only_its_free_slots(self) -> None:
        d = decide([PendingDemand(8, 1)], [booting("b1", busy=2)], LIMITS, NOW)
        assert d.launch == 1

    def test_idle_instance_absorbs_demand_instead_of_launching(self) -> None:
        # An agent that connected after the scheduler's pass: the demand fits on it.
        d = decide([PendingDemand(4, 2)], [idle("i1", idle_for=10 * MIN)], LIMITS, NOW)
        assert d.launch == 0 and d.terminate == ()
        assert "1 idle instance absorb 2 pending tasks (8 slots)" in d.reasons

    def test_busy_instances_free_slots_do_not_absorb(self) -> None:
        # The scheduler has seen busy instances' free slots; demand is additive to them.
        d = decide([PendingDemand(4, 1)], [busy("a", slots=4)], LIMITS, NOW)
        assert d.launch == 1

    def test_clamped_to_max_counting_live_instances(self) -> None:
        insts = [busy(f"a{k}") for k in range(8)] + [booting("b")]
        d = decide([PendingDemand(8, 5)], insts, LIMITS, NOW)
        assert d.launch == 1
        assert any("capped by max_instances 10 with 9 live" in r for r in d.reasons)

    def test_at_max_launches_nothing(self) -> None:
        d = decide([PendingDemand(8, 5)], [busy(f"a{k}") for k in range(10)], LIMITS, NOW)
        assert d.launch == 0
        assert any(r.startswith("launch 0:") and "capped by max_instances" in r for r in d.reasons)

    def test_min_instances_floor(self) -> None:
        d = decide([], [busy("a")], limits(min_instances=3), NOW)
        assert d.launch == 2
        assert "launch 2: min_instances 3 with 1 live" in d.reasons

    def test_min_floor_counts_booting_instances(self) -> None:
        assert decide([], [booting("b1"), booting("b2")], limits(min_instances=2), NOW).launch == 0

    def test_max_launch_per_decision(self) -> None:
        d = decide([PendingDemand(8, 7)], [], limits(max_launch_per_decision=3), NOW)
        assert d.launch == 3
        assert any("capped by max_launch_per_decision 3" in r for r in d.reasons)

    def test_unschedulable_shape_is_reported_and_not_launched_for(self) -> None:
        d = decide([PendingDemand(16, 2), PendingDemand(2, 1)], [], LIMITS, NOW)
        assert d.launch == 1
        assert any(r.startswith("unschedulable: 2 tasks need 16 slots") for r in d.reasons)
        only_big = decide([PendingDemand(16, 2)], [], LIMITS, NOW)
        assert only_big.launch == 0

    def test_a_gang_across_instances_is_demand_for_that_many_whole_instances(self) -> None:
        d = decide([PendingDemand(8, 1, instances=3)], [idle("i1", 10 * MIN)], limits(max_instances=3), NOW)
        assert d.launch == 2 and d.terminate == ()
        assert "1 idle instance absorb 1 pending task (8 slots)" in d.reasons

    def test_a_gang_wider_than_max_instances_launches_and_keeps_nothing(self) -> None:
        """Issue 28: a gang needing more whole instances than max_instances can never be placed; it
        held the pool's idle instances ("keeping 4 idle instances ... for pending demand") forever."""
        idle4 = [idle(f"i{k}", 10 * MIN) for k in range(4)]
        d = decide([PendingDemand(8, 1, instances=5), PendingDemand(2, 1)], idle4, limits(max_instances=4), NOW)
        assert d.launch == 0
        assert sorted(terminated_reasons(d)) == ["i0", "i1", "i2"]  # one stays for the 2-slot task
        assert ("unschedulable: 1 task need 5 whole instances of 8 slots at once (40 slots) but max_instances "
                "is 4; not launching or keeping instances for them") in d.reasons
        alone = decide([PendingDemand(8, 2, instances=5)], idle4, limits(max_instances=4), NOW)
        assert alone.launch == 0 and sorted(terminated_reasons(alone)) == ["i0", "i1", "i2", "i3"]
        assert any("2 tasks need 5 whole instances" in r for r in alone.reasons)
        assert not any("for pending demand" in r for r in alone.reasons)

    def test_zero_slot_tasks(self) -> None:
        assert decide([PendingDemand(0, 4)], [], LIMITS, NOW).launch == 1
        assert decide([PendingDemand(0, 4)], [booting("b")], LIMITS, NOW).launch == 0
        assert decide([PendingDemand(0, 4), PendingDemand(8, 1)], [], LIMITS, NOW).launch == 1
        cpu_pool = limits(slots_per_instance=0)
        assert decide([PendingDemand(0, 4)], [], cpu_pool, NOW).launch == 1

    def test_stopping_and_terminated_instances_are_not_capacity(self) -> None:
        gone = [booting("s1", state="stopping"), booting("t1", state="terminated")]
        d = decide([PendingDemand(8, 2)], gone, LIMITS, NOW)
        assert d.launch == 2 and d.terminate == ()
        full = [busy(f"a{k}") for k in range(10)] + gone
        assert decide([], full, LIMITS, NOW).terminate == ()


# ---------------------------------------------------------------------------------------- scale down


class TestTerminate:
    def test_long_idle_instance_is_terminated_with_reason(self) -> None:
        d = decide([], [idle("i1", idle_for=6 * MIN), idle("i2", idle_for=4 * MIN)], LIMITS, NOW)
        assert terminated_reasons(d) == {"i1": "idle for 6m (max_idle_agent_period 5m)"}
        assert "terminate i1: idle for 6m (max_idle_agent_period 5m)" in d.reasons

    def test_idle_exactly_the_period_is_kept(self) -> None:
        assert decide([], [idle("i1", idle_for=5 * MIN)], LIMITS, NOW).terminate == ()

    def test_idle_termination_never_goes_below_min_and_reaps_longest_idle_first(self) -> None:
        insts = [idle("i1", 7 * MIN), idle("i2", 30 * MIN), idle("i3", 9 * MIN)]
        d = decide([], insts, limits(min_instances=2), NOW)
        assert d.terminate_ids == ("i2",)
        assert "keeping 2 idle instances past max_idle_agent_period for min_instances 2" in d.reasons

    def test_busy_instance_is_never_terminated(self) -> None:
        long_ago = InstanceView("b", "running", NOW - 50 * 60 * MIN, True, NOW - 50 * 60 * MIN, None, 0, None)
        partly = busy("p", slots=1, age=50 * 60 * MIN)
        assert decide([], [long_ago, partly], LIMITS, NOW).terminate == ()

    def test_idle_kept_while_pending_demand_could_use_it(self) -> None:
        insts = [idle(f"i{k}", 30 * MIN) for k in range(4)]
        d = decide([PendingDemand(8, 1), PendingDemand(4, 1)], insts, LIMITS, NOW)
        # The demand fills two instances; the other two are surplus.
        assert d.launch == 0
        assert len(d.terminate) == 2
        assert "keeping 2 idle instances past max_idle_agent_period for pending demand" in d.reasons

    def test_recently_idle_instances_take_the_demand_first(self) -> None:
        insts = [idle("old", 30 * MIN), idle("fresh", 1 * MIN)]
        d = decide([PendingDemand(8, 1)], insts, LIMITS, NOW)
        assert d.terminate_ids == ("old",)

    def test_an_instance_whose_agent_is_disabled_takes_no_demand_and_is_reaped_first(self) -> None:
        from dataclasses import replace
        off = replace(idle("off", 30 * MIN), accepts_work=False)
        d = decide([PendingDemand(8, 1)], [off], LIMITS, NOW)
        # No room: a launch, and the disabled one goes (no flapping: the demand could never use it).
        assert d.launch == 1 and d.terminate_ids == ("off",)
        d = decide([PendingDemand(8, 1)], [off, idle("on", 40 * MIN)], LIMITS, NOW)
        assert d.launch == 0 and d.terminate_ids == ("off",)  # "on" takes the demand and stays, though idle longer
        assert terminated_reasons(d)["off"].endswith(": its agent is disabled, no arrival can use it")
        assert "keeping 1 idle instance past max_idle_agent_period for pending demand" in d.reasons

    def test_no_idle_termination_in_a_decision_that_launches(self) -> None:
        insts = [idle(f"i{k}", 30 * MIN) for k in range(2)]
        d = decide([PendingDemand(8, 5)], insts, LIMITS, NOW)
        assert d.launch == 3
        assert d.terminate == ()

    def test_agent_that_never_connected_is_terminated_and_replaced(self) -> None:
        stuck = booting("stuck", age=21 * MIN)
        d = decide([PendingDemand(8, 1)], [stuck, booting("ok", age=19 * MIN)], LIMITS, NOW)
        assert terminated_reasons(d) == {
            "stuck": "agent did not connect within max_agent_starting_period 20m (launched 21m ago)"
        }
        # "ok" absorbs the one pending task, so no replacement is needed for it...
        assert d.launch == 0
        # ...but with two tasks, the stuck instance's share is launched again.
        assert decide([PendingDemand(8, 2)], [stuck, booting("ok", age=19 * MIN)], LIMITS, NOW).launch == 1

    def test_stuck_instances_are_terminated_even_at_min(self) -> None:
        d = decide([], [booting("stuck", age=2 * 60 * MIN)], limits(min_instances=1), NOW)
        assert d.terminate_ids == ("stuck",)
        assert d.launch == 1

    def test_long_disconnected_is_terminated(self) -> None:
        d = decide([], [disconnected("d1", 11 * MIN), disconnected("d2", 9 * MIN)], LIMITS, NOW)
        assert terminated_reasons(d) == {"d1": "agent disconnected for 11m (max_disconnected_period 10m)"}

    def test_disconnected_within_grace_counts_as_live_but_absorbs_nothing(self) -> None:
        d = decide([PendingDemand(8, 1)], [disconnected("d1", 1 * MIN)], limits(max_instances=1), NOW)
        assert d.launch == 0 and d.terminate == ()
        assert decide([PendingDemand(8, 1)], [disconnected("d1", 1 * MIN)], LIMITS, NOW).launch == 1

    def test_unknown_disconnect_time_starts_the_grace_period_now(self) -> None:
        assert decide([], [disconnected("d1", None)], LIMITS, NOW).terminate == ()


class TestAboveMax:
    def test_sheds_newest_first_preferring_instances_without_work(self) -> None:
        insts = [
            busy("busy-new", age=1 * MIN),
            idle("idle-old", 1 * MIN, age=50 * MIN),
            idle("idle-new", 1 * MIN, age=10 * MIN),
            booting("boot", age=2 * MIN),
            disconnected("disc", 1 * MIN),
            busy("busy-old", age=90 * MIN),
        ]
        d = decide([], insts, limits(max_instances=3), NOW)
        assert d.terminate_ids == ("disc", "boot", "idle-new")
        assert all(
            r.startswith("above max_instances 3: shedding newest") for r in terminated_reasons(d).values()
        )
        assert d.launch == 0

    def test_busy_instances_above_max_are_left_to_drain(self) -> None:
        insts = [busy(f"b{k}", age=k * MIN) for k in range(5)] + [idle("i", 1 * MIN)]
        d = decide([PendingDemand(8, 3)], insts, limits(max_instances=3), NOW)
        assert d.terminate_ids == ("i",)
        assert d.launch == 0
        assert "2 busy instances above max_instances 3; shedding once idle" in d.reasons


class TestWording:
    def test_summary_for_resource_pool_describe(self) -> None:
        d = decide(
            [PendingDemand(2, 6), PendingDemand(1, 4)], [booting("b1"), idle("i1", 30 * MIN)], LIMITS, NOW
        )
        text = summarize(d)
        assert text.splitlines()[0] == f"launch {d.launch}, terminate {len(d.terminate)}"
        assert "  demand: 10 pending tasks (6x2 slots, 4x1 slot) for 8-slot instances" in text.splitlines()

    def test_every_termination_has_a_reason_line(self) -> None:
        insts = [idle("i1", 30 * MIN), booting("s", age=3 * 60 * MIN), disconnected("d", 20 * MIN)]
        d = decide([], insts, LIMITS, NOW)
        assert set(d.terminate_ids) == {"i1", "s", "d"}
        for t in d.terminate:
            assert t.reason
            assert f"terminate {t.id}: {t.reason}" in d.reasons

    def test_durations_with_hours(self) -> None:
        d = decide([], [idle("i1", 90 * MIN + timedelta(seconds=5))], LIMITS, NOW)
        assert d.terminate[0].reason == "idle for 1h30m5s (max_idle_agent_period 5m)"


class TestValidation:
    @pytest.mark.parametrize(
        "kw",
        [
            {"min_instances": -1},
            {"min_instances": 5, "max_instances": 4},
            {"slots_per_instance": -8},
            {"max_launch_per_decision": -1},
        ],
    )
    def test_bad_limits(self, kw: dict[str, int]) -> None:
        with pytest.raises(ValueError):
            limits(**kw)

    def test_bad_demand(self) -> None:
        with pytest.raises(ValueError):
            PendingDemand(-1, 1)
        with pytest.raises(ValueError):
            PendingDemand(1, -1)
        with pytest.raises(ValueError):
            PendingDemand(8, 1, instances=0)

    def test_duplicate_instance_ids_count_once(self) -> None:
        d = decide([], [busy("a"), busy("a")], limits(min_instances=2), NOW)
        assert d.launch == 1
