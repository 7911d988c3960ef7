"""The leadership lease over the database (the decision is core/lease.py).

`Leadership.step()` runs every `renew_s` on the control process: it creates, renews or takes over
the lease row in one write transaction, or stands by. `fence(session)` is the check every loop
transaction makes before it commits: the lease must still be ours with our token, read in the same
transaction (on PostgreSQL with `FOR SHARE`, so a takeover waits for our commit or we see it; on
SQLite the write transaction holds the database lock from its first statement). A leader paused
past its lease (GC, SIGSTOP, a VM migration) therefore cannot write anything once it wakes.

The liveness lock tells a challenger that the holder died without waiting for the lease to expire:
a PostgreSQL session advisory lock on a connection of its own (released by the server when the
holder's connection drops), or on SQLite an exclusive `flock` on a file beside the database
(released by the kernel when the process dies)."""

from __future__ import annotations

import fcntl
import logging
import os
import socket
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, select, text, update
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from control_plane.core import lease as core
from control_plane.db.engine import transaction
from control_plane.db.models import LeaderLease
from control_plane.errors import NotLeader

log = logging.getLogger("shipyard.leadership")

LOOPS = "loops"
# pg_try_advisory_lock key: "SHPYLEAD" as a signed 64-bit integer.
ADVISORY_KEY = int.from_bytes(b"SHPYLEAD", "big", signed=True)


@dataclass(frozen=True)
class LeaderView:
    holder: str
    token: int
    expires_at: datetime
    acquired_at: datetime
    address: str


def current_leader(s: Session) -> LeaderView | None:
    row = s.execute(select(LeaderLease.holder, LeaderLease.token, LeaderLease.expires_at, LeaderLease.acquired_at,
                           LeaderLease.address).where(LeaderLease.name == LOOPS)).first()
    return LeaderView(*row) if row else None


