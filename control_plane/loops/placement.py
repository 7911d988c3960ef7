"""The pool loop: heartbeats, trial reconciliation, and placement — every tick (0.5 s) and at once
whenever something changes (`master.notify()`).

Shell code: it reads a snapshot from the database, asks the pure scheduler, and writes the
result back in one transaction. Agents learn about their work through their long-poll."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from control_plane.config import SchedulerConfig
from control_plane.core import gang_run
from control_plane.core import states as st
from control_plane.core.expconf import ConfigInvalid, ExperimentConfig, Resources
from control_plane.core.scheduling import (
    AgentSlots,
    Assignment,
    Part,
    PendingAllocation,
    RunningAllocation,
    ScheduleDecision,
    scheduling_policy,
)
from control_plane.db.engine import transaction
from control_plane.db.models import Agent, Allocation, Experiment, Instance, Task
from control_plane.master import Master
from control_plane.services import allocations, gangs, lifecycle
from control_plane.services.agents import expire_drains

log = logging.getLogger("shipyard.pools")



def tick(master: Master) -> None:
    with transaction(master.sessions) as s:
        expire_agents(s, master)
    with transaction(master.sessions) as s:
        lifecycle.reconcile_all(s, master)
    with transaction(master.sessions) as s:
        expire_drains(s, master)  # `det agent disable --drain` past agent_drain_timeout_s
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
    if master.serving_since is None:
        return  # this master's API does not answer yet: no agent could have been heard
    # From when this process began to lead (before that another master, or none, ran the loops)
    # and its API answered.
    since_start = now - max(master.started_at, master.serving_since, master.leading_since or master.started_at)
    if since_start < timeout:
        return
    cutoff = now - timeout
    for agent in s.scalars(select(Agent).where(Agent.state == st.AgentState.CONNECTED, Agent.last_seen < cutoff)):
        agent.state = st.AgentState.DISCONNECTED
        agent.disconnected_at = now
        log.warning("event=agent_disconnected agent_id=%s pool=%s last_seen=%s", agent.id, agent.pool, agent.last_seen)
    if since_start < grace:
        return
    lost_cutoff = now - grace
    silent = select(Agent.id).where(Agent.state != st.AgentState.CONNECTED, Agent.last_seen < lost_cutoff)
    # Its part of a gang across agents is gone too: the gang's other parts are stopped, and the
    # allocation ends (agent_lost) once they have exited (services/allocations.py).
    lost = set(s.scalars(silent))
    if not lost:
        return
    holding = set(s.scalars(select(Allocation.agent_id).where(
        Allocation.agent_id.in_(lost), Allocation.placement.is_(None), Allocation.state.in_(st.ALLOC_ON_AGENT))))
    for alloc in s.scalars(select(Allocation).where(Allocation.placement.is_not(None),
                                                    Allocation.state.in_(st.ALLOC_ON_AGENT))):
        holding.update(p["agent"] for p in gangs.parts(alloc) if p["agent"] in lost and p["state"] != "exited")
    for agent_id in sorted(holding):
        log.warning("event=agent_lost agent_id=%s", agent_id)
        allocations.end_agent_allocations(s, master, agent_id, st.ExitCause.AGENT_LOST, f"agent {agent_id} stopped answering")


def escalate_preemptions(s: Session, master: Master) -> None:
    """A trial asked to stop gracefully that has not stopped within the grace period (counted from
    the request) is killed."""
    cutoff = master.clock() - timedelta(seconds=master.config.preemption_grace_s)
    for alloc in s.scalars(
        select(Allocation).where(
            Allocation.preempt_requested.is_(True),
            Allocation.kill_requested.is_(False),
            Allocation.state.in_(st.ALLOC_ON_AGENT),
        )
    ):
        since = alloc.preempt_requested_at or alloc.started_at or alloc.assigned_at or alloc.created_at
        if since < cutoff:
            alloc.kill_requested = True
            log.warning("event=preemption_timeout allocation_id=%s", alloc.id)


@dataclass
class _Snapshot:
    """What one placement pass of a pool reads: its agents, the allocations on them, and its queue."""

    agents: list[Agent]
    on_agents: list[Allocation]
    pending: list[Any]  # rows: id, slots_needed, priority, weight, created_at, experiment_id, waiting_reason, task_id
    used: dict[str, set[str]]  # agent id -> slot ids in use


def place(s: Session, master: Master, pool: str) -> None:
    """Read the pool's snapshot (agents, allocations on them, the queue with each job's priority,
    weight, queue position and max_slots), ask the pool's policy, and apply its decision: gangs
    assigned whole (every agent of a gang claimed, or none), preemptions asked for, and every
    waiting allocation's reason recorded (`det job list` shows it)."""
    snap = _read(s, pool)
    now = master.clock()
    _track_idle(snap, now)
    if not snap.pending:
        return
    scheduler = scheduler_of(master, pool)
    queue, running = _queue_and_running(s, snap, scheduler.default_priority)
    decision = scheduling_policy(scheduler.type).schedule(queue, running, agent_slots(s, snap),
                                                          preemption=scheduler.preemption,
                                                          fitting=scheduler.fitting_policy)
    _apply(s, master, snap, decision, now)


