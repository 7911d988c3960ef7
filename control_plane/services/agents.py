"""Agents: their credentials, registration (and reconciliation after a restart of either side),
the commands they are owed, the task events they report, and the task spec of an allocation.

The wire models are the protocol's own (shipyard_common.agent_protocol), the same the agent uses;
docs/PROTOCOL.md describes the exchange. Every function works inside the caller's transaction and
raises control_plane.errors.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import or_, select, tuple_, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from control_plane import auth
from control_plane.auth import Principal, TokenKind
from control_plane.core import gang_run
from control_plane.core import states as st
from control_plane.core.containers import container_spec
from control_plane.core.expconf import ConfigInvalid, ExperimentConfig
from control_plane.core.host_access import storage_root
from control_plane.db.models import (
    Agent,
    Allocation,
    Checkpoint,
    ConsolidationMove,
    Experiment,
    Instance,
    Token,
    Trial,
    User,
)
from control_plane.errors import Conflict, Internal, bad_request, forbidden, not_found
from control_plane.master import Master
from control_plane.services import allocations, gangs, interruptions, lifecycle, tasks
from shipyard_common.agent_protocol import (
    Command,
    EventsRequest,
    KillCommand,
    RegisterRequest,
    RegisterResponse,
    StartCommand,
    TaskEvent,
    TaskSpec,
)
from shipyard_common.task_env import TrialEnvironment

log = logging.getLogger("shipyard.agents")

# The longest command long-poll the master asks of an agent (it announces it at registration and the
# agent lowers its poll timeout to it). A waiting poll is itself the heartbeat (frontdoor/agent_polls.py
# writes `last_seen` for every waiting poll every 2 s), so the poll's length only bounds how long a
# dead agent's last poll keeps it counted alive: half the heartbeat timeout, at most this.
HEARTBEAT_INTERVAL_MAX_S = 10.0


def heartbeat_interval_s(master: Master) -> float:
    return min(HEARTBEAT_INTERVAL_MAX_S, master.config.agent_heartbeat_timeout_s / 2)

# A task event's effect on its allocation and on the allocation's trial.
_EVENT_STATES: dict[str, tuple[st.AllocationState, st.TrialState]] = {
    "pulling": (st.AllocationState.PULLING, st.TrialState.PULLING),
    "starting": (st.AllocationState.STARTING, st.TrialState.STARTING),
    "running": (st.AllocationState.RUNNING, st.TrialState.RUNNING),
}


def issue_agent_token(s: Session, master: Master, *, pool: str, agent_id: str | None = None,
                      ttl_hours: float | None = None) -> str:
    """A credential for agents of `pool` (for one agent id, if given)."""
    if master.config.pool(pool) is None:
        raise bad_request(f"no resource pool named {pool!r}", "resourcePool")
    return auth.issue_token(s, TokenKind.AGENT, now=master.clock(),
                            ttl=timedelta(hours=ttl_hours) if ttl_hours else None, pool=pool, agent_id=agent_id)


ENROLMENT_KINDS = (TokenKind.AGENT, TokenKind.BOOTSTRAP)


def _credential_rows(s: Session, agent_id: str) -> list[Token]:
    """The live credentials of `agent_id` (at most one, unless two enrolments raced)."""
    return list(s.scalars(select(Token).where(Token.kind == TokenKind.AGENT_CREDENTIAL.value,
                                              Token.agent_id == agent_id, Token.revoked_at.is_(None))))


def is_enrolled(s: Session, agent_id: str) -> bool:
    return bool(_credential_rows(s, agent_id))


def reset_enrolment(s: Session, master: Master, agent_id: str) -> int:
    """Revoke the agent's credential so that the next registration of its id with an enrolment
    token enrols it again (a host rebuilt under the same name, a lost state directory). Its current
    session ends too: a poll answers 409 and the agent must register, with a credential that is no
    longer accepted. Returns how many credentials were revoked."""
    rows = _credential_rows(s, agent_id)
    agent = s.get(Agent, agent_id)
    if not rows and agent is None:
        raise not_found(f"agent {agent_id}")
    for row in rows:
        row.revoked_at = master.clock()
    if agent is not None:
        agent.session_id = secrets.token_hex(16)  # no one holds this session
    log.info("event=agent_enrolment_reset agent_id=%s credentials=%d", agent_id, len(rows))
    return len(rows)


def check_agent_credential(s: Session, p: Principal, agent_id: str, pool: str, instance_id: str | None) -> None:
    if p.pool != pool:
        raise forbidden(f"this credential is for resource pool {p.pool!r}, not {pool!r}")
    if p.agent_id is not None and p.agent_id != agent_id:
        raise forbidden(f"this credential belongs to another agent ({p.agent_id!r}), not {agent_id!r}")
    if p.kind is TokenKind.AGENT_CREDENTIAL:
        return
    if p.kind not in ENROLMENT_KINDS:
        raise forbidden(f"a {p.kind.value} token cannot register an agent")
    if is_enrolled(s, agent_id):
        # The shared pool token (or a launch's bootstrap token) only enrols: whoever holds it must
        # not take over an agent that exists, its session, its tasks or their tokens.
        raise forbidden(f"agent {agent_id!r} is already enrolled: it must register with its own agent "
                        f"credential (kept in its work directory, state/agent-credential), not with the "
                        f"enrolment token; if that credential is lost, an admin can reset the enrolment "
                        f"(det agent reset-enrolment {agent_id})")
    if p.kind is TokenKind.BOOTSTRAP:
        # A bootstrap credential is bound to one launch; the instance presenting it must be the
        # one the cloud reports for that launch.
        inst = s.get(Instance, p.launch_id) if p.launch_id else None
        if inst is None or inst.pool != pool:
            raise forbidden("this credential is not bound to a known instance of this pool")
        if inst.state in (st.InstanceState.STOPPING, st.InstanceState.TERMINATED):
            raise forbidden("this credential's instance has been terminated")
        if not instance_id:
            raise forbidden("a bootstrap credential must be presented with the instance id")
        if inst.instance_id is None:
            # The launch call has not returned yet: the first instance to present the secret
            # binds it (only that launch's user-data carries it).
            inst.instance_id = instance_id
        elif instance_id != inst.instance_id:
            raise forbidden("this credential belongs to another instance")
        # One launch, one agent: the instance's token does not enrol further agent ids.
        others = s.scalars(select(Token.agent_id).where(
            Token.kind == TokenKind.AGENT_CREDENTIAL.value, Token.launch_id == p.launch_id,
            Token.agent_id != agent_id, Token.revoked_at.is_(None))).first()
        if others is not None:
            raise forbidden(f"this instance's token already enrolled agent {others!r}")


def register_agent(s: Session, master: Master, p: Principal, req: RegisterRequest) -> RegisterResponse:
    """Record the agent and its slots under a new session, and reconcile what it reports running
    with what the master wants there: keep what is still wanted on this agent, tell it to kill the
    rest; anything the master thought ran there but the agent no longer has is lost."""
    pool_cfg = master.config.pool(req.resource_pool)
    if pool_cfg is None:
        raise bad_request(f"no resource pool named {req.resource_pool!r}", "resourcePool")
    check_agent_credential(s, p, req.agent_id, req.resource_pool, req.instance_id)
    ids = [sl.id for sl in req.slots]
    if len(set(ids)) != len(ids):
        raise bad_request("slot ids must be unique", "slots")
    now = master.clock()
    agent = s.get(Agent, req.agent_id)
    if agent is not None and agent.pool != req.resource_pool:
        raise forbidden(f"agent {req.agent_id!r} is registered in pool {agent.pool!r}")
    session_id = secrets.token_hex(16)
    slots = [sl.model_dump(by_alias=True) for sl in req.slots]
    if pool_cfg.max_slots_per_agent is not None:
        slots = slots[: pool_cfg.max_slots_per_agent]
    try:
        agent, credential = _record_registration(s, p, req, agent, session_id, slots, now)
    except IntegrityError:
        # Another registration of this id enrolled it (or created its row) at the same moment and
        # the database kept that one: the agents' primary key and the unique index on live agent
        # credentials (db/models.py, Token) refuse the second. Nothing of the loser is written.
        raise Conflict(f"agent {req.agent_id!r} was enrolled by another registration at the same moment: "
                       f"only one enrolment of an agent id succeeds") from None
    reported = set(req.running_allocations)
    wanted = {a.id for a in gangs.holding(s, agent.id)}
    keep = reported & wanted
    kill = sorted(reported - wanted)
    allocations.end_agent_allocations(s, master, agent.id, st.ExitCause.AGENT_LOST, "agent restarted without it", keep=keep)
    log.info("event=agent_registered agent_id=%s pool=%s slots=%d keep=%d kill=%d",
             agent.id, agent.pool, len(slots), len(keep), len(kill))
    master.notify(s)
    return RegisterResponse(session_id=session_id, heartbeat_interval_s=heartbeat_interval_s(master), kill=kill,
                            cluster_id=master.cluster_id, agent_credential=credential,
                            reconnect_backoff_max_s=master.config.agent_reconnect_cap_s)


def _record_registration(s: Session, p: Principal, req: RegisterRequest, agent: Agent | None,
                         session_id: str, slots: list[dict[str, object]], now: datetime) -> tuple[Agent, str | None]:
    """Write the agent's row and, at enrolment, its credential, then flush: a racing enrolment of
    the same id fails here (IntegrityError), not at commit."""
    if agent is None:
        agent = Agent(id=req.agent_id, pool=req.resource_pool, session_id=session_id, registered_at=now)
        s.add(agent)
    agent.session_id = session_id
    agent.state = st.AgentState.CONNECTED
    agent.slots = slots
    agent.version = req.version
    agent.addresses = req.addresses
    agent.instance_id = req.instance_id
    agent.last_seen = now
    agent.disconnected_at = None
    if p.launch_id:
        inst = s.get(Instance, p.launch_id)
        if inst is not None:
            inst.agent_id = agent.id
            if inst.resumed_at is not None and (inst.resume_connected_at is None
                                                or inst.resume_connected_at < inst.resumed_at):
                # Back from the warm pool: its start time is measured, and its idle time starts now.
                inst.resume_connected_at = now
                agent.idle_since = now
        # Used once, the bootstrap credential lives as long as its instance (it is revoked when
        # the instance ends), so an agent restarted by systemd can register again.
        tok = s.get(Token, p.token_id)
        if tok is not None:
            tok.expires_at = None
    credential: str | None = None
    if p.kind is not TokenKind.AGENT_CREDENTIAL:
        # Enrolment: from now on only this credential registers (and acts for) this agent id. An
        # instance's credential carries its launch id, so it is revoked when the instance ends.
        credential = auth.issue_token(s, TokenKind.AGENT_CREDENTIAL, now=now, ttl=None, pool=req.resource_pool,
                                      agent_id=req.agent_id, launch_id=p.launch_id)
    s.flush()
    if credential is not None:
        log.info("event=agent_enrolled agent_id=%s pool=%s via=%s", req.agent_id, req.resource_pool, p.kind.value)
    return agent, credential


def touch_agent(s: Session, master: Master, p: Principal, agent_id: str, session_id: str) -> Agent:
    """The agent, if `p` is its own credential and `session_id` its current session; marks it seen.

    Only the agent's credential (issued at its enrolment) acts as the agent: the shared pool token
    and a launch's bootstrap token only enrol, and another agent's credential is refused, so no one
    can poll an agent's commands (which carry trial tokens) or report its tasks' events."""
    if p.kind is not TokenKind.AGENT_CREDENTIAL:
        raise forbidden(f"a {p.kind.value} token cannot act as agent {agent_id!r}: it only enrols; the agent "
                        f"polls and reports with its own agent credential (returned by its enrolment)")
    if p.agent_id != agent_id:
        raise forbidden(f"this credential belongs to agent {p.agent_id!r}, not {agent_id!r}")
    agent = s.get(Agent, agent_id)
    if agent is None:
        raise not_found(f"agent {agent_id}")
    if p.pool != agent.pool:
        raise forbidden(f"this credential is for resource pool {p.pool!r}, not {agent.pool!r}")
    if agent.session_id != session_id or agent.state != st.AgentState.CONNECTED:
        raise Conflict("stale agent session: register again")
    agent.last_seen = master.clock()
    return agent


def pending_commands(s: Session, master: Master, p: Principal, agent_id: str, session_id: str) -> list[Command]:
    """What the agent must do now (an empty list: nothing yet). Level-triggered: a start is repeated
    until the agent reports the task, a kill until it reports the exit."""
    agent = touch_agent(s, master, p, agent_id, session_id)
    commands: list[Command] = []
    for alloc in gangs.holding(s, agent.id):
        owed = _owed(master, alloc, agent.id)
        if owed == "kill":
            commands.append(KillCommand(allocation_id=alloc.id, grace_seconds=master.config.task_kill_grace_s))
        elif owed == "start":
            commands.append(StartCommand(allocation_id=alloc.id, spec=task_spec(s, master, alloc, agent)))
    return commands


def _owed(master: Master, alloc: Allocation, agent_id: str) -> str | None:
    if gangs.is_gang(alloc):  # each agent of a gang is owed its own part's start or kill
        return gangs.owes(alloc, agent_id, master.clock().timestamp())
    return "kill" if alloc.kill_requested else "start" if alloc.state == st.AllocationState.ASSIGNED else None


def has_news(s: Session, master: Master, p: Principal, agent_id: str, session_id: str) -> bool:
    """Whether `pending_commands` would answer anything but "nothing yet": a command, or a refusal
    (wrong credential, unknown agent, stale session). Read-only: a waiting command long-poll is
    re-checked with it (in batches: `agents_with_news`) and leaves the write (`touch_agent`'s
    heartbeat) to every few seconds."""
    return agent_id in agents_with_news(s, master, {agent_id: (p, session_id)})


def apply_events(s: Session, master: Master, p: Principal, agent_id: str, req: EventsRequest) -> None:
    """Task events move allocations (and their trials) forward; an exit ends the allocation.
    Events are idempotent: a repeated, late or foreign one changes nothing."""
    agent = touch_agent(s, master, p, agent_id, req.session_id)
    for ev in req.events:
        alloc = s.get(Allocation, ev.allocation_id)
        if alloc is None or alloc.state == st.AllocationState.TERMINATED:
            continue
        if gangs.is_gang(alloc):
            _apply_gang_event(s, master, alloc, agent.id, ev)
        elif alloc.agent_id == agent.id:
            _apply_event(s, master, alloc, ev)
    master.notify(s)


def _apply_gang_event(s: Session, master: Master, alloc: Allocation, agent_id: str, ev: TaskEvent) -> None:
    """An event of one part of a gang: the allocation moves with its least advanced part and ends
    when every part has exited (services/gangs.py)."""
    if ev.type == "exited":
        allocations.part_exited(s, master, alloc, agent_id, ev.exit_code, ev.message)
        return
    state = gangs.progressed(alloc, agent_id, ev.type)
    if state is not None and state in _EVENT_STATES:
        _move(s, master, alloc, *_EVENT_STATES[state])


def _apply_event(s: Session, master: Master, alloc: Allocation, ev: TaskEvent) -> None:
    if ev.type == "exited":
        allocations.end_allocation(s, master, alloc, cause=st.ExitCause.EXITED, reason=ev.message, exit_code=ev.exit_code)
        return
    alloc_state, trial_state = _EVENT_STATES[ev.type]
    _move(s, master, alloc, alloc_state, trial_state)


def _move(s: Session, master: Master, alloc: Allocation, alloc_state: st.AllocationState,
          trial_state: st.TrialState) -> None:
    # Forward only: a late "starting" after "running" is ignored.
    if alloc.state == alloc_state or not st.can_transition(alloc.state, alloc_state):
        return
    alloc.state = alloc_state
    if alloc_state == st.AllocationState.RUNNING:
        alloc.started_at = master.clock()
    trial = s.get(Trial, alloc.trial_id) if alloc.trial_id else None
    if trial is not None and trial.state not in st.TRIAL_TERMINAL and trial.state != st.TrialState.STOPPING_KILLED:
        trial.state = trial_state


def task_spec(s: Session, master: Master, alloc: Allocation, agent: Agent) -> TaskSpec:
    """What the agent needs to run the allocation's trial: the entrypoint, the environment the
    harness reads (harness/core/_info.py), the allocation's token and where the code is. A command's
    or notebook's (no trial) comes from services/tasks.py."""
    if alloc.trial_id is None and alloc.experiment_id is None:
        return tasks.task_spec(s, master, alloc, agent, _slots_on(alloc, agent.id), agent_device_type(agent))
    trial = s.get(Trial, alloc.trial_id) if alloc.trial_id else None
    exp = s.get(Experiment, alloc.experiment_id) if alloc.experiment_id else None
    if trial is None or exp is None:
        raise Internal(f"allocation {alloc.id} has no trial")
    try:
        cfg = ExperimentConfig.from_stored(exp.config)
    except ConfigInvalid as e:
        raise Internal(f"experiment {exp.id}: the stored config no longer validates: {e}") from None
    token = allocations.ensure_allocation_token(s, master, alloc)
    argv = list(cfg.entrypoint) if isinstance(cfg.entrypoint, list) else ["sh", "-c", str(cfg.entrypoint)]
    slot_ids = _slots_on(alloc, agent.id)
    env = cfg.environment.environment_variables.as_dict(agent_device_type(agent))
    env.update(TrialEnvironment(
        master_url=master.config.advertised_url, cluster_id=master.cluster_id, agent_id=agent.id,
        task_id=alloc.task_id, allocation_id=alloc.id, session_token=token, trial_id=trial.id,
        experiment_id=exp.id, trial_seed=trial.seed, trial_run_id=alloc.run_id, slot_ids=slot_ids,
        hparams=trial.hparams, experiment_config=exp.config, latest_checkpoint=trial.latest_checkpoint_uuid,
        user=_owner_name(s, exp), steps_completed=_restored_steps(s, trial),
        resources_id=agent.id, rendezvous=gangs.rendezvous(s, alloc, agent.id), c10d_port=gang_run.c10d_port(alloc.id),
        comm_port=gang_run.comm_port(alloc.id),
    ).to_env())
    return TaskSpec(
        allocation_id=alloc.id, task_id=alloc.task_id, trial_id=trial.id, experiment_id=exp.id,
        run_id=alloc.run_id, entrypoint=argv, env=env, slot_ids=slot_ids, token=token,
        model_definition_path=f"/api/v1/experiments/{exp.id}/model_def",
        kill_grace_seconds=master.config.task_kill_grace_s,
        container=container_spec(cfg, agent_device_type(agent),
                                 storage_root(master.config.default_checkpoint_storage)),
        user_id=exp.owner_id,
    )


