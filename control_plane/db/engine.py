"""Engines and sessions for SQLite (WAL, the embedded default) and PostgreSQL (psycopg2)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, exc
from sqlalchemy.orm import Session, sessionmaker

from control_plane.core.metrics import json_safe
from shipyard_common import private_files


def json_text(value: Any) -> str:
    """What a JSON column stores: strict JSON (PostgreSQL's json type refuses NaN and Infinity, a
    500 for metadata that held them), non-finite floats as Determined's strings (core/metrics.py),
    as metric values and checkpoint metadata already are."""
    try:
        return json.dumps(value, allow_nan=False)
    except ValueError:
        return json.dumps(json_safe(value))


def make_engine(url: str, *, pool_size: int = 12, pool_timeout_s: float = 3.0) -> Engine:
    """`pool_size` connections, and a short `pool_timeout_s`: the API admits fewer requests than
    the pool holds (frontdoor/admission.py), so a wait for a connection means something is wrong and it
    should fail fast (503) rather than hang the caller for half a minute."""
    # The overflow is slack for the background loops' bursts, not room for more requests.
    pool_args = {"pool_size": pool_size, "max_overflow": 10, "pool_timeout": pool_timeout_s}
    if url.startswith("sqlite"):
        path = url.split("///", 1)[1] if "///" in url else ""
        if path and path != ":memory:":
            # 0600 before SQLite opens it (its -wal and -shm files copy the database file's mode).
            private_files.ensure_private_file(Path(path), companions=("-wal", "-shm", "-journal",
                                                                      WRITER_LOCK_SUFFIX))
        file_db = bool(path) and path != ":memory:"  # an in-memory database has a single connection
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30}, json_serializer=json_text,
                               **(pool_args if file_db else {}))

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            # NORMAL keeps WAL durable across process crashes (only an OS crash can lose the
            # last transactions), which is what the master's crash-safety relies on.
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        # pysqlite's own transaction handling defers BEGIN; make writes take the lock up front
        # so concurrent writers queue on busy_timeout instead of failing on upgrade. Read-only
        # sessions (see `read_only`) begin deferred: in WAL mode they never wait for a writer.
        gate = _gate_for(path if file_db else None)

        @event.listens_for(engine, "begin")
        def _begin(conn) -> None:  # type: ignore[no-untyped-def]
            read_only = conn.get_execution_options().get(READ_ONLY)
            if not read_only:
                gate.enter(conn.info)
            conn.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")

        @event.listens_for(engine, "commit")
        @event.listens_for(engine, "rollback")
        def _end(conn) -> None:  # type: ignore[no-untyped-def]
            gate.leave(conn.info)

        @event.listens_for(engine.pool, "checkin")
        def _checkin(_dbapi_conn, record) -> None:  # type: ignore[no-untyped-def]
            gate.leave(record.info)  # whatever path ended the transaction, the gate is let go

        @event.listens_for(engine, "connect")
        def _no_autobegin(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
            dbapi_conn.isolation_level = None

        return engine
    engine = create_engine(url, json_serializer=json_text, **pool_args)
    _ping_when_idle(engine)
    return engine


# A connection unused for this long is pinged before it is handed out again.
PING_AFTER_IDLE_S = 10.0
_IDLE_SINCE = "shipyard_idle_since"


def _ping_when_idle(engine: Engine) -> None:
    """SQLAlchemy's `pool_pre_ping` costs a round trip (`SELECT 1`) on every checkout: on a busy
    master that is one more statement per request for PostgreSQL to run. A connection back in
    the pool moments ago is alive; one idle for a while (a server restarted, a proxy or
    `idle_session_timeout` closing it) is pinged, and replaced if dead. A server restart while
    connections are busy fails the statements in flight; SQLAlchemy then invalidates the whole
    pool, so the next checkouts open fresh connections."""
    dialect = engine.dialect

    @event.listens_for(engine.pool, "checkin")
    def _checked_in(_dbapi_conn, record) -> None:  # type: ignore[no-untyped-def]
        record.info[_IDLE_SINCE] = time.monotonic()

    @event.listens_for(engine.pool, "checkout")
    def _checked_out(dbapi_conn, record, _proxy) -> None:  # type: ignore[no-untyped-def]
        since = record.info.pop(_IDLE_SINCE, None)
        if since is None or time.monotonic() - since < PING_AFTER_IDLE_S:
            return  # new, or in use a moment ago
        try:
            dialect.do_ping(dbapi_conn)
        except dialect.loaded_dbapi.Error as e:  # the pool discards it and hands out another
            raise exc.DisconnectionError("connection lost while idle in the pool") from e


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(bind=engine, expire_on_commit=False)


READ_ONLY = "shipyard_read_only"
# Beside a SQLite database: the lock its writers queue on across the master's processes.
WRITER_LOCK_SUFFIX = "-writer-lock"
_GATE_HELD = "shipyard_writer_gate"
# As long as SQLite's own busy_timeout: past it, a writer goes on to SQLite as before the gate.
_GATE_TIMEOUT_S = 30.0


class _WriterGate:
    """SQLite lets one writer at a time in; the others wait in its busy handler, which sleeps in
    steps of up to 100 ms and misses the moment the lock is free, so under concurrent writers the
    database sits idle while they sleep and throughput falls as clients grow. The master's writers
    queue here instead, on a lock handed over the instant the previous transaction ends. Keyed by
    connection (a transaction may end on another thread than the one that began it); a writer
    that cannot get the gate in time (a second write transaction opened by a thread that already
    holds one) proceeds to SQLite, which decides as it always did.

    The master's processes (the control process and its API workers) write to one file: across
    them the gate is an exclusive `flock` on a lock file beside the database (`lock_path`), taken
    by the one thread of each process that holds the process's own lock. The next process takes
    it within a couple of milliseconds of its release (`_flock_before`), and the kernel releases it
    if its holder dies. Without it the workers' writers met in SQLite's busy handler, and the
    master's throughput on SQLite fell as clients grew."""

    def __init__(self, lock_path: Path | None = None) -> None:
        self._lock = threading.Lock()
        self._lock_path = lock_path
        self._fd: int | None = None  # the lock file, open while this process's writer holds the gate

    def enter(self, info: dict[str, object]) -> None:
        if info.get(_GATE_HELD):
            return
        deadline = time.monotonic() + _GATE_TIMEOUT_S
        held = self._lock.acquire(timeout=_GATE_TIMEOUT_S)
        if held and self._lock_path is not None:
            try:
                self._fd = _flock_before(self._lock_path, deadline)
            except BaseException:
                self._lock.release()
                raise
        info[_GATE_HELD] = held

    def leave(self, info: dict[str, object]) -> None:
        if info.pop(_GATE_HELD, False):
            fd, self._fd = self._fd, None
            if fd is not None:
                os.close(fd)  # lets the lock go
            self._lock.release()


