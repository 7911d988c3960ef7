"""The idle stage of the scale decider: which idle instances to terminate, and which to keep for
pending demand, for `min_instances`, or because idling until the next arrival is expected to cost
less than relaunching for it.

Two policies, by what the loop measured:

* With the boot times of the pool's recent instances (`PoolLimits.boot_times`, launch to agent
  first connected) and an arrival window, the **cost policy** (`_reap_by_cost`). An instance idle
  up to `max_idle_agent_period` stays (the grace period users set, as before). Past it, it is kept
  only while idling is the cheaper bet: idling costs the instance's price per hour times the time
  until the next arrival that fits it is expected (the window's arrivals that fit, as a Poisson
  rate, after the free capacity ahead of it has been taken); a relaunch costs the measured boot (the
  median) billed on a new instance plus the slots the arrival would wait for it, each priced at the
  pool's on-demand price of a slot (in slot-hours when the pool has no price catalogue). Twice
  `max_idle_agent_period` is the hard bound: no instance idles longer, whatever the forecast. (The
  grace period is what the cost weighs on top of: a relaunch of a 90 s boot costs about 2 minutes
  of the instance's price, so with the default 5 minutes an instance whose next arrival is not due
  within a couple of minutes goes at the end of it.)
* Without measured boot times, or with `arrival_window` 0, the **plain bound**
  (`_reap_past_bound`): an instance idle past `max_idle_agent_period` goes, and the scale-down
  hysteresis keeps the most recently idle ones while the arrivals say the next task is due before
  twice that period.

Every keep and terminate reason states its numbers.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from control_plane.core.scaling.draft import Draft, fmt_duration, plural
from control_plane.core.scaling.model import Arrival, InstanceView, PoolLimits

HOUR = timedelta(hours=1)
#: Why an idle instance whose agent is disabled goes first, with no forecast to keep it.
DISABLED = "its agent is disabled, no arrival can use it"


def reap_idle(draft: Draft, limits: PoolLimits, now: datetime, arrivals: Sequence[Arrival]) -> None:
    """Stage 4: terminate idle instances, never below min_instances and never one the pending
    demand was packed onto. A decision that launches has packed something onto every idle instance
    that takes work first, so it never also terminates one (no launch/terminate flap); an idle
    instance whose agent is disabled takes none and may go in the same decision."""
    if limits.boot_times and limits.arrival_window:
        _reap_by_cost(draft, limits, now, arrivals)
    else:
        _reap_past_bound(draft, limits, now, arrivals)


def hard_bound(limits: PoolLimits) -> timedelta:
    """The longest an instance stays idle: twice `max_idle_agent_period` when the decider forecasts
    arrivals (cost policy or hysteresis), `max_idle_agent_period` with `arrival_window` 0."""
    return 2 * limits.max_idle_agent_period if limits.arrival_window else limits.max_idle_agent_period


def _held(draft: Draft, idle: list[InstanceView], limits: PoolLimits) -> tuple[int, int]:
    """How many of the idle instances the pending demand holds, and how many min_instances holds;
    the reason for the larger added to the draft. (`idle_absorbing` counts those the demand was
    packed onto: any idle instance can take it, so the most recently idle are the ones kept.)"""
    census = draft.census
    keep_for_demand = min(len(idle), draft.idle_absorbing)
    keep_for_min = min(len(idle), max(0, len(census.idle) - (census.live - limits.min_instances)))
    if keep_for_demand and keep_for_demand >= keep_for_min:
        draft.reasons.append(f"keeping {plural(keep_for_demand, 'idle instance')} for pending demand")
    elif keep_for_min:
        draft.reasons.append(
            f"keeping {plural(keep_for_min, 'idle instance')} for min_instances {limits.min_instances}")
    return keep_for_demand, keep_for_min


# --------------------------------------------------------------------------------------------------
# The cost policy


@dataclass(frozen=True)
class _Prices:
    """What an hour of the instance costs and what an hour of one waiting slot is worth, in `unit`."""

    instance: float
    slot: float
    unit: str  # "$" or "slot-h"

    def fmt(self, amount: float) -> str:
        return f"${amount:.3g}" if self.unit == "$" else f"{amount:.3g} slot-h"


def _prices(inst: InstanceView, limits: PoolLimits) -> _Prices:
    """The instance's price from the pool's options (its type; on-demand over spot when both are
    listed) and a waiting slot's worth: the on-demand price of a slot of that type (what the work's
    GPU-hour is worth), else its own. Without a price: slot-hours (an instance costs its slots)."""
    slots = inst.slots if inst.slots is not None else limits.slots_per_instance
    own = [o for o in limits.options if o.instance_type == inst.instance_type and o.usd_per_hour is not None]
    if own and slots:
        on_demand = [o.usd_per_hour for o in own if not o.spot and o.usd_per_hour is not None]
        price = (on_demand or [o.usd_per_hour for o in own if o.usd_per_hour is not None])[0]
        slot = (on_demand[0] if on_demand else price) / slots
        return _Prices(price, slot, "$")
    return _Prices(float(max(slots, 1)), 1.0, "slot-h")


@dataclass(frozen=True)
class _Estimate:
    """The two costs of one idle instance and how they were reached."""

    prices: _Prices
    boot: timedelta
    boots: int
    #: The relaunch would be a start from the warm pool (it is parked), `boot` a measured start.
    start: bool
    waiting_slots: float  # the mean slots of an arrival that fits
    arrivals: int  # that fit, in the window
    window: timedelta
    ahead: int  # free slots the next arrivals take before this instance
    expected_idle: timedelta | None  # until the next arrival that fits reaches it; None: none expected

    @property
    def relaunch(self) -> float:
        hours = self.boot / HOUR
        return hours * (self.prices.instance + self.waiting_slots * self.prices.slot)

    @property
    def idling(self) -> float:
        return math.inf if self.expected_idle is None else self.prices.instance * (self.expected_idle / HOUR)

    def relaunch_text(self) -> str:
        what = "start from the warm pool" if self.start else "boot"
        return (f"a relaunch {self.prices.fmt(self.relaunch)} ({what} {fmt_duration(self.boot)}, median of "
                f"{plural(self.boots, f'measured {what}')}, billed, and waited for by {self.waiting_slots:.1f} slots)")

    def forecast_text(self) -> str:
        if self.expected_idle is None:
            return f"no arrival that fits in the last {fmt_duration(self.window)}"
        ahead = f", {plural(self.ahead, 'free slot')} ahead of it" if self.ahead else ""
        return (f"the next arrival that fits is expected in {fmt_duration(self.expected_idle)} "
                f"({plural(self.arrivals, 'arrival')} that fit in the last {fmt_duration(self.window)}{ahead})")


def _estimate(inst: InstanceView, ahead: int, limits: PoolLimits, now: datetime,
              arrivals: Sequence[Arrival], parked: bool = False) -> _Estimate:
    """The expected idle time of `inst` until an arrival that fits it reaches it (the window's
    fitting arrivals as a Poisson process: one mean gap, plus the time their slots take to fill the
    `ahead` free slots), and what a relaunch for that arrival would cost: a boot, or a start from the
    warm pool when it would be `parked` (the measured starts; the boots while none is measured)."""
    slots = inst.slots if inst.slots is not None else limits.slots_per_instance
    window = limits.arrival_window
    start = now - window
    fits = [a.slots for a in arrivals if start < a.at <= now and a.slots <= slots]
    measured = limits.start_times if parked and limits.start_times else limits.boot_times
    boot = statistics.median(measured)
    waiting = sum(fits) / len(fits) if fits else float(slots)
    expected: timedelta | None = None
    if fits:
        gap = window / len(fits)
        per_slot = window / sum(fits) if sum(fits) else gap
        expected = gap + ahead * per_slot
    return _Estimate(_prices(inst, limits), boot, len(measured), measured is limits.start_times, waiting, len(fits),
                     window, ahead, expected)


def _reap_by_cost(draft: Draft, limits: PoolLimits, now: datetime, arrivals: Sequence[Arrival]) -> None:
    """The cost policy (module docstring). Idle instances are weighed most recently idle first,
    after those the demand and min_instances hold; each kept one's slots are ahead of the next
    (the arrivals it is kept for take it first), as are the free slots of starting instances."""
    census = draft.census
    # Those that take work first (the demand was packed onto them): a disabled agent's instance goes first.
    idle = sorted((i for i in census.idle if i.idle_since is not None),
                  key=lambda i: (i.accepts_work, i.idle_since, i.id), reverse=True)
    keep_for_demand, keep_for_min = _held(draft, idle, limits)
    held = max(keep_for_demand, keep_for_min)

    def slots_of(inst: InstanceView) -> int:
        if not inst.accepts_work:
            return 0
        return inst.slots if inst.slots is not None else limits.slots_per_instance

    ahead = sum(max(0, slots_of(i) - i.busy_slots) for i in census.booting)
    ahead += sum(slots_of(i) for i in idle[keep_for_demand:held])
    grace, bound = limits.max_idle_agent_period, hard_bound(limits)
    for inst in idle[held:]:
        assert inst.idle_since is not None
        idle_for = now - inst.idle_since
        if idle_for <= grace:
            ahead += slots_of(inst)
            continue
        period = f"idle for {fmt_duration(idle_for)} (max_idle_agent_period {fmt_duration(grace)})"
        if not inst.accepts_work:
            draft.terminate(inst, f"{period}: {DISABLED}", presumes_idle=True)
            continue
        if idle_for > bound:
            draft.retire_idle(inst, f"{period}: past the hard bound {fmt_duration(bound)}")
            continue
        est = _estimate(inst, ahead, limits, now, arrivals, draft.parks_instead(inst))
        p = est.prices
        if est.idling < est.relaunch:
            draft.reasons.append(f"keeping {inst.id} {period}: {est.forecast_text()}; idling "
                                 f"{p.fmt(est.idling)} < {est.relaunch_text()}; at most {fmt_duration(bound)} idle")
            ahead += slots_of(inst)
            continue
        idling = "never pays back" if est.expected_idle is None else f"{p.fmt(est.idling)} >="
        draft.retire_idle(inst, f"{period}: {est.forecast_text()}; idling {idling} {est.relaunch_text()}")


# --------------------------------------------------------------------------------------------------
# The plain bound, with the scale-down hysteresis


def _reap_past_bound(draft: Draft, limits: PoolLimits, now: datetime, arrivals: Sequence[Arrival]) -> None:
    """Terminate idle instances past `max_idle_agent_period` (`presumes_idle`), longest idle
    first. Of those left to reap, the scale-down hysteresis (`_keep_for_arrivals`) may keep the
    most recently idle ones."""
    census = draft.census
    long_idle = sorted(
        (
            i
            for i in census.idle
            if i.idle_since is not None and now - i.idle_since > limits.max_idle_agent_period
        ),
        key=lambda i: (i.accepts_work, i.idle_since, i.id),  # a disabled agent's instance is reaped first
    )
    if not long_idle:
        return
    # The recently idle instances take the demand first; the rest of it holds long-idle ones.
    recent = sum(1 for i in census.idle if i.accepts_work) - sum(1 for i in long_idle if i.accepts_work)
    keep_for_demand = max(0, draft.idle_absorbing - recent)
    keep_for_min = max(0, len(long_idle) - (census.live - limits.min_instances))
    reapable = max(0, len(long_idle) - max(keep_for_demand, keep_for_min))
    kept_ids = _keep_for_arrivals(draft, long_idle[:reapable], limits, now, arrivals)
    if keep_for_demand and keep_for_demand >= keep_for_min:
        draft.reasons.append(
            f"keeping {plural(keep_for_demand, 'idle instance')} past max_idle_agent_period "
            f"for pending demand"
        )
    elif keep_for_min:
        draft.reasons.append(
            f"keeping {plural(keep_for_min, 'idle instance')} past max_idle_agent_period "
            f"for min_instances {limits.min_instances}"
        )
    for inst in long_idle[:reapable]:
        if inst.id in kept_ids:
            continue
        assert inst.idle_since is not None
        why = (f"idle for {fmt_duration(now - inst.idle_since)} "
               f"(max_idle_agent_period {fmt_duration(limits.max_idle_agent_period)})")
        if inst.accepts_work:
            draft.retire_idle(inst, why)
        else:
            draft.terminate(inst, f"{why}: {DISABLED}", presumes_idle=True)


def _keep_for_arrivals(draft: Draft, reapable: list[InstanceView], limits: PoolLimits, now: datetime,
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
        if inst.accepts_work and forecast.next_due - inst.idle_since <= bound:
            kept.append(inst)
    if kept:
        draft.reasons.append(
            f"keeping {plural(len(kept), 'idle instance')} past max_idle_agent_period "
            f"{fmt_duration(limits.max_idle_agent_period)} for expected arrivals: {forecast.describe(now)}; "
            f"at most {fmt_duration(bound)} idle"
        )
    return {i.id for i in kept}


@dataclass(frozen=True)
class _Forecast:
    arrivals: int
    window: timedelta
    mean_gap: timedelta
    next_due: datetime
    instances: int  # how many idle instances the arrivals of one max_idle_agent_period may need

    def describe(self, now: datetime) -> str:
        due = "now (overdue)" if self.next_due <= now else f"in {fmt_duration(self.next_due - now)}"
        return (f"{plural(self.arrivals, 'arrival')} in the last {fmt_duration(self.window)} "
                f"(one every {fmt_duration(self.mean_gap)}), next due {due}")


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
