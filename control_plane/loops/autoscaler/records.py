"""The instance and pool rows' state changes the autoscaler's steps share: a termination begun
(`stopping`, committed before any terminate call), a row closed (its tokens revoked, its agent's
allocations ended), and moves guarded by the state machines."""

from __future__ import annotations

import logging
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from control_plane import telemetry
from control_plane.core import states as st
from control_plane.core.states import InstanceState, PoolState
from control_plane.db.models import Agent, Instance, ResourcePool, Token
from control_plane.master import Master
from control_plane.services import allocations

log = logging.getLogger("shipyard.autoscaler")


def agent_of(s: Session, row: Instance) -> Agent | None:
    if row.agent_id:
        return s.get(Agent, row.agent_id)
    if row.instance_id:
        return s.scalar(select(Agent).where(Agent.instance_id == row.instance_id))
    return None


def begin_termination(s: Session, row: Instance, now: datetime, reason: str) -> None:
    """`stopping` is committed before any terminate call; the call is (re)sent after the commit,
    on this tick and later ones, until the cloud says the instance is gone."""
    row.state = st.transition(InstanceState(row.state), InstanceState.STOPPING)
    row.terminate_requested_at = now
    row.terminate_reason = reason
    telemetry.terminated(row.pool, reason)
    agent = agent_of(s, row)
    if agent is not None:
        agent.enabled = False  # nothing new lands on an instance being terminated
    log.info("event=terminate_decided pool=%s launch_id=%s instance_id=%s reason=%r", row.pool, row.launch_id,
             row.instance_id, reason)


def close_row(s: Session, master: Master, row: Instance, now: datetime, reason: str) -> None:
    """The row ends: its bootstrap tokens are revoked, its agent is disconnected, and the
    allocations on it end (an infrastructure failure)."""
    row.state = st.transition(InstanceState(row.state), InstanceState.TERMINATED)
    row.terminated_at = now
    row.terminate_reason = reason
    for t in s.scalars(select(Token).where(Token.launch_id == row.launch_id, Token.revoked_at.is_(None))):
        t.revoked_at = now
    agent = agent_of(s, row)
    if agent is not None and agent.state == st.AgentState.CONNECTED:
        agent.state = st.AgentState.DISCONNECTED
        agent.disconnected_at = now
    if agent is not None:
        allocations.end_agent_allocations(s, master, agent.id, st.ExitCause.INSTANCE_TERMINATED,
                                          f"instance {row.instance_id} terminated: {reason}")
    log.info("event=instance_closed pool=%s launch_id=%s instance_id=%s reason=%r", row.pool, row.launch_id,
             row.instance_id, reason)


def instance_move(row: Instance, target: InstanceState) -> bool:
    """Move the row to `target` if its state machine allows it; whether it did."""
    current = InstanceState(row.state)
    if not st.can_transition(current, target):
        log.debug("event=instance_state_kept launch_id=%s state=%s refused=%s", row.launch_id, current, target)
        return False
    row.state = target
    return True


def pool_move(row: ResourcePool, target: PoolState) -> PoolState:
    """`target` if the pool's state machine allows the change, else its current state."""
    current = PoolState(row.state)
    return target if st.can_transition(current, target) else current
