"""The rules by which the autoscaler believes the cloud: pure functions of what a list and a lookup
by id said, the instance's record and the time (the loop, control_plane/loops/autoscaler/, calls
them every tick and applies their answers).

* A list miss is evidence, not proof. Cloud lists are eventually consistent (EC2 DescribeInstances
  right after RunInstances, a GCE list right after insert): an instance missing from one list is
  presumed there until it has been missing for the pool's `list_miss_grace`, unless a lookup by id
  says it is gone (reported terminated, or not known to the cloud although it was launched long
  enough ago for the lookup to be trusted, or we asked for its termination ourselves).
* A termination is level-triggered: while an instance is to be terminated and the cloud has not
  said it is gone, the terminate call is sent again, at growing intervals up to a bound; an
  instance still there after `TERMINATE_OVERDUE` is flagged as overdue (it keeps billing).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime, timedelta

from control_plane.core.states import InstanceState
from shipyard_common.pool_settings import DEFAULT_LIST_MISS_GRACE  # noqa: F401 (its one home; re-exported)

# The first retry of a terminate comes soon (a throttled call often passes a few seconds later), the
# later ones every few minutes at most: bounded, so an instance is never left alone for long.
TERMINATE_RETRY_BASE = timedelta(seconds=10)
TERMINATE_RETRY_MAX = timedelta(minutes=5)
TERMINATE_OVERDUE = timedelta(minutes=10)


class Lookup(enum.StrEnum):
    """What a lookup by id said about an instance that a list did not show."""

    NOT_ASKED = "not_asked"  # the provider cannot look up by id, or the lookup failed
    PRESENT = "present"  # the cloud still has it: the list lagged
    TERMINATED = "terminated"  # the cloud reports it terminated
    NOT_FOUND = "not_found"  # the cloud does not know the id


@dataclass(frozen=True)
class MissVerdict:
    gone: bool
    reason: str  # why, for the log and (when gone) the record


def _fmt(d: timedelta) -> str:
    seconds = max(0, int(d.total_seconds()))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def missing_instance(state: InstanceState, launched_at: datetime, first_missed_at: datetime, lookup: Lookup,
                     grace: timedelta, now: datetime) -> MissVerdict:
    """Whether an instance that the cloud's list no longer shows is gone.

    `state` is the master's record of it, `first_missed_at` when a list first missed it (in a row)."""
    if lookup is Lookup.PRESENT:
        return MissVerdict(False, "missing from the list, but the cloud still has it (the list lags)")
    if lookup is Lookup.TERMINATED:
        return MissVerdict(True, "the cloud reports it terminated")
    # "Not found" right after a launch is eventual consistency too (EC2 answers
    # InvalidInstanceID.NotFound for a few seconds); after our own terminate, or for an instance the
    # cloud has had for longer than the grace, it means the instance is gone.
    if lookup is Lookup.NOT_FOUND and (state == InstanceState.STOPPING or now - launched_at >= grace):
        return MissVerdict(True, "the cloud no longer knows it")
    missing_for = now - first_missed_at
    if missing_for >= grace:
        return MissVerdict(True, f"missing from the cloud's lists for {_fmt(missing_for)} "
                                 f"(list_miss_grace {_fmt(grace)})")
    return MissVerdict(False, f"missing from the cloud's list for {_fmt(missing_for)}; presumed there until "
                              f"list_miss_grace {_fmt(grace)}")


def terminate_retry_delay(attempts: int, base: timedelta = TERMINATE_RETRY_BASE,
                          cap: timedelta = TERMINATE_RETRY_MAX) -> timedelta:
    """The wait after `attempts` terminate calls (>= 1) before the next one: doubling, capped."""
    return min(base * 2 ** min(max(attempts, 1) - 1, 16), cap)


def terminate_due(attempts: int, last_attempt_at: datetime | None, now: datetime) -> bool:
    """Whether a terminate call is due for an instance still to be terminated. Nothing known of an
    earlier attempt (none made, or the master restarted since, perhaps before sending it): due."""
    if attempts <= 0 or last_attempt_at is None:
        return True
    return now >= last_attempt_at + terminate_retry_delay(attempts)


def terminate_overdue(requested_at: datetime | None, now: datetime) -> bool:
    return requested_at is not None and now - requested_at > TERMINATE_OVERDUE
