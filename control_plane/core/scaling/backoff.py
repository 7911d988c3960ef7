"""Launch-error backoff of an elastic pool: a pure function from (the pool's state and failures so
far, what failed and how far it reaches, settings, now) to (its next state, when it may launch
again, failures).

The delay depends on the error's kind (whether waiting can help at all) and on its scope (how much
of the pool's capacity it blocks, as the providers sort it):

* auth / invalid: waiting cannot help until someone fixes the account or the config: the pool is
  in `error`, looked at again after `launch_error_backoff_max` (so a fixed IAM policy is picked up
  without a restart);
* quota: an account limit rarely lifts within minutes: exponential, base x 2^(n-1);
* capacity, throttled, unknown: transient, and the scope says how transient:
  - zone: one zone, subnet or host failed and nothing says the others did: a flat base / 2;
  - region: every location the pool launches into failed: a short, growing pause, base x min(n, 4) / 2;
  - cloud: the whole account or provider (every static host in use, a cloud-wide outage):
    exponential, as for quota.

Every delay is capped at `launch_error_backoff_max`. A torn-down (`disabled`) pool stays disabled
whatever a launch still in flight reports."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from control_plane.core.states import PoolState, can_transition
from shipyard_common.provider_errors import ErrorKind, ErrorScope

# Exponents past this would overflow any sensible cap anyway.
_MAX_DOUBLINGS = 16


@dataclass(frozen=True)
class BackoffSettings:
    base: timedelta  # the pool's launch_error_backoff
    max: timedelta  # the pool's launch_error_backoff_max


@dataclass(frozen=True)
class PoolBackoff:
    state: PoolState
    backoff_until: datetime | None
    failures: int  # launch failures in a row
    reason: str = ""  # why this long, shown with the pool's error


def _delay(failures: int, kind: ErrorKind, scope: ErrorScope, base: float) -> float:
    if kind == ErrorKind.QUOTA or scope == ErrorScope.CLOUD:
        return base * 2 ** min(failures - 1, _MAX_DOUBLINGS)
    if scope == ErrorScope.ZONE:
        return base / 2
    return base * min(failures, 4) / 2


def _fmt(delay: timedelta) -> str:
    seconds = int(delay.total_seconds())
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def after_failure(state: PoolState, failures: int, kind: ErrorKind, scope: ErrorScope, settings: BackoffSettings,
                  now: datetime) -> PoolBackoff:
    """The pool after one more failed launch; `failures` is how many failed in a row before it."""
    n = failures + 1
    if kind in (ErrorKind.AUTH, ErrorKind.INVALID):
        target, delay = PoolState.ERROR, settings.max
        reason = f"{scope}-wide {kind} error: launching stops; looked at again in {_fmt(delay)}"
    else:
        target = PoolState.BACKOFF
        delay = min(timedelta(seconds=_delay(n, kind, scope, settings.base.total_seconds())), settings.max)
        reason = f"{scope}-wide {kind} error, failure {n} in a row: no launch for {_fmt(delay)}"
    new_state = target if can_transition(state, target) else state
    return PoolBackoff(new_state, now + delay, n, reason)


def after_success(state: PoolState) -> PoolBackoff:
    """The pool after a launch that went through: the failure count starts again."""
    return PoolBackoff(state if state == PoolState.DISABLED else PoolState.OK, None, 0)


def current_state(state: PoolState, backoff_until: datetime | None, now: datetime) -> PoolState:
    """A pool whose backoff is over may try again (`ok`); disabled and ok pools stay as they are."""
    if state in (PoolState.BACKOFF, PoolState.ERROR) and (backoff_until is None or backoff_until <= now):
        return PoolState.OK
    return state


def may_launch(state: PoolState, backoff_until: datetime | None, now: datetime) -> bool:
    return state != PoolState.DISABLED and (backoff_until is None or backoff_until <= now)


@dataclass(frozen=True)
class LaunchAllowance:
    """How many instances the pool may launch now: None (as many as the decider wants), 0, or 1 (a
    probe), why, and when the next probe may go out (shown in the pool's decision)."""

    cap: int | None
    reason: str = ""
    next_probe_at: datetime | None = None


def launch_allowance(state: PoolState, backoff_until: datetime | None, last_failure_at: datetime | None,
                     probe_interval: timedelta, now: datetime) -> LaunchAllowance:
    """Whether the pool may launch now. During a backoff longer than `probe_interval` (quota errors
    double up to the cap, 30 minutes by default), one instance is launched `probe_interval` after the
    last failure: it costs one call and, if the error is over, ends the backoff long before the cap.
    A pool in `error` (auth, invalid config) gets no probe: it is looked at again when its backoff
    ends. `last_failure_at` None (the master restarted since) counts from now."""
    if state == PoolState.DISABLED:
        return LaunchAllowance(0, "the pool was torn down (enable it to launch again)")
    if backoff_until is None or backoff_until <= now:
        return LaunchAllowance(None)
    if state != PoolState.BACKOFF or probe_interval <= timedelta(0):
        return LaunchAllowance(0, f"backing off after launch errors until {backoff_until.isoformat()}")
    probe_at = (last_failure_at or now) + probe_interval
    if probe_at >= backoff_until:
        return LaunchAllowance(0, f"backing off after launch errors until {backoff_until.isoformat()}")
    if now >= probe_at:
        return LaunchAllowance(1, f"probing with one instance: backing off until {backoff_until.isoformat()}, "
                                  f"but the error may be over (a probe every {_fmt(probe_interval)})", probe_at)
    return LaunchAllowance(0, f"backing off after launch errors until {backoff_until.isoformat()}; one instance "
                              f"probes at {probe_at.isoformat()}", probe_at)
