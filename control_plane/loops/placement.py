"""The pool loop: heartbeats, trial reconciliation, and placement — every tick (0.5 s) and at once
whenever something changes (`master.notify()`).

Shell code: it reads a snapshot from the database, asks the pure scheduler, and writes the
result back in one transaction. Agents learn about their work through their long-poll."""

from __future__ import annotations

import logging
from datetime import timedelta

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from control_plane.core import states as st
from control_plane.core.scheduling import AgentSlots, PendingAllocation, RunningAllocation, scheduling_policy
from control_plane.db.engine import transaction
from control_plane.db.models import Agent, Allocation, Instance
from control_plane.master import Master
from control_plane.services import allocations, lifecycle

log = logging.getLogger("shipyard.pools")

# How long a trial asked to stop gracefully may take before it is killed.
PREEMPT_GRACE = timedelta(minutes=5)


def tick(master: Master) -> None:
    with transaction(master.sessions) as s:
        expire_agents(s, master)
    with transaction(master.sessions) as s:
        lifecycle.reconcile_all(s, master)
    with transaction(master.sessions) as s:
        escalate_preemptions(s, master)
        for pool in master.config.resource_pools:
            place(s, master, pool.name)


def expire_agents(s: Session, master: Master) -> None:
    """Two steps, both counted from the agent's last poll, or from the master's start when that
    is later (while the master was down nobody could poll it):

    * silent for `agent_heartbeat_timeout_s`: disconnected — nothing new is placed on it; its
      tasks and their allocations (and tokens) stay, as it may only be reconnecting;
    * silent for `agent_lost_grace_s` (its reconnect cap + the heartbeat timeout, longer than any
      wait between its reconnect attempts): lost — its allocations end with `agent_lost`, their
      tokens are revoked and the trials are placed again. If it comes back later still running
      them, its registration answer lists them in `kill` (they were already replaced)."""
    now = master.clock()
    timeout = timedelta(seconds=master.config.agent_heartbeat_timeout_s)
    grace = timedelta(seconds=master.config.agent_lost_grace_s)
    since_start = now - master.started_at
    if since_start < timeout:
        return
    cutoff = now - timeout
    for agent in s.scalars(select(Agent).where(Agent.state == st.AGENT_CONNECTED, Agent.last_seen < cutoff)):
        agent.state = st.AGENT_DISCONNECTED
        agent.disconnected_at = now
        log.warning("event=agent_disconnected agent_id=%s pool=%s last_seen=%s", agent.id, agent.pool, agent.last_seen)
    if since_start < grace:
        return
    lost_cutoff = now - grace
    silent = select(Agent.id).where(Agent.state != st.AGENT_CONNECTED, Agent.last_seen < lost_cutoff)
    for alloc in s.scalars(select(Allocation).where(Allocation.agent_id.in_(silent),
                                                    Allocation.state.in_(st.ALLOC_ON_AGENT))):
        log.warning("event=agent_lost agent_id=%s allocation_id=%s", alloc.agent_id, alloc.id)
        allocations.end_allocation(s, master, alloc, cause=st.CAUSE_AGENT_LOST,
                                   reason="agent stopped answering", exit_code=None)


def escalate_preemptions(s: Session, master: Master) -> None:
    """A trial asked to stop gracefully that has not stopped within the grace period is killed."""
    cutoff = master.clock() - PREEMPT_GRACE
    for alloc in s.scalars(
        select(Allocation).where(
            Allocation.preempt_requested.is_(True),
            Allocation.kill_requested.is_(False),
            Allocation.state.in_(st.ALLOC_ON_AGENT),
        )
    ):
        since = alloc.started_at or alloc.assigned_at or alloc.created_at
        if since < cutoff:
            alloc.kill_requested = True
            log.warning("event=preemption_timeout allocation_id=%s", alloc.id)


