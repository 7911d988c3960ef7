"""Wake-ups across master processes.

Inside one process, `Master.notify()` wakes the loops and long-polls through a condition variable.
API workers and the control process (and masters on other hosts) are separate processes, so a
change committed by one must wake the others:

* PostgreSQL: `NOTIFY shipyard_wake` inside the transaction that made the change (delivered on its
  commit, dropped on rollback), heard by a `LISTEN` on a connection each process keeps for it;
* SQLite (one host): the same transaction bumps `wake_signal.seq`; a thread reads that row every
  `sqlite_poll_s` (50 ms) on a connection of its own (a WAL read takes no lock), and wakes its
  process when it moved. Only run when several processes share the file. (Not `PRAGMA
  data_version`: it moves on every commit, metric reports included, and would wake every waiting
  long-poll many times a second under load.)

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
_SIGNAL = {True: text("SELECT pg_notify(:c, :o)"), False: text("UPDATE wake_signal SET seq = seq + 1 WHERE id = 1")}
_SEQ = "SELECT seq FROM wake_signal WHERE id = 1"


class WakeBus:
    def __init__(self, engine: Engine, origin: str, on_wake: Callable[[], None], *, sqlite_poll_s: float = 0.05) -> None:
        self.engine = engine
        self.origin = origin  # our own notifications are not news to us
        self.on_wake = on_wake
        self.postgres = engine.dialect.name == "postgresql"
        self.sqlite_poll_s = sqlite_poll_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- sending ------------------------------------------------------------------------------
    def publish_in(self, session: Session) -> None:
        """Within a transaction: the other processes hear it when (and only if) it commits."""
        session.execute(_SIGNAL[self.postgres], {"c": CHANNEL, "o": self.origin})

    def publish_now(self) -> None:
        """Outside any transaction (a change already committed, or none to wait for)."""
        try:
            with self.engine.begin() as conn:
                conn.execute(_SIGNAL[self.postgres], {"c": CHANNEL, "o": self.origin})
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
            last = conn.execute(_SEQ).fetchone()
            self.on_wake()  # anything committed before we looked
            while not self._stop.wait(self.sqlite_poll_s):
                try:
                    now = conn.execute(_SEQ).fetchone()
                except sqlite3.Error as e:
                    log.warning("event=wakebus_poll_error error=%s", e)
                    continue
                if now != last:
                    last = now
                    self.on_wake()
        finally:
            conn.close()
