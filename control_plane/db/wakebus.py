"""Wake-ups across master processes.

Inside one process, `Master.notify()` wakes the loops and long-polls through a condition variable.
API workers and the control process (and masters on other hosts) are separate processes, so a
change committed by one must wake the others:

* PostgreSQL: `NOTIFY shipyard_wake` inside the transaction that made the change (delivered on its
  commit, dropped on rollback), heard by a `LISTEN` on a connection each process keeps for it;
* SQLite (one host): `PRAGMA data_version` moves whenever another connection commits; a thread polls
  it every `poll_s` on a connection of its own. Cheap, and only run when several processes share
  the file.

Wake-ups are hints, never the record: whoever wakes reads the database, and every loop and
long-poll also has a timeout, so a lost notification only delays."""

from __future__ import annotations

import logging
import select
import sqlite3
import threading
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

log = logging.getLogger("shipyard.wakebus")

CHANNEL = "shipyard_wake"


class WakeBus:
    def __init__(self, engine: Engine, origin: str, on_wake: Callable[[], None], *, sqlite_poll_s: float = 0.05) -> None:
        self.engine = engine
        self.origin = origin  # our own notifications are not news to us
        self.on_wake = on_wake
        self.postgres = engine.dialect.name == "postgresql"
        self.sqlite_poll_s = sqlite_poll_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.received = 0

    # -- sending ------------------------------------------------------------------------------
    def publish_in(self, session: Session) -> None:
        """Within a transaction: the other processes hear it when (and only if) it commits."""
        if self.postgres:
            session.execute(text("SELECT pg_notify(:c, :o)"), {"c": CHANNEL, "o": self.origin})

    def publish_now(self) -> None:
        """Outside any transaction (a change already committed, or none to wait for)."""
        if not self.postgres:
            return  # SQLite: the commit itself moved data_version
        try:
            with self.engine.connect() as conn:
                conn.execute(text("SELECT pg_notify(:c, :o)"), {"c": CHANNEL, "o": self.origin})
                conn.commit()
        except Exception as e:  # a hint: the others' timeouts cover a lost one
            log.debug("event=wake_publish_failed error=%s", e)

    # -- receiving ----------------------------------------------------------------------------
    def start(self) -> None:
        target = self._listen_pg if self.postgres else self._poll_sqlite
        self._thread = threading.Thread(target=target, name="wakebus", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _listen_pg(self) -> None:
        while not self._stop.is_set():
            raw: Any = None
            try:
                raw = self.engine.raw_connection()
                dbapi = raw.driver_connection
                dbapi.set_session(autocommit=True)
                with dbapi.cursor() as cur:
                    cur.execute(f"LISTEN {CHANNEL}")
                self.on_wake()  # anything missed while we were not listening
                while not self._stop.is_set():
                    ready, _, _ = select.select([dbapi], [], [], 1.0)
                    if not ready:
                        continue
                    dbapi.poll()
                    news = [n for n in dbapi.notifies if n.payload != self.origin]
                    dbapi.notifies.clear()
                    if news:
                        self.received += len(news)
                        self.on_wake()
            except Exception as e:
                log.warning("event=wakebus_listen_error error=%s", e)
                if raw is not None:
                    raw.invalidate()
                self._stop.wait(1.0)
            finally:
                if raw is not None:
                    try:
                        raw.close()
                    except Exception:
                        pass

    def _poll_sqlite(self) -> None:
        path = self.engine.url.database
        assert path
        conn = sqlite3.connect(path, timeout=30, check_same_thread=False)
        try:
            last = conn.execute("PRAGMA data_version").fetchone()[0]
            self.on_wake()  # anything committed before we looked
            while not self._stop.wait(self.sqlite_poll_s):
                try:
                    now = conn.execute("PRAGMA data_version").fetchone()[0]
                except sqlite3.Error as e:
                    log.warning("event=wakebus_poll_error error=%s", e)
                    continue
                if now != last:
                    last = now
                    self.received += 1
                    self.on_wake()
        finally:
            conn.close()
