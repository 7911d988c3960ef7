"""The idle stage of the scale decider: which idle instances to terminate, and which to keep for
pending demand, for `min_instances`, or for the arrivals the pool expects (scale-down hysteresis)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from control_plane.core.scaling.draft import Draft, fmt_duration, plural
from control_plane.core.scaling.model import Arrival, InstanceView, PoolLimits


def reap_idle(draft: Draft, limits: PoolLimits, now: datetime, arrivals: Sequence[Arrival]) -> None:
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
        draft.terminate(
            inst,
            f"idle for {fmt_duration(now - inst.idle_since)} "
            f"(max_idle_agent_period {fmt_duration(limits.max_idle_agent_period)})",
            presumes_idle=True,
        )


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
        if forecast.next_due - inst.idle_since <= bound:
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
