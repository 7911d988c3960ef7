"""The rules by which the autoscaler believes the cloud: list misses, lookups by id, terminate retries."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from control_plane.core.scaling.reconcile import (
    TERMINATE_OVERDUE,
    TERMINATE_RETRY_MAX,
    Lookup,
    missing_instance,
    terminate_due,
    terminate_overdue,
    terminate_retry_delay,
)
from control_plane.core.states import InstanceState

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)
GRACE = timedelta(minutes=3)
S = timedelta(seconds=1)


def verdict(state: InstanceState, launched_ago: timedelta, missed_ago: timedelta, lookup: Lookup) -> bool:
    return missing_instance(state, NOW - launched_ago, NOW - missed_ago, lookup, GRACE, NOW).gone


@pytest.mark.parametrize("state", [InstanceState.STARTING, InstanceState.RUNNING, InstanceState.STOPPING])
def test_one_list_miss_is_not_proof(state: InstanceState) -> None:
    assert not verdict(state, timedelta(hours=1), 0 * S, Lookup.NOT_ASKED)
    assert not verdict(state, timedelta(hours=1), GRACE - S, Lookup.NOT_ASKED)
    assert verdict(state, timedelta(hours=1), GRACE, Lookup.NOT_ASKED)


def test_the_cloud_saying_terminated_is_proof_at_once_and_present_is_never_gone() -> None:
    assert verdict(InstanceState.STARTING, 5 * S, 0 * S, Lookup.TERMINATED)
    assert not verdict(InstanceState.RUNNING, timedelta(hours=1), timedelta(hours=1), Lookup.PRESENT)


def test_not_found_is_proof_only_when_the_lookup_can_be_trusted() -> None:
    # Right after a launch, EC2's "not found" is eventual consistency.
    assert not verdict(InstanceState.STARTING, 30 * S, 0 * S, Lookup.NOT_FOUND)
    assert verdict(InstanceState.STARTING, 30 * S, GRACE, Lookup.NOT_FOUND)  # the window still applies
    assert verdict(InstanceState.RUNNING, GRACE, 0 * S, Lookup.NOT_FOUND)
    # After our own terminate, "not found" means it is gone.
    assert verdict(InstanceState.STOPPING, 30 * S, 0 * S, Lookup.NOT_FOUND)


def test_the_reason_says_how_long_and_why() -> None:
    v = missing_instance(InstanceState.RUNNING, NOW - timedelta(hours=1), NOW - GRACE, Lookup.NOT_ASKED, GRACE, NOW)
    assert v.reason == "missing from the cloud's lists for 3m00s (list_miss_grace 3m00s)"
    v = missing_instance(InstanceState.RUNNING, NOW, NOW - 20 * S, Lookup.NOT_ASKED, GRACE, NOW)
    assert not v.gone and v.reason.startswith("missing from the cloud's list for 20s; presumed there")


def test_terminate_retries_double_up_to_a_bound() -> None:
    assert [terminate_retry_delay(n).total_seconds() for n in range(1, 9)] == [10, 20, 40, 80, 160, 300, 300, 300]
    assert terminate_retry_delay(10_000) == TERMINATE_RETRY_MAX


def test_a_terminate_is_due_when_nothing_is_known_of_earlier_attempts_or_the_wait_is_over() -> None:
    assert terminate_due(0, None, NOW)  # never sent, or the master restarted since
    assert not terminate_due(1, NOW - 9 * S, NOW)
    assert terminate_due(1, NOW - 10 * S, NOW)
    assert not terminate_due(3, NOW - 39 * S, NOW)
    assert terminate_due(3, NOW - 40 * S, NOW)


def test_a_termination_is_overdue_after_its_deadline() -> None:
    assert not terminate_overdue(None, NOW)
    assert not terminate_overdue(NOW - TERMINATE_OVERDUE, NOW)
    assert terminate_overdue(NOW - TERMINATE_OVERDUE - S, NOW)
