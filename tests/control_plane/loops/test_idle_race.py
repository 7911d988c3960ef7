"""The idle decision and the placement decision cannot race (issue 10, item 4), on both databases.

The autoscaler reads a snapshot, decides on it, then writes; placement does the same every half
second. These tests force the interleavings at the seams between read and write (the pure `decide`
and the scheduling policy, wrapped) and check that whichever write commits first wins: an instance
whose agent took an allocation is never terminated as idle, and an agent whose instance the
autoscaler began terminating is never given one."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from control_plane.core.states import InstanceState
from control_plane.db.engine import transaction
from control_plane.loops import placement
from control_plane.loops.autoscaler import decision as autoscaler_decision
from control_plane.master import Master
from tests.control_plane.loops.conftest import (
    ELASTIC,
    FakeClock,
    FakeCloud,
    add_allocation,
    agent,
    allocation,
)
from tests.control_plane.loops.test_autoscaler import (
    go_idle,
    idle_for_a_while,
    instance_rows,
    pool_row,
    scaler_for,
    two_booted,
)


@pytest.fixture
def cloud(clock: FakeClock) -> FakeCloud:
    return FakeCloud(clock)


def place_now(master: Master) -> None:
    with transaction(master.sessions) as s:
        placement.place(s, master, ELASTIC)


def decide_then(monkeypatch: pytest.MonkeyPatch, between: Callable[[Any], None]) -> None:
    """The autoscaler runs `between(decision)` after deciding on its snapshot, before writing."""
    real = autoscaler_decision.decide

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        decision = real(*args, **kwargs)
        between(decision)
        return decision

    monkeypatch.setattr(autoscaler_decision, "decide", wrapped)


def schedule_then(monkeypatch: pytest.MonkeyPatch, between: Callable[[], None]) -> None:
    """Placement runs `between()` after scheduling on its snapshot, before writing."""
    real = placement.scheduling_policy

    class Policy:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def schedule(self, *args: Any, **kwargs: Any) -> Any:
            decision = self.inner.schedule(*args, **kwargs)
            between()
            return decision

    monkeypatch.setattr(placement, "scheduling_policy", lambda kind: Policy(real(kind)))


def test_a_placement_committed_after_the_idle_decision_keeps_the_instance(
    loop_master: Master, cloud: FakeCloud, clock: FakeClock, monkeypatch: pytest.MonkeyPatch,
) -> None:
    scaler, inst = idle_for_a_while(loop_master, cloud, clock)
    [row] = instance_rows(loop_master)
    decided: list[list[str]] = []

    def trial_arrives_and_is_placed(decision: Any) -> None:
        decided.append([t.id for t in decision.terminate if t.presumes_idle])
        add_allocation(loop_master, "a2")
        place_now(loop_master)  # commits between the autoscaler's read and its write
        assert allocation(loop_master, "a2").agent_id == inst.id

    decide_then(monkeypatch, trial_arrives_and_is_placed)
    scaler.tick_pool(ELASTIC)

    assert decided == [[row.launch_id]]  # the snapshot said idle past the period
    assert cloud.terminate_calls == [] and inst.id in cloud.instances
    [after] = instance_rows(loop_master)
    assert (after.state, after.terminate_reason) == (InstanceState.RUNNING, None)
    assert agent(loop_master, inst.id).enabled
    a2 = allocation(loop_master, "a2")
    assert (a2.state, a2.agent_id) == ("assigned", inst.id)
    last = pool_row(loop_master).last_decision
    assert last is not None and last["terminate"] == []
    assert f"not terminating {row.launch_id}: its agent {inst.id} took 1 allocation since the decision" in (
        last["reasons"])

    # The next tick sees the instance busy: nothing to decide about it.
    monkeypatch.undo()
    clock.advance(seconds=30)
    scaler.tick_pool(ELASTIC)
    assert cloud.terminate_calls == [] and instance_rows(loop_master)[0].state == InstanceState.RUNNING


def test_an_agent_whose_instance_is_being_terminated_gets_no_allocation(
    loop_master: Master, cloud: FakeCloud, clock: FakeClock,
) -> None:
    scaler, inst = idle_for_a_while(loop_master, cloud, clock)
    scaler.tick_pool(ELASTIC)  # terminated as idle: the row is stopping, the agent disabled
    [row] = instance_rows(loop_master)
    assert row.state in (InstanceState.STOPPING, InstanceState.TERMINATED)

    add_allocation(loop_master, "a2")
    place_now(loop_master)

    a2 = allocation(loop_master, "a2")
    assert (a2.state, a2.agent_id) == ("pending", None)


def test_a_termination_committed_after_placements_snapshot_wins_over_the_placement(
    db_url: str, loop_master: Master, cloud: FakeCloud, clock: FakeClock, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Autoscaler reads (no demand) -> placement reads (a trial arrived, the agent is enabled) ->
    the autoscaler writes the termination -> placement writes. On PostgreSQL the termination commits
    first and placement's compare-and-set refuses the agent. On SQLite placement holds the database
    from its first read, so the autoscaler's write waits for placement's commit and then refuses
    the termination: the other order, with the same guarantee."""
    scaler, inst = idle_for_a_while(loop_master, cloud, clock)
    [row] = instance_rows(loop_master)
    decided, go = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def wait_for_go(decision: Any) -> None:
        assert [t.id for t in decision.terminate if t.presumes_idle] == [row.launch_id]
        decided.set()
        go.wait()

    def autoscaler_tick() -> None:
        try:
            scaler.tick_pool(ELASTIC)
        except BaseException as e:  # surfaced below
            errors.append(e)

    decide_then(monkeypatch, wait_for_go)
    ticker = threading.Thread(target=autoscaler_tick)
    ticker.start()
    decided.wait()
    add_allocation(loop_master, "a2")

    sqlite = db_url.startswith("sqlite")

    def let_the_autoscaler_write() -> None:
        go.set()
        if not sqlite:
            ticker.join()  # its write commits while placement's snapshot is still the old one

    schedule_then(monkeypatch, let_the_autoscaler_write)
    place_now(loop_master)
    ticker.join()
    assert errors == []

    a2 = allocation(loop_master, "a2")
    [after] = instance_rows(loop_master)
    if sqlite:
        assert (a2.state, a2.agent_id) == ("assigned", inst.id)
        assert after.state == InstanceState.RUNNING and cloud.terminate_calls == []
    else:
        assert (a2.state, a2.agent_id) == ("pending", None)
        assert after.state in (InstanceState.STOPPING, InstanceState.TERMINATED)
        # then the idle policy's forecast and costs (core/scaling/idle.py)
        assert after.terminate_reason.startswith("idle for 1m1s (max_idle_agent_period 1m)")
        assert cloud.terminated == [inst.id]
        assert not agent(loop_master, inst.id).enabled


