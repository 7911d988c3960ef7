"""Who runs the loops: the leadership lease, as a pure decision.

Several master processes (API workers, or masters on other hosts against one PostgreSQL) share one
database; exactly one of them may run the control loops (placement, autoscaler, lifecycle,
checkpoint GC). The record is one lease row: the holder, a fencing token that grows by one at every
change of holder, and an expiry the holder pushes forward every few seconds.

Two signals decide a takeover:

* the lease has expired (its holder stopped renewing: dead, partitioned, or paused), or
* the holder's *liveness lock* is free: every leader holds a lock that its death releases at once
  (a PostgreSQL advisory lock on its own connection; on SQLite, a file lock on the host). A
  challenger that gets that lock knows the holder is gone without waiting for the expiry, so a
  master restarted after a crash leads again at once. A paused holder keeps its lock: then only the
  expiry lets another take over.

Safety does not rest on either signal but on the token: every write a loop commits checks, in the
same transaction, that its token is still the lease's (services/leadership.py), so an old leader
that wakes up after losing the lease cannot write anything."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum


class Move(StrEnum):
    CREATE = "create"  # no lease row yet: create it with token 1
    RENEW = "renew"  # ours: push the expiry
    TAKE_OVER = "take_over"  # someone else's, and they are gone: ours, with token + 1
    STAND_BY = "stand_by"  # someone else's, alive: wait


@dataclass(frozen=True)
class Lease:
    holder: str
    token: int
    expires_at: datetime
    # The holder held its liveness lock at its last renewal. One that took over a paused leader by
    # expiry cannot take the lock until the paused one lets it go: until then, a free lock says
    # nothing about this holder, and only the expiry counts.
    locked: bool = True


@dataclass(frozen=True)
class Decision:
    move: Move
    token: int | None  # the token we hold after the move (None: standing by)
    expires_at: datetime | None
    reason: str


def decide(lease: Lease | None, me: str, now: datetime, ttl: timedelta, *, holder_lock_free: bool) -> Decision:
    """`holder_lock_free`: we just took the liveness lock (we did not hold it before), so no live
    leader holds it."""
    until = now + ttl
    if lease is None:
        return Decision(Move.CREATE, 1, until, "no leader yet")
    if lease.holder == me:
        return Decision(Move.RENEW, lease.token, until, "ours")
    if lease.expires_at <= now:
        return Decision(Move.TAKE_OVER, lease.token + 1, until,
                        f"lease of {lease.holder} expired {(now - lease.expires_at).total_seconds():.1f}s ago")
    if holder_lock_free and lease.locked:
        return Decision(Move.TAKE_OVER, lease.token + 1, until, f"{lease.holder} is gone (its liveness lock is free)")
    return Decision(Move.STAND_BY, None, None,
                    f"{lease.holder} leads (token {lease.token}) for {(lease.expires_at - now).total_seconds():.1f}s more")


def still_valid(lease: Lease | None, me: str, token: int, now: datetime) -> bool:
    """The fence: may a leader holding `token` write now?"""
    return lease is not None and lease.holder == me and lease.token == token and lease.expires_at > now
