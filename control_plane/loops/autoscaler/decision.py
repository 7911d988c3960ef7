"""Decide: read a pool's snapshot in a read-only transaction, call the pure scale decider on it,
then apply the decision in a write transaction (terminations begun, launch rows requested, the
decision recorded on the pool for `det resource-pool describe`).

Placement may commit between the read and the write: a termination that presumes the instance idle
is applied only if its agent still holds no allocation, checked under a lock on the agent's row
(`claim_idle`), and placement assigns only to an agent still enabled
(control_plane/loops/placement.py), so neither overwrites what the other committed. Launches are
capped by the pool's backoff (control_plane/core/scaling/backoff.py) here, before any row is
written."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import exists, select
from sqlalchemy.orm import Session, aliased

from control_plane.config import SchedulerConfig
from control_plane.core import states as st
from control_plane.core.scaling import (
    Arrival,
    InstanceView,
    LaunchPlan,
    PendingDemand,
    PoolLimits,
    ScaleDecision,
    backoff,
    decide,
)
from control_plane.core.scaling import reconcile as rec
from control_plane.core.scheduling.gang import whole_agent_parts
from control_plane.core.states import InstanceState, PoolState
from control_plane.db.engine import transaction
from control_plane.db.models import Agent, Allocation, ConsolidationMove, Instance, ResourcePool
from control_plane.loops import placement
from control_plane.loops.autoscaler import types, warm
from control_plane.loops.autoscaler.memory import Attempts, PoolMemory
from control_plane.loops.autoscaler.records import agent_of, begin_termination, close_row
from control_plane.master import Master
from control_plane.services import gangs, scaling_history
from provisioners.base import CloudInstance
from provisioners.capacity import cooldowns_of
from provisioners.factory import PoolProvider

log = logging.getLogger("shipyard.autoscaler")

_Stopping = tuple[str | None, datetime | None, str | None]  # (instance id, since, reason)


@dataclass
class Snapshot:
    """What the decider is given, read in one read-only transaction, and what the write needs of it."""

    demand: list[PendingDemand]
    shapes: dict[int, int]
    placeable: int  # pending allocations placement places on free slots now (not demand)
    capped: int  # pending allocations waiting under their job's max_slots (not demand)
    arrivals: list[Arrival]
    views: list[InstanceView]
    live: int
    stopping: list[_Stopping]
    links: dict[str, str]  # launch id -> agent id, for rows not yet linked to their agent
    orphans: list[CloudInstance] = field(default_factory=list)
    boot_times: tuple[timedelta, ...] = ()  # of the pool's recent instances (the idle stage weighs them)
    start_times: tuple[timedelta, ...] = ()  # of the pool's recent starts from the warm pool
    # Live rows whose agent reported an interruption notice and holds no work: terminated now.
    interrupted_idle: list[str] = field(default_factory=list)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def pool_limits(pp: PoolProvider) -> PoolLimits:
    """The decider's limits, from the pool's provider settings."""
    settings = pp.settings
    options = types.options_of(pp.provider)  # a pool of several types: each with its slots and price
    return PoolLimits(
        min_instances=settings.min_instances, max_instances=settings.max_instances,
        slots_per_instance=max((o.slots for o in options), default=pp.slots_per_instance),
        max_idle_agent_period=settings.max_idle_agent_period,
        max_agent_starting_period=settings.max_agent_starting_period,
        max_disconnected_period=settings.max_disconnected_period,
        max_launch_per_decision=settings.max_launch_per_decision,
        arrival_window=settings.arrival_window, options=options,
        out_of_capacity=types.out_of_capacity(pp.provider) if options else frozenset(),
        warm_pool_size=settings.warm_pool_size, warm_pool_max_age=settings.warm_pool_max_age,
    )


def decide_and_apply(master: Master, pool: str, memory: PoolMemory, orphans: list[CloudInstance],
                     now: datetime) -> tuple[ScaleDecision, list[str]]:
    """Read a snapshot (a read-only transaction), decide on it (pure), then apply the decision in a
    write transaction. The decision, and the launch ids of the rows requested for its launches."""
    pp = memory.provider
    assert pp is not None
    limits = pool_limits(pp)
    scheduler = placement.scheduler_of(master, pool)
    with master.read_sessions() as s:
        snap = read_snapshot(s, pool, orphans, limits, now, scheduler, hysteresis=bool(limits.arrival_window))
    decision = decide(snap.demand, snap.views, replace(limits, boot_times=snap.boot_times,
                                                       start_times=snap.start_times), now, snap.arrivals)
    with transaction(master.sessions) as s:
        launch_ids = apply_decision(s, master, pool, memory, decision, snap, now)
    return decision, launch_ids


def _pending_demand(pending: list[Any], not_demand: set[str], slots_per_instance: int
                    ) -> tuple[list[PendingDemand], dict[int, int]]:
    """The pool's pending allocations as the decider's demand but for those in `not_demand`
    (placement places them now, or they wait under their job's max_slots), and every pending one
    counted by slots (the record)."""
    shapes: dict[int, int] = {}
    unmet: dict[int, int] = {}
    for row in pending:
        shapes[row.slots_needed] = shapes.get(row.slots_needed, 0) + 1
        if row.id not in not_demand:
            unmet[row.slots_needed] = unmet.get(row.slots_needed, 0) + 1
    demand: dict[tuple[int, int], int] = {}
    for slots, count in unmet.items():
        # A gang larger than an instance goes on whole instances (core/scheduling/gang.py): demand
        # for that many full instances at once; one that cannot be split stays unschedulable.
        parts = whole_agent_parts(slots, slots_per_instance)
        key = (slots_per_instance, parts) if parts is not None and parts > 1 else (slots, 1)
        demand[key] = demand.get(key, 0) + count
    return [PendingDemand(slots, count, instances) for (slots, instances), count in sorted(demand.items())], shapes


#: How many of the pool's most recent instances' boots the idle stage is given (their median is used).
BOOT_SAMPLES = 20


def boot_times(s: Session, pool: str) -> tuple[timedelta, ...]:
    """Launch to agent first connected, of the pool's most recent instances that connected."""
    rows = s.execute(select(Instance.launched_at, Agent.registered_at).join(Agent, Agent.id == Instance.agent_id)
                     .where(Instance.pool == pool, Instance.launched_at.is_not(None))
                     .order_by(Instance.launched_at.desc()).limit(BOOT_SAMPLES))
    return tuple(connected - launched for launched, connected in rows if connected >= launched)


def arrivals_of(s: Session, pool: str, since: datetime) -> list[Arrival]:
    """The demand arrivals since `since`: every allocation created then, whatever it became, but
    not a trial's run that follows a preempted one (a consolidation move, a spot notice, a higher
    priority; also a pause and its resume): the master made that demand itself, and counted as
    arriving it would make the idle policy keep instances for work that is not coming (scale-down
    hysteresis). A restart after a crash, or after an instance lost without notice, still counts."""
    earlier = aliased(Allocation)
    returned = exists().where(earlier.task_id == Allocation.task_id, earlier.run_id == Allocation.run_id - 1,
                              earlier.end_cause == st.ExitCause.PREEMPTED)
    return [Arrival(at, slots) for at, slots in s.execute(
        select(Allocation.created_at, Allocation.slots_needed).where(
            Allocation.pool == pool, Allocation.created_at > since, ~returned))]


def read_snapshot(s: Session, pool: str, orphans: list[CloudInstance], limits: PoolLimits,
                  now: datetime, scheduler: SchedulerConfig, *, hysteresis: bool = True) -> Snapshot:
    """The pending demand, the demand arrivals of the window, and a view of every billed instance
    (live rows, stopping rows, orphans) with its agent's state and work.

    The demand is the queue less what placement would place now on the free slots of connected,
    enabled agents (`placement.dry_run`), and those placements count as the agents' work: a task
    queued between two placement passes (a trial requeued by a move or a preemption, a new
    submission) launches nothing while there is room for it, and the agent it is about to land on is
    not idle. A connected agent that is disabled (cordoned, drained, disabled by an admin) takes no
    demand."""
    plan, dry = placement.dry_run(s, pool, scheduler)
    placed = {a.allocation_id for a in dry.assignments}
    # Waiting for their own job's slots (max_slots): no new instance helps them.
    demand, shapes = _pending_demand(plan.pending, placed | set(dry.capped), limits.slots_per_instance)
    arrivals = [] if not hysteresis else arrivals_of(s, pool, now - limits.arrival_window)
    billed = list(s.scalars(select(Instance).where(Instance.pool == pool,
                                                    Instance.state.in_(st.INSTANCE_KEPT))))
    rows = [r for r in billed if r.state in st.INSTANCE_LIVE]
    stopping = [r for r in billed if r.state == InstanceState.STOPPING]
    # Every agent an allocation holds is busy, each part of a gang across instances included.
    busy = gangs.busy_slots(plan.on_agents)
    for assignment in dry.assignments:  # about to be placed: the agents' work from the next pass
        for part in assignment.parts:
            busy[part.agent_id] = busy.get(part.agent_id, 0) + len(part.slot_ids)
    running = set(busy)  # agents with any task, zero-slot ones included
    views = []
    links: dict[str, str] = {}
    interrupted_idle = []
    for row in rows:
        agent = agent_of(s, row)
        if agent is not None and row.agent_id is None:
            links[row.launch_id] = agent.id
        if agent is not None and agent.interruption_action is not None:
            # Its cloud announced it goes (services/interruptions.py): never capacity, billed until
            # gone, like a stopping instance; once its work has moved it is terminated.
            views.append(InstanceView(id=row.launch_id, state=InstanceState.STOPPING,
                                      launched_at=row.launched_at or row.requested_at))
            if agent.id not in running:
                interrupted_idle.append(row.launch_id)
            continue
        # Started from the warm pool: as if launched then, until its agent registers again.
        restarted = warm.resumed(row)
        connected = agent is not None and agent.state == st.AgentState.CONNECTED and not restarted
        views.append(InstanceView(
            id=row.launch_id,
            state=InstanceState(row.state),
            launched_at=(row.resumed_at if restarted else None) or row.launched_at or row.requested_at,
            agent_connected=connected,
            agent_first_connected_at=agent.registered_at if agent and not restarted else None,
            agent_disconnected_since=None if connected or agent is None else agent.disconnected_at,
            busy_slots=busy.get(agent.id, 0) if agent else 0,
            idle_since=(agent.idle_since or now) if connected and agent.id not in running else None,
            slots=types.slots_of(limits.options, row.instance_type), instance_type=row.instance_type or "",
            accepts_work=agent is None or agent.enabled, spot=row.capacity == types.SPOT,
        ))
    # Instances being stopped, and orphans, bill until the cloud says they are gone: they leave
    # no room under max_instances (never capacity).
    views += [InstanceView(id=r.launch_id, state=InstanceState.STOPPING, launched_at=r.launched_at or r.requested_at)
              for r in stopping]
    views += [InstanceView(id=f"orphan:{ci.id}", state=InstanceState.STOPPING, launched_at=ci.launched_at)
              for ci in orphans]
    views += [warm.parked_view(r) for r in billed if r.state in st.INSTANCE_PARKED]
    return Snapshot(demand=demand, shapes=shapes, placeable=len(placed), capped=len(dry.capped), arrivals=arrivals,
                    views=views, live=len(rows),
                    stopping=[(r.instance_id, r.terminate_requested_at, r.terminate_reason) for r in stopping],
                    links=links, orphans=orphans, interrupted_idle=interrupted_idle,
                    boot_times=boot_times(s, pool) if hysteresis else (),
                    start_times=warm.start_times(s, pool) if hysteresis else ())


def apply_decision(s: Session, master: Master, pool: str, memory: PoolMemory, decision: ScaleDecision,
                   snap: Snapshot, now: datetime) -> list[str]:
    """Write the decision: launches capped by the backoff, agents linked to their rows, the
    terminations begun (an idle one only if `claim_idle` agrees), a `requested` row per launch, and
    the decision recorded on the pool. The launch ids of the requested rows."""
    pp = memory.provider
    assert pp is not None
    prow = s.get(ResourcePool, pool)
    assert prow is not None
    reasons = list(decision.reasons)
    if snap.placeable:
        fit, it = ("fits", "it") if snap.placeable == 1 else ("fit", "them")
        reasons.insert(0, f"{_plural(snap.placeable, 'pending task')} {fit} the free slots of connected instances: "
                          f"placement takes {it}, no launch for {it}")
    if snap.capped:
        reasons.insert(0, f"{_plural(snap.capped, 'pending task')} {'waits' if snap.capped == 1 else 'wait'} "
                          f"for {'its' if snap.capped == 1 else 'their'} job's own slots (max_slots): no launch")
    if memory.last_launch_failure_at is None and prow.backoff_until is not None and prow.backoff_until > now:
        memory.last_launch_failure_at = now  # restarted during a backoff: the probe interval starts again
    allowance = backoff.launch_allowance(PoolState(prow.state), prow.backoff_until, memory.last_launch_failure_at,
                                         pp.settings.launch_probe_interval, now)
    launch = decision.launch
    if launch and allowance.cap is not None and launch > allowance.cap:
        error = f" ({prow.error})" if prow.error and prow.state != PoolState.DISABLED else ""
        reasons.append(f"{'not launching' if allowance.cap == 0 else 'launch 1'}: {allowance.reason}{error}")
        launch = allowance.cap
    for launch_id, agent_id in snap.links.items():
        row = s.get(Instance, launch_id)
        if row is not None and row.agent_id is None:
            row.agent_id = agent_id
    claims = _claim_idle_instances(s, decision)
    terminated = _apply_terminations(s, master, pool, decision, reasons, now, claims)
    parked, started = warm.apply(s, decision, reasons, now, claims)
    for launch_id in snap.interrupted_idle:
        row = s.get(Instance, launch_id)
        if row is not None and row.state in st.INSTANCE_LIVE and row.instance_id and claim_idle(s, row) is None:
            reason = row.terminate_reason or "interruption notice"
            begin_termination(s, row, now, reason)
            terminated.append({"id": launch_id, "reason": reason, "cause": scaling_history.CAUSE_INTERRUPTION})
    launch_ids: list[str] = []
    planned = types.planned_rows(decision, launch)
    for instance_type, capacity in planned:  # the type the decider chose
        launch_id = uuid.uuid4().hex
        s.add(Instance(launch_id=launch_id, pool=pool, provider=pp.settings.type, state=InstanceState.REQUESTED,
                       requested_at=now, instance_type=instance_type, capacity=capacity))
        launch_ids.append(launch_id)
    _record_decision(prow, memory, snap, now, launch=launch, terminated=terminated, reasons=reasons,
                     allowance=allowance, launches=decision.launches if launch == decision.launch else (),
                     usd_per_hour=decision.usd_per_hour if launch == decision.launch else None)
    # The history every API worker reads: this decision, or the steady run it extends.
    scaling_history.record_decision(s, pool, now, scaling_history.retention_of(master.config),
                                    launches=[*planned, *started], terminated=[*terminated, *parked], reasons=reasons)
    return launch_ids


def _claim_idle_instances(s: Session, decision: ScaleDecision) -> dict[str, str | None]:
    """`claim_idle` for every instance the decision presumes idle (an idle termination, a park) that
    is still live, in agent id order, as placement takes the agents' rows: no cycle of waits. Launch
    id -> why the claim was refused, or None when the instance is claimed."""
    ids = {t.id for t in decision.terminate if t.presumes_idle} | {p.id for p in decision.park}
    rows = [r for r in (s.get(Instance, i) for i in ids) if r is not None and r.state in st.INSTANCE_LIVE]
    return {r.launch_id: claim_idle(s, r) for r in sorted(rows, key=lambda r: (r.agent_id or "", r.launch_id))}


def _apply_terminations(s: Session, master: Master, pool: str, decision: ScaleDecision, reasons: list[str],
                        now: datetime, claims: dict[str, str | None]) -> list[dict[str, str]]:
    """Begin the decided terminations of rows still live (or parked); one presuming the instance idle
    only if its claim (`_claim_idle_instances`) went through (else why not is added to `reasons`).
    The terminations applied."""
    terminated: list[dict[str, str]] = []
    for t in decision.terminate:
        row = s.get(Instance, t.id)
        if row is None or row.state not in st.INSTANCE_LIVE | st.INSTANCE_PARKED:
            continue  # an orphan (its terminate is sent by send_terminations), or ended meanwhile
        if t.presumes_idle:
            refused = claims.get(t.id, "it is no longer live")
            if refused:
                reasons.append(f"not terminating {t.id}: {refused}")
                log.info("event=idle_termination_refused pool=%s launch_id=%s instance_id=%s decided=%r why=%r",
                         pool, row.launch_id, row.instance_id, t.reason, refused)
                continue
        if row.instance_id is None:
            close_row(s, master, row, now, t.reason)
        else:
            begin_termination(s, row, now, t.reason)
        terminated.append({"id": t.id, "reason": t.reason, "cause": scaling_history.CAUSE_IDLE if t.presumes_idle
                           else scaling_history.CAUSE_DECIDER})
    return terminated


def _record_decision(prow: ResourcePool, memory: PoolMemory, snap: Snapshot, now: datetime, *, launch: int,
                     terminated: list[dict[str, str]], reasons: list[str], allowance: backoff.LaunchAllowance,
                     launches: tuple[LaunchPlan, ...] = (), usd_per_hour: float | None = None) -> None:
    """The pool's state after its backoff, and the decision as `det resource-pool describe` shows it."""
    pp = memory.provider
    assert pp is not None
    # The backoff is over: the next launch tries again, and the error that caused it is history.
    new_state = backoff.current_state(PoolState(prow.state), prow.backoff_until, now)
    previous_error = None
    if new_state != prow.state and new_state == PoolState.OK and prow.error:
        previous_error, prow.error = prow.error, None
        log.info("event=pool_backoff_over pool=%s previous_error=%r", prow.name, previous_error)
    prow.state = new_state
    prow.last_decision = {
        "launch": launch, "terminate": terminated,
        "reasons": reasons, "pending": {str(k): v for k, v in snap.shapes.items()}, "instances": snap.live,
        "stopping": len(snap.stopping), "orphans": len(snap.orphans),
        "terminating": terminating(memory, snap.stopping, snap.orphans, now),
        "backoff": None if prow.backoff_until is None or prow.backoff_until <= now else {
            "until": prow.backoff_until.isoformat(), "failures": prow.launch_failures,
            "probe": allowance.cap == 1,
            "next_probe_at": allowance.next_probe_at.isoformat() if allowance.next_probe_at else None,
        },
        **({"previous_error": previous_error} if previous_error else {}),
        # Subnets/zones skipped after capacity errors (provisioners/capacity.py), and the slots one
        # instance brings (what submissions and pending trials are checked against).
        "capacity": cooldowns_of(pp.provider), "slots_per_instance": pp.slots_per_instance,
        # A pool of several types: what it may launch at which price, and this decision's choice.
        **({"offers": types.describe_offers(options), "launches": types.describe_plans(launches),
            "usd_per_hour": usd_per_hour} if (options := types.options_of(pp.provider)) else {}),
    }
    prow.last_decision_at = now


def claim_idle(s: Session, row: Instance) -> str | None:
    """Whether the instance is still without work, decided under a lock on its agent's row; if
    so its agent is disabled in the same transaction (nothing new lands on it). The reason it is
    not, else. The lock (FOR UPDATE on PostgreSQL; SQLite's write transaction already holds the
    database) waits for a placement writing to that agent to commit (a gang's placement claims
    every agent it takes), and the check for allocations runs after it, so it sees that
    placement's assignment, whether the agent is the allocation's chief or another of its parts."""
    agent_id = row.agent_id or (s.scalar(select(Agent.id).where(Agent.instance_id == row.instance_id))
                                if row.instance_id else None)
    if agent_id is None:
        return None  # no agent: nothing can run there, and a stopping instance's agent is refused
    agent = s.scalar(select(Agent).where(Agent.id == agent_id).with_for_update()
                     .execution_options(populate_existing=True))
    if agent is None:
        return None
    held = len(gangs.holding(s, agent.id, agent.pool))  # a part of a gang holds it too
    if held:
        return f"its agent {agent.id} took {_plural(held, 'allocation')} since the decision"
    # A consolidation replacement stays while the work it was launched for is still stopping on the
    # instance it replaces (checkpointing can outlast the idle period); once that work has exited,
    # the trial's next allocation is pending demand the decider packs onto it.
    moving = s.scalar(select(ConsolidationMove.allocation_id).join(
        Allocation, Allocation.id == ConsolidationMove.allocation_id).where(
        ConsolidationMove.replacement_launch_id == row.launch_id, ConsolidationMove.abandoned.is_(False),
        Allocation.state != st.AllocationState.TERMINATED).limit(1))
    if moving is not None:
        return f"it replaces an instance whose allocation {moving} is still moving onto it"
    agent.enabled = False
    return None


def terminating(memory: PoolMemory, stopping: list[_Stopping], orphans: list[CloudInstance],
                now: datetime) -> list[dict[str, Any]]:
    """What `det resource-pool describe` shows of the terminations still waiting on the cloud."""
    out = []
    for iid, since, reason in [*stopping, *((ci.id, None, "orphan") for ci in orphans)]:
        if iid is None:
            continue
        attempts = memory.terminations.get(iid, Attempts())
        out.append({"instance_id": iid, "reason": reason, "since": since.isoformat() if since else None,
                    "attempts": attempts.count, "last_error": attempts.last_error,
                    "overdue": rec.terminate_overdue(since, now)})
    return out
