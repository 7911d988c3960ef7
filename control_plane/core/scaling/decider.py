"""The scale decider of an elastic resource pool: a pure function of demand, instances and limits.

`decide(demand, instances, limits, now)` answers "how many instances to launch and which ones to
terminate, and why" for one pool with one instance type. It does no I/O and never reads the clock;
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
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from control_plane.core.states import InstanceState

# The pool settings' defaults have one home (shipyard_common/pool_settings.py); the limits a test or
# a benchmark builds by hand take the same ones.
from shipyard_common.pool_settings import (
    DEFAULT_ARRIVAL_WINDOW,
    DEFAULT_MAX_AGENT_STARTING_PERIOD,
    DEFAULT_MAX_DISCONNECTED_PERIOD,
    DEFAULT_MAX_IDLE_AGENT_PERIOD,
)


@dataclass(frozen=True)
class PendingDemand:
    """`count` tasks, each needing `slots` slots on one instance (a gang). `slots == 0` is a task
    that needs an instance but no slot; it fits on any instance. `instances` > 1: each task is a
    gang across that many whole instances of `slots` slots at once (core/scheduling/gang.py); one
    that needs more than `max_instances` can never be placed, so it launches and keeps nothing."""

    slots: int
    count: int
    instances: int = 1

    def __post_init__(self) -> None:
        if self.slots < 0:
            raise ValueError(f"slots must be >= 0, got {self.slots}")
        if self.count < 0:
            raise ValueError(f"count must be >= 0, got {self.count}")
        if self.instances < 1:
            raise ValueError(f"instances must be >= 1, got {self.instances}")


@dataclass(frozen=True)
class Arrival:
    """A task that arrived in the pool's queue at `at`, needing `slots` slots on one instance (an
    allocation's creation). The recent ones predict the next (scale-down hysteresis)."""

    at: datetime
    slots: int


@dataclass(frozen=True)
class InstanceView:
    """One instance of the pool as the autoscaler loop observed it.

    `agent_disconnected_since` is when a once-connected agent dropped (None while connected, or if
    unknown: then the disconnection is treated as starting now). `idle_since` is when the agent's
    last task finished; None means busy. "Busy" is only meaningful for a connected agent: the work of
    an agent gone longer than max_disconnected_period is presumed lost, and its instance is replaced.
    """

    id: str
    state: InstanceState
    launched_at: datetime
    agent_connected: bool = False
    agent_first_connected_at: datetime | None = None
    agent_disconnected_since: datetime | None = None
    busy_slots: int = 0
    idle_since: datetime | None = None


@dataclass(frozen=True)
class PoolLimits:
    min_instances: int
    max_instances: int
    slots_per_instance: int
    max_idle_agent_period: timedelta = DEFAULT_MAX_IDLE_AGENT_PERIOD
    max_agent_starting_period: timedelta = DEFAULT_MAX_AGENT_STARTING_PERIOD
    max_disconnected_period: timedelta = DEFAULT_MAX_DISCONNECTED_PERIOD
    max_launch_per_decision: int | None = None
    arrival_window: timedelta = DEFAULT_ARRIVAL_WINDOW

    def __post_init__(self) -> None:
        if self.min_instances < 0:
            raise ValueError(f"min_instances must be >= 0, got {self.min_instances}")
        if self.max_instances < self.min_instances:
            raise ValueError(
                f"max_instances ({self.max_instances}) must be >= min_instances ({self.min_instances})"
            )
        if self.slots_per_instance < 0:
            raise ValueError(f"slots_per_instance must be >= 0, got {self.slots_per_instance}")
        if self.max_launch_per_decision is not None and self.max_launch_per_decision < 0:
            raise ValueError(f"max_launch_per_decision must be >= 0, got {self.max_launch_per_decision}")
        if self.arrival_window < timedelta(0):
            raise ValueError(f"arrival_window must be >= 0 (0: no hysteresis), got {self.arrival_window}")


@dataclass(frozen=True)
class Termination:
    """`presumes_idle`: decided because the instance had no work in the snapshot (idle, or shed
    before its agent connected). The shell must apply it only if that is still true when it writes
    (a placement may have committed since), and skip it otherwise."""

    id: str
    reason: str
    presumes_idle: bool = False


