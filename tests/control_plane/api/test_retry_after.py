"""Retry-After grows with the pressure on a lane (control_plane/frontdoor/admission.py): the pure
estimate and the service-rate meter, with time passed in. Through the HTTP app:
tests/control_plane/api/test_load_shedding.py::test_retry_after_grows_as_the_lane_slows."""

from __future__ import annotations

import pytest

from control_plane.frontdoor.admission import Admission, ServiceRate, next_return, queue_admits


def retry_after(backlog: int, rate: float, *, floor_s: int, cap_s: int) -> int:
    """The Retry-After of a client refused with `backlog` requests queued and no one told to come
    back yet (an empty return schedule)."""
    return next_return(0.0, 0.0, backlog, rate, floor_s=floor_s, cap_s=cap_s)[0]


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
    # Unmeasured until releases have been seen for a second: a burst's first releases (20 in
    # 0.3 s) say nothing yet of what the lane serves per second.
    assert rate.per_s(100.5) == 0.0
    assert rate.per_s(101.2) == pytest.approx(20 / 1.2)  # then over the time since its second began
    assert rate.per_s(104.0) == 5.0   # 20 over the 4 s since its second began
    for _ in range(10):
        rate.record(105.0)
    assert rate.per_s(109.0) == 30 / 9  # 30 over the 9 s since second 100 began
    assert rate.per_s(110.0) == 2.0     # second 100 has left the window: 10 over the 5 s since 105
    assert rate.per_s(200.0) == 0.0   # nothing served lately
    rate.record(300.0)  # a new burst after the idle spell: unmeasured again for its first second
    assert rate.per_s(300.5) == 0.0 and rate.per_s(301.0) == 1.0


@pytest.mark.parametrize(("ahead", "rate", "wait_s", "admitted"), [
    (0, 10.0, 5.0, True),      # 0.1 s of work ahead
    (49, 10.0, 5.0, True),     # exactly 5 s including itself
    (50, 10.0, 5.0, False),    # 5.1 s: it would time out in the queue
    (500, 0.0, 5.0, True),     # no measured rate: only the count bound decides
    (3, float("nan"), 1.0, True),
    (0, 0.5, 1.0, False),      # a lane serving one request every 2 s cannot serve it within 1 s
])
def test_the_queue_admits_only_what_it_can_serve_in_time(ahead: int, rate: float, wait_s: float,
                                                         admitted: bool) -> None:
    assert queue_admits(ahead, rate, wait_s) is admitted


def test_a_request_that_would_time_out_in_the_queue_is_refused_at_once() -> None:
    import asyncio

    now = [100.0]
    lane = Admission(limit=1, queue=1000, wait_s=2.0, retry_after_s=1, retry_after_max_s=30, clock=lambda: now[0])
    for _ in range(4):  # served 4 in the last second: 4/s
        lane.served.record(now[0])
    now[0] += 0.5

    async def scenario() -> list[bool]:
        assert await lane.acquire()  # the one slot
        queued = [asyncio.ensure_future(lane.acquire()) for _ in range(8)]  # 8 ahead = 2 s at 4/s
        await asyncio.sleep(0)
        refused = await lane.acquire()  # the 9th would wait 2.25 s > 2 s: refused without waiting
        for f in queued:
            f.cancel()
        await asyncio.gather(*queued, return_exceptions=True)
        return [refused, lane.waiting == 0]

    refused, drained = asyncio.run(scenario())
    assert refused is False and drained


def test_returns_are_scheduled_at_the_service_rate_and_a_client_refused_again_is_not_counted_twice() -> None:
    """100 clients refused at once at 10/s are told 1..10 s; when they come back as told and are
    served at that rate, none is refused again, and the schedule does not run away: a client
    refused on its return gets one new place, not one per earlier refusal."""
    rate, cursor, now = 10.0, 0.0, 100.0
    waits = []
    for _ in range(100):
        wait, cursor = next_return(cursor, now, 0, rate, floor_s=1, cap_s=30)
        waits.append(wait)
    assert waits == sorted(waits) and waits[0] == 1 and waits[-1] == 10
    assert sum(1 for w in waits if w == 5) == 10  # ten per second of service: spread, not bunched
    # Ten seconds later everyone has come back and been served; a straggler refused again now
    # (the lane momentarily full) waits about one request's worth, not the sum of past refusals.
    wait, cursor = next_return(cursor, now + 10.0, 0, rate, floor_s=1, cap_s=30)
    assert wait == 1 and cursor <= now + 10.0 + 1.0
    # The schedule never reaches past the cap, however many are refused.
    for _ in range(10_000):
        wait, cursor = next_return(cursor, now + 10.0, 0, rate, floor_s=1, cap_s=30)
    assert wait == 30 and cursor <= now + 10.0 + 30


