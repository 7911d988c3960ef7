"""The placement loop (heartbeats, preemption escalation, placement) on both databases, with agents
and allocations as rows and a fake clock; each test ticks the loop by hand."""

from __future__ import annotations

from sqlalchemy import select

from control_plane.db.engine import transaction
from control_plane.db.models import Agent, Allocation, Token
from control_plane.loops import placement
from control_plane.master import Master
from tests.control_plane.loops.conftest import FakeClock, add_agent, add_allocation, agent, allocation

POOL = "default"


def test_allocations_are_placed_whole_on_one_agent(loop_master: Master, clock: FakeClock) -> None:
    add_agent(loop_master, "small-1", pool=POOL, slots=2)
    add_agent(loop_master, "small-2", pool=POOL, slots=2)
    add_allocation(loop_master, "gang-3", pool=POOL, slots=3)  # 4 slots free in all, 2 per agent
    add_allocation(loop_master, "pair", pool=POOL, slots=2)
    clock.advance(seconds=1)

    placement.tick(loop_master)

    gang = allocation(loop_master, "gang-3")
    assert (gang.state, gang.agent_id, gang.slot_ids) == ("pending", None, [])  # never split across agents
    pair = allocation(loop_master, "pair")
    assert pair.state == "assigned" and pair.agent_id in ("small-1", "small-2")
    assert sorted(pair.slot_ids) == ["0", "1"] and pair.assigned_at == clock()
    with loop_master.sessions() as s:  # the trial's session token is issued with the placement
        assert s.scalar(select(Token).where(Token.allocation_id == "pair")) is not None

    add_agent(loop_master, "big", pool=POOL, slots=4)
    placement.tick(loop_master)
    gang = allocation(loop_master, "gang-3")
    assert (gang.state, gang.agent_id, len(gang.slot_ids)) == ("assigned", "big", 3)


def test_an_agent_silent_past_the_heartbeat_timeout_is_lost_but_not_during_the_restart_grace(
    loop_master: Master, clock: FakeClock,
) -> None:
    timeout = loop_master.config.agent_heartbeat_timeout_s
    assert timeout < placement.RESTART_GRACE.total_seconds()  # the case this test is about
    add_agent(loop_master, "a1", pool=POOL, slots=1)
    add_allocation(loop_master, "run", pool=POOL, state="running", agent_id="a1", slot_ids=["0"])

    clock.advance(seconds=timeout + 1)  # silent past the timeout, but the master only just started
    placement.tick(loop_master)
    assert agent(loop_master, "a1").state == "connected"
    assert allocation(loop_master, "run").state == "running"

    clock.advance(seconds=placement.RESTART_GRACE.total_seconds())
    placement.tick(loop_master)
    lost = agent(loop_master, "a1")
    assert (lost.state, lost.disconnected_at) == ("disconnected", clock())
    ended = allocation(loop_master, "run")
    assert (ended.state, ended.end_cause) == ("terminated", "agent_lost")


def heartbeat(master: Master, agent_id: str) -> None:
    with transaction(master.sessions) as s:
        row = s.get(Agent, agent_id)
        assert row is not None
        row.last_seen = master.clock()


def test_an_agent_that_keeps_heartbeating_stays(loop_master: Master, clock: FakeClock) -> None:
    add_agent(loop_master, "a1", pool=POOL, slots=1)
    for _ in range(4):
        clock.advance(seconds=loop_master.config.agent_heartbeat_timeout_s - 1)
        heartbeat(loop_master, "a1")
        placement.tick(loop_master)
    assert agent(loop_master, "a1").state == "connected"


def test_higher_priority_work_preempts_and_the_preemption_escalates_after_the_grace(
    loop_master: Master, clock: FakeClock,
) -> None:
    add_agent(loop_master, "a1", pool=POOL, slots=2)
    add_allocation(loop_master, "low", pool=POOL, slots=2, priority=60, state="running", agent_id="a1",
                   slot_ids=["0", "1"])
    add_allocation(loop_master, "high", pool=POOL, slots=2, priority=10)  # 1 is the highest

    placement.tick(loop_master)
    low = allocation(loop_master, "low")
    assert (low.preempt_requested, low.kill_requested) == (True, False)  # asked to stop gracefully
    assert allocation(loop_master, "high").state == "pending"  # waits for the slots to free up

    clock.advance(seconds=placement.PREEMPT_GRACE.total_seconds())
    heartbeat(loop_master, "a1")
    placement.tick(loop_master)
    assert allocation(loop_master, "low").kill_requested is False  # the grace is not over yet

    clock.advance(seconds=1)
    placement.tick(loop_master)
    assert allocation(loop_master, "low").kill_requested is True


def test_equal_priority_does_not_preempt(loop_master: Master) -> None:
    add_agent(loop_master, "a1", pool=POOL, slots=1)
    add_allocation(loop_master, "first", pool=POOL, state="running", agent_id="a1", slot_ids=["0"])
    add_allocation(loop_master, "second", pool=POOL)
    placement.tick(loop_master)
    assert allocation(loop_master, "first").preempt_requested is False
    assert allocation(loop_master, "second").state == "pending"


def test_idle_since_is_set_when_an_agent_runs_nothing_and_cleared_when_it_does(
    loop_master: Master, clock: FakeClock,
) -> None:
    add_agent(loop_master, "a1", pool=POOL, slots=1)
    placement.tick(loop_master)
    idle_from = clock()
    assert agent(loop_master, "a1").idle_since == idle_from

    clock.advance(seconds=10)
    placement.tick(loop_master)
    assert agent(loop_master, "a1").idle_since == idle_from  # idle since the first tick, not the last

    add_allocation(loop_master, "work", pool=POOL)
    placement.tick(loop_master)  # placed here: the agent is busy from the next tick on
    assert allocation(loop_master, "work").agent_id == "a1"
    placement.tick(loop_master)
    assert agent(loop_master, "a1").idle_since is None

    with transaction(loop_master.sessions) as s:
        alloc = s.get(Allocation, "work")
        assert alloc is not None
        alloc.state = "terminated"
    clock.advance(seconds=5)
    placement.tick(loop_master)
    assert agent(loop_master, "a1").idle_since == clock()


def test_a_disconnected_agent_gets_no_idle_time_and_no_work(loop_master: Master, clock: FakeClock) -> None:
    add_agent(loop_master, "gone", pool=POOL, slots=2, state="disconnected")
    add_allocation(loop_master, "work", pool=POOL)
    placement.tick(loop_master)
    assert agent(loop_master, "gone").idle_since is None
    assert allocation(loop_master, "work").state == "pending"