def _owner_name(s: Session, exp: Experiment) -> str:
    owner = s.get(User, exp.owner_id) if exp.owner_id is not None else None
    return owner.username if owner is not None else ""


def _restored_steps(s: Session, trial: Trial) -> int:
    ckpt = s.get(Checkpoint, trial.latest_checkpoint_uuid) if trial.latest_checkpoint_uuid else None
    return ckpt.steps_completed if ckpt is not None else 0


def agent_device_type(agent: Agent) -> str:
    """The device type whose environment variables a task on this agent gets (Determined keeps
    them per device: cpu, cuda, rocm)."""
    types = {sl.get("type") for sl in agent.slots}
    if "cuda" in types:
        return "cuda"
    return "rocm" if "rocm" in types else "cpu"


@dataclass(frozen=True)
class AgentView:
    agent: Agent
    allocations: list[Allocation]


def list_agents(s: Session, pool: str | None = None) -> list[AgentView]:
    """Every agent (of `pool`), each with the allocations on it."""
    q = select(Agent).order_by(Agent.id)
    if pool:
        q = q.where(Agent.pool == pool)
    by_agent: dict[str, list[Allocation]] = {}
    for a in s.scalars(select(Allocation).where(Allocation.state.in_(st.ALLOC_ON_AGENT))):
        for agent_id, _ in gangs.held(a):  # a gang across agents shows on each of them
            by_agent.setdefault(agent_id, []).append(a)
    return [AgentView(agent, by_agent.get(agent.id, [])) for agent in s.scalars(q)]


