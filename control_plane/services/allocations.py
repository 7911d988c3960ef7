"""Allocations: ending them (and revoking their token), the exits of gangs' parts (a gang ends
whole, core/gang_run.py), and issuing their session token.

Called by the placement loop (lost agents), the agent service (exits, restarts) and the autoscaler
(instances gone)."""

from __future__ import annotations

import logging

from sqlalchemy import select
from sqlalchemy.orm import Session

from control_plane import auth
from control_plane.core import gang_run
from control_plane.core import states as st
from control_plane.db.models import Allocation, Experiment, Token
from control_plane.master import Master
from control_plane.services import gangs, interruptions, lifecycle

log = logging.getLogger("shipyard.allocations")


def end_agent_allocations(s: Session, master: Master, agent_id: str, cause: str, reason: str,
                          keep: set[str] | None = None) -> None:
    """The allocations on an agent that is gone (lost, restarted without them, its instance
    terminated) end with `cause`; its parts of gangs are gone, which ends those gangs whole."""
    for alloc in s.scalars(
        select(Allocation).where(Allocation.agent_id == agent_id, Allocation.state.in_(st.ALLOC_ON_AGENT))
    ):
        if (keep and alloc.id in keep) or gangs.is_gang(alloc):
            continue
        end_allocation(s, master, alloc, cause=cause, reason=reason, exit_code=None)
    agent_gone(s, master, agent_id, cause, reason, keep)


def part_exited(s: Session, master: Master, alloc: Allocation, agent_id: str, exit_code: int | None,
                message: str | None, *, gone: str | None = None) -> None:
    """A part exited (or went with its agent: `gone` is the cause). When that makes the gang over,
    the other parts are owed a kill; when every part has exited, the allocation ends."""
    before = gangs.parts(alloc)
    changed = gang_run.exited(before, agent_id, exit_code, message, gone=gone, at=master.clock().timestamp())
    if changed is None:
        return
    alloc.placement = changed
    rank = gang_run.rank_of(changed, agent_id)
    log.info("event=gang_part_exited allocation_id=%s agent_id=%s rank=%s exit_code=%s gone=%s",
             alloc.id, agent_id, rank, exit_code, gone)
    if gang_run.over(changed) and not gang_run.over(before):
        log.info("event=gang_over allocation_id=%s running=%s", alloc.id,
                 ",".join(str(p["agent"]) for p in changed if p["state"] != "exited"))
        master.notify(s)
    end = gang_run.outcome(changed)
    if end is None:
        return
    cause = end.gone or st.ExitCause.EXITED
    end_allocation(s, master, alloc, cause=cause, reason=end.reason, exit_code=end.exit_code)


def agent_gone(s: Session, master: Master, agent_id: str, cause: str, reason: str,
               keep: set[str] | None = None) -> None:
    """The agent's parts of gangs are gone with it (lost, restarted without them, instance gone)."""
    for alloc in s.scalars(select(Allocation).where(Allocation.placement.is_not(None),
                                                    Allocation.state.in_(st.ALLOC_ON_AGENT))):
        if (not gangs.is_gang(alloc) or (keep and alloc.id in keep)
                or gang_run.rank_of(gangs.parts(alloc), agent_id) is None):
            continue
        part_exited(s, master, alloc, agent_id, None, reason, gone=cause)


def end_allocation(s: Session, master: Master, alloc: Allocation, *, cause: str, reason: str | None,
                   exit_code: int | None) -> None:
    if alloc.state == st.AllocationState.TERMINATED:
        return
    alloc.state = st.AllocationState.TERMINATED
    alloc.ended_at = master.clock()
    alloc.exit_code = exit_code
    alloc.exit_reason = reason
    # A process that exits after the master asked it to stop was stopped by the master.
    if cause == st.ExitCause.EXITED and alloc.kill_requested:
        cause = st.ExitCause.KILLED
    elif cause == st.ExitCause.EXITED and alloc.preempt_requested and (
            exit_code == 0 or interruptions.allocation_interrupted(s, alloc)):
        # On an instance going away (services/interruptions.py) the agent stops a task still
        # running at the notice's deadline: not the trial's fault either.
        cause = st.ExitCause.PREEMPTED
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