def place(s: Session, master: Master, pool: str) -> None:
    agents = list(s.scalars(select(Agent).where(Agent.pool == pool)))
    on_agents = list(
        s.scalars(select(Allocation).where(Allocation.pool == pool, Allocation.state.in_(st.ALLOC_ON_AGENT)))
    )
    pending = list(
        s.scalars(select(Allocation).where(Allocation.pool == pool, Allocation.state == st.ALLOC_PENDING))
    )
    now = master.clock()
    used: dict[str, set[str]] = {}
    for a in on_agents:
        used.setdefault(a.agent_id or "", set()).update(str(x) for x in a.slot_ids)
    busy_agents = {a.agent_id for a in on_agents}
    for agent in agents:
        # Idle tracking feeds the autoscaler's scale-down.
        if agent.id in busy_agents:
            agent.idle_since = None
        elif agent.idle_since is None and agent.state == st.AGENT_CONNECTED:
            agent.idle_since = now
    if not pending:
        return
    pool_cfg = master.config.pool(pool)
    decision = scheduling_policy(pool_cfg.scheduler.type if pool_cfg else None).schedule(
        [PendingAllocation(a.id, a.slots_needed, a.priority, a.created_at.timestamp()) for a in pending],
        [
            RunningAllocation(a.id, a.agent_id or "", tuple(str(x) for x in a.slot_ids), a.priority,
                              stopping=a.preempt_requested or a.kill_requested)
            for a in on_agents
        ],
        [
            AgentSlots(
                agent.id,
                tuple(str(sl["id"]) for sl in agent.slots),
                frozenset(used.get(agent.id, set())),
                schedulable=agent.state == st.AGENT_CONNECTED and agent.enabled,
            )
            for agent in agents
        ],
        preemption=pool_cfg.scheduler.preemption if pool_cfg else True,
    )
    by_id = {a.id: a for a in pending}
    claimed = claim_agents(s, sorted({asg.agent_id for asg in decision.assignments}))
    for asg in decision.assignments:
        if asg.agent_id not in claimed:
            log.info("event=allocation_not_assigned allocation_id=%s agent_id=%s why=%r", asg.allocation_id,
                     asg.agent_id, "the agent was disabled or its instance is being terminated since the snapshot")
            continue  # stays pending: the next tick places it elsewhere
        alloc = by_id[asg.allocation_id]
        alloc.state = st.ALLOC_ASSIGNED
        alloc.agent_id = asg.agent_id
        alloc.slot_ids = list(asg.slot_ids)
        alloc.assigned_at = now
        allocations.ensure_allocation_token(s, master, alloc)
        log.info("event=allocation_assigned allocation_id=%s agent_id=%s slots=%s",
                 alloc.id, asg.agent_id, list(asg.slot_ids))
    running_by_id = {a.id: a for a in on_agents}
    for victim in decision.preemptions:
        alloc = running_by_id[victim]
        if not alloc.preempt_requested:
            alloc.preempt_requested = True
            log.info("event=preempted_for_priority allocation_id=%s", alloc.id)
    if decision.assignments or decision.preemptions:
        master.notify(s)


def claim_agents(s: Session, agent_ids: list[str]) -> set[str]:
    """Of the agents the scheduler assigned work to, those still connected and enabled, with no
    termination begun on their instance: each checked by a compare-and-set on its row, which also
    marks it busy (idle_since NULL). The autoscaler disables an agent it terminates as idle under a
    lock on the same row (loops/autoscaler.py `_claim_idle`), so whichever commits first wins: on
    PostgreSQL this UPDATE waits for that lock and re-checks `enabled` on the row as committed.
    Agents go in id order, the autoscaler's too, so the two never wait on each other in a cycle."""
    s.flush()  # this tick's idle tracking first: the UPDATE below bypasses the session
    ending = select(Instance.instance_id).where(
        Instance.instance_id.is_not(None),
        Instance.state.in_((st.InstanceState.STOPPING, st.InstanceState.TERMINATED)))
    claimed: set[str] = set()
    for agent_id in agent_ids:
        result = s.execute(
            update(Agent)
            .where(Agent.id == agent_id, Agent.enabled.is_(True), Agent.state == st.AGENT_CONNECTED,
                   or_(Agent.instance_id.is_(None), Agent.instance_id.not_in(ending)))
            .values(idle_since=None)
            .execution_options(synchronize_session=False))
        if result.rowcount == 1:  # type: ignore[attr-defined]
            claimed.add(agent_id)
            agent = s.get(Agent, agent_id)
            if agent is not None:
                set_committed_value(agent, "idle_since", None)
    return claimed


def register(master: Master) -> None:
    master.add_loop("pools", lambda: tick(master), master.config.scheduler_interval_s)
