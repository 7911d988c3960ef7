"""PostgreSQL connections are pinged only after idling in the pool: a dead one is replaced
before a request gets it, and a busy pool does not pay a `SELECT 1` per checkout."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import create_engine, event, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from control_plane.db import engine as engine_mod
from tests.pg import PostgresServer


@pytest.fixture
def pg_url(postgres_server: PostgresServer) -> str:
    return postgres_server.create_database()


def _backend_pid(engine) -> int:  # type: ignore[no-untyped-def]
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())


def _terminate(pg_url: str, pid: int) -> None:
    admin = create_engine(pg_url, poolclass=NullPool)
    with admin.connect() as conn:
        assert conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid}).scalar_one()
    admin.dispose()


def test_a_connection_killed_while_idle_is_replaced_before_use(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_mod, "PING_AFTER_IDLE_S", 0.05)
    engine = engine_mod.make_engine(pg_url, pool_size=1)
    try:
        dead = _backend_pid(engine)
        _terminate(pg_url, dead)  # as a server restart or an idle timeout would
        time.sleep(0.1)
        with engine.connect() as conn:  # no error: the ping found it dead, the pool opened another
            assert conn.execute(text("SELECT 1")).scalar_one() == 1
        assert _backend_pid(engine) != dead
    finally:
        engine.dispose()


def test_a_connection_back_a_moment_ago_is_not_pinged(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_mod, "PING_AFTER_IDLE_S", 60.0)
    engine = engine_mod.make_engine(pg_url, pool_size=1)
    pings: list[object] = []
    real_ping = engine.dialect.do_ping
    monkeypatch.setattr(engine.dialect, "do_ping", lambda c: pings.append(c) or real_ping(c))
    try:
        for _ in range(5):
            _backend_pid(engine)
        assert pings == []
        monkeypatch.setattr(engine_mod, "PING_AFTER_IDLE_S", 0.0)
        _backend_pid(engine)
        assert len(pings) == 1
    finally:
        engine.dispose()


def test_statements_on_a_connection_killed_mid_use_fail_then_the_pool_recovers(pg_url: str) -> None:
    engine = engine_mod.make_engine(pg_url, pool_size=2)
    try:
        with engine.connect() as conn:
            pid = int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())
            _terminate(pg_url, pid)
            with pytest.raises(DBAPIError) as failed:
                conn.execute(text("SELECT 1"))
            assert failed.value.connection_invalidated
        seen: list[int] = []
        event.listen(engine, "connect", lambda *_: seen.append(1))
        assert _backend_pid(engine) != pid  # the disconnect invalidated the pool: a fresh connection
        assert seen
    finally:
        engine.dispose()
