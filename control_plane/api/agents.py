"""The agent side of the master over HTTP: agent tokens, registration, the command long-poll (which
is also the heartbeat), task events, and `GET /api/v1/agents`. The logic is in
control_plane/services/agents.py; the models are the protocol's (shipyard_common.agent_protocol).
Protocol: docs/PROTOCOL.md."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import Field
from sqlalchemy.orm import Session

from control_plane.api import deps
from control_plane.api.wire import StrictWire, ts
from control_plane.auth import Principal
from control_plane.core import states as st
from control_plane.db.engine import transaction
from control_plane.db.models import Agent, Allocation
from control_plane.errors import bad_request
from control_plane.frontdoor import agent_polls
from control_plane.frontdoor.admission import Ticket, busy_response
from control_plane.master import Master
from control_plane.services import agents as service
from control_plane.services import gangs, interruptions
from shipyard_common.agent_protocol import (
    COMMANDS_PATH,
    ENROLMENT_PATH,
    EVENTS_PATH,
    INTERRUPTION_PATH,
    REGISTER_PATH,
    TOKENS_PATH,
    AgentId,
    Command,
    CommandsResponse,
    EventsRequest,
    InterruptionRequest,
    RegisterRequest,
)

router = APIRouter()


# An agent token lives at most this long (a century): beyond, its expiry is past what a timestamp holds.
MAX_AGENT_TOKEN_TTL_HOURS = 100 * 365 * 24


class AgentTokenRequest(StrictWire):
    resource_pool: str = Field(max_length=64)
    agent_id: AgentId | None = None
    ttl_hours: float | None = Field(default=None, gt=0, le=MAX_AGENT_TOKEN_TTL_HOURS)


@router.post(TOKENS_PATH)
def create_agent_token(
    body: AgentTokenRequest,
    _p: Principal = Depends(deps.admin),
    master: Master = Depends(deps.get_master),
    db: Session = Depends(deps.get_db, scope="function"),
) -> dict[str, Any]:
    token = service.issue_agent_token(db, master, pool=body.resource_pool, agent_id=body.agent_id,
                                      ttl_hours=body.ttl_hours)
    return {"token": token}


@router.post(REGISTER_PATH)
def register(
    body: RegisterRequest,
    p: Principal = Depends(deps.agent),
    master: Master = Depends(deps.get_master),
    db: Session = Depends(deps.get_db, scope="function"),
) -> dict[str, Any]:
    return service.register_agent(db, master, p, body).to_wire()


def _full_check(master: Master, request: Request, agent_id: str, session_id: str) -> tuple[Principal, list[Command]]:
    """Who polls (401/403 as any agent request) and what the agent must do now, in one
    transaction: the poll's heartbeat is written too."""
    with transaction(master.sessions) as s:
        p = deps.principal_in(s, request, master)
        deps.require_agent(p)
        return p, service.pending_commands(s, master, p, agent_id, session_id)


async def _disconnect(request: Request) -> None:
    """Completes when the client closes the connection (a GET has no body to read first)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


# A poll shorter than this is always checked in full on arrival (it could not wait for a batch).
_MIN_HUB_WAIT_S = 1.0
# A poll with news that finds the agents' lane too busy to queue it asks again this often.
_SLOT_RETRY_S = 0.5


async def _slot_before(slot: Ticket, deadline: float) -> bool:
    """A slot for a waiting poll's full check, taken before the poll's deadline: queued for as long
    as the poll has left, and asked again while the lane refuses it at once. A poll with news
    answered empty when the lane is busy would come straight back and find the same news: when 500
    trials start at once, thousands of empty round trips that delay the very starts they carry."""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        if await slot.acquire(remaining):
            return True
        await asyncio.sleep(min(remaining, _SLOT_RETRY_S))


@router.get(COMMANDS_PATH)
async def commands(
    agentId: str,
    sessionId: str,
    request: Request,
    timeoutSeconds: float = 10.0,
    master: Master = Depends(deps.get_master),
    slot: Ticket = Depends(deps.ticket),
) -> dict[str, Any]:
    # The long-poll is HTTP's business (frontdoor/agent_polls.py). A poll whose credential this process
    # has verified before goes straight to the process's poll hub: no thread, no connection, no
    # admission slot. The hub checks arrivals and waiting polls in batches, re-verifying their
    # credential and session, and writes the heartbeats of every waiting agent together. Only a
    # poll the hub finds news for, and the first poll of a credential, run the full check
    # (`_full_check`, with a slot of the cluster's lane), which alone hands out commands.
    # The front door takes no slot for this route (admission.is_self_admitted): a poll waits on
    # nothing, so a saturated master still hears its agents.
    deadline = slot.arrived + max(0.0, min(timeoutSeconds, 60.0))
    hub = agent_polls.of(master)
    token = deps.bearer_token(request)
    p = hub.remembered(token, agentId) if timeoutSeconds >= _MIN_HUB_WAIT_S else None
    unchecked = p is not None
    if p is None:
        if not await slot.acquire():
            return busy_response(slot)  # type: ignore[return-value]
        try:
            p, found = await run_in_threadpool(_full_check, master, request, agentId, sessionId)
        finally:
            slot.release()
        if token:
            hub.remember(token, p)
        if found:
            return CommandsResponse(commands=found).to_wire()
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or master.stopping.is_set():
            return CommandsResponse(commands=[]).to_wire()
        if not await hub.wait(p, agentId, sessionId, remaining, unchecked=unchecked, gone=_disconnect(request)):
            return CommandsResponse(commands=[]).to_wire()
        unchecked = False
        # News: a command, or a refusal the full check states (and then the credential is forgotten).
        if not await _slot_before(slot, deadline):
            return CommandsResponse(commands=[]).to_wire()  # seen all the same; the agent polls again
        try:
            p, found = await run_in_threadpool(_full_check, master, request, agentId, sessionId)
        except Exception:
            hub.forget(token)
            raise
        finally:
            slot.release()
        if found:
            return CommandsResponse(commands=found).to_wire()


@router.post(EVENTS_PATH)
def events(
    agentId: str,
    body: EventsRequest,
    p: Principal = Depends(deps.agent),
    master: Master = Depends(deps.get_master),
    db: Session = Depends(deps.get_db, scope="function"),
) -> dict[str, Any]:
    service.apply_events(db, master, p, agentId, body)
    return {}


@router.post(INTERRUPTION_PATH)
def interruption(
    agentId: str,
    body: InterruptionRequest,
    p: Principal = Depends(deps.agent),
    master: Master = Depends(deps.get_master),
    db: Session = Depends(deps.get_db, scope="function"),
) -> dict[str, Any]:
    """The agent's cloud announced that its instance goes (services/interruptions.py)."""
    agent = service.touch_agent(db, master, p, agentId, body.session_id)
    interruptions.record(db, master, agent, body)
    return {}


