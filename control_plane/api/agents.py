"""The agent side of the master: agent tokens, registration, the command long-poll (which is also
the heartbeat), task events, and `GET /api/v1/agents`. Protocol: docs/PROTOCOL.md."""

from __future__ import annotations

import json
import logging
import secrets
import time
from datetime import datetime, timedelta
from typing import Any, Literal

from fastapi import APIRouter, Depends
from fastapi.concurrency import run_in_threadpool
from pydantic import Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from control_plane import auth
from control_plane.api import deps
from control_plane.api.wire import StrictWire, Wire, ts
from control_plane.auth import Principal, TokenKind
from control_plane.core import states as st
from control_plane.db.engine import transaction
from control_plane.db.models import Agent, Allocation, Experiment, Instance, Token, Trial
from control_plane.errors import Conflict, Internal, bad_request, forbidden, not_found
from control_plane.master import Master
from control_plane.services import allocations

log = logging.getLogger("shipyard.api.agents")
router = APIRouter()


class AgentTokenRequest(StrictWire):
    resource_pool: str
    agent_id: str | None = None
    ttl_hours: float | None = Field(default=None, gt=0)


@router.post("/api/v1/agents/tokens")
def create_agent_token(
    body: AgentTokenRequest,
    _p: Principal = Depends(deps.admin),
    master: Master = Depends(deps.get_master),
    db: Session = Depends(deps.get_db, scope="function"),
) -> dict[str, Any]:
    if master.config.pool(body.resource_pool) is None:
        raise bad_request(f"no resource pool named {body.resource_pool!r}", "resourcePool")
    token = auth.issue_token(
        db, TokenKind.AGENT, now=master.clock(),
        ttl=timedelta(hours=body.ttl_hours) if body.ttl_hours else None,
        pool=body.resource_pool, agent_id=body.agent_id,
    )
    return {"token": token}


class SlotIn(StrictWire):
    id: str = Field(min_length=1, max_length=64)
    type: Literal["cuda", "cpu", "rocm"] = "cpu"
    uuid: str | None = None
    brand: str | None = None
    memory_mb: int | None = None


class RegisterRequest(StrictWire):
    agent_id: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")
    resource_pool: str
    version: str = ""
    addresses: list[str] = Field(default_factory=list)
    instance_id: str | None = None
    slots: list[SlotIn] = Field(default_factory=list, max_length=1024)
    running_allocations: list[str] = Field(default_factory=list)


def check_agent_credential(s: Session, p: Principal, agent_id: str, pool: str, instance_id: str | None) -> None:
    if p.pool != pool:
        raise forbidden(f"this credential is for resource pool {p.pool!r}, not {pool!r}")
    if p.agent_id is not None and p.agent_id != agent_id:
        raise forbidden("this credential belongs to another agent")
    if p.kind is TokenKind.BOOTSTRAP:
        # A bootstrap credential is bound to one launch; the instance presenting it must be the
        # one the cloud reports for that launch.
        inst = s.get(Instance, p.launch_id) if p.launch_id else None
        if inst is None or inst.pool != pool:
            raise forbidden("this credential is not bound to a known instance of this pool")
        if inst.state in ("stopping", "terminated"):
            raise forbidden("this credential's instance has been terminated")
        if not instance_id:
            raise forbidden("a bootstrap credential must be presented with the instance id")
        if inst.instance_id is None:
            # The launch call has not returned yet: the first instance to present the secret
            # binds it (only that launch's user-data carries it).
            inst.instance_id = instance_id
        elif instance_id != inst.instance_id:
            raise forbidden("this credential belongs to another instance")