def get_agent(s: Session, agent_id: str) -> AgentView:
    agent = s.get(Agent, agent_id)
    if agent is None:
        raise not_found(f"agent {agent_id}")
    return AgentView(agent, list(gangs.holding(s, agent_id)))


def _slots_on(alloc: Allocation, agent_id: str) -> list[str]:
    """The slot ids of an allocation on one of its agents."""
    return dict(gangs.held(alloc)).get(agent_id, [str(x) for x in alloc.slot_ids])


# --------------------------------------------------------------------------------------------
# Enabling, disabling and draining (admin: `det agent enable|disable [--drain]`)
# --------------------------------------------------------------------------------------------


def is_draining(agent: Agent) -> bool:
    return not agent.enabled and agent.drain_started_at is not None


def _ending_instance(s: Session, agent: Agent) -> Instance | None:
    """The instance of the agent, if the autoscaler has begun terminating it."""
    ending = (st.InstanceState.STOPPING, st.InstanceState.TERMINATED)
    q = select(Instance).where(Instance.state.in_(ending))
    if agent.instance_id:
        q = q.where(Instance.instance_id == agent.instance_id)
    else:
        q = q.where(Instance.agent_id == agent.id)
    return s.scalars(q).first()


def _locked_agent(s: Session, agent_id: str) -> Agent:
    # The autoscaler disables an agent it terminates under a lock on the same row
    # (loops/autoscaler/decision.py, claim_idle): taking it first, the instance's state read below is the committed one.
    agent = s.scalar(select(Agent).where(Agent.id == agent_id).with_for_update()
                     .execution_options(populate_existing=True))
    if agent is None:
        raise not_found(f"agent {agent_id}")
    return agent