@router.delete(ENROLMENT_PATH)
def reset_enrolment(
    agentId: str,
    _p: Principal = Depends(deps.admin),
    master: Master = Depends(deps.get_master),
    db: Session = Depends(deps.get_db, scope="function"),
) -> dict[str, Any]:
    return {"revokedCredentials": service.reset_enrolment(db, master, agentId)}


def agent_json(agent: Agent, allocs: list[Allocation]) -> dict[str, Any]:
    # A gang holds other slots on each of its agents: this agent's part, not the chief's slot ids.
    by_slot = {sl: a for a in allocs for sl in dict(gangs.held(a)).get(agent.id, ())}
    slots = {}
    for sl in agent.slots:
        a = by_slot.get(str(sl["id"]))
        slots[str(sl["id"])] = {
            "id": str(sl["id"]),
            "device": {"id": sl["id"], "brand": sl.get("brand") or "", "uuid": sl.get("uuid") or "",
                       "type": "TYPE_CUDA" if sl.get("type") == "cuda" else "TYPE_CPU"},
            "enabled": agent.enabled,
            "draining": service.is_draining(agent),
            "container": ({"id": a.id, "state": "STATE_RUNNING", "devices": []} if a else None),
        }
    return {
        "id": agent.id,
        "resourcePools": [agent.pool],
        "registeredTime": ts(agent.registered_at),
        "lastSeen": ts(agent.last_seen),
        "state": agent.state,
        "enabled": agent.enabled,
        "draining": service.is_draining(agent),
        "drainStartedTime": ts(agent.drain_started_at),
        "addresses": agent.addresses,
        "version": agent.version,
        "slots": slots,
        "slotStats": {"typeStats": {}, "brandStats": {}},
        "instanceId": agent.instance_id,
        "idleSince": ts(agent.idle_since),
        "connected": agent.state == st.AgentState.CONNECTED,
    }


@router.get("/api/v1/agents")
def list_agents(
    _p: Principal = Depends(deps.user), db: Session = Depends(deps.get_db, scope="function"), resourcePool: str | None = None
) -> dict[str, Any]:
    return {"agents": [agent_json(v.agent, v.allocations) for v in service.list_agents(db, resourcePool)]}


@router.get("/api/v1/agents/{agentId}")
def get_agent(agentId: str, _p: Principal = Depends(deps.user), db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
    view = service.get_agent(db, agentId)
    return {"agent": agent_json(view.agent, view.allocations)}


class DisableAgentRequest(StrictWire):
    """Determined's v1DisableAgentRequest (its CLI sends no body, or only `drain`)."""

    agent_id: str | None = None
    drain: bool | None = None


@router.post("/api/v1/agents/{agentId}/enable")
def enable_agent(
    agentId: str,
    _p: Principal = Depends(deps.admin),
    master: Master = Depends(deps.get_master),
    db: Session = Depends(deps.get_db, scope="function"),
) -> dict[str, Any]:
    view = service.enable_agent(db, master, agentId)
    return {"agent": agent_json(view.agent, view.allocations)}


@router.post("/api/v1/agents/{agentId}/disable")
def disable_agent(
    agentId: str,
    body: DisableAgentRequest | None = None,
    _p: Principal = Depends(deps.admin),
    master: Master = Depends(deps.get_master),
    db: Session = Depends(deps.get_db, scope="function"),
) -> dict[str, Any]:
    if body is not None and body.agent_id and body.agent_id != agentId:
        raise bad_request(f"names agent {body.agent_id!r} but the path names {agentId!r}", "agentId")
    view = service.disable_agent(db, master, agentId, drain=bool(body and body.drain))
    return {"agent": agent_json(view.agent, view.allocations)}
