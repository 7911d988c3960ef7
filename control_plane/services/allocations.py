"""Allocations: ending them (and revoking their token) and issuing their session token.

Called by the placement loop (lost agents), the agent service (exits, restarts) and the autoscaler
(instances gone)."""

from __future__ import annotations

import logging

from sqlalchemy import select
from sqlalchemy.orm import Session

from control_plane import auth
from control_plane.core import states as st
from control_plane.db.models import Allocation, Experiment, Token
from control_plane.master import Master
from control_plane.services import lifecycle

log = logging.getLogger("shipyard.allocations")


def end_agent_allocations(s: Session, master: Master, agent_id: str, cause: str, reason: str,
                          keep: set[str] | None = None) -> None:
    for alloc in s.scalars(
        select(Allocation).where(Allocation.agent_id == agent_id, Allocation.state.in_(st.ALLOC_ON_AGENT))
    ):
        if keep and alloc.id in keep:
            continue
        end_allocation(s, master, alloc, cause=cause, reason=reason, exit_code=None)


def end_allocation(s: Session, master: Master, alloc: Allocation, *, cause: str, reason: str | None,
                   exit_code: int | None) -> None:
    if alloc.state == st.ALLOC_TERMINATED:
        return
    alloc.state = st.ALLOC_TERMINATED
    alloc.ended_at = master.clock()
    alloc.exit_code = exit_code
    alloc.exit_reason = reason
    # A process that exits after the master asked it to stop was stopped by the master.
    if cause == st.CAUSE_EXITED and alloc.kill_requested:
        cause = st.CAUSE_KILLED
    elif cause == st.CAUSE_EXITED and alloc.preempt_requested and exit_code == 0:
        cause = st.CAUSE_PREEMPTED
    alloc.end_cause = cause
    # The allocation's session token dies with it.
    for t in s.scalars(select(Token).where(Token.allocation_id == alloc.id, Token.revoked_at.is_(None))):
        t.revoked_at = master.clock()
    log.info("event=allocation_ended allocation_id=%s trial_id=%s cause=%s exit_code=%s",
             alloc.id, alloc.trial_id, cause, exit_code)
    lifecycle.on_allocation_exited(s, master, alloc)
    master.notify(s)


def allocation_token(master: Master, alloc: Allocation) -> str:
    return master.derived_token(f"allocation:{alloc.id}")


def ensure_allocation_token(s: Session, master: Master, alloc: Allocation) -> str:
    token = allocation_token(master, alloc)
    digest = auth.token_digest(token)
    if s.scalar(select(Token).where(Token.token_hash == digest)) is None:
        exp = s.get(Experiment, alloc.experiment_id) if alloc.experiment_id else None
        s.add(Token(token_hash=digest, kind=auth.TokenKind.ALLOCATION.value, allocation_id=alloc.id,
                    trial_id=alloc.trial_id, user_id=exp.owner_id if exp else None, created_at=master.clock()))
    return token
