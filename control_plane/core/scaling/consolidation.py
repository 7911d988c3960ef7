"""Consolidation (pure): which instance of an elastic pool to empty so that its running work moves,
by checkpoint and resume, onto the free slots of the others, and the instance can be terminated.

A candidate is an instance whose agent runs work. Its work moves only if a scheduling simulation
places all of it on the free slots of the other instances that run work (never onto an idle one:
that would empty nothing): the pool's own policy (the same function as
placement, control_plane/core/scheduling/) is run over the pool without that instance, with the
moved allocations queued beside the real pending ones (preemption off: a move never evicts anything).
The queue order puts pending work of higher priority first, and the policy reserves what waiting
work needs, so moved work never takes the slots higher-priority pending work would go to; and a
pending allocation the pool places today must still be placed. While pending work at least as
important as the moved work waits, nothing is moved: the slots being freed are its.

The disruption budget (shipyard_common/consolidation_settings.py): at most `max_moves_per_hour`
allocations moved per pool in any hour (the moves of the last hour are an input), none moved before
`min_run_time` since it started (a moved allocation starts again when it resumes, so this is also
the time since its last move), never a non-preemptible one, never one already stopping.

Of the candidates that pass, the one whose removal saves the most is chosen: its price per hour when
every candidate's price is known, else its slots (slot-hours per hour); then the fewest slots moved.
Candidates are simulated in that order and the first whose work is placed is the plan (at most
`MAX_SIMULATIONS` passes per decision). Every candidate left out says why. Time is an input (`now`); nothing here reads the clock.

Replacement: when no instance can be emptied onto the others and the pool has several options
(`InstanceOption`, priced), an instance whose work (none of it a gang spanning other instances) fits
one instance of a cheaper option is replaced: the plan names that option, the caller launches it and
moves the work once it has connected. The same budget applies, and the instance's free slots must
not be where pending work is placed today. The largest saving ($/h) wins."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from control_plane.core.scaling.model import InstanceOption
from control_plane.core.scheduling import (
    AgentSlots,
    Fitting,
    PendingAllocation,
    RunningAllocation,
    scheduling_policy,
)

__all__ = ["Budget", "ConsolidationDecision", "InstanceSlots", "Plan", "decide", "moves_left"]

HOUR = timedelta(hours=1)
DOLLARS = "$/h"
SLOTS = "slot-h/h"  # slot-hours saved per hour: the unit when prices are not known
#: Scheduling passes one decision may run (one per candidate, the most saving first).
MAX_SIMULATIONS = 32


@dataclass(frozen=True)
class InstanceSlots:
    """A live instance of the pool and its agent, as placement sees it (`agent` carries the slots in
    use and whether new work may go there)."""

    id: str  # the instance's launch id
    agent: AgentSlots
    price_per_hour: float | None = None  # None: not known


@dataclass(frozen=True)
class Budget:
    max_moves_per_hour: int
    min_run_time: timedelta
    min_instances: int = 0


@dataclass(frozen=True)
class Plan:
    """Empty `instance`: move `allocations` (checkpoint, exit, resume) to where the simulation put them."""

    instance: str
    agent_id: str
    allocations: tuple[str, ...]
    destinations: dict[str, tuple[str, ...]]  # allocation id -> the agents the simulation placed it on
    saving: float
    unit: str  # DOLLARS or SLOTS
    reason: str
    # Launch one of these first and move the work once it has connected (None: onto the others).
    replacement: InstanceOption | None = None


@dataclass(frozen=True)
class ConsolidationDecision:
    plan: Plan | None
    refused: tuple[tuple[str, str], ...] = ()  # (instance id, why it is not emptied now)
    reason: str = ""  # why nothing is moved, when nothing is


def moves_left(budget: Budget, recent_moves: Sequence[datetime], now: datetime) -> int:
    """What the budget still allows this hour: `max_moves_per_hour` less the moves of the last hour."""
    return max(0, budget.max_moves_per_hour - sum(1 for at in recent_moves if at > now - HOUR))


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _work_by_agent(running: Sequence[RunningAllocation]) -> dict[str, list[RunningAllocation]]:
    """Each agent's running work (a gang across agents under each of them), in the given order."""
    out: dict[str, list[RunningAllocation]] = {}
    for r in running:
        for agent_id in dict.fromkeys(p.agent_id for p in r.parts):
            out.setdefault(agent_id, []).append(r)
    return out