@dataclass(frozen=True)
class ScaleDecision:
    launch: int
    terminate: tuple[Termination, ...] = ()
    reasons: tuple[str, ...] = field(default_factory=tuple)

    @property
    def terminate_ids(self) -> tuple[str, ...]:
        return tuple(t.id for t in self.terminate)


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
    for d in demand:
        if not d.count:
            continue
        if max_instances is not None and d.instances > max_instances:
            too_wide[(d.instances, d.slots)] = too_wide.get((d.instances, d.slots), 0) + d.count
        else:
            by_shape[d.slots] = by_shape.get(d.slots, 0) + d.count * d.instances
    zero = by_shape.pop(0, 0)
    sized = tuple(sorted(((s, c) for s, c in by_shape.items() if s <= slots_per_instance), reverse=True))
    unsched = tuple(sorted(((s, c) for s, c in by_shape.items() if s > slots_per_instance), reverse=True))
    wide = tuple(sorted(((n, s, c) for (n, s), c in too_wide.items()), reverse=True))
    return _Shapes(sized=sized, zero_slot=zero, unschedulable=unsched, too_wide=wide)


@dataclass(frozen=True)
class _Packing:
    new_instances: int
    # Per open group (in the order given to _pack): tasks and slots placed there, instances used.
    tasks: tuple[int, ...]
    slots: tuple[int, ...]
    used: tuple[int, ...]


def _pack(shapes: _Shapes, capacity: int, open_groups: Sequence[Sequence[int]] = ()) -> _Packing:
    """Best-fit decreasing over counts of shapes, onto open instances first, then new ones.

    `open_groups` are the free slots of instances that exist already, grouped (idle, then booting)
    in order of preference. Instances are kept as histograms "free slots -> number of instances", so
    the cost is O(shapes x capacity x groups), independent of the number of tasks. Placing a shape
    into the fullest instance where it fits and filling that instance before moving on is exactly
    item-by-item best-fit decreasing (it stays the fullest instance that fits), so BFD's guarantee
    (<= 11/9 OPT + 1) holds, and with power-of-two shapes that divide the instance size it is
    optimal: ceil(total slots / capacity). Ties go to instances already touched, then to earlier
    groups, so untouched idle instances stay free to be reaped.
    """
    n_groups = len(open_groups)
    pristine = [[0] * (capacity + 1) for _ in range(n_groups)]
    touched = [[0] * (capacity + 1) for _ in range(n_groups + 1)]  # the last one: opened here
    for g, frees in enumerate(open_groups):
        for free in frees:
            pristine[g][max(0, min(free, capacity))] += 1
    order: list[tuple[int, list[int], list[int]]] = []
    for g in range(n_groups):
        order += [(g, touched[g], touched[g]), (g, pristine[g], touched[g])]
    fresh = touched[n_groups]
    order.append((n_groups, fresh, fresh))

    tasks = [0] * n_groups
    slots = [0] * n_groups
    used = [0] * n_groups
    new_instances = 0
    for size, count in shapes.sized:
        for free in range(size, capacity + 1):
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
        if count:
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
        elif new_instances == 0:
            new_instances = 1
    return _Packing(new_instances, tuple(tasks), tuple(slots), tuple(used))


def instances_needed(demand: Iterable[PendingDemand], slots_per_instance: int) -> int:
    """How many empty instances of `slots_per_instance` slots the demand needs (best-fit decreasing
    over counts of shapes). Shapes larger than an instance are unschedulable and need none."""
    return _pack(_aggregate(demand, slots_per_instance), slots_per_instance).new_instances


# --------------------------------------------------------------------------------------------------
# Wording


def _fmt_duration(d: timedelta) -> str:
    total = max(0, int(d.total_seconds()))
    hours, rem = divmod(total, 3600)
    minutes, seconds = divmod(rem, 60)
    parts = [f"{hours}h" if hours else "", f"{minutes}m" if minutes else "", f"{seconds}s" if seconds else ""]
    return "".join(parts) or "0s"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _fmt_shapes(shapes: Iterable[tuple[int, int]]) -> str:
    return ", ".join(f"{c}x{s} slots" if s != 1 else f"{c}x1 slot" for s, c in shapes)


def _fmt_demand(shapes: _Shapes) -> str:
    parts = [_fmt_shapes(shapes.sized)] if shapes.sized else []
    if shapes.zero_slot:
        parts.append(f"{shapes.zero_slot} zero-slot")
    return f"{_plural(shapes.tasks, 'pending task')} ({', '.join(parts)})"


# --------------------------------------------------------------------------------------------------
# The decision: a pipeline of stages over a draft


