"""The scale decider of an elastic resource pool: a pure function of demand, instances and limits.

`decide(demand, instances, limits, now)` answers "how many instances to launch and which ones to
terminate, and why" for one pool; with several instance types (`PoolLimits.options`) also which
types, the cheapest combination that fits (core/scaling/mix.py). It does no I/O and never reads the clock;
the autoscaler loop (the imperative shell) builds the snapshot, calls it every tick, and applies the
result through a provider. Because it is level-triggered, a lost decision is simply recomputed.

How it differs from Determined's provisioner scale decider (which it otherwise follows):

* Demand is bin-packed (best-fit decreasing over *counts* of shapes, so 10,000 pending trials of four
  shapes cost four iterations), not summed as slots: 3 trials of 3 slots on 4-slot instances need 3
  instances, not ceil(9/4) = 2.
* Instances still booting absorb demand by their free slots, through the same packing, instead of
  "desired - number of recently launched instances", which ignores how the shapes fit.
* It is stateless: idle/disconnected durations come from timestamps in the snapshot, not from what
  the decider remembered last tick, so a master restart does not reset the grace periods.
* Idle instances are never reaped while the pending demand could use them, and never in a decision
  that also launches, so it cannot flap between terminate and launch.
* Above `max_instances` it sheds only instances without work (disconnected, booting, idle; newest
  first) and waits for busy ones to drain rather than killing trials.
* Scale-down hysteresis: an instance idle past `max_idle_agent_period` is kept while the pool's
  recent demand arrivals (passed in: when tasks arrived, over `arrival_window`) say the next one is
  due before the instance reaches twice that period, the hard bound. Bursty demand (a trial every
  few minutes) then finds a warm instance instead of reaping one and relaunching it seconds later.
* A termination that presumes the instance has no work (idle, or shed while booting) is marked
  `presumes_idle`: the shell applies it only if the database still agrees (a compare-and-set on the
  agent), so a placement committed after the snapshot wins over the idle decision.
* A gang across instances is demand for that many whole instances at once; one that needs more
  than `max_instances` can never be placed, so it launches nothing and keeps no idle instance, and
  the decision says so (Determined's decider would hold the instances for it forever).
* Instances being stopped still bill until the cloud says they are gone: they leave no room under
  `max_instances` for a launch (with max 2, never more than 2 billed), though they are no capacity.

The input contract: `demand` is what the scheduler could NOT place on connected capacity, computed
from the same snapshot as `instances`, so it is additive to busy capacity. Capacity the scheduler has
not been able to use yet absorbs it first: booting instances, and idle ones (an agent that connected
after the scheduler's pass), which is cluster-autoscaler's "filter out pods that fit existing nodes".
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from control_plane.core.scaling import mix
from control_plane.core.scaling.draft import Census, Draft, fmt_duration, is_busy, plural
from control_plane.core.scaling.idle import reap_idle
from control_plane.core.scaling.model import (
    Arrival,
    InstanceAction,
    InstanceOption,
    InstanceView,
    LaunchPlan,
    PendingDemand,
    PoolLimits,
    ScaleDecision,
)
from control_plane.core.states import InstanceState

__all__ = ["decide", "instances_needed", "lower_bound_instances", "summarize"]


# --------------------------------------------------------------------------------------------------
# Bin packing over counts of shapes


@dataclass(frozen=True)
class _Shapes:
    """Demand aggregated by shape: schedulable slot shapes largest first (a gang across instances as
    that many tasks of a whole instance), zero-slot tasks, shapes that can never fit on one
    instance, and gangs needing more instances than the pool may have: (instances, slots, tasks)."""

    sized: tuple[tuple[int, int], ...]
    zero_slot: int
    unschedulable: tuple[tuple[int, int], ...]
    too_wide: tuple[tuple[int, int, int], ...] = ()
    #: Of `sized`, the tasks that are parts of gangs across instances (each a whole instance).
    gang_parts: tuple[tuple[int, int], ...] = ()

    @property
    def tasks(self) -> int:
        return sum(c for _, c in self.sized) + self.zero_slot

    @property
    def slots(self) -> int:
        return sum(s * c for s, c in self.sized)


def _aggregate(demand: Iterable[PendingDemand], slots_per_instance: int, max_instances: int | None = None) -> _Shapes:
    """`max_instances`: gangs across more instances than that are `too_wide` (None: no bound)."""
    by_shape: dict[int, int] = {}
    too_wide: dict[tuple[int, int], int] = {}
    gang_parts: dict[int, int] = {}
    for d in demand:
        if not d.count:
            continue
        if max_instances is not None and d.instances > max_instances:
            too_wide[(d.instances, d.slots)] = too_wide.get((d.instances, d.slots), 0) + d.count
        else:
            by_shape[d.slots] = by_shape.get(d.slots, 0) + d.count * d.instances
            if d.instances > 1 and 0 < d.slots <= slots_per_instance:
                gang_parts[d.slots] = gang_parts.get(d.slots, 0) + d.count * d.instances
    zero = by_shape.pop(0, 0)
    sized = tuple(sorted(((s, c) for s, c in by_shape.items() if s <= slots_per_instance), reverse=True))
    unsched = tuple(sorted(((s, c) for s, c in by_shape.items() if s > slots_per_instance), reverse=True))
    wide = tuple(sorted(((n, s, c) for (n, s), c in too_wide.items()), reverse=True))
    return _Shapes(sized=sized, zero_slot=zero, unschedulable=unsched, too_wide=wide,
                   gang_parts=tuple(sorted(gang_parts.items(), reverse=True)))


@dataclass(frozen=True)
class _Packing:
    new_instances: int
    # Per open group (in the order given to _pack): tasks and slots placed there, instances used.
    tasks: tuple[int, ...]
    slots: tuple[int, ...]
    used: tuple[int, ...]
    #: With `new=False`: the tasks no open instance took, by shape, and whether the zero-slot ones
    #: still need an instance.
    leftover: tuple[tuple[int, int], ...] = ()
    zero_needs_instance: bool = False


def _pack(shapes: _Shapes, capacity: int, open_groups: Sequence[Sequence[int]] = (), new: bool = True) -> _Packing:
    """Best-fit decreasing over counts of shapes, onto open instances first, then new ones.

    `open_groups` are the free slots of instances that exist already, grouped (idle, then booting)
    in order of preference. Instances are kept as histograms "free slots -> number of instances", so
    the cost is O(shapes x capacity x groups), independent of the number of tasks. Placing a shape
    into the fullest instance where it fits and filling that instance before moving on is exactly
    item-by-item best-fit decreasing (it stays the fullest instance that fits), so BFD's guarantee
    (<= 11/9 OPT + 1) holds, and with power-of-two shapes that divide the instance size it is
    optimal: ceil(total slots / capacity). Ties go to instances already touched, then to earlier
    groups, so untouched idle instances stay free to be reaped. Open instances may have more free
    slots than `capacity` (a pool of several types). `new=False` opens no instance: what the open
    ones do not take is the packing's `leftover` (the several types' mix places it).
    """
    n_groups = len(open_groups)
    top = max([capacity, *(f for frees in open_groups for f in frees)])
    pristine = [[0] * (top + 1) for _ in range(n_groups)]
    touched = [[0] * (top + 1) for _ in range(n_groups + 1)]  # the last one: opened here
    for g, frees in enumerate(open_groups):
        for free in frees:
            pristine[g][max(0, free)] += 1
    order: list[tuple[int, list[int], list[int]]] = []
    for g in range(n_groups):
        order += [(g, touched[g], touched[g]), (g, pristine[g], touched[g])]
    fresh = touched[n_groups]
    if new:
        order.append((n_groups, fresh, fresh))
    leftover: list[tuple[int, int]] = []

    tasks = [0] * n_groups
    slots = [0] * n_groups
    used = [0] * n_groups
    new_instances = 0
    for size, count in shapes.sized:
        for free in range(size, top + 1):
            for g, src, dst in order:
                if not count:
                    break
                n = src[free]
                if not n:
                    continue
                fits = free // size
                placed = min(count, n * fits)
                full, rest = divmod(placed, fits)
                src[free] -= full + (1 if rest else 0)
                dst[free - fits * size] += full
                if rest:
                    dst[free - rest * size] += 1
                count -= placed
                if g < n_groups:
                    tasks[g] += placed
                    slots[g] += placed * size
                    if src is not dst:
                        used[g] += full + (1 if rest else 0)
        if count and not new:
            leftover.append((size, count))
        elif count:
            fits = capacity // size
            full, rest = divmod(count, fits)
            new_instances += full + (1 if rest else 0)
            fresh[capacity - fits * size] += full
            if rest:
                fresh[capacity - rest * size] += 1

    if shapes.zero_slot:
        # Zero-slot tasks ride along on any instance; they need one only when there is none.
        host = next((g for g in range(n_groups) if open_groups[g]), None)
        if host is not None:
            tasks[host] += shapes.zero_slot
            used[host] = max(used[host], 1)
        elif new_instances == 0 and new:
            new_instances = 1
    return _Packing(new_instances, tuple(tasks), tuple(slots), tuple(used), tuple(leftover),
                    bool(shapes.zero_slot) and not any(open_groups))


def instances_needed(demand: Iterable[PendingDemand], slots_per_instance: int) -> int:
    """How many empty instances of `slots_per_instance` slots the demand needs (best-fit decreasing
    over counts of shapes). Shapes larger than an instance are unschedulable and need none."""
    return _pack(_aggregate(demand, slots_per_instance), slots_per_instance).new_instances


# --------------------------------------------------------------------------------------------------
# Wording


def _fmt_shapes(shapes: Iterable[tuple[int, int]]) -> str:
    return ", ".join(f"{c}x{s} slots" if s != 1 else f"{c}x1 slot" for s, c in shapes)


def _fmt_demand(shapes: _Shapes) -> str:
    parts = [_fmt_shapes(shapes.sized)] if shapes.sized else []
    if shapes.zero_slot:
        parts.append(f"{shapes.zero_slot} zero-slot")
    return f"{plural(shapes.tasks, 'pending task')} ({', '.join(parts)})"


# --------------------------------------------------------------------------------------------------
# The decision: a pipeline of stages over a draft


def decide(
    demand: Sequence[PendingDemand],
    instances: Sequence[InstanceView],
    limits: PoolLimits,
    now: datetime,
    arrivals: Sequence[Arrival] = (),
) -> ScaleDecision:
    """Decide how many instances to launch and which to terminate, with a reason for each.
    `arrivals`: the pool's demand arrivals (any order; those older than `limits.arrival_window`
    are ignored); none turns the scale-down hysteresis off.

    A pipeline of stages over one draft, in this order (each may read what the earlier ones
    decided): retire broken instances, shed above max_instances, launch for the pending demand, reap
    idle instances (with the hysteresis); the reasons follow the same order, terminations last."""
    shapes = _aggregate(demand, limits.slots_per_instance, limits.max_instances)
    draft = _retire_broken(instances, limits, now)
    _tend_warm_pool(draft, limits, now)
    _describe_demand(draft, shapes, limits)
    _shed_above_max(draft, limits)
    _launch_for_demand(draft, shapes, limits)
    reap_idle(draft, limits, now, arrivals)
    _conclude(draft)
    return draft.decision()


def _retire_broken(instances: Sequence[InstanceView], limits: PoolLimits, now: datetime) -> Draft:
    """Stage 1: sort the instances by what they can do (the census), and terminate the broken ones:
    an agent that never connected within `max_agent_starting_period`, or one disconnected longer
    than `max_disconnected_period`. They go regardless of min_instances (a broken instance does not
    count toward the floor; the launch stage replaces it). Duplicates and terminated rows are
    skipped; stopping ones are counted (they bill) but are no capacity."""
    draft = Draft(Census())
    census = draft.census
    seen: set[str] = set()
    for inst in instances:
        if inst.state == InstanceState.TERMINATED or inst.id in seen:
            continue
        seen.add(inst.id)
        if inst.state == InstanceState.STOPPING:
            census.stopping.append(inst)
            continue
        if inst.state in (InstanceState.PARKING, InstanceState.PARKED):
            census.parked.append(inst)
            continue
        if inst.agent_connected:
            (census.busy if is_busy(inst) else census.idle).append(inst)
        elif inst.agent_first_connected_at is None:
            waited = now - inst.launched_at
            if waited > limits.max_agent_starting_period:
                draft.terminate(
                    inst,
                    f"agent did not connect within max_agent_starting_period "
                    f"{fmt_duration(limits.max_agent_starting_period)} (launched {fmt_duration(waited)} ago)",
                )
            else:
                census.booting.append(inst)
        else:
            gone_for = now - (inst.agent_disconnected_since or now)
            if gone_for > limits.max_disconnected_period:
                draft.terminate(
                    inst,
                    f"agent disconnected for {fmt_duration(gone_for)} "
                    f"(max_disconnected_period {fmt_duration(limits.max_disconnected_period)})",
                )
            else:
                census.disconnected.append(inst)
    return draft


def _tend_warm_pool(draft: Draft, limits: PoolLimits, now: datetime) -> None:
    """Stage 1b: the warm pool's parked instances older than `warm_pool_max_age`, and those beyond
    `warm_pool_size` (lowered since; the longest parked first), are terminated; what room is left
    there is what the idle stage may park."""
    census = draft.census
    kept: list[InstanceView] = []
    for inst in sorted(census.parked, key=lambda i: (i.parked_at or now, i.id), reverse=True):
        age = now - (inst.parked_at or now)
        if age > limits.warm_pool_max_age:
            draft.terminate(inst, f"parked for {fmt_duration(age)} (warm_pool_max_age "
                                  f"{fmt_duration(limits.warm_pool_max_age)})")
        elif len(kept) >= limits.warm_pool_size:
            draft.terminate(inst, f"beyond warm_pool_size {limits.warm_pool_size} (parked {fmt_duration(age)} ago)")
        else:
            kept.append(inst)
    census.parked = kept
    draft.warm_pool_size = limits.warm_pool_size
    draft.warm_room = max(0, limits.warm_pool_size - len(kept))


def _start_parked(draft: Draft, limits: PoolLimits, launch: int) -> int:
    """Parked instances started again instead of launches, most recently parked first: any of them
    for a launch in a pool of one type; in a pool of several, for each on-demand launch one of the
    planned type, else the smallest of at most twice its slots (what it costs more an hour until
    consolidation replaces it is bounded); never for a spot launch, cheaper than the on-demand
    instance parked. The launches left."""
    ready = sorted((i for i in draft.census.parked if i.state == InstanceState.PARKED),
                   key=lambda i: (i.parked_at or datetime.min, i.id), reverse=True)

    def start(inst: InstanceView) -> None:
        ready.remove(inst)
        draft.starts.append(InstanceAction(inst.id, "started from the warm pool instead of a launch"
                                           + (f" of {inst.instance_type}" if inst.instance_type else "")))

    if not limits.options:
        for inst in list(ready[:launch]):
            start(inst)
        return launch - len(draft.starts)
    plans = []
    for plan in draft.launches:
        count = plan.count
        want = plan.option.slots
        fits = [] if plan.option.spot else sorted(
            (i for i in ready if want <= (i.slots or 0) <= 2 * want),
            key=lambda i: (i.instance_type != plan.option.instance_type, i.slots or 0))
        for inst in fits:
            if not count:
                break
            start(inst)
            count -= 1
        if count:
            plans.append(replace(plan, count=count))
    draft.launches = tuple(plans)
    return sum(p.count for p in plans)


def _describe_demand(draft: Draft, shapes: _Shapes, limits: PoolLimits) -> None:
    """The pending demand as the decision's first reasons, and the shapes no instance can host or
    no allowed number of instances can (no launch is made for them, no idle instance kept)."""
    capacity = limits.slots_per_instance
    if shapes.tasks:
        sizes = (f"instances of up to {capacity} slots ({plural(len({o.instance_type for o in limits.options}), 'type')})"
                 if limits.options else f"{capacity}-slot instances")
        draft.reasons.append(f"demand: {_fmt_demand(shapes)} for {sizes}")
    for size, count in shapes.unschedulable:
        draft.reasons.append(
            f"unschedulable: {plural(count, 'task')} need {size} slots on one instance but instances "
            f"have {capacity}; not launching for them"
        )
    for parts, size, count in shapes.too_wide:
        draft.reasons.append(
            f"unschedulable: {plural(count, 'task')} need {parts} whole instances of {size} slots at once "
            f"({parts * size} slots) but max_instances is {limits.max_instances}; not launching or keeping "
            f"instances for them"
        )


def _shed_above_max(draft: Draft, limits: PoolLimits) -> None:
    """Stage 2: above `max_instances`, shed instances without work, newest first: disconnected ones,
    then those not yet connected, then idle ones (those two `presumes_idle`). Busy instances are
    never killed for this; they are shed as they go idle on later ticks. The shed instances leave
    the census."""
    census = draft.census
    excess = census.live - limits.max_instances
    if excess <= 0:
        return

    def newest_first(group: list[InstanceView]) -> list[InstanceView]:
        return sorted(group, key=lambda i: (i.launched_at, i.id), reverse=True)

    sheddable = [
        (inst, kind)
        for group, kind in (
            (census.disconnected, "disconnected"),
            (census.booting, "not yet connected"),
            (census.idle, "idle"),
        )
        for inst in newest_first(group)
    ]
    shed: set[str] = set()
    for inst, kind in sheddable[:excess]:
        draft.terminate(inst, f"above max_instances {limits.max_instances}: shedding newest {kind} instance",
                        presumes_idle=kind != "disconnected")
        shed.add(inst.id)
    census.disconnected = [i for i in census.disconnected if i.id not in shed]
    census.booting = [i for i in census.booting if i.id not in shed]
    census.idle = [i for i in census.idle if i.id not in shed]
    still = census.live - limits.max_instances
    if still > 0:
        draft.reasons.append(
            f"{plural(still, 'busy instance')} above max_instances {limits.max_instances}; "
            f"shedding once idle"
        )


def _launch_for_demand(draft: Draft, shapes: _Shapes, limits: PoolLimits) -> None:
    """Stage 3: how many new instances the demand needs once the instances that exist but have not
    taken it yet have absorbed what they can: idle ones (connected after the scheduler's pass, as
    cluster-autoscaler filters out pods that fit existing nodes) and booting ones. At least enough
    for `min_instances`; capped by the room under `max_instances` (stopping instances, this
    decision's terminations included, bill until gone) and by `max_launch_per_decision`."""
    census = draft.census
    capacity = limits.slots_per_instance
    live = census.live
    # An instance whose agent is disabled takes no demand (placement puts nothing on it).
    idle_free = [_free(i, capacity) for i in census.idle if i.accepts_work]
    booting_free = [_free(i, capacity) for i in census.booting if i.accepts_work]
    packing = _pack(shapes, capacity, (idle_free, booting_free), new=not limits.options)
    # Those terminated by this decision (broken, shed) are stopping from now on and bill until gone;
    # so do those being parked until the cloud says they are stopped.
    parking = sum(1 for i in census.parked if i.state == InstanceState.PARKING)
    draft.stopping = stopping = len(census.stopping) + len(draft.terminations) + parking
    room = max(0, limits.max_instances - live - stopping)
    usable = _usable(limits, packing)
    new_bins = _new_instances(shapes, packing, usable, room) if limits.options else []
    want = sum(n for _, _, n in new_bins) if limits.options else packing.new_instances
    floor = max(0, limits.min_instances - live)
    launch = min(max(want, floor), room)
    if limits.max_launch_per_decision is not None:
        launch = min(launch, limits.max_launch_per_decision)
    draft.idle_absorbing = packing.used[0]
    if limits.options:
        draft.launches = _launch_plans(new_bins, launch, usable)
    planned, launch = launch, _start_parked(draft, limits, launch)
    draft.launch = launch

    for g, word in ((0, "idle instance"), (1, "starting instance")):
        if packing.tasks[g]:
            draft.reasons.append(
                f"{plural(packing.used[g], word)} absorb {plural(packing.tasks[g], 'pending task')} "
                f"({plural(packing.slots[g], 'slot')})"
            )
    if not (launch or want or floor):
        return
    why: list[str] = []
    if want:
        total = want + sum(packing.used) if limits.options else _pack(shapes, capacity).new_instances
        absorbing = "".join(
            f", {packing.used[g]} {word}" for g, word in ((0, "idle"), (1, "starting")) if packing.used[g]
        )
        why.append(f"{plural(shapes.tasks, 'pending task')} need {plural(total, 'instance')}{absorbing}")
    if floor > want:
        why.append(f"min_instances {limits.min_instances} with {live} live")
    if max(want, floor) > room:
        still_billed = f" and {stopping} stopping (billed until the cloud says they are gone)" if stopping else ""
        why.append(f"capped by max_instances {limits.max_instances} with {live} live{still_billed}")
    if planned < min(max(want, floor), room):
        why.append(f"capped by max_launch_per_decision {limits.max_launch_per_decision}")
    head = f"launch {launch}"
    if draft.starts:
        head = (f"start {plural(len(draft.starts), 'parked instance')} from the warm pool "
                f"({', '.join(a.id for a in draft.starts)})" + (f" and launch {launch}" if launch else ""))
    draft.reasons.append(f"{head}: " + "; ".join(why))
    if draft.launches:
        draft.reasons.append(_fmt_plans(draft.launches))


def _usable(limits: PoolLimits, packing: _Packing) -> list[InstanceOption]:
    """The options new instances are planned on: those not out of capacity everywhere, unless they
    cannot host the largest task left (then all: the launch reports what is out)."""
    usable = [o for o in limits.options if o not in limits.out_of_capacity]
    largest = max((s for s, c in packing.leftover if c), default=0)
    return usable if usable and max(o.slots for o in usable) >= largest else list(limits.options)


def _free(inst: InstanceView, capacity: int) -> int:
    return max(0, (inst.slots if inst.slots is not None else capacity) - inst.busy_slots)


def _pack_one(shapes: mix.Shapes, capacity: int) -> int:
    return _pack(_Shapes(sized=tuple(sorted(shapes, reverse=True)), zero_slot=0, unschedulable=()),
                 capacity).new_instances


def _new_instances(shapes: _Shapes, packing: _Packing, options: Sequence[InstanceOption],
                   room: int) -> list[tuple[InstanceOption, int, int]]:
    """The new instances of a pool of several types for what the open instances did not take:
    (option, largest task, count), cheapest first found. A gang part takes a whole instance of the
    cheapest option it fits (every part of a gang then has the same type); the other tasks are
    packed by cost (core/scaling/mix.py), preferring a combination within the `room` under
    max_instances; zero-slot tasks need the cheapest instance when there is none at all."""
    left = dict(packing.leftover)
    bins: list[tuple[InstanceOption, int, int]] = []
    for size, parts in shapes.gang_parts:
        whole = min(parts, left.get(size, 0))
        option = mix.cheapest_fitting(options, size)
        if whole and option is not None:
            bins.append((option, size, whole))
            left[size] -= whole
    found = mix.cheapest_mix(sorted(left.items(), reverse=True), options, _pack_one,
                             max(0, room - sum(n for _, _, n in bins)))
    bins = [*found.bins, *bins]
    cheapest = mix.cheapest_fitting(options, 0)
    if packing.zero_needs_instance and not bins and cheapest is not None:
        bins.append((cheapest, 0, 1))
    return bins


def _launch_plans(bins: list[tuple[InstanceOption, int, int]], launch: int,
                  options: Sequence[InstanceOption]) -> tuple[LaunchPlan, ...]:
    """The first `launch` instances of `bins` (in their order), or all of them and the cheapest
    option for the rest (min_instances), as launch plans with their fallbacks."""
    taken: list[tuple[InstanceOption, int, int]] = []
    room = launch
    for option, largest, n in bins:
        if room <= 0:
            break
        taken.append((option, largest, min(n, room)))
        room -= min(n, room)
    cheapest = mix.cheapest_fitting(options, 0)
    if room > 0 and cheapest is not None:
        taken.append((cheapest, 0, room))
    return mix.plans(taken, options)


def _fmt_plans(plans: Sequence[LaunchPlan]) -> str:
    """The launch by type and capacity, and its estimated $/h."""
    parts = " + ".join(f"{p.count}x {p.option.describe()}" for p in plans)
    prices = [p.usd_per_hour for p in plans]
    total = sum(p for p in prices if p is not None)
    return f"cheapest fit: {parts}" + (f", est. ${total:.4g}/h" if None not in prices else ", price partly unknown")


def _conclude(draft: Draft) -> None:
    """Last: one reason per termination, in the order decided; with no reason at all, a steady
    state summary. (Steady means nothing was terminated, so the census is what stays.)"""
    for p in draft.parks:
        draft.reasons.append(f"park {p.id}: {p.reason}")
    for t in draft.terminations:
        draft.reasons.append(f"terminate {t.id}: {t.reason}")
    if draft.reasons:
        return
    census = draft.census
    draft.reasons.append(
        f"steady: {plural(census.live, 'instance')} ({len(census.busy)} busy, {len(census.idle)} idle, "
        f"{len(census.booting)} starting, {len(census.disconnected)} disconnected"
        + (f", {draft.stopping} stopping" if draft.stopping else "")
        + (f", {len(census.parked)} parked in the warm pool" if census.parked else "") + "), no pending demand"
    )


def summarize(decision: ScaleDecision) -> str:
    """The decision as shown by `det resource-pool describe`: a headline, then one line per reason."""
    head = f"launch {decision.launch}, terminate {len(decision.terminate)}"
    if decision.start or decision.park:
        head += f", start {len(decision.start)}, park {len(decision.park)}"
    return "\n".join([head, *(f"  {line}" for line in decision.reasons)])


def lower_bound_instances(demand: Iterable[PendingDemand], slots_per_instance: int) -> int:
    """ceil(total schedulable slots / slots per instance): no packing can use fewer instances."""
    shapes = _aggregate(demand, slots_per_instance)
    if not shapes.sized:
        return 1 if shapes.zero_slot else 0
    return math.ceil(shapes.slots / slots_per_instance)
