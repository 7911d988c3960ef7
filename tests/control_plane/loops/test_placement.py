"""The placement loop (heartbeats, preemption escalation, placement) on both databases, with agents
and allocations as rows and a fake clock; each test ticks the loop by hand."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from sqlalchemy import select

from control_plane import auth
from control_plane.auth import Principal
from control_plane.core.expconf import config_to_dict, parse_experiment_config
from control_plane.db.engine import transaction
from control_plane.db.models import Agent, Allocation, Experiment, Instance, ModelDefinition, Token, User
from control_plane.loops import placement
from control_plane.master import Master
from control_plane.services import agents as agents_service
from control_plane.services import allocations, gangs
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


def test_after_a_restart_the_grace_counts_from_when_the_api_answers(loop_master: Master, clock: FakeClock) -> None:
    """The API workers of a restarted master took long to start (20 s on a loaded host, longer
    than a short grace): no agent could reach it, so none is counted silent until the API answers,
    and the grace runs from then (issue 27: trials lost to a slow restart after an outage)."""
    grace = loop_master.config.agent_lost_grace_s
    add_agent(loop_master, "a1", pool=POOL, slots=1, last_seen=clock() - timedelta(seconds=600))
    add_allocation(loop_master, "run", pool=POOL, state="running", agent_id="a1", slot_ids=["0"])
    loop_master.serving_since = None  # det-master's start: its API does not answer yet
    clock.advance(seconds=3 * grace)
    placement.tick(loop_master)
    assert agent(loop_master, "a1").state == "connected" and allocation(loop_master, "run").state == "running"

    loop_master.mark_serving()
    clock.advance(seconds=grace - 1)
    placement.tick(loop_master)
    assert allocation(loop_master, "run").state == "running"
    clock.advance(seconds=2)
    placement.tick(loop_master)
    assert allocation(loop_master, "run").end_cause == "agent_lost"  # silent for the whole grace


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

    clock.advance(seconds=loop_master.config.preemption_grace_s)
    heartbeat(loop_master, "a1")
    placement.tick(loop_master)
    assert allocation(loop_master, "low").kill_requested is False  # the grace is not over yet

    clock.advance(seconds=1)
    placement.tick(loop_master)
    assert allocation(loop_master, "low").kill_requested is True


def test_the_preemption_grace_runs_from_the_request_not_from_the_start(
    loop_master: Master, clock: FakeClock,
) -> None:
    """A trial that has run for hours and is asked to stop gets the whole grace to checkpoint."""
    add_agent(loop_master, "a1", pool=POOL, slots=2)
    add_allocation(loop_master, "long", pool=POOL, slots=2, priority=60, state="running", agent_id="a1",
                   slot_ids=["0", "1"])
    clock.advance(hours=3)
    heartbeat(loop_master, "a1")
    add_allocation(loop_master, "urgent", pool=POOL, slots=2, priority=10)
    placement.tick(loop_master)
    long = allocation(loop_master, "long")
    assert (long.preempt_requested, long.kill_requested) == (True, False)
    assert long.preempt_requested_at == clock()

    clock.advance(seconds=loop_master.config.preemption_grace_s - 1)
    heartbeat(loop_master, "a1")
    placement.tick(loop_master)
    assert allocation(loop_master, "long").kill_requested is False
    clock.advance(seconds=2)
    heartbeat(loop_master, "a1")
    placement.tick(loop_master)
    assert allocation(loop_master, "long").kill_requested is True


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


# --------------------------------------------------------------------------------------------
# Scheduling: gangs across agents, job attributes from the experiment, waiting reasons
# --------------------------------------------------------------------------------------------


def _stored_config(resources: dict[str, object] | None) -> dict[str, Any]:
    """A config as the experiment service stores it: validated and fully defaulted."""
    text = json.dumps({"entrypoint": "python3 train.py", "searcher": {"name": "single", "metric": "loss"},
                       "checkpoint_storage": {"type": "shared_fs", "host_path": "/ckpt"}, "resources": resources or {}})
    cfg, _ = parse_experiment_config(text, default_resource_pool=POOL)
    return config_to_dict(cfg)


def _experiment(master: Master, *, priority: int | None = None, weight: float = 1.0,
                queue_position: float | None = None, resources: dict[str, object] | None = None,
                config: dict[str, Any] | None = None) -> int:
    with transaction(master.sessions) as s:
        owner = s.scalar(select(User))
        assert owner is not None
        md = ModelDefinition(archive=b"", size_bytes=0, sha256="0" * 64, file_count=0)
        s.add(md)
        s.flush()
        exp = Experiment(name="e", config=config if config is not None else _stored_config(resources),
                         original_config="", state="ACTIVE",
                         owner_id=owner.id, model_definition_id=md.id, resource_pool=POOL, priority=priority,
                         weight=weight, job_id=f"job-{md.id}", queue_position=queue_position)
        s.add(exp)
        s.flush()
        return exp.id


def _of_experiment(master: Master, alloc_id: str, exp_id: int) -> None:
    with transaction(master.sessions) as s:
        row = s.get(Allocation, alloc_id)
        assert row is not None
        row.experiment_id = exp_id


def test_a_gang_larger_than_any_agent_is_placed_whole_across_agents_and_each_agent_sees_it(
    loop_master: Master, clock: FakeClock,
) -> None:
    for name in ("g1", "g2", "g3"):
        add_agent(loop_master, name, pool=POOL, slots=2)
    add_allocation(loop_master, "gang", pool=POOL, slots=4)
    add_allocation(loop_master, "odd", pool=POOL, slots=3)  # not whole agents of 2: never placed

    placement.tick(loop_master)

    gang = allocation(loop_master, "gang")
    assert gang.state == "assigned" and gang.placement is not None and len(gang.placement) == 2
    members = [p["agent"] for p in gang.placement]
    assert gang.agent_id == members[0] and gang.slot_ids == gang.placement[0]["slots"] == ["0", "1"]
    assert gang.waiting_reason is None
    odd = allocation(loop_master, "odd")
    assert odd.state == "pending" and (odd.waiting_reason or "").startswith("unschedulable: needs 3 slots")
    with loop_master.sessions() as s:
        for member in members:  # every agent of the gang gets it in its commands, with its own slots
            view = agents_service.get_agent(s, member)
            assert [a.id for a in view.allocations] == ["gang"]
        listed = {v.agent.id: [a.id for a in v.allocations] for v in agents_service.list_agents(s, POOL)}
    assert sorted(m for m, ids in listed.items() if ids == ["gang"]) == sorted(members)
    with transaction(loop_master.sessions) as s:  # their idle clocks stop: both are busy
        assert all(not s.get(Agent, m).idle_since for m in members)  # type: ignore[union-attr]


def test_a_gang_is_not_assigned_when_one_of_its_agents_is_being_terminated(loop_master: Master) -> None:
    add_agent(loop_master, "g1", pool=POOL, slots=2)
    add_agent(loop_master, "g2", pool=POOL, slots=2, instance_id="i-ending")
    with transaction(loop_master.sessions) as s:  # terminated by the autoscaler since the snapshot
        s.add(Instance(launch_id="l-1", pool=POOL, provider="local", instance_id="i-ending", state="stopping"))
    add_allocation(loop_master, "gang", pool=POOL, slots=4)

    placement.tick(loop_master)

    gang = allocation(loop_master, "gang")
    assert (gang.state, gang.agent_id, gang.placement) == ("pending", None, None)  # whole or nothing


def test_a_gang_ends_whole_when_one_of_its_agents_is_lost(loop_master: Master, clock: FakeClock) -> None:
    add_agent(loop_master, "g1", pool=POOL, slots=2)
    add_agent(loop_master, "g2", pool=POOL, slots=2)
    add_allocation(loop_master, "gang", pool=POOL, slots=4)
    clock.advance(seconds=loop_master.config.agent_lost_grace_s + 1)  # past the restart grace
    heartbeat(loop_master, "g1")
    heartbeat(loop_master, "g2")
    placement.tick(loop_master)
    chief = allocation(loop_master, "gang").agent_id
    member = "g2" if chief == "g1" else "g1"

    clock.advance(seconds=loop_master.config.agent_lost_grace_s + 1)
    heartbeat(loop_master, chief or "")  # only the chief still answers
    placement.tick(loop_master)

    gang = allocation(loop_master, "gang")  # the member's part is gone; the chief is owed a kill
    assert gang.state == "assigned" and [p["state"] for p in gang.placement or []] == ["assigned", "exited"]
    with loop_master.sessions() as s:
        assert gangs.owes(s.get(Allocation, "gang"), chief or "", clock().timestamp()) == "kill"  # type: ignore[arg-type]
    placement.tick(loop_master)  # a lost agent's part is gone once: nothing more happens
    with transaction(loop_master.sessions) as s:  # the chief's part exits (the agent reports it)
        row = s.get(Allocation, "gang")
        assert row is not None
        allocations.part_exited(s, loop_master, row, chief or "", -15, "killed at the master's request")

    gang = allocation(loop_master, "gang")
    assert (gang.state, gang.end_cause) == ("terminated", "agent_lost")
    assert member in (gang.exit_reason or "")


def test_the_queue_orders_by_the_jobs_priority_and_position_and_says_why_the_rest_waits(
    loop_master: Master, clock: FakeClock,
) -> None:
    add_agent(loop_master, "a", pool=POOL, slots=3)
    urgent = _experiment(loop_master, priority=5)
    from_config = _experiment(loop_master, resources={"priority": 20})
    moved = _experiment(loop_master, queue_position=-1.0)  # default priority, moved to the front of it
    plain = _experiment(loop_master)
    for name, exp in (("plain", plain), ("moved", moved), ("from-config", from_config), ("urgent", urgent)):
        add_allocation(loop_master, name, pool=POOL, slots=1, priority=99)  # the row's own copy is stale
        _of_experiment(loop_master, name, exp)
        clock.advance(seconds=1)

    placement.tick(loop_master)

    assigned = {n for n in ("urgent", "from-config", "moved", "plain") if allocation(loop_master, n).state == "assigned"}
    assert assigned == {"urgent", "from-config", "moved"}
    assert allocation(loop_master, "plain").waiting_reason == "waiting for 1 slot on one agent; 1 agent has at most 0 free"


def test_max_slots_of_the_job_caps_its_running_allocations(loop_master: Master) -> None:
    add_agent(loop_master, "a", pool=POOL, slots=4)
    exp = _experiment(loop_master, resources={"max_slots": 2})
    for name in ("t1", "t2", "t3"):
        add_allocation(loop_master, name, pool=POOL, slots=1)
        _of_experiment(loop_master, name, exp)

    placement.tick(loop_master)

    states = sorted(allocation(loop_master, n).state for n in ("t1", "t2", "t3"))
    assert states == ["assigned", "assigned", "pending"]
    waiting = next(n for n in ("t1", "t2", "t3") if allocation(loop_master, n).state == "pending")
    assert allocation(loop_master, waiting).waiting_reason == "its job holds 2 slots of its max_slots 2"


def test_a_stored_config_that_no_longer_validates_is_placed_with_the_defaults(loop_master: Master) -> None:
    add_agent(loop_master, "a", pool=POOL, slots=4)
    # No entrypoint, searcher or storage: its max_slots is not believed, nor does it stop the tick.
    broken = _experiment(loop_master, config={"resources": {"max_slots": 1, "priority": 20}})
    for name in ("b1", "b2"):
        add_allocation(loop_master, name, pool=POOL, slots=1)
        _of_experiment(loop_master, name, broken)

    placement.tick(loop_master)

    assert [allocation(loop_master, n).state for n in ("b1", "b2")] == ["assigned", "assigned"]


def test_a_trial_marked_not_preemptible_is_never_preempted(loop_master: Master) -> None:
    """`resources.preemptible: false` (Shipyard): higher-priority work waits instead of evicting it."""
    add_agent(loop_master, "a1", pool=POOL, slots=2)
    add_allocation(loop_master, "low", pool=POOL, slots=2, priority=60, state="running", agent_id="a1",
                   slot_ids=["0", "1"])
    _of_experiment(loop_master, "low", _experiment(loop_master, resources={"preemptible": False}))
    add_allocation(loop_master, "high", pool=POOL, slots=2, priority=10)
    placement.tick(loop_master)
    assert allocation(loop_master, "low").preempt_requested is False
    assert allocation(loop_master, "high").state == "pending"
    # The same trial without the mark yields.
    _of_experiment(loop_master, "low", _experiment(loop_master, resources={"priority": 60}))
    placement.tick(loop_master)
    assert allocation(loop_master, "low").preempt_requested is True
