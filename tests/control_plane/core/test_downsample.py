"""LTTB and smoothing (core/downsample.py): pure, so plain and property tests."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from control_plane.core.downsample import lttb, moving_average


def test_short_series_are_kept_whole() -> None:
    pts = [(0.0, 1.0), (1.0, 2.0), (2.0, 0.5)]
    assert lttb(pts, 10) == pts
    assert lttb(pts, 3) == pts
    assert lttb([], 5) == []


def test_keeps_ends_and_at_most_threshold() -> None:
    pts = [(float(i), math.sin(i / 10)) for i in range(10_000)]
    out = lttb(pts, 500)
    assert len(out) == 500
    assert out[0] == pts[0] and out[-1] == pts[-1]
    assert [p[0] for p in out] == sorted(p[0] for p in out)


def test_keeps_a_spike() -> None:
    # A single outlier in a flat series is the largest triangle of its bucket: LTTB must keep it.
    pts = [(float(i), 0.0) for i in range(100_000)]
    pts[54_321] = (54_321.0, 100.0)
    out = lttb(pts, 200)
    assert (54_321.0, 100.0) in out


def test_tiny_threshold() -> None:
    pts = [(float(i), float(i)) for i in range(10)]
    assert lttb(pts, 2) == [pts[0], pts[-1]]
    assert lttb(pts, 0) == [pts[0], pts[-1]]


@given(st.lists(st.floats(-1e6, 1e6), min_size=0, max_size=400), st.integers(3, 100))
def test_output_is_a_sorted_subset(ys: list[float], threshold: int) -> None:
    pts = [(float(i), y) for i, y in enumerate(ys)]
    out = lttb(pts, threshold)
    assert len(out) == min(len(pts), threshold) or len(pts) <= 2
    assert set(out) <= set(pts)
    assert [p[0] for p in out] == sorted({p[0] for p in out})


def test_moving_average() -> None:
    assert moving_average([1.0, 2.0, 3.0], 0) == [1.0, 2.0, 3.0]
    out = moving_average([5.0] * 10, 0.9)
    assert all(abs(v - 5.0) < 1e-9 for v in out)  # debiased: a constant stays constant
    with pytest.raises(ValueError):
        moving_average([1.0], 1.0)
