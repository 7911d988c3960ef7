"""Interruption notices: an agent reports that its cloud is taking its instance away (AWS's spot
two-minute warning, GCP's preemption notice) or may soon (AWS's rebalance recommendation).

The record is the agent's row (`interruption_at/_action/_deadline`). From the first notice the
agent takes no new work (disabled, shown as draining) and the autoscaler no longer counts its
instance as capacity (loops/autoscaler/decision.py); the instance's row takes the notice as its
reason, so the row that closes when the cloud removes the instance says why. A final notice also
asks every allocation on the agent to checkpoint and stop, at once (the preemption long-polls are
woken by `master.notify`), with a line in the trial's logs. When such an allocation ends it ends as
preempted whatever its exit code (the agent stops a task still running at the deadline): its trial
runs again from its checkpoint on another agent, no restart counted (services/allocations.py)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from control_plane.core import states as st
from control_plane.db.models import Agent, Allocation, Instance, TaskLog
from control_plane.master import Master
from control_plane.services import gangs, lifecycle
from shipyard_common.agent_protocol import InterruptionRequest

log = logging.getLogger("shipyard.interruptions")

REBALANCE = "rebalance"
TRIAL_LINE = "spot interruption notice: checkpointing"


def is_final(action: str | None) -> bool:
    """A notice that the instance goes (a rebalance recommendation only says that it may)."""
    return action is not None and action != REBALANCE


def describe(agent: Agent) -> str:
    """The notice as a reason: `spot interruption notice (aws terminate, instance goes at …)`."""
    when = f", instance goes at {agent.interruption_deadline.isoformat()}" if agent.interruption_deadline else ""
    return f"spot interruption notice ({agent.interruption_action}{when})"


def record(s: Session, master: Master, agent: Agent, req: InterruptionRequest) -> None:
    """Apply a notice to the agent (already authenticated, its session checked). Idempotent: a
    repeated notice changes nothing, a final one after a rebalance hint takes over."""
    if is_final(agent.interruption_action) or (agent.interruption_action == req.action):
        return
    now = master.clock()
    agent.interruption_at = agent.interruption_at or now
    agent.interruption_action = req.action
    agent.interruption_deadline = req.deadline
    agent.enabled = False  # nothing new lands on an instance going away
    agent.drain_started_at = agent.drain_started_at or now
    reason = f"{req.cloud} " + describe(agent)
    row = _instance_of(s, agent)
    if row is not None and row.state in st.INSTANCE_LIVE:
        row.terminate_reason = reason
    log.warning("event=interruption_notice agent_id=%s instance_id=%s action=%s deadline=%s", agent.id,
                agent.instance_id, req.action, req.deadline.isoformat() if req.deadline else None)
    if is_final(req.action):
        for alloc in gangs.holding(s, agent.id):
            if alloc.kill_requested or not lifecycle.request_preemption(alloc, now):
                continue
            log.info("event=preempt_requested allocation_id=%s trial_id=%s reason=interruption agent_id=%s",
                     alloc.id, alloc.trial_id, agent.id)
            s.add(TaskLog(task_id=alloc.task_id, allocation_id=alloc.id, timestamp=now, level="WARNING",
                          stdtype="stderr", source="master",
                          log=f"{TRIAL_LINE} (agent {agent.id}: {reason})\n"))
    master.notify(s)


@dataclass(frozen=True)
class Notice:
    agent_id: str
    instance_id: str | None
    at: datetime | None
    final: bool  # the instance goes (else a rebalance recommendation: it may)
    reason: str  # describe()'s words


def notices(s: Session, pool: str) -> list[Notice]:
    """The pool's agents that reported a notice, newest first (the web UI's cluster page)."""
    agents = s.scalars(select(Agent).where(Agent.pool == pool, Agent.interruption_action.is_not(None))
                       .order_by(Agent.interruption_at.desc(), Agent.id))
    return [Notice(a.id, a.instance_id, a.interruption_at, is_final(a.interruption_action), describe(a)) for a in agents]


def _instance_of(s: Session, agent: Agent) -> Instance | None:
    q = select(Instance).where(Instance.agent_id == agent.id)
    if agent.instance_id:
        q = select(Instance).where(Instance.instance_id == agent.instance_id)
    return s.scalars(q.order_by(Instance.requested_at.desc())).first()


def interrupted(s: Session, agent_ids: Iterable[str]) -> bool:
    """Whether any of the agents reported a final interruption notice."""
    ids = {a for a in agent_ids if a}
    if not ids:
        return False
    actions = s.scalars(select(Agent.interruption_action).where(Agent.id.in_(ids)))
    return any(is_final(a) for a in actions)


def allocation_interrupted(s: Session, alloc: Allocation) -> bool:
    """Whether an agent of the allocation (each part of a gang) reported a final notice."""
    return interrupted(s, [a for a, _ in gangs.held(alloc)])