@dataclass
class _Census:
    booting: list[InstanceView] = field(default_factory=list)
    idle: list[InstanceView] = field(default_factory=list)
    busy: list[InstanceView] = field(default_factory=list)
    disconnected: list[InstanceView] = field(default_factory=list)
    stopping: list[InstanceView] = field(default_factory=list)  # billed, no capacity

    @property
    def live(self) -> int:
        return len(self.booting) + len(self.idle) + len(self.busy) + len(self.disconnected)


@dataclass
class _Draft:
    """The decision being built: each stage of `decide` reads what the earlier ones left here and
    adds its own part. Only `decide` makes one, so the stages stay pure functions of their inputs."""

    census: _Census
    terminations: list[Termination] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    launch: int = 0
    #: Idle instances the pending demand was packed onto (set by the launch stage; kept by the reap).
    idle_absorbing: int = 0
    #: Instances billed while stopping when the launch was sized: the census's and those this
    #: decision had terminated by then (broken, shed).
    stopping: int = 0

    def terminate(self, inst: InstanceView, why: str, presumes_idle: bool = False) -> None:
        self.terminations.append(Termination(inst.id, why, presumes_idle))

    def decision(self) -> ScaleDecision:
        return ScaleDecision(launch=self.launch, terminate=tuple(self.terminations), reasons=tuple(self.reasons))


def _is_busy(inst: InstanceView) -> bool:
    return inst.busy_slots > 0 or inst.idle_since is None


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
    _describe_demand(draft, shapes, limits)
    _shed_above_max(draft, limits)
    _launch_for_demand(draft, shapes, limits)
    _reap_idle(draft, limits, now, arrivals)
    _conclude(draft)
    return draft.decision()


def _retire_broken(instances: Sequence[InstanceView], limits: PoolLimits, now: datetime) -> _Draft:
    """Stage 1: sort the instances by what they can do (the census), and terminate the broken ones:
    an agent that never connected within `max_agent_starting_period`, or one disconnected longer
    than `max_disconnected_period`. They go regardless of min_instances (a broken instance does not
    count toward the floor; the launch stage replaces it). Duplicates and terminated rows are
    skipped; stopping ones are counted (they bill) but are no capacity."""
    draft = _Draft(_Census())
    census = draft.census
    seen: set[str] = set()
    for inst in instances:
        if inst.state == InstanceState.TERMINATED or inst.id in seen:
            continue
        seen.add(inst.id)
        if inst.state == InstanceState.STOPPING:
            census.stopping.append(inst)
            continue
        if inst.agent_connected:
            (census.busy if _is_busy(inst) else census.idle).append(inst)
        elif inst.agent_first_connected_at is None:
            waited = now - inst.launched_at
            if waited > limits.max_agent_starting_period:
                draft.terminate(
                    inst,
                    f"agent did not connect within max_agent_starting_period "
                    f"{_fmt_duration(limits.max_agent_starting_period)} (launched {_fmt_duration(waited)} ago)",
                )
            else:
                census.booting.append(inst)
        else:
            gone_for = now - (inst.agent_disconnected_since or now)
            if gone_for > limits.max_disconnected_period:
                draft.terminate(
                    inst,
                    f"agent disconnected for {_fmt_duration(gone_for)} "
                    f"(max_disconnected_period {_fmt_duration(limits.max_disconnected_period)})",
                )
            else:
                census.disconnected.append(inst)
    return draft


def _describe_demand(draft: _Draft, shapes: _Shapes, limits: PoolLimits) -> None:
    """The pending demand as the decision's first reasons, and the shapes no instance can host or
    no allowed number of instances can (no launch is made for them, no idle instance kept)."""
    capacity = limits.slots_per_instance
    if shapes.tasks:
        draft.reasons.append(f"demand: {_fmt_demand(shapes)} for {capacity}-slot instances")
    for size, count in shapes.unschedulable:
        draft.reasons.append(
            f"unschedulable: {_plural(count, 'task')} need {size} slots on one instance but instances "
            f"have {capacity}; not launching for them"
        )
    for parts, size, count in shapes.too_wide:
        draft.reasons.append(
            f"unschedulable: {_plural(count, 'task')} need {parts} whole instances of {size} slots at once "
            f"({parts * size} slots) but max_instances is {limits.max_instances}; not launching or keeping "
            f"instances for them"
        )


def _shed_above_max(draft: _Draft, limits: PoolLimits) -> None:
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
            f"{_plural(still, 'busy instance')} above max_instances {limits.max_instances}; "
            f"shedding once idle"
        )