def enable_agent(s: Session, master: Master, agent_id: str) -> AgentView:
    """The agent takes new work again (and stops draining). Refused (409) for an agent whose
    instance the autoscaler is terminating: it is disabled because it is going away."""
    agent = _locked_agent(s, agent_id)
    inst = _ending_instance(s, agent)
    if inst is not None:
        raise Conflict(f"agent {agent_id!r} cannot be enabled: its instance {inst.instance_id or inst.launch_id} "
                       f"is being terminated by the autoscaler of pool {inst.pool!r} "
                       f"({inst.terminate_reason or 'terminating'}); it will not take work again")
    if interruptions.is_final(agent.interruption_action):
        raise Conflict(f"agent {agent_id!r} cannot be enabled: its cloud is taking its instance away "
                       f"({interruptions.describe(agent)}); it will not take work again")
    agent.enabled = True
    agent.drain_started_at = None
    log.info("event=agent_enabled agent_id=%s", agent.id)
    master.notify(s)
    return get_agent(s, agent_id)


def disable_agent(s: Session, master: Master, agent_id: str, *, drain: bool) -> AgentView:
    """Nothing new is placed on the agent. Without `drain` its allocations are killed now and their
    trials placed again elsewhere (an infrastructure cause: no restart is counted); with `drain`
    they may finish, and whatever still runs after `agent_drain_timeout_s` is preempted."""
    agent = _locked_agent(s, agent_id)
    now = master.clock()
    agent.enabled = False
    # A replacement consolidation is waiting for (its cordon) gives the agent up to the admin: the
    # move, abandoned, will never enable the agent again (loops/autoscaler/consolidate.py).
    for move in s.scalars(select(ConsolidationMove).where(ConsolidationMove.agent_id == agent.id,
                                                          ConsolidationMove.pending.is_(True))):
        move.pending, move.abandoned = False, True
        move.reason = f"{move.reason}; abandoned: its agent was disabled by an admin"
    if drain:
        if agent.drain_started_at is None:
            agent.drain_started_at = now
    else:
        agent.drain_started_at = None
        for alloc in gangs.holding(s, agent.id):
            if not alloc.kill_requested:
                alloc.kill_requested = True
                log.info("event=kill_requested allocation_id=%s agent_id=%s reason=%r", alloc.id, agent.id,
                         "agent disabled")
    log.info("event=agent_disabled agent_id=%s drain=%s", agent.id, drain)
    master.notify(s)
    return get_agent(s, agent_id)