@router.post("/api/v1/agents/register")
def register(
    body: RegisterRequest,
    p: Principal = Depends(deps.agent),
    master: Master = Depends(deps.get_master),
    db: Session = Depends(deps.get_db, scope="function"),
) -> dict[str, Any]:
    pool_cfg = master.config.pool(body.resource_pool)
    if pool_cfg is None:
        raise bad_request(f"no resource pool named {body.resource_pool!r}", "resourcePool")
    check_agent_credential(db, p, body.agent_id, body.resource_pool, body.instance_id)
    ids = [sl.id for sl in body.slots]
    if len(set(ids)) != len(ids):
        raise bad_request("slot ids must be unique", "slots")
    now = master.clock()
    agent = db.get(Agent, body.agent_id)
    if agent is not None and agent.pool != body.resource_pool:
        raise forbidden(f"agent {body.agent_id!r} is registered in pool {agent.pool!r}")
    session_id = secrets.token_hex(16)
    slots = [sl.model_dump(by_alias=True) for sl in body.slots]
    if pool_cfg.max_slots_per_agent is not None:
        slots = slots[: pool_cfg.max_slots_per_agent]
    if agent is None:
        agent = Agent(id=body.agent_id, pool=body.resource_pool, session_id=session_id, registered_at=now)
        db.add(agent)
    agent.session_id = session_id
    agent.state = st.AGENT_CONNECTED
    agent.slots = slots
    agent.version = body.version
    agent.addresses = body.addresses
    agent.instance_id = body.instance_id
    agent.last_seen = now
    agent.disconnected_at = None
    if p.launch_id:
        inst = db.get(Instance, p.launch_id)
        if inst is not None:
            inst.agent_id = agent.id
        # Used once, the bootstrap credential lives as long as its instance (it is revoked when
        # the instance ends), so an agent restarted by systemd can register again.
        tok = db.get(Token, p.token_id)
        if tok is not None:
            tok.expires_at = None
    # Reconcile what the agent runs with what the master wants: keep what we still want on this
    # agent, kill the rest; anything we thought ran there but the agent no longer has is lost.
    reported = set(body.running_allocations)
    wanted = {
        a.id
        for a in db.scalars(
            select(Allocation).where(Allocation.agent_id == agent.id, Allocation.state.in_(st.ALLOC_ON_AGENT))
        )
    }
    keep = reported & wanted
    kill = sorted(reported - wanted)
    allocations.end_agent_allocations(db, master, agent.id, st.CAUSE_AGENT_LOST, "agent restarted without it", keep=keep)
    log.info("event=agent_registered agent_id=%s pool=%s slots=%d keep=%d kill=%d",
             agent.id, agent.pool, len(slots), len(keep), len(kill))
    master.notify(db)
    return {"sessionId": session_id, "heartbeatIntervalS": 5, "kill": kill,
            "clusterId": master.cluster_id}


def _touch_agent(s: Session, master: Master, p: Principal, agent_id: str, session_id: str) -> Agent:
    agent = s.get(Agent, agent_id)
    if agent is None:
        raise not_found(f"agent {agent_id}")
    if p.pool != agent.pool or (p.agent_id is not None and p.agent_id != agent_id):
        raise forbidden("this credential does not belong to that agent")
    if agent.session_id != session_id or agent.state != st.AGENT_CONNECTED:
        raise Conflict("stale agent session: register again")
    agent.last_seen = master.clock()
    return agent


def _commands(master: Master, p: Principal, agent_id: str, session_id: str) -> list[dict[str, Any]]:
    with transaction(master.sessions) as s:
        agent = _touch_agent(s, master, p, agent_id, session_id)
        commands: list[dict[str, Any]] = []
        for alloc in s.scalars(
            select(Allocation).where(Allocation.agent_id == agent.id, Allocation.state.in_(st.ALLOC_ON_AGENT))
        ):
            if alloc.kill_requested:
                commands.append({"type": "kill", "allocationId": alloc.id,
                                 "graceSeconds": master.config.task_kill_grace_s})
            elif alloc.state == st.ALLOC_ASSIGNED:
                commands.append({"type": "start", "allocationId": alloc.id,
                                 "spec": task_spec(s, master, alloc, agent)})
        return commands


