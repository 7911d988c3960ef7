"""Retry-After grows with the pressure on a lane (control_plane/api/admission.py): the pure
estimate and the service-rate meter, with time passed in. Through the HTTP app:
tests/control_plane/api/test_load_shedding.py::test_retry_after_grows_as_the_lane_slows."""

from __future__ import annotations

import pytest

from control_plane.api.admission import ServiceRate, retry_after


@pytest.mark.parametrize(("backlog", "rate", "expected"), [
    (65, 100.0, 1),    # a fast lane: the floor
    (65, 10.0, 7),     # 6.5 s of work ahead, rounded up
    (65, 5.0, 13),
    (65, 1.0, 30),     # capped
    (1, 0.5, 2),
    (3, 3.0, 1),
    (65, 0.0, 1),      # no measured rate (just started, or idle until a burst): the floor
    (0, 1.0, 1),       # nothing ahead
    (65, float("nan"), 1),
])
def test_retry_after_is_the_backlog_over_the_rate_within_floor_and_cap(backlog: int, rate: float,
                                                                      expected: int) -> None:
    assert retry_after(backlog, rate, floor_s=1, cap_s=30) == expected


def test_retry_after_grows_with_the_queue_and_as_the_rate_falls() -> None:
    by_backlog = [retry_after(b, 2.0, floor_s=1, cap_s=30) for b in range(0, 200, 5)]
    assert by_backlog == sorted(by_backlog) and by_backlog[0] == 1 and by_backlog[-1] == 30
    by_rate = [retry_after(64, r, floor_s=1, cap_s=30) for r in (100.0, 20.0, 8.0, 4.0, 2.0, 1.0, 0.1)]
    assert by_rate == sorted(by_rate) and len(set(by_rate)) > 3


def test_retry_after_floor_wins_over_a_smaller_cap() -> None:
    assert retry_after(1000, 0.01, floor_s=5, cap_s=2) == 5
    assert retry_after(1, 1000.0, floor_s=5, cap_s=60) == 5


def test_service_rate_over_its_window() -> None:
    rate = ServiceRate(window_s=10)
    assert rate.per_s(100.0) == 0.0
    for _ in range(20):
        rate.record(100.2)
    assert rate.per_s(100.5) == 20.0  # a burst is measured over at least one second
    assert rate.per_s(104.0) == 5.0   # 20 over the 4 s since its second began
    for _ in range(10):
        rate.record(105.0)
    assert rate.per_s(109.0) == 30 / 9  # 30 over the 9 s since second 100 began
    assert rate.per_s(110.0) == 2.0     # second 100 has left the window: 10 over the 5 s since 105
    assert rate.per_s(200.0) == 0.0   # nothing served lately