def scheduler_of(master: Master, pool: str) -> SchedulerConfig:
    """The pool's scheduler settings; a pool row left from an older config is still drained, with
    the scheduler's defaults."""
    pool_cfg = master.config.pool(pool)
    return pool_cfg.scheduler if pool_cfg is not None else SchedulerConfig()


def agent_slots(s: Session, snap: _Snapshot) -> list[AgentSlots]:
    """The pool's agents as the scheduler sees them: schedulable when connected, enabled and not on
    an instance whose termination has begun (`claim_agents` refuses those)."""
    ending: set[str] = set()
    if snap.agents:  # the pool's agents on an instance whose row is stopping or ended, by either link
        pool = snap.agents[0].pool
        ending = set(s.scalars(select(Agent.id).join(Instance, Instance.instance_id == Agent.instance_id).where(
            Agent.pool == pool, Instance.state.in_((st.InstanceState.STOPPING, st.InstanceState.TERMINATED)))))
        ending |= set(s.scalars(select(Instance.agent_id).where(  # few: the terminations in flight
            Instance.pool == pool, Instance.state == st.InstanceState.STOPPING, Instance.agent_id.is_not(None))))
    return [AgentSlots(agent.id, tuple(str(sl["id"]) for sl in agent.slots), frozenset(snap.used.get(agent.id, set())),
                       schedulable=(agent.state == st.AgentState.CONNECTED and agent.enabled
                                    and agent.id not in ending))
            for agent in snap.agents]


def dry_run(s: Session, pool: str, scheduler: SchedulerConfig) -> tuple[_Snapshot, ScheduleDecision]:
    """What a placement pass would assign now on free slots (no preemption), written nowhere: the
    autoscaler's demand is the queue less these (loops/autoscaler/decision.py), as cluster-autoscaler
    filters out the pods that fit existing nodes, with the same code as placement."""
    snap = _read(s, pool)
    if not snap.pending:
        return snap, ScheduleDecision()
    queue, running = _queue_and_running(s, snap, scheduler.default_priority)
    return snap, scheduling_policy(scheduler.type).schedule(queue, running, agent_slots(s, snap), preemption=False,
                                                            fitting=scheduler.fitting_policy)


def _read(s: Session, pool: str) -> _Snapshot:
    agents = list(s.scalars(select(Agent).where(Agent.pool == pool)))
    on_agents = list(
        s.scalars(select(Allocation).where(Allocation.pool == pool, Allocation.state.in_(st.ALLOC_ON_AGENT)))
    )
    # The queue as plain rows (it can be long): ORM objects only for what gets assigned.
    pending = list(s.execute(
        select(Allocation.id, Allocation.slots_needed, Allocation.priority, Allocation.weight,
               Allocation.created_at, Allocation.experiment_id, Allocation.waiting_reason, Allocation.task_id)
        .where(Allocation.pool == pool, Allocation.state == st.AllocationState.PENDING)))
    used: dict[str, set[str]] = {}
    for a in on_agents:
        for agent_id, slot_ids in gangs.held(a):
            used.setdefault(agent_id, set()).update(slot_ids)
    return _Snapshot(agents, on_agents, pending, used)