@router.get("/api/v1/agents/{agentId}/commands")
async def commands(
    agentId: str,
    sessionId: str,
    timeoutSeconds: float = 10.0,
    p: Principal = Depends(deps.agent),
    master: Master = Depends(deps.get_master),
) -> dict[str, Any]:
    deadline = time.monotonic() + max(0.0, min(timeoutSeconds, 60.0))
    while True:
        found = await run_in_threadpool(_commands, master, p, agentId, sessionId)
        remaining = deadline - time.monotonic()
        if found or remaining <= 0 or master.stopping.is_set():
            return {"commands": found}
        await master.wait_async(min(remaining, 2.0))


class TaskEvent(Wire):
    allocation_id: str
    type: Literal["pulling", "starting", "running", "exited"]
    pid: int | None = None
    exit_code: int | None = None
    message: str | None = Field(default=None, max_length=8192)
    time: datetime | None = None


class EventsRequest(StrictWire):
    session_id: str
    events: list[TaskEvent] = Field(default_factory=list, max_length=10_000)


_ORDER = {st.ALLOC_ASSIGNED: 0, st.ALLOC_PULLING: 1, st.ALLOC_STARTING: 2, st.ALLOC_RUNNING: 3}


@router.post("/api/v1/agents/{agentId}/events")
def events(
    agentId: str,
    body: EventsRequest,
    p: Principal = Depends(deps.agent),
    master: Master = Depends(deps.get_master),
    db: Session = Depends(deps.get_db, scope="function"),
) -> dict[str, Any]:
    agent = _touch_agent(db, master, p, agentId, body.session_id)
    for ev in body.events:
        alloc = db.get(Allocation, ev.allocation_id)
        if alloc is None or alloc.agent_id != agent.id or alloc.state == st.ALLOC_TERMINATED:
            continue  # stale or foreign: ignore (idempotent)
        if ev.type == "exited":
            allocations.end_allocation(db, master, alloc, cause=st.CAUSE_EXITED, reason=ev.message,
                                 exit_code=ev.exit_code)
            continue
        new_state = {"pulling": st.ALLOC_PULLING, "starting": st.ALLOC_STARTING, "running": st.ALLOC_RUNNING}[ev.type]
        if _ORDER[new_state] > _ORDER.get(alloc.state, -1):
            alloc.state = new_state
            if new_state == st.ALLOC_RUNNING:
                alloc.started_at = master.clock()
            trial = db.get(Trial, alloc.trial_id) if alloc.trial_id else None
            if trial is not None and trial.state not in st.TRIAL_TERMINAL:
                trial.state = {st.ALLOC_PULLING: st.TRIAL_PULLING, st.ALLOC_STARTING: st.TRIAL_STARTING,
                               st.ALLOC_RUNNING: st.TRIAL_RUNNING}[new_state]
    master.notify(db)
    return {}


def task_spec(s: Session, master: Master, alloc: Allocation, agent: Agent) -> dict[str, Any]:
    trial = s.get(Trial, alloc.trial_id) if alloc.trial_id else None
    exp = s.get(Experiment, alloc.experiment_id) if alloc.experiment_id else None
    if trial is None or exp is None:
        raise Internal(f"allocation {alloc.id} has no trial")
    token = allocations.ensure_allocation_token(s, master, alloc)
    cfg = exp.config
    entrypoint = cfg.get("entrypoint")
    argv = entrypoint if isinstance(entrypoint, list) else ["sh", "-c", str(entrypoint)]
    env = environment_variables(cfg, agent)
    env.update({
        "DET_MASTER": master.config.advertised_url,
        "DET_CLUSTER_ID": master.cluster_id,
        "DET_AGENT_ID": agent.id,
        "DET_SLOT_IDS": json.dumps([str(x) for x in alloc.slot_ids]),
        "DET_TASK_ID": alloc.task_id,
        "DET_ALLOCATION_ID": alloc.id,
        "DET_SESSION_TOKEN": token,
        "DET_TRIAL_ID": str(trial.id),
        "DET_EXPERIMENT_ID": str(exp.id),
        "DET_TRIAL_SEED": str(trial.seed),
        "DET_TRIAL_RUN_ID": str(alloc.run_id),
        "DET_HPARAMS": json.dumps(trial.hparams),
        "DET_EXPERIMENT_CONFIG": json.dumps(cfg),
        "DET_LATEST_CHECKPOINT": trial.latest_checkpoint_uuid or "",
        "DET_TASK_TYPE": "TRIAL",
    })
    return {
        "allocationId": alloc.id,
        "taskId": alloc.task_id,
        "trialId": trial.id,
        "experimentId": exp.id,
        "runId": alloc.run_id,
        "entrypoint": argv,
        "env": env,
        "slotIds": [str(x) for x in alloc.slot_ids],
        "token": token,
        "modelDefinitionPath": f"/api/v1/experiments/{exp.id}/model_def",
        "killGraceSeconds": master.config.task_kill_grace_s,
    }


