"""The master's own log, from every process, for `det master logs` (Determined's GetMasterLogs).

Determined's master keeps its recent log entries in memory. Shipyard's master is several processes
(the leader and its API workers, any of which may answer a request), so each process hands its
lines to a `Recorder`, a logging handler that only queues them (bounded; the oldest are dropped
when the database is away for long), and a thread writes them in batches to `master_logs` about
once a second, trimming the table to the newest `retention` lines now and then. A line is written
as the process's stderr shows it (control characters escaped: control_plane/logs.py), without the
timestamp, which has its own column.

The recorder never logs from its own thread (a failed write would feed itself) and skips
SQLAlchemy's loggers (its own statements at debug level)."""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import delete, func, insert, select
from sqlalchemy.orm import Session, sessionmaker

from control_plane.db.engine import transaction
from control_plane.db.models import MasterLog
from control_plane.logs import EventFormatter

RETENTION = 25_000  # lines kept, all processes together
FLUSH_S = 1.0
TRIM_EVERY = 60  # flushes
QUEUE_MAX = 20_000
LEVELS = {"DEBUG": "LOG_LEVEL_DEBUG", "INFO": "LOG_LEVEL_INFO", "WARNING": "LOG_LEVEL_WARNING",
          "ERROR": "LOG_LEVEL_ERROR", "CRITICAL": "LOG_LEVEL_CRITICAL"}


@dataclass(frozen=True)
class Entry:
    id: int
    timestamp: datetime
    level: str
    message: str

    def to_wire(self) -> dict[str, object]:
        """Determined's v1LogEntry."""
        ts = self.timestamp if self.timestamp.tzinfo else self.timestamp.replace(tzinfo=UTC)
        return {"id": self.id, "level": LEVELS.get(self.level, "LOG_LEVEL_UNSPECIFIED"), "message": self.message,
                "timestamp": ts.isoformat().replace("+00:00", "Z")}


class Recorder(logging.Handler):
    """Queues this process's log lines and writes them to the database from its own thread."""

    def __init__(self, sessions: sessionmaker[Session], process: str, *, retention: int,
                 flush_s: float = FLUSH_S) -> None:
        super().__init__()
        self.setFormatter(EventFormatter("logger=%(name)s %(message)s"))
        self._sessions = sessions
        self._process = process[:32]
        self._retention = retention
        self._flush_s = flush_s
        self._queue: deque[dict[str, object]] = deque(maxlen=QUEUE_MAX)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="master-log-recorder", daemon=True)
        self.dropped = 0  # lines lost while the database was away (the queue is bounded)
        self._failing = False

    def emit(self, record: logging.LogRecord) -> None:
        if threading.current_thread() is self._thread or record.name.startswith("sqlalchemy"):
            return
        try:
            line = self.format(record)
        except Exception:  # a bad format argument: logging's own handling prints it on stderr
            self.handleError(record)
            return
        if len(self._queue) == self._queue.maxlen:
            self.dropped += 1
        self._queue.append({"timestamp": datetime.fromtimestamp(record.created, UTC), "level": record.levelname[:16],
                            "process": self._process, "message": line})

    def start(self) -> Recorder:
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop the writer and write what is left, once, unless the writer is stuck or the last
        write failed (the database is away: shutdown does not wait for its timeouts)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        if not self._thread.is_alive() and not self._failing:
            self._flush()
        super().close()

    def _run(self) -> None:
        flushes = 0
        while not self._stop.wait(self._flush_s):
            if self._flush():
                flushes += 1
                if flushes % TRIM_EVERY == 1:
                    self._trim()

    def _flush(self) -> bool:
        """Write what is queued; on a failure keep it queued (bounded) for the next try."""
        rows = [self._queue.popleft() for _ in range(len(self._queue))]
        if not rows:
            return False
        try:
            with transaction(self._sessions) as s:
                s.execute(insert(MasterLog), rows)
        except Exception:
            # Keep the newest that fit beside what arrived meanwhile; the oldest are dropped, counted.
            room = max(0, QUEUE_MAX - len(self._queue))
            self.dropped += max(0, len(rows) - room)
            self._queue.extendleft(reversed(rows[len(rows) - room:] if room else []))
            self._failing = True
            return False
        self._failing = False
        return True

    def _trim(self) -> None:
        try:
            with transaction(self._sessions) as s:
                newest = s.scalar(select(func.max(MasterLog.id)))
                if newest is not None and newest > self._retention:
                    s.execute(delete(MasterLog).where(MasterLog.id <= newest - self._retention))
        except Exception:
            return


def record(sessions: sessionmaker[Session], process: str, *, level: str,
           retention: int = RETENTION) -> Callable[[], None]:
    """Adds a recorder to the root logger (this process's lines from now on, at `level` and above);
    returns what removes it and writes what is left."""
    recorder = Recorder(sessions, process, retention=retention).start()
    recorder.setLevel(level.upper())
    logging.getLogger().addHandler(recorder)

    def stop() -> None:
        logging.getLogger().removeHandler(recorder)
        recorder.close()

    return stop


def entries(s: Session, *, offset: int | None, after: int | None, limit: int) -> list[Entry]:
    """One page, oldest first. `offset` (the first page only) skips that many lines from the start,
    or with a negative value starts that many lines from the end, as Determined's; `after`: the lines
    after that id (the pages that follow, and `--follow`)."""
    q = select(MasterLog).order_by(MasterLog.id)
    if after is not None:
        q = q.where(MasterLog.id > after)
    elif offset is not None and offset < 0:
        ids = select(MasterLog.id).order_by(MasterLog.id.desc()).limit(-offset).subquery()
        q = q.where(MasterLog.id >= select(func.min(ids.c.id)).scalar_subquery())
    elif offset:
        q = q.offset(offset)
    rows = s.scalars(q.limit(limit)).all()
    return [Entry(r.id, r.timestamp, r.level, r.message) for r in rows]



def newest_id(s: Session) -> int:
    return s.scalar(select(func.max(MasterLog.id))) or 0