def _track_idle(snap: _Snapshot, now: datetime) -> None:
    """Idle tracking feeds the autoscaler's scale-down: an agent with no allocation is idle since
    the first pass that saw it so."""
    for agent in snap.agents:
        if agent.id in snap.used:
            agent.idle_since = None
        elif agent.idle_since is None and agent.state == st.AgentState.CONNECTED:
            agent.idle_since = now


def _queue_and_running(s: Session, snap: _Snapshot,
                       default_priority: int) -> tuple[list[PendingAllocation], list[RunningAllocation]]:
    """The scheduler's view of the queue and of what runs, each with its job's attributes."""
    jobs = _jobs(s, {a.experiment_id for a in snap.pending} | {a.experiment_id for a in snap.on_agents},
                 default_priority)

    # A command or notebook (services/tasks.py) is its own job and is not preempted: it cannot checkpoint.
    interactive = _task_ids(s, {a.task_id for a in (*snap.pending, *snap.on_agents) if a.experiment_id is None})

    def job_of(a: Any) -> dict[str, Any]:
        return jobs.get(a.experiment_id or -1) or {"job_id": a.task_id if a.task_id in interactive else "",
                                                    "priority": a.priority, "weight": a.weight,
                                                    "queue_position": None, "max_slots": None,
                                                    "preemptible": a.task_id not in interactive}

    queue = []
    for a in snap.pending:
        j = job_of(a)
        queue.append(PendingAllocation(a.id, a.slots_needed, j["priority"], a.created_at.timestamp(), j["job_id"],
                                       j["weight"], j["queue_position"], j["max_slots"]))
    running = []
    for a in snap.on_agents:
        j = job_of(a)
        since = a.started_at or a.assigned_at or a.created_at
        running.append(RunningAllocation(
            a.id, tuple(Part(agent_id, tuple(ids)) for agent_id, ids in gangs.held(a)), j["priority"],
            preemptible=j["preemptible"], stopping=a.preempt_requested or a.kill_requested, job_id=j["job_id"], weight=j["weight"],
            order=since.timestamp(), max_slots=j["max_slots"]))
    return queue, running


def _apply(s: Session, master: Master, snap: _Snapshot, decision: ScheduleDecision, now: datetime) -> None:
    """Assign the gangs whose agents are all claimed, record waiting reasons, ask for preemptions."""
    claimed = claim_agents(s, sorted({p.agent_id for asg in decision.assignments for p in asg.parts}))
    ids = [asg.allocation_id for asg in decision.assignments]
    rows = {a.id: a for n in range(0, len(ids), 1000)
            for a in s.scalars(select(Allocation).where(Allocation.id.in_(ids[n:n + 1000])))}
    with s.no_autoflush:  # one flush at the end (batched), not one per allocation
        _assign(s, master, decision.assignments, claimed, rows)
    known = {a.id: a.waiting_reason for a in snap.pending}
    changed = [{"id": alloc_id, "waiting_reason": reason} for alloc_id, reason in decision.reasons.items()
               if known.get(alloc_id) != reason]
    if changed:  # one executemany by primary key (the rows are not loaded as objects)
        s.execute(update(Allocation), changed)
    running_by_id = {a.id: a for a in snap.on_agents}
    for victim in decision.preemptions:
        alloc = running_by_id[victim]
        if lifecycle.request_preemption(alloc, now):
            log.info("event=preempted_by_scheduler allocation_id=%s", alloc.id)
    if decision.assignments or decision.preemptions:
        master.notify(s)