def environment_variables(cfg: dict[str, Any], agent: Agent) -> dict[str, str]:
    """The config's environment variables for this agent's device type. Stored per device
    (`{cpu: [...], cuda: [...], rocm: [...]}`, Determined's form); a plain list or mapping applies
    to every device."""
    raw = (cfg.get("environment") or {}).get("environment_variables") or []
    if isinstance(raw, dict) and set(raw) <= {"cpu", "cuda", "rocm"}:
        device = "cuda" if any(sl.get("type") == "cuda" for sl in agent.slots) else (
            "rocm" if any(sl.get("type") == "rocm" for sl in agent.slots) else "cpu")
        raw = raw.get(device) or []
    env: dict[str, str] = {}
    if isinstance(raw, dict):
        env.update({str(k): str(v) for k, v in raw.items()})
    else:
        for item in raw:
            if isinstance(item, str) and "=" in item:
                k, v = item.split("=", 1)
                env[k] = v
    return env


def agent_json(agent: Agent, allocs: list[Allocation]) -> dict[str, Any]:
    by_slot = {str(sl): a for a in allocs for sl in a.slot_ids}
    slots = {}
    for sl in agent.slots:
        a = by_slot.get(str(sl["id"]))
        slots[str(sl["id"])] = {
            "id": str(sl["id"]),
            "device": {"id": sl["id"], "brand": sl.get("brand") or "", "uuid": sl.get("uuid") or "",
                       "type": "TYPE_CUDA" if sl.get("type") == "cuda" else "TYPE_CPU"},
            "enabled": agent.enabled,
            "draining": False,
            "container": ({"id": a.id, "state": "STATE_RUNNING", "devices": []} if a else None),
        }
    return {
        "id": agent.id,
        "resourcePools": [agent.pool],
        "registeredTime": ts(agent.registered_at),
        "lastSeen": ts(agent.last_seen),
        "state": agent.state,
        "enabled": agent.enabled,
        "draining": False,
        "addresses": agent.addresses,
        "version": agent.version,
        "slots": slots,
        "slotStats": {"typeStats": {}, "brandStats": {}},
        "instanceId": agent.instance_id,
        "idleSince": ts(agent.idle_since),
        "connected": agent.state == st.AGENT_CONNECTED,
    }


@router.get("/api/v1/agents")
def list_agents(
    _p: Principal = Depends(deps.user), db: Session = Depends(deps.get_db, scope="function"), resourcePool: str | None = None
) -> dict[str, Any]:
    q = select(Agent).order_by(Agent.id)
    if resourcePool:
        q = q.where(Agent.pool == resourcePool)
    agents = list(db.scalars(q))
    allocs = list(db.scalars(select(Allocation).where(Allocation.state.in_(st.ALLOC_ON_AGENT))))
    by_agent: dict[str, list[Allocation]] = {}
    for a in allocs:
        by_agent.setdefault(a.agent_id or "", []).append(a)
    return {"agents": [agent_json(a, by_agent.get(a.id, [])) for a in agents]}


@router.get("/api/v1/agents/{agentId}")
def get_agent(agentId: str, _p: Principal = Depends(deps.user), db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
    agent = db.get(Agent, agentId)
    if agent is None:
        raise not_found(f"agent {agentId}")
    allocs = list(db.scalars(select(Allocation).where(Allocation.agent_id == agentId,
                                                        Allocation.state.in_(st.ALLOC_ON_AGENT))))
    return {"agent": agent_json(agent, allocs)}
