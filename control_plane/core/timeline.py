"""Slots over time from intervals: how many slots were provisioned (or used) at each instant of a
window, for the cluster page's chart. Pure: the intervals and the window's ends are arguments."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class Interval:
    """`weight` slots from `start` until `end` (None: still there)."""

    start: datetime
    end: datetime | None
    weight: int


def step_series(intervals: Sequence[Interval], start: datetime, end: datetime) -> list[tuple[float, int]]:
    """The total weight as a step function over [start, end], as (epoch seconds, value) points: one
    at `start`, one at every change inside the window, one at `end`. Intervals outside the window
    count only where they overlap it."""
    if end <= start:
        return []
    changes: dict[float, int] = {}
    level = 0
    t0, t1 = start.timestamp(), end.timestamp()
    for iv in intervals:
        s = iv.start.timestamp()
        e = iv.end.timestamp() if iv.end is not None else None
        if e is not None and (e <= t0 or e <= s):
            continue
        if s >= t1:
            continue
        if s <= t0:
            level += iv.weight
        else:
            changes[s] = changes.get(s, 0) + iv.weight
        if e is not None and e < t1:
            changes[e] = changes.get(e, 0) - iv.weight
    out = [(t0, level)]
    for t in sorted(changes):
        level += changes[t]
        out.append((t, level))
    out.append((t1, level))
    return out