def _assign(s: Session, master: Master, assignments: Sequence[Assignment], claimed: set[str],
            rows: dict[str, Allocation]) -> None:
    """Write the gangs whose every agent was claimed; the others stay pending, whole."""
    now = master.clock()
    for asg in assignments:
        missing = [p.agent_id for p in asg.parts if p.agent_id not in claimed]
        if missing:
            log.info("event=allocation_not_assigned allocation_id=%s agent_id=%s why=%r", asg.allocation_id,
                     missing[0], "the agent was disabled or its instance is being terminated since the snapshot")
            continue  # stays pending, whole: the next tick places it elsewhere
        alloc = rows.get(asg.allocation_id)
        if alloc is None or alloc.state != st.AllocationState.PENDING:
            continue
        alloc.state = st.AllocationState.ASSIGNED
        alloc.agent_id = asg.agent_id
        alloc.slot_ids = list(asg.slot_ids)
        alloc.placement = (gang_run.new_parts((p.agent_id, p.slot_ids) for p in asg.parts)
                           if len(asg.parts) > 1 else None)
        alloc.waiting_reason = None
        alloc.assigned_at = now
        allocations.ensure_allocation_token(s, master, alloc)
        log.info("event=allocation_assigned allocation_id=%s agent_id=%s slots=%s%s",
                 alloc.id, asg.agent_id, list(asg.slot_ids),
                 "" if len(asg.parts) == 1 else " gang=" + ",".join(f"{p.agent_id}:{len(p.slot_ids)}" for p in asg.parts))


#: Experiments whose stored config was found invalid, logged once per process (placement and the
#: autoscaler's dry run read it every pass).
_INVALID_LOGGED: set[int] = set()


def _resources(experiment_id: int, config: dict[str, Any]) -> Resources:
    """The experiment's typed resources. A row that no longer validates is scheduled with the
    model's defaults (and logged, once) rather than stopping placement in every pool."""
    try:
        return ExperimentConfig.from_stored(config).resources
    except ConfigInvalid as e:
        if experiment_id not in _INVALID_LOGGED:
            _INVALID_LOGGED.add(experiment_id)
            log.warning("event=experiment_config_invalid experiment_id=%s error=%r", experiment_id, str(e))
        return Resources()


def _jobs(s: Session, experiment_ids: set[int | None], default_priority: int) -> dict[int, dict[str, Any]]:
    """The job attributes of experiments (one query): priority (the job's, else its config's, else
    the pool's default), weight (the job's, else its config's), queue position, and the config's
    resources.max_slots and resources.preemptible."""
    ids = [i for i in experiment_ids if i is not None]
    out: dict[int, dict[str, Any]] = {}
    for chunk in range(0, len(ids), 1000):
        for eid, job_id, priority, weight, position, config in s.execute(
            select(Experiment.id, Experiment.job_id, Experiment.priority, Experiment.weight,
                   Experiment.queue_position, Experiment.config).where(Experiment.id.in_(ids[chunk:chunk + 1000]))
        ):
            resources = _resources(eid, config)
            if priority is None:
                priority = resources.priority if resources.priority is not None else default_priority
            out[eid] = {"job_id": job_id or f"experiment-{eid}", "priority": int(priority),
                        "weight": float(weight if weight is not None else resources.weight),
                        "queue_position": position, "max_slots": resources.max_slots,
                        "preemptible": resources.preemptible}
    return out


def _task_ids(s: Session, ids: set[str]) -> set[str]:
    """Which of these task ids are commands' or notebooks' (rows of `tasks`)."""
    found: set[str] = set()
    listed = sorted(ids)
    for n in range(0, len(listed), 1000):
        found.update(s.scalars(select(Task.id).where(Task.id.in_(listed[n:n + 1000]))))
    return found


def claim_agents(s: Session, agent_ids: list[str]) -> set[str]:
    """Of the agents the scheduler assigned work to, those still connected and enabled, with no
    termination begun on their instance: each checked by a compare-and-set on its row, which also
    marks it busy (idle_since NULL). The autoscaler disables an agent it terminates as idle under a
    lock on the same row (loops/autoscaler/decision.py `claim_idle`), so whichever commits first wins: on
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
            .where(Agent.id == agent_id, Agent.enabled.is_(True), Agent.state == st.AgentState.CONNECTED,
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
    master.add_loop("pools", lambda: tick(master), master.config.scheduler_interval_s,
                    min_gap_s=min(0.1, master.config.scheduler_interval_s))
