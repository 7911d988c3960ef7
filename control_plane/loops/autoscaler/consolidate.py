"""Consolidate: the autoscaler's stage that moves the running work of one instance, by checkpoint and
resume, onto the free slots of the pool's other instances, and terminates the emptied instance.

Per elastic pool and tick, after the scale decision:

1. an instance emptied by an earlier move (a live row whose agent consolidation cordoned, with a
   move recorded) whose agent holds no allocation any more is terminated, reason "consolidated";
2. with `provider.consolidation.enabled`, a snapshot of the pool as placement reads it
   (control_plane/loops/placement.py: the same queue, running work and agents) goes to the pure core
   (control_plane/core/scaling/consolidation.py) with the moves of the last hour; a plan is applied
   in one transaction: under a lock on the agent's row (as the idle claim takes it) the instance must
   still hold exactly the planned work, then the agent is disabled (cordoned: placement puts nothing
   new there), each allocation is asked to stop gracefully (its trial sees `should_preempt`,
   checkpoints and exits; the lifecycle requeues it from that checkpoint, not as a failure; past
   `preemption_grace_s` it is killed, as any preemption) and a `consolidation_moves` row is written
   per allocation with the reason and the estimated saving.

A replacement (the core's plan names a cheaper option: the work fits one such instance) is applied
in two steps. First, under the same lock and check, the instance is cordoned, a `requested` row of
that option is written (launched by this tick like the decision's) and each move row is `pending`
with the replacement's launch id. Then, on a later tick, once the replacement's agent has connected,
the work is asked to checkpoint and stop (placement puts it where it fits, the new instance being
the free one) and the rows stop being pending; if the replacement fails, or has not connected
within max_agent_starting_period, the instance is enabled again and the move is abandoned.

The moves rows are the record: the budget counts them across restarts, step 1 finds the instances
it emptied from them, and describe and the web UI show them (services/consolidation.py)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from control_plane.core import states as st
from control_plane.core.scaling import backoff, consolidation
from control_plane.core.scheduling import AgentSlots, PendingAllocation, RunningAllocation
from control_plane.core.states import PoolState
from control_plane.db.engine import transaction
from control_plane.db.models import Agent, ConsolidationMove, Instance, ResourcePool
from control_plane.errors import NotLeader
from control_plane.loops import placement
from control_plane.loops.autoscaler.memory import PoolMemory
from control_plane.loops.autoscaler.records import agent_of, begin_termination
from control_plane.loops.autoscaler.types import SPOT, matches, options_of, out_of_capacity
from control_plane.master import Master
from control_plane.services import gangs, lifecycle, scaling_history
from provisioners.base import InstanceOffer, offers_of
from shipyard_common import clouds

log = logging.getLogger("shipyard.autoscaler")

CONSOLIDATED = "consolidated"


def run(master: Master, pool: str, memory: PoolMemory, now: datetime) -> list[str]:
    """One consolidation step of `pool` (see the module's docstring): the launch ids of the
    replacements it requested, for this tick to launch. A failure here is logged and leaves the
    tick's launches and terminations to go on: consolidation is an optimisation, never a reason for
    the pool to stop scaling."""
    try:
        return _run(master, pool, memory, now)
    except NotLeader:
        raise
    except Exception:
        log.exception("event=consolidation_error pool=%s", pool)
        return []


def _run(master: Master, pool: str, memory: PoolMemory, now: datetime) -> list[str]:
    pp = memory.provider
    assert pp is not None
    offers = offers_of(pp.provider)
    with transaction(master.sessions) as s:
        emptied = finish_emptied(s, pool, now)
        scaling_history.record_terminations(s, pool, now, scaling_history.retention_of(master.config), emptied)
        advance_replacements(s, master, pool, now, pp.settings.max_agent_starting_period, offers)
    settings = pp.settings.consolidation
    if not settings.enabled:
        return []
    scheduler = placement.scheduler_of(master, pool)
    budget = consolidation.Budget(settings.max_moves_per_hour, settings.min_run_time, pp.settings.min_instances)
    with master.read_sessions() as s:
        instances, running, pending = _snapshot(s, pool, scheduler.default_priority, offers)
        recent = recent_move_times(s, pool, now)
        cooling = set(s.scalars(select(ConsolidationMove.launch_id).where(  # abandoned within the hour
            ConsolidationMove.pool == pool, ConsolidationMove.abandoned.is_(True),
            ConsolidationMove.at > now - consolidation.HOUR)))
    gone = out_of_capacity(pp.provider)
    decision = consolidation.decide(instances, running, pending, budget, recent, now, policy=scheduler.type,
                                    fitting=scheduler.fitting_policy,
                                    options=tuple(o for o in options_of(pp.provider) if o not in gone),
                                    not_replaced=cooling)
    launch_ids: list[str] = []
    with transaction(master.sessions) as s:
        refused = apply_plan(s, master, pool, decision.plan, now, pp.settings.type, launch_ids,
                             pp.settings.max_instances) if decision.plan is not None else None
        _record(s, pool, decision, refused, now)
        if decision.plan is not None and refused is None:
            plan = decision.plan
            scaling_history.record_consolidation(s, pool, now, scaling_history.retention_of(master.config),
                                                 instance=plan.instance, allocations=plan.allocations,
                                                 reason=plan.reason, saving=plan.saving, unit=plan.unit)
    return launch_ids


def recent_move_times(s: Session, pool: str, now: datetime) -> list[datetime]:
    return list(s.scalars(select(ConsolidationMove.at).where(ConsolidationMove.pool == pool,
                                                            ConsolidationMove.at > now - consolidation.HOUR)))


def price_of(row: Instance, offers: Sequence[InstanceOffer]) -> float | None:
    """What an instance costs an hour: the pool's offer for its type in its capacity (the region's
    price, a GCP machine's attached GPUs included, spot's when it is spot); without one, an on-demand
    row's list price; None when not known."""
    spot = row.capacity == SPOT
    for o in offers:
        if o.spot == spot and row.instance_type and matches(o.instance_type, row.instance_type) \
                and o.usd_per_hour is not None:
            return o.usd_per_hour
    return clouds.on_demand_usd_per_hour(row.instance_type) if row.instance_type and not spot else None


