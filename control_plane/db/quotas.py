"""Counters every master process counts together: leases in the database (db/models.py QuotaLease).

A master runs several API worker processes (workers.py), and masters on other hosts may share its
database, so a limit kept in one process's memory is a limit per process: a caller got the per-user
cap on open log searches once per worker. Here each share of a counter is a row: `take` counts the
live rows of every key it claims and adds its own only if all of them stay within their caps (all
or nothing), under a transaction lock (SQLite's write lock, BEGIN IMMEDIATE; an advisory lock on
PostgreSQL), so parallel takers from any process never overshoot a cap.

A lease expires `ttl_s` after it was taken or last renewed. The process that holds leases renews
them every `ttl_s / 3` from a thread of its own, so a lease lives as long as its holder needs it
(a log follow may stream for hours) and no longer than `ttl_s` after its process died: a crashed
worker's shares come back by themselves. Time is the wall clock (shared by the processes and hosts).

Giving a lease back from the event loop must not wait on the database (the front door never blocks
its loop): `give_back` hands it to the renewing thread there, which deletes it at once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session, sessionmaker

from control_plane.db.models import QuotaLease

log = logging.getLogger("shipyard.quotas")

DEFAULT_TTL_S = 30.0
KEY_MAX = 255


@dataclass(frozen=True)
class Claim:
    key: str
    cap: int


class QuotaFull(Exception):
    def __init__(self, claim: Claim, used: int) -> None:
        super().__init__(f"{claim.key}: {used} of {claim.cap} in use")
        self.claim = claim
        self.used = used


@dataclass
class Lease:
    """What one holder took: its rows (a lease may grow: `extend`); give it back once."""

    quotas: SharedQuotas
    ids: list[int] = field(default_factory=list)
    amount: int = 0

    def give_back(self) -> None:
        ids, self.ids = self.ids, []
        if ids:
            self.quotas.give_back(ids)


class SharedQuotas:
    LOCK_KEY = int.from_bytes(b"SHPYQUOT", "big", signed=True)

    def __init__(self, sessions: sessionmaker[Session], *, ttl_s: float = DEFAULT_TTL_S,
                 clock: Callable[[], float] = time.time, holder: str | None = None) -> None:
        self.sessions = sessions
        self.ttl_s = ttl_s
        self.clock = clock
        self.holder = holder or f"{socket.gethostname()[:64]}:{os.getpid()}:{secrets.token_hex(4)}"
        self._held: set[int] = set()
        self._returns: list[int] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- taking and giving back ----------------------------------------------------------------
    def take(self, claims: Sequence[Claim], amount: int, into: Lease | None = None) -> Lease:
        """Add `amount` to every claimed key if each stays within its cap; else QuotaFull naming the
        first key that would not (nothing is taken then). `into`: grow an existing lease."""
        lease = into or Lease(self)
        now = self.clock()
        with self.sessions() as s, s.begin():
            self._serialize(s)
            s.execute(delete(QuotaLease).where(QuotaLease.expires_at <= now))
            for claim in claims:
                used = s.scalar(select(func.coalesce(func.sum(QuotaLease.amount), 0)).where(
                    QuotaLease.key == claim.key[:KEY_MAX])) or 0
                if used + amount > claim.cap:
                    raise QuotaFull(claim, int(used))
            rows = [QuotaLease(key=c.key[:KEY_MAX], amount=amount, holder=self.holder, expires_at=now + self.ttl_s)
                    for c in claims]
            s.add_all(rows)
            s.flush()
            ids = [r.id for r in rows]
        with self._lock:
            self._held.update(ids)
        lease.ids.extend(ids)
        lease.amount += amount
        self._ensure_keeper()
        return lease

    def give_back(self, ids: Sequence[int]) -> None:
        """Delete the rows; from an event loop, through the keeper thread (no database wait there)."""
        with self._lock:
            self._held.difference_update(ids)
        if _on_event_loop():
            with self._lock:
                self._returns.extend(ids)
            self._ensure_keeper()
            self._wake.set()
            return
        self._delete(ids)

    def used(self, key: str) -> int:
        """The live total of a key, over every process (leases given back from a loop included)."""
        self._flush_returns()
        with self.sessions() as s:
            return int(s.scalar(select(func.coalesce(func.sum(QuotaLease.amount), 0)).where(
                QuotaLease.key == key[:KEY_MAX], QuotaLease.expires_at > self.clock())) or 0)

    # -- keeping leases alive ------------------------------------------------------------------
    def renew(self) -> None:
        with self._lock:
            held = list(self._held)
        if not held:
            return
        with self.sessions() as s, s.begin():
            s.execute(update(QuotaLease).where(QuotaLease.id.in_(held)).values(expires_at=self.clock() + self.ttl_s))

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._flush_returns()

    def _ensure_keeper(self) -> None:
        with self._lock:
            if self._thread is not None or self._stop.is_set():
                return
            self._thread = threading.Thread(target=self._keep, name="quota-leases", daemon=True)
        self._thread.start()

    def _keep(self) -> None:
        period = self.ttl_s / 3
        next_renew = time.monotonic() + period
        while not self._stop.is_set():
            self._wake.wait(max(0.0, next_renew - time.monotonic()))
            self._wake.clear()
            try:
                self._flush_returns()
                if time.monotonic() >= next_renew:
                    self.renew()
                    next_renew = time.monotonic() + period
            except Exception as e:  # the database is away: retry soon; the leases outlive a short outage
                log.warning("event=quota_lease_keeper_failed error=%s", e)
                self._stop.wait(1.0)

    def _flush_returns(self) -> None:
        with self._lock:
            ids, self._returns = self._returns, []
        if ids:
            try:
                self._delete(ids)
            except Exception:
                with self._lock:
                    self._returns.extend(ids)  # tried again on the next turn (they expire anyway)
                raise

    def _delete(self, ids: Sequence[int]) -> None:
        with self.sessions() as s, s.begin():
            s.execute(delete(QuotaLease).where(QuotaLease.id.in_(list(ids))))

    def _serialize(self, s: Session) -> None:
        if s.get_bind().dialect.name == "postgresql":
            s.execute(select(func.pg_advisory_xact_lock(self.LOCK_KEY)))


def _on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