def _launch_for_demand(draft: _Draft, shapes: _Shapes, limits: PoolLimits) -> None:
    """Stage 3: how many new instances the demand needs once the instances that exist but have not
    taken it yet have absorbed what they can: idle ones (connected after the scheduler's pass, as
    cluster-autoscaler filters out pods that fit existing nodes) and booting ones. At least enough
    for `min_instances`; capped by the room under `max_instances` (stopping instances, this
    decision's terminations included, bill until gone) and by `max_launch_per_decision`."""
    census = draft.census
    capacity = limits.slots_per_instance
    live = census.live
    idle_free = [max(0, capacity - i.busy_slots) for i in census.idle]
    booting_free = [max(0, capacity - i.busy_slots) for i in census.booting]
    packing = _pack(shapes, capacity, (idle_free, booting_free))
    want = packing.new_instances
    floor = max(0, limits.min_instances - live)
    # Those terminated by this decision (broken, shed) are stopping from now on and bill until gone.
    draft.stopping = stopping = len(census.stopping) + len(draft.terminations)
    room = max(0, limits.max_instances - live - stopping)
    launch = min(max(want, floor), room)
    if limits.max_launch_per_decision is not None:
        launch = min(launch, limits.max_launch_per_decision)
    draft.launch = launch
    draft.idle_absorbing = packing.used[0]

    for g, word in ((0, "idle instance"), (1, "starting instance")):
        if packing.tasks[g]:
            draft.reasons.append(
                f"{_plural(packing.used[g], word)} absorb {_plural(packing.tasks[g], 'pending task')} "
                f"({_plural(packing.slots[g], 'slot')})"
            )
    if not (launch or want or floor):
        return
    why: list[str] = []
    if want:
        total = _pack(shapes, capacity).new_instances
        absorbing = "".join(
            f", {packing.used[g]} {word}" for g, word in ((0, "idle"), (1, "starting")) if packing.used[g]
        )
        why.append(f"{_plural(shapes.tasks, 'pending task')} need {_plural(total, 'instance')}{absorbing}")
    if floor > want:
        why.append(f"min_instances {limits.min_instances} with {live} live")
    if max(want, floor) > room:
        still_billed = f" and {stopping} stopping (billed until the cloud says they are gone)" if stopping else ""
        why.append(f"capped by max_instances {limits.max_instances} with {live} live{still_billed}")
    if launch < min(max(want, floor), room):
        why.append(f"capped by max_launch_per_decision {limits.max_launch_per_decision}")
    draft.reasons.append(f"launch {launch}: " + "; ".join(why))


def _reap_idle(draft: _Draft, limits: PoolLimits, now: datetime, arrivals: Sequence[Arrival]) -> None:
    """Stage 4: terminate idle instances past `max_idle_agent_period` (`presumes_idle`), longest
    idle first, never below min_instances and never one the pending demand was packed onto. A
    decision that launches has packed something onto every idle instance first, so it never also
    terminates one (no launch/terminate flap). Of those left to reap, the scale-down hysteresis
    (`_keep_for_arrivals`) may keep the most recently idle ones."""
    census = draft.census
    long_idle = sorted(
        (
            i
            for i in census.idle
            if i.idle_since is not None and now - i.idle_since > limits.max_idle_agent_period
        ),
        key=lambda i: (i.idle_since, i.id),
    )
    if not long_idle:
        return
    # The recently idle instances take the demand first; the rest of it holds long-idle ones.
    keep_for_demand = max(0, draft.idle_absorbing - (len(census.idle) - len(long_idle)))
    keep_for_min = max(0, len(long_idle) - (census.live - limits.min_instances))
    reapable = max(0, len(long_idle) - max(keep_for_demand, keep_for_min))
    kept_ids = _keep_for_arrivals(draft, long_idle[:reapable], limits, now, arrivals)
    if keep_for_demand and keep_for_demand >= keep_for_min:
        draft.reasons.append(
            f"keeping {_plural(keep_for_demand, 'idle instance')} past max_idle_agent_period "
            f"for pending demand"
        )
    elif keep_for_min:
        draft.reasons.append(
            f"keeping {_plural(keep_for_min, 'idle instance')} past max_idle_agent_period "
            f"for min_instances {limits.min_instances}"
        )
    for inst in long_idle[:reapable]:
        if inst.id in kept_ids:
            continue
        assert inst.idle_since is not None
        draft.terminate(
            inst,
            f"idle for {_fmt_duration(now - inst.idle_since)} "
            f"(max_idle_agent_period {_fmt_duration(limits.max_idle_agent_period)})",
            presumes_idle=True,
        )


