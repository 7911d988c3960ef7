"""The placement loop (heartbeats, preemption escalation, placement) on both databases, with agents
and allocations as rows and a fake clock; each test ticks the loop by hand."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select

from control_plane import auth
from control_plane.auth import Principal
from control_plane.db.engine import transaction
from control_plane.db.models import Agent, Allocation, Token
from control_plane.loops import placement
from control_plane.master import Master
from control_plane.services import agents as agents_service
from control_plane.services import allocations
from shipyard_common.agent_protocol import RegisterRequest, RegisterResponse, SlotInfo
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


def _token_revoked(master: Master, alloc_id: str) -> bool:
    with master.sessions() as s:
        rows = list(s.scalars(select(Token).where(Token.allocation_id == alloc_id)))
    assert rows
    return all(t.revoked_at is not None for t in rows)


def _with_token(master: Master, alloc_id: str) -> None:
    with transaction(master.sessions) as s:
        row = s.get(Allocation, alloc_id)
        assert row is not None
        allocations.ensure_allocation_token(s, master, row)


def test_the_lost_grace_derives_from_the_agents_reconnect_cap(loop_master: Master) -> None:
    cfg = loop_master.config
    assert cfg.agent_lost_grace_s == cfg.agent_reconnect_cap_s + cfg.agent_heartbeat_timeout_s
    assert cfg.agent_lost_grace_s > cfg.agent_reconnect_cap_s  # longer than any wait between attempts


def test_after_a_restart_allocations_outlive_the_outage_until_the_lost_grace(
    loop_master: Master, clock: FakeClock,
) -> None:
    """The master was down for a minute: its agents' last polls are a minute old when it starts.
    Their allocations (and tokens) stay until the grace, counted from the start, has passed."""
    grace = loop_master.config.agent_lost_grace_s
    timeout = loop_master.config.agent_heartbeat_timeout_s
    add_agent(loop_master, "a1", pool=POOL, slots=1, last_seen=clock() - timedelta(seconds=60))
    add_allocation(loop_master, "run", pool=POOL, state="running", agent_id="a1", slot_ids=["0"])
    _with_token(loop_master, "run")

    placement.tick(loop_master)  # just started: nobody could have polled yet
    assert agent(loop_master, "a1").state == "connected"

    clock.advance(seconds=timeout + 1)  # disconnected: no new work, but its tasks are kept
    placement.tick(loop_master)
    assert agent(loop_master, "a1").state == "disconnected"
    clock.advance(seconds=grace - timeout - 2)  # one second before the grace ends
    placement.tick(loop_master)
    assert allocation(loop_master, "run").state == "running"
    assert not _token_revoked(loop_master, "run")

    clock.advance(seconds=2)
    placement.tick(loop_master)
    ended = allocation(loop_master, "run")
    assert (ended.state, ended.end_cause) == ("terminated", "agent_lost")
    assert _token_revoked(loop_master, "run")


def test_an_agent_that_reconnects_within_the_grace_keeps_its_allocations(
    loop_master: Master, clock: FakeClock,
) -> None:
    add_agent(loop_master, "a1", pool=POOL, slots=1, last_seen=clock() - timedelta(seconds=180))
    add_allocation(loop_master, "run", pool=POOL, state="running", agent_id="a1", slot_ids=["0"])
    _with_token(loop_master, "run")
    with transaction(loop_master.sessions) as s:
        enrol = agents_service.issue_agent_token(s, loop_master, pool=POOL)
    p = _principal(loop_master, enrol)
    # The agent's reconnect wait is at most the cap: it is back before the grace ends.
    clock.advance(seconds=loop_master.config.agent_reconnect_cap_s)
    resp = _register(loop_master, p, running=["run"])
    assert resp.kill == [] and resp.reconnect_backoff_max_s == loop_master.config.agent_reconnect_cap_s
    for _ in range(3):
        clock.advance(seconds=loop_master.config.agent_heartbeat_timeout_s - 1)
        heartbeat(loop_master, "a1")
        placement.tick(loop_master)
    assert allocation(loop_master, "run").state == "running" and not _token_revoked(loop_master, "run")
    assert agent(loop_master, "a1").state == "connected"


def test_a_silent_agent_is_disconnected_then_lost_and_its_late_return_kills_the_replaced_task(
    loop_master: Master, clock: FakeClock,
) -> None:
    with transaction(loop_master.sessions) as s:
        enrol = agents_service.issue_agent_token(s, loop_master, pool=POOL)
    first = _register(loop_master, _principal(loop_master, enrol))
    cred = _principal(loop_master, first.agent_credential or "")
    add_allocation(loop_master, "run", pool=POOL, state="running", agent_id="a1", slot_ids=["0"])
    _with_token(loop_master, "run")
    clock.advance(seconds=loop_master.config.agent_lost_grace_s + 60)  # long past the restart grace
    heartbeat(loop_master, "a1")

    clock.advance(seconds=loop_master.config.agent_heartbeat_timeout_s + 1)
    placement.tick(loop_master)
    assert agent(loop_master, "a1").state == "disconnected"
    assert allocation(loop_master, "run").state == "running"  # may only be reconnecting

    clock.advance(seconds=loop_master.config.agent_reconnect_cap_s)
    placement.tick(loop_master)
    ended = allocation(loop_master, "run")
    assert (ended.state, ended.end_cause) == ("terminated", "agent_lost") and _token_revoked(loop_master, "run")

    # It comes back, still running the task the master has given up on: the answer says kill it.
    late = _register(loop_master, cred, running=["run"])
    assert late.kill == ["run"]
    assert allocation(loop_master, "run").end_cause == "agent_lost"  # the record is not rewritten


def _principal(master: Master, token: str) -> Principal:
    with master.sessions() as s:
        p = auth.resolve_token(s, token, now=master.clock())
    assert p is not None
    return p


def _register(master: Master, p: Principal, running: list[str] | None = None) -> RegisterResponse:
    with transaction(master.sessions) as s:
        return agents_service.register_agent(s, master, p, RegisterRequest(
            agent_id="a1", resource_pool=POOL, slots=[SlotInfo(id="0")], running_allocations=running or []))


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