def expire_drains(s: Session, master: Master) -> None:
    """Called on every placement tick: on an agent draining for longer than
    `agent_drain_timeout_s`, ask what still runs to stop (cooperative preemption: the trial
    checkpoints and is placed elsewhere; one that ignores it is killed after the preemption grace)."""
    cutoff = master.clock() - timedelta(seconds=master.config.agent_drain_timeout_s)
    overdue = s.scalars(select(Agent.id).where(Agent.enabled.is_(False), Agent.drain_started_at.is_not(None),
                                               Agent.drain_started_at <= cutoff))
    for agent_id in overdue.all():
        for alloc in gangs.holding(s, agent_id):  # a gang across agents too, when the agent is a member
            if not alloc.kill_requested and lifecycle.request_preemption(alloc, master.clock()):
                log.warning("event=drain_timeout allocation_id=%s agent_id=%s", alloc.id, agent_id)


def agents_with_news(s: Session, master: Master, polls: dict[str, tuple[Principal, str]], *,
                     verify: bool = True) -> set[str]:
    """`has_news` for many waiting command long-polls at once ({agent id: (credential, session)}):
    three small queries whatever their number, so a wake-up costs one check per process rather than
    one per waiting agent (frontdoor/agent_polls.py). News is a command owed to the agent or a refusal
    its next full check would answer: a credential revoked or expired meanwhile, an unknown agent,
    a replaced session. Reads columns, not ORM objects, and only the allocations that may owe
    something (to be started, to be killed, or a gang's part): a running trial owes nothing.

    `verify=False` looks for commands only (one query): the poll hub re-checks every waiting poll
    that way on each wake-up, having verified credential and session when the poll arrived."""
    news = {aid for aid, (p, _sid) in polls.items() if p.kind is not TokenKind.AGENT_CREDENTIAL or p.agent_id != aid}
    asked = [a for a in polls if a not in news]
    if not asked:
        return news
    if not verify:
        return news | _owing(s, master, set(asked))
    now = master.clock()
    live = set(s.scalars(select(Token.id).where(
        Token.id.in_({polls[a][0].token_id for a in asked}), Token.revoked_at.is_(None),
        or_(Token.expires_at.is_(None), Token.expires_at > now))))
    rows = {r.id: r for r in s.execute(select(Agent.id, Agent.pool, Agent.session_id, Agent.state)
                                       .where(Agent.id.in_(asked)))}
    for aid in asked:
        p, sid = polls[aid]
        agent = rows.get(aid)
        if (p.token_id not in live or agent is None or p.pool != agent.pool or agent.session_id != sid
                or agent.state != st.AgentState.CONNECTED):
            news.add(aid)
    waiting = set(asked) - news
    return news | _owing(s, master, waiting) if waiting else news