def _keep_for_arrivals(draft: _Draft, reapable: list[InstanceView], limits: PoolLimits, now: datetime,
                       arrivals: Sequence[Arrival]) -> set[str]:
    """Scale-down hysteresis: of the instances left to reap (longest idle first), the most recently
    idle are kept while the recent arrivals say the next task is due before they reach the hard
    bound, twice `max_idle_agent_period`; as many as the arrival rate's instances per idle period
    (`_forecast`). Their ids, with the reason added to the draft."""
    forecast = _forecast(arrivals, limits, now) if reapable else None
    if forecast is None:
        return set()
    bound = 2 * limits.max_idle_agent_period
    kept: list[InstanceView] = []
    for inst in reversed(reapable):
        if len(kept) == forecast.instances:
            break
        assert inst.idle_since is not None
        if forecast.next_due - inst.idle_since <= bound:
            kept.append(inst)
    if kept:
        draft.reasons.append(
            f"keeping {_plural(len(kept), 'idle instance')} past max_idle_agent_period "
            f"{_fmt_duration(limits.max_idle_agent_period)} for expected arrivals: {forecast.describe(now)}; "
            f"at most {_fmt_duration(bound)} idle"
        )
    return {i.id for i in kept}


def _conclude(draft: _Draft) -> None:
    """Last: one reason per termination, in the order decided; with no reason at all, a steady
    state summary. (Steady means nothing was terminated, so the census is what stays.)"""
    for t in draft.terminations:
        draft.reasons.append(f"terminate {t.id}: {t.reason}")
    if draft.reasons:
        return
    census = draft.census
    draft.reasons.append(
        f"steady: {_plural(census.live, 'instance')} ({len(census.busy)} busy, {len(census.idle)} idle, "
        f"{len(census.booting)} starting, {len(census.disconnected)} disconnected"
        + (f", {draft.stopping} stopping" if draft.stopping else "") + "), no pending demand"
    )


@dataclass(frozen=True)
class _Forecast:
    arrivals: int
    window: timedelta
    mean_gap: timedelta
    next_due: datetime
    instances: int  # how many idle instances the arrivals of one max_idle_agent_period may need

    def describe(self, now: datetime) -> str:
        due = "now (overdue)" if self.next_due <= now else f"in {_fmt_duration(self.next_due - now)}"
        return (f"{_plural(self.arrivals, 'arrival')} in the last {_fmt_duration(self.window)} "
                f"(one every {_fmt_duration(self.mean_gap)}), next due {due}")


def _forecast(arrivals: Sequence[Arrival], limits: PoolLimits, now: datetime) -> _Forecast | None:
    """When the next task is due, from the arrivals in the window: the mean gap is window /
    arrivals (conservative while the history is shorter than the window), and the next one is due a
    mean gap after the last, or now if that is past. Arrivals that no instance can host do not
    count. None without any arrival in the window, or with no window (the hysteresis is off)."""
    if not limits.arrival_window:
        return None
    capacity = limits.slots_per_instance
    start = now - limits.arrival_window
    recent = sorted((a for a in arrivals if start < a.at <= now and a.slots <= capacity), key=lambda a: a.at)
    if not recent:
        return None
    gap = limits.arrival_window / len(recent)
    next_due = max(now, recent[-1].at + gap)
    # Slots arriving per max_idle_agent_period at the recent rate, in instances; at least one.
    per_period = sum(a.slots for a in recent) * (limits.max_idle_agent_period / limits.arrival_window)
    instances = max(1, math.ceil(per_period / capacity)) if capacity else 1
    return _Forecast(len(recent), limits.arrival_window, gap, next_due, instances)


def summarize(decision: ScaleDecision) -> str:
    """The decision as shown by `det resource-pool describe`: a headline, then one line per reason."""
    head = f"launch {decision.launch}, terminate {len(decision.terminate)}"
    return "\n".join([head, *(f"  {line}" for line in decision.reasons)])


def lower_bound_instances(demand: Iterable[PendingDemand], slots_per_instance: int) -> int:
    """ceil(total schedulable slots / slots per instance): no packing can use fewer instances."""
    shapes = _aggregate(demand, slots_per_instance)
    if not shapes.sized:
        return 1 if shapes.zero_slot else 0
    return math.ceil(shapes.slots / slots_per_instance)