def _budget_refusal(work: Sequence[RunningAllocation], budget: Budget, left: int, now: datetime) -> str | None:
    """Why the budget keeps this work where it is, or None."""
    for r in work:
        if r.stopping:
            return f"allocation {r.id} is already stopping"
        if not r.preemptible:
            return f"allocation {r.id} is not preemptible"
        ran = timedelta(seconds=max(0.0, now.timestamp() - r.order))
        if ran < budget.min_run_time:
            return (f"allocation {r.id} has run {int(ran.total_seconds())}s since it started or last moved "
                    f"(min_run_time {int(budget.min_run_time.total_seconds())}s)")
    if len(work) > left:
        return (f"disruption budget: moving {_plural(len(work), 'allocation')} exceeds the "
                f"{left} move{'' if left == 1 else 's'} left this hour (max_moves_per_hour "
                f"{budget.max_moves_per_hour})")
    return None


def _simulate(inst: InstanceSlots, work: Sequence[RunningAllocation], instances: Sequence[InstanceSlots],
              running: Sequence[RunningAllocation], pending: Sequence[PendingAllocation], placed_now: set[str],
              policy: str | None, fitting: Fitting, now: float) -> tuple[dict[str, tuple[str, ...]] | None, str]:
    """Where the policy places `work` once `inst` is gone (the moved work queued as it would be on
    resuming, pending work kept as it is); None and why when it does not place all of it, or when it
    would leave a pending allocation unplaced that the pool places today."""
    moved = {r.id for r in work}
    # Only instances that run other work take it: moving work onto an idle instance empties nothing
    # (the idle one is the idle policy's to terminate).
    busy = {p.agent_id for r in running if r.id not in moved for p in r.parts}
    # Resumed, the moved work queues as new work would: behind what waits at its priority.
    queue = [*pending, *(PendingAllocation(r.id, r.slots, r.priority, now, r.job_id, r.weight, None,
                                           r.max_slots) for r in work)]
    agents = [i.agent if i.id != inst.id and i.agent.agent_id in busy else AgentSlots(
        i.agent.agent_id, i.agent.slot_ids, i.agent.used_slot_ids, schedulable=False) for i in instances]
    # The moved work's slots stay used on the emptied agent; it is not schedulable anyway.
    decision = scheduling_policy(policy).schedule(queue, [r for r in running if r.id not in moved], agents,
                                                  preemption=False, fitting=fitting)
    where = {a.allocation_id: tuple(p.agent_id for p in a.parts) for a in decision.assignments}
    missing = [r for r in work if r.id not in where]
    if missing:
        r = missing[0]
        return None, (f"allocation {r.id} ({_plural(r.slots, 'slot')}) does not fit on the other instances' free "
                      f"slots: {decision.reasons.get(r.id, 'not placed')}")
    displaced = sorted(placed_now - set(where))
    if displaced:
        return None, f"moving its work would keep pending allocation {displaced[0]} from being placed"
    return {r.id: where[r.id] for r in work}, ""


def _replacement(candidates: Sequence[tuple[InstanceSlots, Sequence[RunningAllocation]]],
                 options: Sequence[InstanceOption], pending_on: set[str], not_replaced: Collection[str]) -> Plan | None:
    """The instance whose work one instance of a cheaper option holds, saving the most; None if none."""
    best: Plan | None = None
    for inst, work in candidates:
        me = inst.agent.agent_id
        if inst.price_per_hour is None or me in pending_on or inst.id in not_replaced \
                or any(p.agent_id != me for r in work for p in r.parts):
            continue
        used = sum(r.slots for r in work)
        fitting_options = [o for o in options if used <= o.slots < len(inst.agent.slot_ids)
                           and o.usd_per_hour is not None and o.usd_per_hour < inst.price_per_hour]
        if not fitting_options:
            continue
        o = min(fitting_options, key=lambda o: (o.usd_per_hour, o.slots, o.spot is False))
        assert o.usd_per_hour is not None
        saving = inst.price_per_hour - o.usd_per_hour
        if best is not None and saving <= best.saving:
            continue
        reason = (f"replacing: {_plural(len(work), 'allocation')} ({_plural(used, 'slot')}) of instance {inst.id} "
                  f"({_plural(len(inst.agent.slot_ids), 'slot')}) fit one {o.instance_type} ({o.capacity}, "
                  f"{_plural(o.slots, 'slot')}); replacing it saves ${saving:.2f}/h")
        best = Plan(inst.id, me, tuple(r.id for r in work), {}, saving, DOLLARS, reason, o)
    return best


