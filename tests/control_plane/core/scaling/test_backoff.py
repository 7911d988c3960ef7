"""The launch-error backoff core: the pool's next state, when it may launch again, failures."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from control_plane.core.scaling.backoff import (
    BackoffSettings,
    after_failure,
    after_success,
    current_state,
    launch_allowance,
    may_launch,
)
from control_plane.core.states import PoolState
from shipyard_common.provider_errors import ErrorKind, ErrorScope

NOW = datetime(2026, 1, 1, tzinfo=UTC)
SETTINGS = BackoffSettings(base=timedelta(seconds=30), max=timedelta(minutes=30))


def delays(kind: ErrorKind, scope: ErrorScope, n: int) -> list[float]:
    """Seconds of backoff after each of n failures in a row."""
    out, state, failures = [], PoolState.OK, 0
    for _ in range(n):
        b = after_failure(state, failures, kind, scope, SETTINGS, NOW)
        assert b.backoff_until is not None
        out.append((b.backoff_until - NOW).total_seconds())
        state, failures = b.state, b.failures
    return out


def test_quota_doubles_up_to_the_cap() -> None:
    assert delays(ErrorKind.QUOTA, ErrorScope.REGION, 8) == [30, 60, 120, 240, 480, 960, 1800, 1800]


def test_regional_capacity_is_a_short_growing_pause() -> None:
    assert delays(ErrorKind.CAPACITY, ErrorScope.REGION, 6) == [15, 30, 45, 60, 60, 60]
    assert delays(ErrorKind.THROTTLED, ErrorScope.REGION, 2) == [15, 30]
    assert delays(ErrorKind.UNKNOWN, ErrorScope.REGION, 2) == [15, 30]


def test_zone_scope_does_not_escalate() -> None:
    """One zone, subnet or host out: the pool's other locations may still work, try again soon."""
    assert delays(ErrorKind.CAPACITY, ErrorScope.ZONE, 5) == [15] * 5


def test_cloud_scope_escalates_like_quota() -> None:
    """The whole account or provider is out (every static host in use): retrying fast cannot help."""
    assert delays(ErrorKind.CAPACITY, ErrorScope.CLOUD, 4) == [30, 60, 120, 240]


@pytest.mark.parametrize("kind", [ErrorKind.AUTH, ErrorKind.INVALID])
@pytest.mark.parametrize("scope", list(ErrorScope))
def test_auth_and_invalid_stop_the_pool_until_the_longest_backoff(kind: ErrorKind, scope: ErrorScope) -> None:
    b = after_failure(PoolState.OK, 0, kind, scope, SETTINGS, NOW)
    assert (b.state, b.backoff_until, b.failures) == (PoolState.ERROR, NOW + SETTINGS.max, 1)
    assert f"{scope}-wide {kind}" in b.reason


def test_the_reason_names_scope_kind_and_delay() -> None:
    b = after_failure(PoolState.BACKOFF, 2, ErrorKind.QUOTA, ErrorScope.REGION, SETTINGS, NOW)
    assert b.failures == 3 and b.state == PoolState.BACKOFF
    assert b.reason == "region-wide quota error, failure 3 in a row: no launch for 2m00s"


def test_huge_failure_counts_stay_at_the_cap() -> None:
    b = after_failure(PoolState.BACKOFF, 10_000, ErrorKind.QUOTA, ErrorScope.CLOUD, SETTINGS, NOW)
    assert b.backoff_until == NOW + SETTINGS.max


def test_a_torn_down_pool_stays_disabled_whatever_a_late_launch_reports() -> None:
    failed = after_failure(PoolState.DISABLED, 0, ErrorKind.QUOTA, ErrorScope.REGION, SETTINGS, NOW)
    assert failed.state == PoolState.DISABLED and failed.failures == 1
    assert after_success(PoolState.DISABLED).state == PoolState.DISABLED


@pytest.mark.parametrize("state", [PoolState.OK, PoolState.BACKOFF, PoolState.ERROR])
def test_success_resets(state: PoolState) -> None:
    b = after_success(state)
    assert (b.state, b.backoff_until, b.failures) == (PoolState.OK, None, 0)


def test_the_backoff_ends_at_backoff_until() -> None:
    until = NOW + timedelta(seconds=30)
    for state in (PoolState.BACKOFF, PoolState.ERROR):
        assert current_state(state, until, NOW) == state
        assert current_state(state, until, until) == PoolState.OK
        assert not may_launch(state, until, NOW)
        assert may_launch(state, until, until)
    assert current_state(PoolState.DISABLED, None, until) == PoolState.DISABLED
    assert not may_launch(PoolState.DISABLED, None, NOW)
    assert may_launch(PoolState.OK, None, NOW)


# -- probes during a long backoff ----------------------------------------------------------------

PROBE = timedelta(minutes=5)


def test_no_cap_once_the_backoff_is_over_and_none_for_a_torn_down_pool() -> None:
    assert launch_allowance(PoolState.OK, None, None, PROBE, NOW).cap is None
    assert launch_allowance(PoolState.BACKOFF, NOW, NOW - PROBE, PROBE, NOW).cap is None
    assert launch_allowance(PoolState.DISABLED, None, None, PROBE, NOW).cap == 0


def test_one_instance_probes_a_long_backoff_every_probe_interval() -> None:
    until = NOW + timedelta(minutes=30)
    waiting = launch_allowance(PoolState.BACKOFF, until, NOW - timedelta(minutes=4), PROBE, NOW)
    assert (waiting.cap, waiting.next_probe_at) == (0, NOW + timedelta(minutes=1))
    probe = launch_allowance(PoolState.BACKOFF, until, NOW - PROBE, PROBE, NOW)
    assert (probe.cap, probe.next_probe_at) == (1, NOW)
    assert probe.reason.startswith("probing with one instance")


def test_no_probe_for_a_short_backoff_or_a_pool_in_error() -> None:
    short = launch_allowance(PoolState.BACKOFF, NOW + timedelta(minutes=1), NOW, PROBE, NOW)
    assert (short.cap, short.next_probe_at) == (0, None)  # the backoff ends before a probe would
    error = launch_allowance(PoolState.ERROR, NOW + timedelta(minutes=30), NOW - timedelta(hours=1), PROBE, NOW)
    assert error.cap == 0  # auth / invalid: a probe cannot tell anything a config fix would not
    off = launch_allowance(PoolState.BACKOFF, NOW + timedelta(minutes=30), NOW - timedelta(hours=1), 0 * PROBE, NOW)
    assert off.cap == 0
