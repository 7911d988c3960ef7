"""Slots over time from intervals (core/timeline.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from control_plane.core.timeline import Interval, step_series

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def test_steps_inside_the_window() -> None:
    ivs = [Interval(at(-10), None, 2),  # there before the window, still there
           Interval(at(5), at(20), 4),  # comes and goes inside
           Interval(at(-30), at(-20), 8),  # gone before the window
           Interval(at(50), at(90), 1)]  # starts inside, ends after
    pts = step_series(ivs, at(0), at(60))
    values = [(round((t - T0.timestamp()) / 60), v) for t, v in pts]
    assert values == [(0, 2), (5, 6), (20, 2), (50, 3), (60, 3)]


def test_empty_window() -> None:
    assert step_series([Interval(at(0), None, 1)], at(10), at(10)) == []
    assert step_series([], at(0), at(1)) == [(at(0).timestamp(), 0), (at(1).timestamp(), 0)]