def _snapshot(s: Session, pool: str, default_priority: int, offers: Sequence[InstanceOffer] = ()
              ) -> tuple[list[consolidation.InstanceSlots], list[RunningAllocation], list[PendingAllocation]]:
    """The pool's running instances with their agents and prices, and its running work and queue
    exactly as placement reads them: placement's own readers, so the simulation sees what placement
    sees."""
    snap = placement._read(s, pool)
    queue, running = placement._queue_and_running(s, snap, default_priority)
    agents = {a.id: a for a in snap.agents}
    instances = []
    for row in s.scalars(select(Instance).where(Instance.pool == pool, Instance.state == st.InstanceState.RUNNING)
                         .order_by(Instance.launch_id)):
        agent = agents.get(row.agent_id or "") or next(
            (a for a in snap.agents if row.instance_id and a.instance_id == row.instance_id), None)
        if agent is None or agent.state != st.AgentState.CONNECTED:
            continue
        price = price_of(row, offers)
        instances.append(consolidation.InstanceSlots(row.launch_id, AgentSlots(
            agent.id, tuple(str(sl["id"]) for sl in agent.slots), frozenset(snap.used.get(agent.id, set())),
            schedulable=bool(agent.enabled)), price))
    known = {i.agent.agent_id for i in instances}
    # Work that also holds an agent outside these instances stays where it is (it is not a candidate's).
    running = [r for r in running if all(p.agent_id in known for p in r.parts)]
    return instances, running, queue


def apply_plan(s: Session, master: Master, pool: str, plan: consolidation.Plan, now: datetime,
               provider_type: str = "", launch_ids: list[str] | None = None,
               max_instances: int | None = None) -> str | None:
    """Cordon the instance and ask its work to checkpoint and stop (or, for a replacement, request
    the new instance and leave the work pending on it, its launch id added to `launch_ids`), if under
    a lock on its agent's row it still holds exactly the planned work; why not, else."""
    row = s.get(Instance, plan.instance)
    if row is None or row.state != st.InstanceState.RUNNING:
        return f"instance {plan.instance} is no longer running"
    agent = s.scalar(select(Agent).where(Agent.id == plan.agent_id).with_for_update()
                     .execution_options(populate_existing=True))
    if agent is None or not agent.enabled:
        return f"agent {plan.agent_id} was disabled since the decision"
    held = {a.id: a for a in gangs.holding(s, agent.id, pool)}
    if set(held) != set(plan.allocations) or any(a.preempt_requested or a.kill_requested for a in held.values()):
        return f"the work on agent {agent.id} changed since the decision"
    if plan.replacement is not None:
        why = _no_room(s, pool, now, max_instances)
        if why is not None:
            return why
    agent.enabled = False  # cordoned: placement puts nothing new on it
    replacement = None
    if plan.replacement is not None:
        replacement = uuid.uuid4().hex
        s.add(Instance(launch_id=replacement, pool=pool, provider=provider_type, state=st.InstanceState.REQUESTED,
                       requested_at=now, instance_type=plan.replacement.instance_type,
                       capacity=plan.replacement.capacity))
        if launch_ids is not None:
            launch_ids.append(replacement)
        log.info("event=consolidation_replacement pool=%s launch_id=%s replaced_by=%s instance_type=%s capacity=%s",
                 pool, row.launch_id, replacement, plan.replacement.instance_type, plan.replacement.capacity)
    for alloc_id in plan.allocations:
        alloc = held[alloc_id]
        if replacement is None:
            lifecycle.request_preemption(alloc, now)
        s.add(ConsolidationMove(pool=pool, at=now, launch_id=row.launch_id, instance_id=row.instance_id,
                                agent_id=agent.id, allocation_id=alloc.id, trial_id=alloc.trial_id,
                                reason=plan.reason, saving=plan.saving, saving_unit=plan.unit,
                                replacement_launch_id=replacement, pending=replacement is not None))
        log.info("event=consolidation_move pool=%s launch_id=%s instance_id=%s allocation_id=%s trial_id=%s "
                 "to=%s saving=%s%s", pool, row.launch_id, row.instance_id, alloc.id, alloc.trial_id,
                 ",".join(plan.destinations.get(alloc.id, ())), plan.saving, plan.unit)
    master.notify(s)
    return None


