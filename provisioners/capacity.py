"""Per-scope capacity memory: a subnet (AWS) or zone (GCP) that answered "no capacity" for an instance
type is skipped for a cool-down, instead of being tried first by every later batch; and the failover
across instance types (`launch_with_failover`): a launch whose type has no capacity left in any
location goes on as its next choice.

A pure table: the provider passes `now` in (its clock is injected), nothing here reads the clock or
talks to a cloud. It is soft state, safe to lose: a restarted master tries every location once more
and learns again. The autoscaler copies `snapshot()` into the pool's record, where
`det resource-pool describe` shows it (see `cooldowns_of`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Protocol

from provisioners.base import (
    CloudInstance,
    ErrorKind,
    ErrorScope,
    LaunchChoice,
    LaunchResult,
    LaunchSpec,
    ProviderError,
)

DEFAULT_CAPACITY_COOLDOWN_S = 600  # 10 minutes: long enough to stop wasting calls, short enough to come back


@dataclass(frozen=True)
class Cooldown:
    """One location that is skipped for one instance type until `until`."""

    location: str  # subnet id, zone (or the region, for a pool without subnets)
    instance_type: str
    until: datetime
    code: str  # the cloud's error code, e.g. InsufficientInstanceCapacity
    message: str
    failures: int  # capacity errors from this location in a row

    def to_json(self) -> dict[str, Any]:
        return {"location": self.location, "instance_type": self.instance_type, "until": self.until.isoformat(),
                "code": self.code, "error": self.message, "failures": self.failures}


class CapacityMemory:
    """Locations out of capacity, per instance type, each until its cool-down ends."""

    def __init__(self, cooldown: timedelta) -> None:
        if cooldown < timedelta(0):
            raise ValueError("the capacity cool-down must not be negative")
        self.cooldown = cooldown
        self._lock = threading.Lock()
        self._table: dict[tuple[str, str], Cooldown] = {}

    def exhausted(self, location: str, instance_type: str, error: ProviderError, now: datetime) -> Cooldown | None:
        """Record a capacity error: the location cools down from `now`. None when cool-downs are off."""
        if self.cooldown <= timedelta(0):
            return None
        key = (location, instance_type)
        with self._lock:
            previous = self._table.get(key)
            entry = Cooldown(location, instance_type, now + self.cooldown, error.code, str(error.args[0]),
                             (previous.failures if previous is not None else 0) + 1)
            self._table[key] = entry
        return entry

    def succeeded(self, location: str, instance_type: str) -> None:
        """An instance launched there: whatever was remembered of it is over."""
        with self._lock:
            self._table.pop((location, instance_type), None)

    def cooling(self, location: str, instance_type: str, now: datetime) -> Cooldown | None:
        """The location's cool-down for this type, if it is still running at `now`."""
        with self._lock:
            entry = self._table.get((location, instance_type))
        return entry if entry is not None and entry.until > now else None

    def everywhere(self, locations: Iterable[str], instance_type: str, now: datetime) -> bool:
        """Whether every location is cooling down for this type at `now`."""
        return not self.available(locations, instance_type, now)

    def available(self, locations: Iterable[str], instance_type: str, now: datetime) -> list[str]:
        """The locations not cooling down at `now`, in the given (failover) order."""
        return [loc for loc in locations if self.cooling(loc, instance_type, now) is None]

    def snapshot(self, now: datetime) -> list[Cooldown]:
        """The cool-downs still running at `now` (ended ones are dropped), soonest end first."""
        with self._lock:
            for key in [k for k, e in self._table.items() if e.until <= now]:
                del self._table[key]
            return sorted(self._table.values(), key=lambda e: (e.until, e.location))


class CapacityReporter(Protocol):
    """Optional for a provider: the locations it currently skips."""

    def capacity_cooldowns(self) -> list[Cooldown]: ...


def cooldowns_of(provider: object) -> list[dict[str, Any]]:
    """What a provider skips now, as JSON for the pool's record; [] when it keeps no such memory."""
    report = getattr(provider, "capacity_cooldowns", None)
    if not callable(report):
        return []
    return [c.to_json() for c in report()]


def all_cooling_error(cooling: list[Cooldown], instance_type: str, what: str) -> ProviderError:
    """The capacity error of a batch that found every location cooling down: no call was made; the
    pool's launch backoff takes it from there."""
    soonest = min(cooling, key=lambda c: c.until)
    places = ", ".join(f"{c.location} ({c.code}) until {c.until.isoformat()}" for c in cooling)
    return ProviderError(
        ErrorKind.CAPACITY,
        f"every {what} is cooling down after running out of capacity for {instance_type}: {places}",
        scope=ErrorScope.ZONE if len(cooling) == 1 else ErrorScope.REGION,
        code=soonest.code,
        location=",".join(c.location for c in cooling),
    )


def choice_key(choice: LaunchChoice) -> str:
    """The capacity memory's key of a launch choice: its type, and whether it is spot (spot capacity
    runs out apart from on-demand capacity)."""
    return f"{choice.instance_type}{' (spot)' if choice.spot else ''}"


def launch_with_failover(specs: Sequence[LaunchSpec], defaults: tuple[LaunchChoice, ...],
                         launch_one: Callable[[LaunchChoice, list[LaunchSpec]], LaunchResult],
                         log: logging.Logger, pool: str) -> LaunchResult:
    """Launch each spec as its first choice (its `choices`, else `defaults`); the specs a choice found
    no capacity for, in any location, go on to their next choice (the next-cheapest type that fits,
    or on demand after spot), so a type out of capacity fails over like a zone. `launch_one(choice,
    specs)` is the provider's launch of one choice, whose locations it walks itself (and cools down
    in its CapacityMemory, so the next launch skips them). Any other error stops the launch."""
    launched: list[CloudInstance] = []
    groups: dict[tuple[LaunchChoice, ...], list[LaunchSpec]] = {}
    for spec in specs:
        groups.setdefault(spec.choices or defaults, []).append(spec)
    last: ProviderError | None = None
    for choices, group in groups.items():
        remaining = group
        for n, choice in enumerate(choices):
            result = launch_one(choice, [replace(s, choices=(choice,)) for s in remaining])
            launched += result.launched
            done = {ci.launch_id for ci in result.launched}
            remaining = [s for s in remaining if s.launch_id not in done]
            if result.error is None or not remaining:
                break
            if result.error.kind is not ErrorKind.CAPACITY:
                return LaunchResult(tuple(launched), result.error)
            last = result.error
            if n + 1 < len(choices):
                log.warning("event=launch_type_failover pool=%s from=%r to=%r remaining=%d error=%r", pool,
                            choice_key(choice), choice_key(choices[n + 1]), len(remaining), str(result.error))
        if remaining and last is not None:
            tried = ", ".join(choice_key(c) for c in choices)
            error = ProviderError(last.kind, f"no capacity for {len(remaining)} instance(s) as any of {tried}; "
                                             f"last: {last.args[0]}", scope=last.scope, code=last.code,
                                  location=last.location)
            return LaunchResult(tuple(launched), error)
    return LaunchResult(tuple(launched))
