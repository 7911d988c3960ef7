"""The agent service (control_plane/services/agents.py) called directly, on SQLite and PostgreSQL:
enrolment and agent credentials, registration and its reconciliation after a restart, the commands
an agent is owed, the task event state machine, exits, stale sessions and the task spec. The pool
loop is ticked by hand."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
import yaml
from sqlalchemy import event, select
from sqlalchemy.exc import IntegrityError

from control_plane import auth
from control_plane.auth import Principal, TokenKind
from control_plane.core import states as st
from control_plane.db.engine import transaction
from control_plane.db.models import Agent, Allocation, Instance, Token, Trial
from control_plane.errors import Conflict, Invalid, NotFound, PermissionDenied
from control_plane.loops import placement
from control_plane.services import agents as service
from shipyard_common.agent_protocol import (
    EventsRequest,
    KillCommand,
    RegisterRequest,
    SlotInfo,
    StartCommand,
    TaskEvent,
)
from tests.control_plane.services import builders

CONFIG: dict[str, Any] = {
    "name": "agents",
    "entrypoint": "python3 train.py --fast",
    "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 20}},
    "hyperparameters": {"lr": 0.1},
    "environment": {"environment_variables": {"cpu": ["ON_CPU=1"], "cuda": ["ON_GPU=1"]}},
}


def submit(master, config: dict[str, Any] | None = None) -> int:  # type: ignore[no-untyped-def]
    return builders.create_experiment(master, yaml.safe_dump(config or CONFIG))


def agent_principal(master, pool: str = "default", agent_id: str | None = None) -> Principal:  # type: ignore[no-untyped-def]
    with transaction(master.sessions) as s:
        token = service.issue_agent_token(s, master, pool=pool, agent_id=agent_id)
    with transaction(master.sessions) as s:
        p = auth.resolve_token(s, token, now=master.clock())
    assert p is not None and p.kind is TokenKind.AGENT
    return p


def register(master, p: Principal, agent_id: str = "a1", slots: int = 1,  # type: ignore[no-untyped-def]
             running: list[str] | None = None, slot_type: str = "cpu"):
    with transaction(master.sessions) as s:
        return service.register_agent(s, master, p, RegisterRequest(
            agent_id=agent_id, resource_pool="default", version="test",
            slots=[SlotInfo(id=str(i), type=slot_type) for i in range(slots)],  # type: ignore[arg-type]
            running_allocations=running or []))


def credential(master, resp) -> Principal:  # type: ignore[no-untyped-def]
    """The agent credential a registration returned at enrolment, as the master resolves it."""
    assert resp.agent_credential
    with transaction(master.sessions) as s:
        p = auth.resolve_token(s, resp.agent_credential, now=master.clock())
    assert p is not None and p.kind is TokenKind.AGENT_CREDENTIAL
    return p


def commands(master, p: Principal, session: str, agent_id: str = "a1") -> list[Any]:  # type: ignore[no-untyped-def]
    with transaction(master.sessions) as s:
        return service.pending_commands(s, master, p, agent_id, session)


def report(master, p: Principal, session: str, alloc: str, kind: str, exit_code: int | None = None,  # type: ignore[no-untyped-def]
           message: str | None = None, agent_id: str = "a1") -> None:
    with transaction(master.sessions) as s:
        service.apply_events(s, master, p, agent_id, EventsRequest(session_id=session, events=[
            TaskEvent(allocation_id=alloc, type=kind, exit_code=exit_code, message=message)]))  # type: ignore[arg-type]


def states(master, alloc_id: str) -> tuple[str, str | None]:  # type: ignore[no-untyped-def]
    """(allocation state, its trial's state)"""
    with transaction(master.sessions) as s:
        alloc = s.get(Allocation, alloc_id)
        assert alloc is not None
        trial = s.get(Trial, alloc.trial_id)
        return alloc.state, trial.state if trial else None


def started(master, p: Principal, session: str, count: int = 1) -> list[StartCommand]:  # type: ignore[no-untyped-def]
    placement.tick(master)
    cmds = commands(master, p, session)
    assert len(cmds) == count and all(isinstance(c, StartCommand) for c in cmds)
    return cmds


def one_task(master, slot_type: str = "cpu") -> tuple[Principal, str, StartCommand]:  # type: ignore[no-untyped-def]
    """A submitted single-trial experiment, a registered one-slot agent and the start it is owed:
    (the agent's credential, its session, the start command)."""
    submit(master)
    first = register(master, agent_principal(master), slot_type=slot_type)
    cred = credential(master, first)
    (cmd,) = started(master, cred, first.session_id)
    return cred, first.session_id, cmd


def test_register_records_the_agent_under_a_new_session(master) -> None:  # type: ignore[no-untyped-def]
    p = agent_principal(master)
    first = register(master, p, slots=2)
    assert first.session_id and first.kill == [] and first.cluster_id == master.cluster_id
    # half the heartbeat timeout (a waiting poll is the heartbeat), at most 10 s
    assert first.heartbeat_interval_s == min(10.0, master.config.agent_heartbeat_timeout_s / 2)
    with transaction(master.sessions) as s:
        agent = s.get(Agent, "a1")
        assert agent is not None and agent.state == st.AgentState.CONNECTED and agent.pool == "default"
        assert [sl["id"] for sl in agent.slots] == ["0", "1"] and agent.version == "test"
    cred = credential(master, first)
    second = register(master, cred, slots=2)
    assert second.session_id != first.session_id and second.agent_credential is None
    # The first session is over: the agent must use the new one.
    with pytest.raises(Conflict, match="stale agent session"):
        commands(master, cred, first.session_id)
    assert commands(master, cred, second.session_id) == []
    assert [v.agent.id for v in _list(master)] == ["a1"]


def _list(master) -> list[service.AgentView]:  # type: ignore[no-untyped-def]
    with transaction(master.sessions) as s:
        return service.list_agents(s, "default")


def test_register_refusals(master) -> None:  # type: ignore[no-untyped-def]
    p = agent_principal(master)
    with pytest.raises(Invalid, match="slot ids must be unique"), transaction(master.sessions) as s:
        service.register_agent(s, master, p, RegisterRequest(
            agent_id="a1", resource_pool="default", slots=[SlotInfo(id="0"), SlotInfo(id="0")]))
    with pytest.raises(Invalid, match="no resource pool named 'nope'"), transaction(master.sessions) as s:
        service.register_agent(s, master, p, RegisterRequest(agent_id="a1", resource_pool="nope"))
    with pytest.raises(Invalid, match="no resource pool named 'nope'"), transaction(master.sessions) as s:
        service.issue_agent_token(s, master, pool="nope")
    bound = agent_principal(master, agent_id="a2")
    with pytest.raises(PermissionDenied, match="another agent"):
        register(master, bound, agent_id="a1")
    first = register(master, p)
    session = first.session_id
    with pytest.raises(PermissionDenied, match="cannot act as agent 'a1': it only enrols"):
        commands(master, bound, session)
    with pytest.raises(PermissionDenied, match="belongs to agent 'a1', not 'ghost'"):
        commands(master, credential(master, first), session, agent_id="ghost")


def test_start_command_carries_the_task_spec(master) -> None:  # type: ignore[no-untyped-def]
    p, session, cmd = one_task(master)
    spec = cmd.spec
    exp_id = spec.experiment_id
    assert spec.allocation_id == cmd.allocation_id and exp_id is not None
    with transaction(master.sessions) as s:
        trial = s.get(Trial, spec.trial_id)
        assert trial is not None and trial.experiment_id == exp_id and spec.run_id is not None
    assert spec.argv == ["sh", "-c", "python3 train.py --fast"]
    assert spec.slot_ids == ["0"] and spec.model_definition_path == f"/api/v1/experiments/{exp_id}/model_def"
    assert spec.kill_grace_seconds == master.config.task_kill_grace_s
    # The cluster's own storage root, the one place besides its work dir the agent makes directories.
    assert spec.container is not None
    assert spec.container.storage_root == master.config.default_checkpoint_storage["host_path"]
    env = spec.env
    assert env["ON_CPU"] == "1" and "ON_GPU" not in env  # the variables of this agent's device type
    assert env["DET_EXPERIMENT_ID"] == str(exp_id) and env["DET_TRIAL_ID"] == str(spec.trial_id)
    assert env["DET_ALLOCATION_ID"] == cmd.allocation_id and env["DET_AGENT_ID"] == "a1"
    assert json.loads(env["DET_HPARAMS"]) == {"lr": 0.1} and json.loads(env["DET_SLOT_IDS"]) == ["0"]
    assert json.loads(env["DET_EXPERIMENT_CONFIG"])["entrypoint"] == CONFIG["entrypoint"]
    assert env["DET_MASTER"] == master.config.advertised_url and env["DET_TASK_TYPE"] == "TRIAL"
    # The token is the allocation's own credential, recorded for it.
    assert env["DET_SESSION_TOKEN"] == spec.token
    with transaction(master.sessions) as s:
        trial_p = auth.resolve_token(s, spec.token or "", now=master.clock())
    assert trial_p is not None and trial_p.kind is TokenKind.ALLOCATION
    assert trial_p.allocation_id == cmd.allocation_id and trial_p.trial_id == spec.trial_id
    # Level-triggered: the start is repeated until the agent reports the task.
    assert [c.allocation_id for c in commands(master, p, session)] == [cmd.allocation_id]


def test_a_gpu_agent_gets_the_cuda_variables(master) -> None:  # type: ignore[no-untyped-def]
    _, _, cmd = one_task(master, slot_type="cuda")
    assert cmd.spec.env["ON_GPU"] == "1" and "ON_CPU" not in cmd.spec.env


def test_events_move_the_allocation_forward_only(master) -> None:  # type: ignore[no-untyped-def]
    p, session, cmd = one_task(master)
    alloc = cmd.allocation_id
    assert states(master, alloc) == (st.AllocationState.ASSIGNED, st.TrialState.QUEUED)
    report(master, p, session, alloc, "pulling")
    assert states(master, alloc) == (st.AllocationState.PULLING, st.TrialState.PULLING)
    assert commands(master, p, session) == []  # reported: no more start
    report(master, p, session, alloc, "starting")
    assert states(master, alloc) == (st.AllocationState.STARTING, st.TrialState.STARTING)
    report(master, p, session, alloc, "running")
    assert states(master, alloc) == (st.AllocationState.RUNNING, st.TrialState.RUNNING)
    with transaction(master.sessions) as s:
        started_at = s.get(Allocation, alloc).started_at  # type: ignore[union-attr]
    assert started_at is not None
    # Late or repeated events change nothing.
    report(master, p, session, alloc, "pulling")
    report(master, p, session, alloc, "running")
    assert states(master, alloc) == (st.AllocationState.RUNNING, st.TrialState.RUNNING)
    with transaction(master.sessions) as s:
        assert s.get(Allocation, alloc).started_at == started_at  # type: ignore[union-attr]
    # An event for an allocation that is not there is ignored, not an error.
    report(master, p, session, "no-such-allocation", "running")


def test_exit_ends_the_allocation_and_revokes_its_token(master) -> None:  # type: ignore[no-untyped-def]
    p, session, cmd = one_task(master)
    alloc = cmd.allocation_id
    report(master, p, session, alloc, "running")
    report(master, p, session, alloc, "exited", exit_code=3, message="exited with code 3")
    with transaction(master.sessions) as s:
        row = s.get(Allocation, alloc)
        assert row is not None and row.state == st.AllocationState.TERMINATED
        assert (row.end_cause, row.exit_code, row.exit_reason) == (st.ExitCause.EXITED, 3, "exited with code 3")
        tokens = list(s.scalars(select(Token).where(Token.allocation_id == alloc)))
        assert tokens and all(t.revoked_at is not None for t in tokens)
        assert auth.resolve_token(s, cmd.spec.token or "", now=master.clock()) is None
    # A repeated exit is ignored.
    report(master, p, session, alloc, "exited", exit_code=0)
    with transaction(master.sessions) as s:
        assert s.get(Allocation, alloc).exit_code == 3  # type: ignore[union-attr]


def test_kill_is_commanded_until_the_exit_is_reported(master) -> None:  # type: ignore[no-untyped-def]
    p, session, cmd = one_task(master)
    report(master, p, session, cmd.allocation_id, "running")
    with transaction(master.sessions) as s:
        s.get(Allocation, cmd.allocation_id).kill_requested = True  # type: ignore[union-attr]
    (kill,) = commands(master, p, session)
    assert isinstance(kill, KillCommand) and kill.allocation_id == cmd.allocation_id
    assert kill.grace_seconds == master.config.task_kill_grace_s
    report(master, p, session, cmd.allocation_id, "exited", exit_code=143)
    with transaction(master.sessions) as s:
        assert s.get(Allocation, cmd.allocation_id).end_cause == st.ExitCause.KILLED  # type: ignore[union-attr]
    assert commands(master, p, session) == []


def test_reregistration_after_an_agent_restart_reconciles_its_tasks(master) -> None:  # type: ignore[no-untyped-def]
    submit(master, {**CONFIG, "searcher": {"name": "random", "metric": "loss", "max_trials": 2,
                                           "max_length": {"batches": 20}},
                    "hyperparameters": {"lr": {"type": "double", "minval": 0.01, "maxval": 0.1}}})
    first = register(master, agent_principal(master), slots=2)
    session = first.session_id
    p = credential(master, first)
    kept, lost = (c.allocation_id for c in started(master, p, session, count=2))
    for alloc in (kept, lost):
        report(master, p, session, alloc, "running")
    # The agent comes back still running one task, plus one the master never gave it.
    again = register(master, p, slots=2, running=[kept, "from-before"])
    assert again.kill == ["from-before"]
    assert states(master, kept) == (st.AllocationState.RUNNING, st.TrialState.RUNNING)
    with transaction(master.sessions) as s:
        row = s.get(Allocation, lost)
        assert row is not None and row.state == st.AllocationState.TERMINATED and row.end_cause == st.ExitCause.AGENT_LOST
    # The old session is stale for events too.
    with pytest.raises(Conflict):
        report(master, p, session, kept, "exited", exit_code=0)
    assert states(master, kept)[0] == st.AllocationState.RUNNING
    assert [v.allocations[0].id for v in _list(master) if v.allocations] == [kept]


# -- identity: the pool token only enrols ---------------------------------------------------------

def test_enrolment_returns_a_credential_bound_to_the_agent_and_stored_hashed(master) -> None:  # type: ignore[no-untyped-def]
    first = register(master, agent_principal(master))
    cred = credential(master, first)
    assert (cred.agent_id, cred.pool) == ("a1", "default")
    with transaction(master.sessions) as s:
        rows = list(s.scalars(select(Token).where(Token.kind == TokenKind.AGENT_CREDENTIAL.value)))
        assert [(r.agent_id, r.token_hash) for r in rows] == [("a1", auth.token_digest(first.agent_credential or ""))]
        assert service.is_enrolled(s, "a1") and not service.is_enrolled(s, "a2")
    assert first.agent_credential and first.agent_credential not in repr(first)  # never in a log line


def test_an_enrolled_agent_id_refuses_the_enrolment_token_and_keeps_its_tasks(master) -> None:  # type: ignore[no-untyped-def]
    p, session, cmd = one_task(master)
    report(master, p, session, cmd.allocation_id, "running")
    # Anyone holding the pool's token (another agent of the pool, a fresh one) tries to take a1 over.
    for intruder in (agent_principal(master), agent_principal(master, agent_id="a1")):
        with pytest.raises(PermissionDenied, match="already enrolled.*own agent credential"):
            register(master, intruder, running=[])
    # Nothing changed: a1's session, its allocation and its trial's token are as they were.
    assert commands(master, p, session) == []
    assert states(master, cmd.allocation_id) == (st.AllocationState.RUNNING, st.TrialState.RUNNING)
    with transaction(master.sessions) as s:
        assert auth.resolve_token(s, cmd.spec.token or "", now=master.clock()) is not None


def test_reregistration_with_the_credential_keeps_allocations(master) -> None:  # type: ignore[no-untyped-def]
    submit(master)
    first = register(master, agent_principal(master))
    cred = credential(master, first)
    (cmd,) = started(master, cred, first.session_id)
    report(master, cred, first.session_id, cmd.allocation_id, "running")
    again = register(master, cred, running=[cmd.allocation_id])
    assert again.kill == [] and again.agent_credential is None  # the same identity, no new credential
    assert again.reconnect_backoff_max_s == master.config.agent_reconnect_cap_s
    assert states(master, cmd.allocation_id) == (st.AllocationState.RUNNING, st.TrialState.RUNNING)
    assert commands(master, cred, again.session_id) == []


def test_one_agent_cannot_register_poll_or_post_for_another(master) -> None:  # type: ignore[no-untyped-def]
    p, session, cmd = one_task(master)  # a1 runs a task
    y = credential(master, register(master, agent_principal(master), agent_id="y"))
    with pytest.raises(PermissionDenied, match="another agent"):
        register(master, y, agent_id="a1")
    with pytest.raises(PermissionDenied, match="belongs to agent 'y', not 'a1'"):
        commands(master, y, session)
    with pytest.raises(PermissionDenied, match="belongs to agent 'y', not 'a1'"):
        report(master, y, session, cmd.allocation_id, "exited", exit_code=0)
    assert states(master, cmd.allocation_id)[0] == st.AllocationState.ASSIGNED


def test_the_pool_token_only_enrols_it_never_acts_as_an_agent(master) -> None:  # type: ignore[no-untyped-def]
    # The shared pool token (even one issued for this very agent id) and a launch's bootstrap token
    # can enrol, but polling an agent's commands (they carry trial tokens) or reporting its events
    # takes the agent's own credential, whoever knows the session id.
    cred, session, cmd = one_task(master)
    with transaction(master.sessions) as s:
        s.add(Instance(launch_id="launch-x", pool="default", provider="local", state="running"))
        boot = auth.issue_token(s, TokenKind.BOOTSTRAP, now=master.clock(), ttl=None, pool="default",
                                launch_id="launch-x")
    with transaction(master.sessions) as s:
        boot_p = auth.resolve_token(s, boot, now=master.clock())
    assert boot_p is not None
    for pool_p in (agent_principal(master), agent_principal(master, agent_id="a1"), boot_p):
        with pytest.raises(PermissionDenied, match="cannot act as agent 'a1': it only enrols"):
            commands(master, pool_p, session)
        with pytest.raises(PermissionDenied, match="cannot act as agent 'a1': it only enrols"):
            report(master, pool_p, session, cmd.allocation_id, "exited", exit_code=0)
    assert states(master, cmd.allocation_id)[0] == st.AllocationState.ASSIGNED
    assert [c.allocation_id for c in commands(master, cred, session)] == [cmd.allocation_id]


def test_an_admin_reset_lets_the_agent_id_enrol_again(master) -> None:  # type: ignore[no-untyped-def]
    p = agent_principal(master)
    first = register(master, p)
    old = first.agent_credential or ""
    cred = credential(master, first)
    with transaction(master.sessions) as s:
        assert service.reset_enrolment(s, master, "a1") == 1
        assert auth.resolve_token(s, old, now=master.clock()) is None  # the old credential is dead
    with pytest.raises(Conflict):  # and so is its session
        commands(master, cred, first.session_id)
    again = register(master, p)
    assert again.agent_credential and again.agent_credential != old
    with pytest.raises(NotFound), transaction(master.sessions) as s:
        service.reset_enrolment(s, master, "ghost")


def test_a_bootstrap_token_enrols_its_instance_once_and_the_credential_dies_with_it(master) -> None:  # type: ignore[no-untyped-def]
    with transaction(master.sessions) as s:
        s.add(Instance(launch_id="launch-1", pool="default", provider="local", state="running"))
        boot = auth.issue_token(s, TokenKind.BOOTSTRAP, now=master.clock(), ttl=None, pool="default",
                                launch_id="launch-1")
    with transaction(master.sessions) as s:
        p = auth.resolve_token(s, boot, now=master.clock())
    assert p is not None

    def reg(principal: Principal, agent_id: str = "i-1"):  # type: ignore[no-untyped-def]
        with transaction(master.sessions) as s:
            return service.register_agent(s, master, principal, RegisterRequest(
                agent_id=agent_id, resource_pool="default", instance_id="i-1", slots=[SlotInfo(id="0")]))

    first = reg(p)
    cred = credential(master, first)
    assert cred.launch_id == "launch-1"
    with pytest.raises(PermissionDenied, match="already enrolled"):
        reg(p)  # the launch's token only enrols
    with pytest.raises(PermissionDenied, match="already enrolled agent 'i-1'"):
        reg(p, agent_id="i-2")  # and only one agent
    assert reg(cred).agent_credential is None  # the agent's own credential works
    # The instance ends: every token of its launch is revoked, the agent credential included.
    with transaction(master.sessions) as s:
        for t in s.scalars(select(Token).where(Token.launch_id == "launch-1")):
            t.revoked_at = master.clock()
        assert auth.resolve_token(s, first.agent_credential or "", now=master.clock()) is None


# -- concurrent enrolment: the database keeps one -------------------------------------------------

def _race_enrolments(master, agent_id: str) -> list[Any]:  # type: ignore[no-untyped-def]
    """Two enrolments of `agent_id` with the pool token, started together. On PostgreSQL both are
    held, once each has found the id not enrolled and written its credential, until the other is
    there too, so both flush into the database at the same moment. SQLite takes the write lock at
    BEGIN (db/engine.py), so there the second cannot start before the first commits."""
    tokens = [agent_principal(master), agent_principal(master)]
    start = threading.Barrier(2, timeout=10)
    at_flush = threading.Barrier(2, timeout=10)
    overlap = master.engine.dialect.name == "postgresql"

    def hold(session, _ctx, _instances) -> None:  # type: ignore[no-untyped-def]
        enrolling = any(isinstance(o, Token) and o.kind == TokenKind.AGENT_CREDENTIAL.value for o in session.new)
        if overlap and enrolling and not session.info.get("held"):
            session.info["held"] = True
            at_flush.wait()

    results: list[Any] = [None, None]

    def enrol(i: int) -> None:
        start.wait()
        try:
            results[i] = register(master, tokens[i], agent_id=agent_id)
        except Exception as e:  # noqa: BLE001 - the outcome is what the test looks at
            results[i] = e

    event.listen(master.sessions, "before_flush", hold)
    try:
        threads = [threading.Thread(target=enrol, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
    finally:
        event.remove(master.sessions, "before_flush", hold)
    return results


def _exactly_one_winner(master, agent_id: str, results: list[Any]) -> None:  # type: ignore[no-untyped-def]
    won = [r for r in results if not isinstance(r, Exception)]
    lost = [r for r in results if isinstance(r, Exception)]
    assert len(won) == 1 and len(lost) == 1, results
    if master.engine.dialect.name == "postgresql":  # both got past the check: the database decided
        assert isinstance(lost[0], Conflict) and "same moment" in str(lost[0]), lost[0]
    else:  # serialized: the second saw the first's commit
        assert isinstance(lost[0], PermissionDenied) and "already enrolled" in str(lost[0]), lost[0]
    with transaction(master.sessions) as s:
        live = list(s.scalars(select(Token).where(Token.kind == TokenKind.AGENT_CREDENTIAL.value,
                                                  Token.agent_id == agent_id, Token.revoked_at.is_(None))))
        assert [t.token_hash for t in live] == [auth.token_digest(won[0].agent_credential)]
        agent = s.get(Agent, agent_id)
        assert agent is not None and agent.session_id == won[0].session_id
    cred = credential(master, won[0])
    assert commands(master, cred, won[0].session_id, agent_id=agent_id) == []


def test_two_enrolments_racing_for_a_new_agent_id_leave_one_credential(master) -> None:  # type: ignore[no-untyped-def]
    _exactly_one_winner(master, "new-1", _race_enrolments(master, "new-1"))


def test_two_enrolments_racing_after_a_reset_leave_one_credential(master) -> None:  # type: ignore[no-untyped-def]
    # The agent's row exists (its primary key does not collide): the unique index on live agent
    # credentials decides.
    register(master, agent_principal(master), agent_id="re-1")
    with transaction(master.sessions) as s:
        service.reset_enrolment(s, master, "re-1")
    _exactly_one_winner(master, "re-1", _race_enrolments(master, "re-1"))


def test_the_database_refuses_a_second_live_credential_for_one_agent(master) -> None:  # type: ignore[no-untyped-def]
    with transaction(master.sessions) as s:
        auth.issue_token(s, TokenKind.AGENT_CREDENTIAL, now=master.clock(), ttl=None, pool="default", agent_id="d1")
    with pytest.raises(IntegrityError), transaction(master.sessions) as s:
        auth.issue_token(s, TokenKind.AGENT_CREDENTIAL, now=master.clock(), ttl=None, pool="default", agent_id="d1")
    with transaction(master.sessions) as s:  # a revoked one does not count; other kinds are not concerned
        for row in s.scalars(select(Token).where(Token.agent_id == "d1")):
            row.revoked_at = master.clock()
    with transaction(master.sessions) as s:
        auth.issue_token(s, TokenKind.AGENT_CREDENTIAL, now=master.clock(), ttl=None, pool="default", agent_id="d1")
        auth.issue_token(s, TokenKind.AGENT, now=master.clock(), ttl=None, pool="default", agent_id="d1")
        auth.issue_token(s, TokenKind.AGENT, now=master.clock(), ttl=None, pool="default", agent_id="d1")