def _no_room(s: Session, pool: str, now: datetime, max_instances: int | None) -> str | None:
    """Why no replacement may be launched now: the pool at max_instances, or backing off after launch
    errors (the decision's own allowance; a replacement is never the backoff's probe)."""
    prow = s.get(ResourcePool, pool)
    if prow is not None:
        allowance = backoff.launch_allowance(PoolState(prow.state), prow.backoff_until, None, timedelta(0), now)
        if allowance.cap == 0:
            return f"no replacement: {allowance.reason}"
    if max_instances is None:
        return None
    billed = s.scalar(select(func.count()).select_from(Instance).where(
        Instance.pool == pool, Instance.state.in_(st.INSTANCE_BILLED))) or 0
    if billed >= max_instances:
        return f"no room for a replacement: the pool has {billed} of its max_instances {max_instances}"
    return None


def advance_replacements(s: Session, master: Master, pool: str, now: datetime, starting_period: timedelta,
                         offers: Sequence[InstanceOffer] = ()) -> None:
    """The pending moves of replacements: once the replacement's agent has connected, free and
    cheaper than the instance it replaces (a capacity failover may have launched another type), ask
    the work still on the replaced instance to checkpoint and stop. Else, or if the replacement
    failed or did not connect within `starting_period`, the move is abandoned: the replaced instance
    takes work again (and a replacement that was not cheaper is terminated)."""
    pending = list(s.scalars(select(ConsolidationMove).where(ConsolidationMove.pool == pool,
                                                             ConsolidationMove.pending.is_(True))))
    by_replacement: dict[str, list[ConsolidationMove]] = {}
    for m in pending:
        by_replacement.setdefault(m.replacement_launch_id or "", []).append(m)
    for launch_id, moves in by_replacement.items():
        new = s.get(Instance, launch_id) if launch_id else None
        old = s.get(Instance, moves[0].launch_id)
        old_agent = s.scalar(select(Agent).where(Agent.id == moves[0].agent_id).with_for_update()
                             .execution_options(populate_existing=True))
        # Under that lock, as an admin's disable takes it: the moves it abandoned meanwhile are not ours.
        moves = list(s.scalars(select(ConsolidationMove).where(
            ConsolidationMove.id.in_([m.id for m in moves]), ConsolidationMove.pending.is_(True))
            .execution_options(populate_existing=True)))
        if not moves:
            continue
        new_agent = agent_of(s, new) if new is not None else None
        why = _replacement_refusal(s, pool, new, new_agent, old, offers, now, starting_period)
        if why == "":
            continue  # still booting
        if why is not None:
            dearer = new is not None and old is not None and new_agent is not None and _dearer(new, old, offers)
            _abandon(s, pool, moves, old_agent, new, why, now, terminate=dearer)
            continue
        held = {a.id: a for a in gangs.holding(s, moves[0].agent_id, pool)}
        for m in moves:
            alloc = held.get(m.allocation_id)
            if alloc is not None and not (alloc.preempt_requested or alloc.kill_requested):
                lifecycle.request_preemption(alloc, now)
            m.pending = False
        log.info("event=consolidation_replacement_ready pool=%s launch_id=%s replaced_by=%s allocations=%d",
                 pool, moves[0].launch_id, launch_id, len(moves))
        master.notify(s)