# How often a writer asks again for the lock file while another process holds it: well under a
# transaction's length, so the lock is taken almost as soon as it is let go.
_FLOCK_RETRY_S = (0.0002, 0.002)


def _flock_before(path: Path, deadline: float) -> int | None:
    """The lock file, open and exclusively locked; None if another process still holds it at the
    deadline (the writer then goes on to SQLite, which waits its busy_timeout as it always did: no
    writer waits forever on a process stuck inside a transaction)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    pause = _FLOCK_RETRY_S[0]
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    return None
            time.sleep(pause)
            pause = min(pause * 2, _FLOCK_RETRY_S[1])
    except BaseException:
        os.close(fd)
        raise


_GATES: dict[str, _WriterGate] = {}
_GATES_LOCK = threading.Lock()


def _gate_for(path: str | None) -> _WriterGate:
    """One gate per database file in a process, whichever engines open it: a thread that holds it
    and opens a second write transaction on another engine waits out the gate's timeout, as on one
    engine, rather than for its own lock file."""
    if path is None:
        return _WriterGate()
    key = os.path.realpath(path)
    with _GATES_LOCK:
        gate = _GATES.get(key)
        if gate is None:
            gate = _GATES[key] = _WriterGate(Path(key + WRITER_LOCK_SUFFIX))
        return gate


def read_only(engine: Engine) -> Engine:
    """The same engine and connection pool, for transactions that only read."""
    return engine.execution_options(**{READ_ONLY: True})


@contextlib.contextmanager
def transaction(factory: sessionmaker[Session]) -> Iterator[Session]:
    """One unit of work: commits on success, rolls back on any error (nothing half-written)."""
    with factory() as session, session.begin():
        yield session