def test_a_gang_placed_after_the_idle_decision_keeps_every_instance_it_took(
    loop_master: Master, cloud: FakeCloud, clock: FakeClock, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 28: the re-check under the agent's lock counted only the allocations the agent is the
    chief of, so a gang placed across two idle instances between the decision and its write lost
    its second instance."""
    scaler = scaler_for(loop_master, cloud)
    for alloc_id in ("a1", "a2"):
        add_allocation(loop_master, alloc_id, slots=2)
    ids = two_booted(loop_master, scaler, cloud, clock)
    for alloc_id, iid in zip(("a1", "a2"), ids, strict=True):
        go_idle(loop_master, alloc_id, iid)
    clock.advance(seconds=61)
    decided: list[list[str]] = []

    def gang_arrives_and_is_placed(decision: Any) -> None:
        decided.append(sorted(t.id for t in decision.terminate if t.presumes_idle))
        add_allocation(loop_master, "gang", slots=4)
        place_now(loop_master)  # commits between the autoscaler's read and its write
        assert [p["agent"] for p in allocation(loop_master, "gang").placement or ()] == ids

    decide_then(monkeypatch, gang_arrives_and_is_placed)
    scaler.tick_pool(ELASTIC)

    assert decided == [sorted(r.launch_id for r in instance_rows(loop_master))]  # both idle in the snapshot
    assert cloud.terminate_calls == [] and sorted(cloud.instances) == ids
    assert [r.state for r in instance_rows(loop_master)] == [InstanceState.RUNNING] * 2
    assert all(agent(loop_master, iid).enabled for iid in ids)
    last = pool_row(loop_master).last_decision
    assert last is not None and last["terminate"] == []
    for iid in ids:
        assert any(f"its agent {iid} took 1 allocation since the decision" in r for r in last["reasons"])