def test_clients_told_to_wait_count_as_a_queue_outside() -> None:
    """Refused clients come back when their Retry-After ends: a burst of refusals is spread over
    time (each later one told to wait longer) instead of all returning at the same instant."""
    now = [50.0]
    lane = Admission(limit=1, queue=0, wait_s=1.0, retry_after_s=1, retry_after_max_s=30, clock=lambda: now[0])
    for _ in range(2):
        lane.served.record(now[0])
    now[0] += 1.0  # 2 served over the last second: 2/s
    waits = [lane.retry_after() for _ in range(10)]
    assert waits == sorted(waits) and waits[0] == 1 and waits[-1] == 5, waits
    now[0] += 120  # long after: those refusals have come and gone
    lane.served.record(now[0])
    assert lane.retry_after() == 1


async def _served(lane: Admission, order: list[str], name: str, urgent: bool) -> None:
    """Waits for a slot of `lane`, notes its turn in `order`, and gives the slot back."""
    import asyncio

    if await lane.acquire(urgent=urgent):
        order.append(name)
        await asyncio.sleep(0)
        lane.release()


def test_an_urgent_waiter_goes_before_the_queue_and_counts_only_the_urgent_ahead() -> None:
    # The cluster's lane: the trials' reports (urgent) go ahead of queued start-ups, and a full
    # queue of start-ups does not refuse a report.
    import asyncio

    lane = Admission(limit=1, queue=2, wait_s=5.0, retry_after_s=1, retry_after_max_s=30, name="cluster")

    async def scenario() -> tuple[list[str], bool, int]:
        assert await lane.acquire()  # the one slot
        order: list[str] = []

        tasks = [asyncio.ensure_future(_served(lane, order, f"start-{i}", False)) for i in (1, 2)]
        await asyncio.sleep(0)
        refused_start = await lane.acquire()  # two start-ups queued: the queue is full for a third
        tasks += [asyncio.ensure_future(_served(lane, order, f"report-{i}", True)) for i in (1, 2)]
        await asyncio.sleep(0)
        queued = lane.waiting
        lane.release()  # the slot goes to the reports first, then the start-ups in their order
        await asyncio.gather(*tasks)
        return order, refused_start, queued

    order, refused_start, queued = asyncio.run(scenario())
    assert refused_start is False
    assert queued == 4
    assert order == ["report-1", "report-2", "start-1", "start-2"]
    assert lane.active == 0 and lane.waiting == 0


def test_an_urgent_waiter_that_times_out_leaves_its_own_queue() -> None:
    import asyncio

    lane = Admission(limit=1, queue=4, wait_s=0.05, retry_after_s=1, retry_after_max_s=30)

    async def scenario() -> tuple[bool, int]:
        assert await lane.acquire()
        got = await lane.acquire(urgent=True)
        return got, lane.waiting

    got, waiting = asyncio.run(scenario())
    assert got is False and waiting == 0
    lane.release()
    assert lane.active == 0


def test_urgent_waiters_do_not_starve_the_others() -> None:
    # A lane flooded with reports still serves its other requests: once the oldest of them has
    # waited URGENT_AGE_S, it and the reports take turns.
    import asyncio

    from control_plane.frontdoor.admission import URGENT_AGE_S

    now = [100.0]
    lane = Admission(limit=1, queue=100, wait_s=5.0, retry_after_s=1, retry_after_max_s=30, name="cluster",
                     clock=lambda: now[0])

    async def scenario(age: float) -> list[str]:
        assert await lane.acquire()
        order: list[str] = []
        tasks = [asyncio.ensure_future(_served(lane, order, f"start-{i}", False)) for i in range(2)]
        tasks += [asyncio.ensure_future(_served(lane, order, f"report-{i}", True)) for i in range(4)]
        await asyncio.sleep(0)
        now[0] += age
        lane.release()
        await asyncio.gather(*tasks)
        return order

    # Young: the reports go first.
    assert asyncio.run(scenario(0.0)) == ["report-0", "report-1", "report-2", "report-3", "start-0", "start-1"]
    # Waited long enough: they take turns.
    assert asyncio.run(scenario(URGENT_AGE_S)) == ["report-0", "start-0", "report-1", "start-1", "report-2",
                                                   "report-3"]
    assert lane.active == 0 and lane.waiting == 0