def _replacement_refusal(s: Session, pool: str, new: Instance | None, new_agent: Agent | None, old: Instance | None,
                         offers: Sequence[InstanceOffer], now: datetime, starting_period: timedelta) -> str | None:
    """Why a pending replacement's move is abandoned; "" while it boots; None when the work moves now.
    (`_dearer` says which of these abandonments also terminate the replacement.)"""
    if old is None or old.state not in st.INSTANCE_LIVE:
        return "the replaced instance ended first"
    if new is None or new.state not in st.INSTANCE_LIVE:
        return f"the replacement ended ({new.terminate_reason or new.state})" if new is not None \
            else "the replacement was not launched"
    if new_agent is None or new_agent.state != st.AgentState.CONNECTED or not new_agent.enabled:
        if now - new.requested_at > starting_period:
            return f"the replacement did not connect within {int(starting_period.total_seconds())}s"
        return ""
    if _dearer(new, old, offers):
        return (f"the replacement launched as {new.instance_type} ({new.capacity or 'on-demand'}), "
                f"not cheaper than the instance it replaces")
    if gangs.holding(s, new_agent.id, pool):
        return "the replacement took other work first"
    return None


def _dearer(new: Instance, old: Instance, offers: Sequence[InstanceOffer]) -> bool:
    """Whether what the cloud launched (a capacity failover may have chosen another type) is not
    known to cost less than the instance it replaces."""
    new_price, old_price = price_of(new, offers), price_of(old, offers)
    return new_price is None or old_price is None or new_price >= old_price


def _abandon(s: Session, pool: str, moves: Sequence[ConsolidationMove], old_agent: Agent | None,
             new: Instance | None, why: str, now: datetime, terminate: bool) -> None:
    """Give up the moves: the replaced instance takes work again; `terminate`: the replacement,
    still without work, goes too (it was not cheaper)."""
    for m in moves:
        m.pending, m.abandoned = False, True
        m.reason = f"{m.reason}; abandoned: {why}"
    if old_agent is not None and old_agent.interruption_at is None:
        old_agent.enabled = True  # not emptied after all: it takes work again
    if terminate and new is not None and new.state in st.INSTANCE_LIVE and new.instance_id:
        new_agent = agent_of(s, new)
        if new_agent is None or not gangs.holding(s, new_agent.id, pool):
            begin_termination(s, new, now, f"{CONSOLIDATED}: {why}")
    log.warning("event=consolidation_replacement_abandoned pool=%s launch_id=%s replaced_by=%s why=%r",
                pool, moves[0].launch_id, new.launch_id if new is not None else None, why)


def finish_emptied(s: Session, pool: str, now: datetime) -> list[dict[str, str]]:
    """Terminate the instances consolidation emptied: cordoned by a move, live, and holding no
    allocation now (the moved work has exited). The terminations begun, as the history records them."""
    moved = set(s.scalars(select(ConsolidationMove.launch_id).where(  # not one given up (re-enabled, or an admin's)
        ConsolidationMove.pool == pool, ConsolidationMove.at > now - timedelta(days=1),
        ConsolidationMove.abandoned.is_(False))))
    begun: list[dict[str, str]] = []
    if not moved:
        return begun
    for row in s.scalars(select(Instance).where(Instance.launch_id.in_(moved), Instance.state.in_(st.INSTANCE_LIVE))):
        agent = s.get(Agent, row.agent_id) if row.agent_id else None
        if agent is None or agent.enabled:
            continue  # not cordoned (an admin enabled it again): it stays
        if gangs.holding(s, agent.id, pool):
            continue
        if row.instance_id is None:
            continue
        reason = f"{CONSOLIDATED}: its work moved to the pool's other instances"
        begin_termination(s, row, now, reason)
        begun.append({"id": row.launch_id, "reason": reason, "cause": scaling_history.CAUSE_CONSOLIDATED})
    return begun


def _record(s: Session, pool: str, decision: consolidation.ConsolidationDecision, refused: str | None,
            now: datetime) -> None:
    """The consolidation decision beside the scale decision (`det resource-pool describe`)."""
    prow = s.get(ResourcePool, pool)
    if prow is None:
        return
    plan = decision.plan
    entry: dict[str, object] = {"at": now.isoformat()}
    if plan is not None and refused is None:
        entry.update(instance=plan.instance, allocations=list(plan.allocations), reason=plan.reason,
                     saving=plan.saving, unit=plan.unit)
    else:
        entry["reason"] = f"not moving: {refused}" if refused else (decision.reason or "nothing to move")
    if decision.refused:
        entry["refused"] = [f"{i}: {why}" for i, why in decision.refused]
    prow.last_decision = {**(prow.last_decision or {}), "consolidation": entry}
