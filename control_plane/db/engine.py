"""Engines and sessions for SQLite (WAL, the embedded default) and PostgreSQL (psycopg2)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        path = url.split("///", 1)[1] if "///" in url else ""
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

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
        @event.listens_for(engine, "begin")
        def _begin(conn) -> None:  # type: ignore[no-untyped-def]
            read_only = conn.get_execution_options().get(READ_ONLY)
            conn.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")

        @event.listens_for(engine, "connect")
        def _no_autobegin(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
            dbapi_conn.isolation_level = None

        return engine
    return create_engine(url, pool_size=10, max_overflow=20, pool_pre_ping=True)


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(bind=engine, expire_on_commit=False)


READ_ONLY = "shipyard_read_only"


def read_only(engine: Engine) -> Engine:
    """The same engine and connection pool, for transactions that only read."""
    return engine.execution_options(**{READ_ONLY: True})


@contextlib.contextmanager
def transaction(factory: sessionmaker[Session]) -> Iterator[Session]:
    """One unit of work: commits on success, rolls back on any error (nothing half-written)."""
    with factory() as session, session.begin():
        yield session