def _owing(s: Session, master: Master, waiting: set[str]) -> set[str]:
    """Which of the agents are owed a start or a kill."""
    owing: set[str] = set()
    # Plain rows with the columns `_owed` reads, not ORM objects: every waiting poll of a process
    # is checked with this on each wake-up, and while a cluster starts, hundreds are assigned.
    maybe_owing = select(Allocation.id, Allocation.agent_id, Allocation.slot_ids, Allocation.state,
                         Allocation.kill_requested, Allocation.placement).where(
        Allocation.state.in_(st.ALLOC_ON_AGENT),
        or_(Allocation.kill_requested.is_(True), Allocation.state == st.AllocationState.ASSIGNED,
            Allocation.placement.is_not(None)))
    for alloc in s.execute(maybe_owing):
        members = {agent_id for agent_id, _ in gangs.held(alloc)}
        for aid in members & waiting:
            if _owed(master, alloc, aid) is not None:
                owing.add(aid)
    return owing


def record_heartbeats(s: Session, master: Master, seen: set[tuple[str, str]]) -> int:
    """Mark the agents seen now ({(agent id, session id)}), in one statement: the heartbeats of the
    command long-polls a process holds (frontdoor/agent_polls.py), written together every few seconds
    instead of one write transaction per poll. Only an agent still connected on that session is
    touched (one the placement loop has meanwhile disconnected, or that registered again, is not
    revived). Returns how many rows moved."""
    if not seen:
        return 0
    t = Agent.__table__.c
    moved = 0
    pairs = sorted(seen)  # one order for every process: concurrent flushes cannot deadlock on PostgreSQL
    for i in range(0, len(pairs), _HEARTBEAT_CHUNK):
        stmt = (update(Agent.__table__).where(tuple_(t.id, t.session_id).in_(pairs[i:i + _HEARTBEAT_CHUNK]),
                                              t.state == st.AgentState.CONNECTED).values(last_seen=master.clock()))
        moved += int(s.connection().execute(stmt).rowcount or 0)
    return moved


_HEARTBEAT_CHUNK = 400  # (id, session) pairs per statement: within SQLite's limit on bound values