def decide(instances: Sequence[InstanceSlots], running: Sequence[RunningAllocation],
           pending: Sequence[PendingAllocation], budget: Budget, recent_moves: Sequence[datetime],
           now: datetime, *, policy: str | None = None, fitting: Fitting = "best",
           options: Sequence[InstanceOption] = (), not_replaced: Collection[str] = ()) -> ConsolidationDecision:
    """The instance to empty now, if any (see the module's docstring), and why each other is not."""
    left = moves_left(budget, recent_moves, now)
    live = sum(1 for i in instances if i.agent.schedulable)
    by_agent = _work_by_agent(running)
    candidates = [(i, work) for i in instances if i.agent.schedulable and (work := by_agent.get(i.agent.agent_id))]
    if not candidates:
        return ConsolidationDecision(None, reason="no instance with work to move")
    at_min = live - 1 < budget.min_instances  # nothing emptied; a replacement keeps the count
    if at_min and not options:
        return ConsolidationDecision(None, reason=f"the pool keeps min_instances {budget.min_instances}")
    baseline = scheduling_policy(policy).schedule(pending, running, [i.agent for i in instances],
                                                  preemption=False, fitting=fitting)
    placed_now = {a.allocation_id for a in baseline.assignments}
    waiting = [p for p in pending if p.id in set(baseline.unplaced)]
    priced = all(i.price_per_hour is not None for i, _ in candidates)
    refused: list[tuple[str, str]] = []
    ranked: list[tuple[tuple[float, int, str], InstanceSlots, list[RunningAllocation]]] = []
    for inst, work in candidates:
        why = _budget_refusal(work, budget, left, now)
        urgent = [p for p in waiting if p.priority <= max(r.priority for r in work)]
        if why is None and urgent:
            why = (f"pending allocation {urgent[0].id} (priority {urgent[0].priority}) waits: the slots "
                   f"being freed are its")
        if why is not None:
            refused.append((inst.id, why))
            continue
        saving = float(inst.price_per_hour) if priced and inst.price_per_hour is not None \
            else float(len(inst.agent.slot_ids))
        ranked.append(((-saving, sum(r.slots for r in work), inst.id), inst, work))
    # The simulations (one scheduling pass each) in the order of preference: the first that places
    # its work is the plan, so a large pool costs few passes; at most MAX_SIMULATIONS per decision.
    ranked.sort(key=lambda c: c[0])
    for n, ((neg_saving, moved_slots, _), inst, work) in enumerate([] if at_min else ranked):
        if n == MAX_SIMULATIONS:
            refused.extend((i.id, f"not simulated: {MAX_SIMULATIONS} simulations per decision")
                           for _, i, _ in ranked[n:])
            break
        destinations, why = _simulate(inst, work, instances, running, pending, placed_now, policy, fitting,
                                      now.timestamp())
        if destinations is None:
            refused.append((inst.id, why))
            continue
        saving = -neg_saving
        hosts = sorted({a for agents in destinations.values() for a in agents})
        reason = (f"consolidating: {_plural(len(work), 'allocation')} ({_plural(moved_slots, 'slot')}) of "
                  f"instance {inst.id} fit{'s' if len(work) == 1 else ''} on the free slots of "
                  f"{_plural(len(hosts), 'other agent')}; emptying it saves "
                  + (f"${saving:.2f}/h" if priced else f"{saving:g} slot-hours per hour"))
        return ConsolidationDecision(Plan(inst.id, inst.agent.agent_id, tuple(r.id for r in work), destinations,
                                          saving, DOLLARS if priced else SLOTS, reason), tuple(refused))
    if options:
        pending_on = {p.agent_id for a in baseline.assignments for p in a.parts}
        plan = _replacement([(inst, work) for _, inst, work in ranked], options, pending_on, not_replaced)
        if plan is not None:
            return ConsolidationDecision(plan, tuple((i, why) for i, why in refused if i != plan.instance))
    if at_min:
        return ConsolidationDecision(None, tuple(refused), f"the pool keeps min_instances {budget.min_instances}"
                                     " and no instance's work fits a cheaper one")
    return ConsolidationDecision(None, tuple(refused), "no instance can be emptied: " + "; ".join(
        f"{i}: {why}" for i, why in refused))