class _PgLock:
    """A session advisory lock on a connection kept for it alone."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.conn: Connection | None = None

    @property
    def held(self) -> bool:
        return self.conn is not None

    def try_acquire(self) -> bool:
        if self.conn is not None:
            return True
        conn = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        try:
            got = bool(conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": ADVISORY_KEY}).scalar())
        except Exception:
            conn.invalidate()
            conn.close()
            raise
        if got:
            self.conn = conn
        else:
            conn.close()
        return got

    def check(self) -> None:
        """The lock lives as long as its connection: a connection lost (the database restarted)
        means the lock is gone too."""
        if self.conn is None:
            return
        try:
            self.conn.execute(text("SELECT 1"))
        except Exception:
            log.warning("event=liveness_lock_connection_lost")
            self._drop(invalidate=True)

    def release(self) -> None:
        if self.conn is None:
            return
        try:
            self.conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": ADVISORY_KEY})
        except Exception:
            self._drop(invalidate=True)
            return
        self._drop(invalidate=False)

    def _drop(self, *, invalidate: bool) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            if invalidate:
                conn.invalidate()
            conn.close()


class _FileLock:
    """An exclusive flock on a file beside the SQLite database: only one process on the host holds it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd: int | None = None

    @property
    def held(self) -> bool:
        return self.fd is not None

    def try_acquire(self) -> bool:
        if self.fd is not None:
            return True
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self.fd = fd
        return True

    def check(self) -> None:
        pass

    def release(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            os.close(fd)  # closing the only descriptor drops the flock


def liveness_lock(engine: Engine) -> _PgLock | _FileLock | None:
    if engine.dialect.name == "postgresql":
        return _PgLock(engine)
    db = engine.url.database
    if engine.dialect.name == "sqlite" and db and db != ":memory:":
        return _FileLock(Path(db + ".leader"))
    return None  # in-memory SQLite: a single process by construction


class Leadership:
    """This process's side of the lease. `token` is set while it leads."""

    def __init__(self, sessions: sessionmaker[Session], engine: Engine, me: str, *, ttl_s: float,
                 address: str = "") -> None:
        self.sessions = sessions
        self.me = me
        self.ttl = timedelta(seconds=ttl_s)
        self.address = address or f"{socket.gethostname()} pid {os.getpid()}"
        self.lock = liveness_lock(engine)
        self.postgres = engine.dialect.name == "postgresql"
        self.token: int | None = None
        self.expires_at: datetime | None = None
        self.last_reason = ""

    def step(self, now: datetime) -> int | None:
        """Create, renew or take over the lease, or stand by. Returns the token held after it."""
        lock_free = False
        if self.lock is not None:
            try:
                self.lock.check()
                had = self.lock.held  # a deposed leader still holding it learns nothing from it
                lock_free = self.lock.try_acquire() and not had
            except OperationalError as e:
                log.warning("event=liveness_lock_error error=%s", e)
        try:
            with transaction(self.sessions) as s:
                d = self._move(s, now, lock_free)
        except (IntegrityError, OperationalError) as e:
            # Another process created the row first, or the database is away: stand by this round.
            # A leader that cannot renew keeps leading only until its lease runs out; its writes are
            # fenced in any case.
            log.warning("event=lease_step_failed error=%s", type(e).__name__)
            if self.token is not None and self.expires_at is not None and now >= self.expires_at:
                self._lost(f"could not renew before the lease ran out ({type(e).__name__})")
            return self.token
        if d.token is None:
            if self.token is not None:
                self._lost(d.reason)
            elif self.lock is not None and self.lock.held:
                self.lock.release()  # we took the lock but someone else leads: do not keep it
            self.last_reason = d.reason
            return None
        if self.token != d.token:
            log.info("event=leadership_acquired master_id=%s token=%d reason=%r", self.me, d.token, d.reason)
        self.token, self.expires_at, self.last_reason = d.token, d.expires_at, d.reason
        return self.token

    def _move(self, s: Session, now: datetime, lock_free: bool) -> core.Decision:
        q = select(LeaderLease).where(LeaderLease.name == LOOPS)
        row = s.scalars(q.with_for_update() if self.postgres else q).first()
        current = core.Lease(row.holder, row.token, row.expires_at, row.holder_locked) if row else None
        locked = self.lock is None or self.lock.held
        d = core.decide(current, self.me, now, self.ttl, holder_lock_free=lock_free)
        assert d.expires_at is not None or d.token is None
        if d.move is core.Move.CREATE:
            s.add(LeaderLease(name=LOOPS, holder=self.me, token=d.token, expires_at=d.expires_at, acquired_at=now,
                              renewed_at=now, address=self.address, holder_locked=locked))
            s.flush()
        elif d.move is core.Move.RENEW:
            assert row is not None
            row.expires_at, row.renewed_at = d.expires_at, now  # type: ignore[assignment]
            row.holder_locked = locked
        elif d.move is core.Move.TAKE_OVER:
            assert row is not None
            row.holder, row.token, row.expires_at = self.me, d.token, d.expires_at  # type: ignore[assignment]
            row.acquired_at = row.renewed_at = now
            row.address, row.holder_locked = self.address, locked
        return d

    def _lost(self, reason: str) -> None:
        log.warning("event=leadership_lost master_id=%s token=%s reason=%r", self.me, self.token, reason)
        self.token = self.expires_at = None
        if self.lock is not None:
            self.lock.release()

    def fence(self, s: Session, now: datetime) -> None:
        """Raise NotLeader unless the lease is still ours, read inside `s` (the caller's transaction)."""
        token = self.token
        if token is None:
            raise NotLeader("this master does not lead")
        q: Any = select(LeaderLease.holder, LeaderLease.token, LeaderLease.expires_at).where(LeaderLease.name == LOOPS)
        if self.postgres:
            q = q.with_for_update(read=True)
        row = s.execute(q).first()
        lease = core.Lease(*row) if row else None
        if not core.still_valid(lease, self.me, token, now):
            holder = f"{lease.holder} (token {lease.token})" if lease else "nobody"
            raise NotLeader(f"token {token} is no longer the lease's: {holder} holds it")

    def resign(self, now: datetime) -> None:
        """On a clean stop: let the next master take over at once."""
        if self.token is not None:
            try:
                with transaction(self.sessions) as s:
                    s.execute(update(LeaderLease).where(LeaderLease.name == LOOPS, LeaderLease.holder == self.me,
                                                        LeaderLease.token == self.token).values(expires_at=now))
            except Exception as e:  # best effort: the lease expires anyway
                log.warning("event=resign_failed error=%s", type(e).__name__)
            self.token = self.expires_at = None
        if self.lock is not None:
            self.lock.release()
