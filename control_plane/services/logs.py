"""Task logs: who may ship lines for a task, storing them, and reading them back page by page.

A task is a trial's run or any other allocation's work (task ids are on trials and allocations).
Lines are stored as sent (NUL and lone surrogates cleaned, over-long lines truncated) with a level
from Determined's set; readers page by row id, which is also what a following stream waits on.

Regex search uses RE2 (as Determined's Go master does): matching is linear in the text, so no
pattern can make a search backtrack for seconds or forever; patterns RE2 refuses (backreferences,
lookaround) are a 400. Each user may run only a few searches at once (`search_slot`).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson
import re2
from sqlalchemy import Connection, Dialect, Select, func, select
from sqlalchemy.orm import Session

from control_plane.auth import Principal, TokenKind
from control_plane.core import states as st
from control_plane.db.engine import transaction
from control_plane.db.models import Allocation, TaskLog, Trial
from control_plane.db.quotas import Claim, Lease, QuotaFull, SharedQuotas
from control_plane.errors import DomainError, TooManyRequests, bad_request, forbidden, not_found
from control_plane.master import Master
from control_plane.services import access, authz
from control_plane.services.text import clean_text

log = logging.getLogger("shipyard.logs")

LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL", "UNSPECIFIED")
MAX_LOG_LINE_BYTES = 64 * 1024
MAX_SEARCH_TEXT = 1024  # characters of `searchText`: longer is a 400, not a huge automaton
MAX_SEARCHES_PER_USER = 4  # log searches (regex or text) one caller may have open at once
# RE2's own memory budget for one compiled pattern; a pattern that needs more is refused (400).
_RE2_MAX_MEM = 8 << 20


def normalize_level(value: str | None, where: str) -> str:
    """`LOG_LEVEL_WARNING`, `warning` and `WARN` are all WARNING; none means INFO."""
    if value in (None, ""):
        return "INFO"
    name = value.upper().removeprefix("LOG_LEVEL_")
    if name == "WARN":
        name = "WARNING"
    if name not in LOG_LEVELS:
        raise bad_request(f"unknown log level {value!r}", where)
    return name


def truncate_line(text: str) -> str:
    raw = text.encode("utf-8")
    if len(raw) <= MAX_LOG_LINE_BYTES:
        return text
    kept = raw[:MAX_LOG_LINE_BYTES].decode("utf-8", "ignore")
    newline = "\n" if text.endswith("\n") else ""
    return f"{kept} [shipyard: line truncated, {len(raw) - MAX_LOG_LINE_BYTES} more bytes dropped]{newline}"


# -- ingest ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LogLine:
    """One shipped line; `level` as sent (normalised when stored), `timestamp` None = now."""

    task_id: str
    log: str
    allocation_id: str | None = None
    agent_id: str | None = None
    rank: int | None = None
    timestamp: datetime | None = None
    level: str | None = None
    stdtype: str | None = None
    source: str | None = None


@dataclass(frozen=True)
class LogTarget:
    """What a writer names for one line: the task and, optionally, its allocation."""

    task_id: str
    allocation_id: str | None = None


def require_log_writer(s: Session, p: Principal, targets: list[LogTarget]) -> None:
    """Admin (or ClusterAdmin): any task. Allocation token: its own task (and allocation). Agent token: tasks with
    an allocation in its pool (on its own agent when the token is bound to one). Every task must
    exist. Field paths name `logs[i]`, the request's list."""
    for i, t in enumerate(targets):
        if "\x00" in t.task_id:
            raise bad_request("must not contain NUL characters", f"logs[{i}].taskId")
    if p.kind is TokenKind.ALLOCATION and p.allocation_id is not None:
        # The common case, a trial shipping its own output: one query. Anything else (another
        # task, an unknown one) takes the checks below, in their order, for its 404 or 403.
        own = s.scalar(select(Allocation.task_id).where(Allocation.id == p.allocation_id))
        if own is not None and all(t.task_id == own and t.allocation_id in (None, p.allocation_id)
                                   for t in targets):
            return
    tasks = {t.task_id for t in targets}
    known = set(s.scalars(select(Trial.task_id).where(Trial.task_id.in_(tasks))))
    known |= set(s.scalars(select(Allocation.task_id).where(Allocation.task_id.in_(tasks))))
    for i, t in enumerate(targets):
        if t.task_id not in known:
            raise not_found(f"task {t.task_id!r} (logs[{i}].taskId)")
    if p.kind is TokenKind.USER:
        if not authz.is_cluster_admin(s, p):
            raise forbidden("only an admin, the task's agent or the task itself can post its logs")
        return
    if p.kind is TokenKind.ALLOCATION:
        own_task: str | None = None
        if p.allocation_id is not None:
            own_task = s.scalar(select(Allocation.task_id).where(Allocation.id == p.allocation_id))
        if own_task is None and p.trial_id is not None:
            own_task = s.scalar(select(Trial.task_id).where(Trial.id == p.trial_id))
        for i, t in enumerate(targets):
            if t.task_id != own_task:
                raise forbidden(f"logs[{i}]: this token belongs to another task")
            if t.allocation_id is not None and p.allocation_id is not None and t.allocation_id != p.allocation_id:
                raise forbidden(f"logs[{i}]: this token belongs to another allocation")
        return
    if p.kind in (TokenKind.AGENT, TokenKind.AGENT_CREDENTIAL):
        allocs = s.execute(select(Allocation.id, Allocation.task_id, Allocation.pool, Allocation.agent_id)
                           .where(Allocation.task_id.in_(tasks))).all()
        for i, t in enumerate(targets):
            ok = any(
                a.task_id == t.task_id
                and a.pool == p.pool
                and (t.allocation_id is None or a.id == t.allocation_id)
                and (p.agent_id is None or a.agent_id == p.agent_id)
                for a in allocs
            )
            if not ok:
                raise forbidden(f"logs[{i}]: task {t.task_id!r} does not run on an agent of this credential")
        return
    raise forbidden(f"a {p.kind.value} token cannot post logs")


Shipment = tuple[Callable[[Session], Principal], list[LogTarget], Callable[[], list[LogLine]]]


def post(master: Master, caller: Callable[[Session], Principal], targets: list[LogTarget],
         build: Callable[[], list[LogLine]]) -> None:
    """One shipment of lines, all or nothing (`post_many` of one): its refusal is raised."""
    (refusal,) = post_many(master, [(caller, targets, build)])
    if refusal is not None:
        raise refusal


def post_many(master: Master, shipments: list[Shipment]) -> list[DomainError | None]:
    """Several shipments of lines (a caller, the targets, how to build the lines), stored with one
    commit: the one way task log lines reach the database, whether a shipment came alone (`post`)
    or with others (frontdoor/log_batches.py). Each is checked on its own, in this order: `caller(s)` resolves who is shipping (its
    401/403), `require_log_writer` checks their right to every target, `build()` makes the lines
    (their 400s). A refusal (its DomainError, in the shipment's place in the answer) leaves the
    others be; the lines of every shipment allowed are inserted together. A failure of the
    database fails them all (raised): nothing of any is stored. On SQLite the checks run in a read
    transaction, so the database-wide write lock is held only for the insert; on PostgreSQL, where
    readers and writers do not block each other, it is all one transaction on one connection."""
    answers: list[DomainError | None] = [None] * len(shipments)

    def checked(s: Session) -> list[tuple[Any, ...]]:
        rows: list[tuple[Any, ...]] = []
        for i, (caller, targets, build) in enumerate(shipments):
            try:
                require_log_writer(s, caller(s), targets)
                rows.extend(_rows(master, build()))
            except DomainError as e:
                answers[i] = e
        return rows

    if master.engine.dialect.name == "sqlite":
        with master.read_sessions() as s:
            rows = checked(s)
        if rows:
            with transaction(master.sessions) as s:
                _insert(s.connection(), rows)
        return answers
    with transaction(master.sessions) as s:
        _insert(s.connection(), checked(s))
    return answers


_LOG_COLUMNS = ("task_id", "allocation_id", "agent_id", "rank", "timestamp", "level", "stdtype", "source", "log")
_INSERT_CHUNK = 500  # rows per INSERT on SQLite: 9 values each, well under its variable limit
# PostgreSQL: the batch travels as one JSON parameter the server unpacks (the driver would quote
# nine parameters per line one by one, most of the client's CPU for a batch).
_PG_INSERT = (f"INSERT INTO task_logs ({', '.join(_LOG_COLUMNS)}) "
              "SELECT r.task_id, r.allocation_id, r.agent_id, r.rank, r.timestamp, r.level, r.stdtype, r.source, "
              "r.log FROM json_to_recordset(%s) AS r(task_id text, allocation_id text, agent_id text, rank integer, "
              "timestamp timestamptz, level text, stdtype text, source text, log text)")


@functools.lru_cache(maxsize=64)
def _sqlite_insert(n: int) -> str:
    return (f"INSERT INTO task_logs ({', '.join(_LOG_COLUMNS)}) VALUES "
            + ", ".join(["(" + ", ".join(["?"] * len(_LOG_COLUMNS)) + ")"] * n))


def _rows(master: Master, lines: list[LogLine]) -> list[tuple[Any, ...]]:
    """The lines as stored (cleaned, levels normalised: a 400 names the line), in _LOG_COLUMNS order."""
    now = master.clock()
    return [
        (
            line.task_id,
            clean_text(line.allocation_id) if line.allocation_id else None,
            clean_text(line.agent_id) if line.agent_id else None,
            line.rank,
            line.timestamp or now,
            normalize_level(line.level, f"logs[{i}].level"),
            clean_text(line.stdtype or "stdout"),
            clean_text(line.source or "task"),
            truncate_line(clean_text(line.log)),
        )
        for i, line in enumerate(lines)
    ]


def _insert(conn: Connection, rows: list[tuple[Any, ...]]) -> int:
    """One statement per batch (of up to _INSERT_CHUNK lines on SQLite), as plain SQL built once:
    no ORM object, statement construction or compilation per line or request."""
    if not rows:
        return 0
    bind_time = _bind_time(conn.dialect)
    if conn.dialect.name == "postgresql":
        doc = [dict(zip(_LOG_COLUMNS, (*row[:4], bind_time(row[4]).isoformat(), *row[5:]), strict=True))
               for row in rows]
        conn.exec_driver_sql(_PG_INSERT, (orjson.dumps(doc).decode(),))
        return len(rows)
    for i in range(0, len(rows), _INSERT_CHUNK):
        chunk = rows[i : i + _INSERT_CHUNK]
        params = tuple(v for row in chunk for v in (*row[:4], bind_time(row[4]), *row[5:]))
        conn.exec_driver_sql(_sqlite_insert(len(chunk)), params)
    return len(rows)


@functools.cache
def _bind_time(dialect: Dialect) -> Callable[[Any], Any]:
    """The timestamp column's own bind processing (SQLite stores a text form)."""
    proc = TaskLog.__table__.c.timestamp.type.dialect_impl(dialect).bind_processor(dialect)
    return proc if proc is not None else (lambda v: v)


# -- read ------------------------------------------------------------------------------------------
@dataclass
class LogFilter:
    """Which lines of a task a reader wants. Levels are normalised names (`normalize_level`)."""

    levels: list[str] = field(default_factory=list)
    stdtypes: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    agent_ids: list[str] = field(default_factory=list)
    rank_ids: list[int] = field(default_factory=list)
    allocation_ids: list[str] = field(default_factory=list)
    after: datetime | None = None
    before: datetime | None = None
    search_text: str | None = None
    enable_regex: bool = False
    regex: Any = field(default=None, init=False)  # a compiled RE2 pattern (re2 ships no type stubs)

    def __post_init__(self) -> None:
        self.search_text = self.search_text or None
        if self.search_text is not None and len(self.search_text) > MAX_SEARCH_TEXT:
            raise bad_request(f"longer than {MAX_SEARCH_TEXT} characters", "searchText")
        if self.search_text and self.enable_regex:
            self.regex = compile_search(self.search_text)

    def apply(self, q: Select[Any]) -> Select[Any]:
        if self.levels:
            q = q.where(TaskLog.level.in_(self.levels))
        if self.stdtypes:
            q = q.where(TaskLog.stdtype.in_(self.stdtypes))
        if self.sources:
            q = q.where(TaskLog.source.in_(self.sources))
        if self.agent_ids:
            q = q.where(TaskLog.agent_id.in_(self.agent_ids))
        if self.rank_ids:
            q = q.where(TaskLog.rank.in_(self.rank_ids))
        if self.allocation_ids:
            q = q.where(TaskLog.allocation_id.in_(self.allocation_ids))
        if self.after is not None:
            q = q.where(TaskLog.timestamp > self.after)
        if self.before is not None:
            q = q.where(TaskLog.timestamp < self.before)
        if self.search_text and self.regex is None:
            # Case-insensitive on both databases (SQLite's LIKE already is, PostgreSQL's is not).
            q = q.where(func.lower(TaskLog.log).contains(self.search_text.lower(), autoescape=True))
        return q

    def keep(self, row: TaskLog) -> bool:
        # A shipped line usually ends with its newline; `$` means the end of the line, as in Go.
        return self.regex is None or self.regex.search(row.log.removesuffix("\n")) is not None


def compile_search(pattern: str) -> Any:
    """Compile a user's pattern with RE2 (linear-time matching, bounded memory); what RE2 cannot
    take is a 400 naming `searchText` with RE2's reason."""
    options = re2.Options()
    options.log_errors = False  # a bad pattern is the caller's error, not a line in the master's log
    options.max_mem = _RE2_MAX_MEM
    options.never_capture = True  # we only ask "does it match"
    try:
        return re2.compile(pattern, options)
    except re2.error as e:
        reason = e.args[0].decode("utf-8", "replace") if e.args and isinstance(e.args[0], bytes) else str(e)
        raise bad_request(f"invalid or unsupported regular expression (RE2 syntax): {reason}", "searchText") from None


def caller_key(p: Principal) -> str:
    """Whose searches (and request bodies, frontdoor/limits.py) count together: a user's, whatever
    token or login they use; one allocation's; one agent's."""
    if p.kind is TokenKind.USER:
        return f"user:{p.user_id}"
    return f"{p.kind.value}:{p.allocation_id or p.agent_id or p.trial_id}"


def search_key(p: Principal) -> str:
    return f"log_search:{caller_key(p)}"


class SearchLease:
    """One open search; `release` is idempotent, so the stream's end and a fallback may both call it."""

    def __init__(self, lease: Lease | None) -> None:
        self._lease = lease

    def release(self) -> None:
        lease, self._lease = self._lease, None
        if lease is not None:
            lease.give_back()


def search_slot(quotas: SharedQuotas, p: Principal, flt: LogFilter) -> SearchLease:
    """Take one of the caller's search slots if the filter searches text (429 if none is free).
    Counted in the database (db/quotas.py), so the cap holds across every API worker process."""
    if not flt.search_text:
        return SearchLease(None)
    try:
        return SearchLease(quotas.take([Claim(search_key(p), MAX_SEARCHES_PER_USER)], 1))
    except QuotaFull:
        raise TooManyRequests(
            f"at most {MAX_SEARCHES_PER_USER} log searches at once per user; retry when one ends") from None


@dataclass
class LogPage:
    rows: list[TaskLog]  # only those the filter keeps
    cursor: int | None  # the last row id read (kept or not): where the next page starts
    fetched: int  # rows read, before the regex filter; a full batch means there may be more


def log_page(s: Session, task_id: str, flt: LogFilter, cursor: int | None, *, desc: bool, batch: int) -> LogPage:
    q = flt.apply(select(TaskLog).where(TaskLog.task_id == task_id))
    if cursor is not None:
        q = q.where(TaskLog.id < cursor if desc else TaskLog.id > cursor)
    rows = list(s.scalars(q.order_by(TaskLog.id.desc() if desc else TaskLog.id.asc()).limit(batch)))
    return LogPage([r for r in rows if flt.keep(r)], rows[-1].id if rows else cursor, len(rows))


def readable_task(s: Session, p: Principal, task_id: str) -> int | None:
    """Check that `p` may read the task's logs; returns its trial's id (None: not a trial's task)."""
    trial = s.scalar(select(Trial).where(Trial.task_id == task_id))
    if trial is not None:
        access.require_read_trial(p, trial)
        return trial.id
    if s.scalar(select(func.count()).where(Allocation.task_id == task_id)) == 0:
        raise not_found(f"task {task_id!r}")
    # A command's, notebook's, TensorBoard's or shell's logs: every user's to read, as experiments'
    # (services/tasks.py).
    if p.kind is not TokenKind.USER:
        raise forbidden(f"a {p.kind.value} token cannot read this task's logs")
    return None


def task_over(s: Session, task_id: str, trial_id: int | None) -> bool:
    """Has the task ended (so a following reader may stop)? A trial's task ends with the trial."""
    if trial_id is not None:
        state = s.scalar(select(Trial.state).where(Trial.id == trial_id))
        return state is None or state in st.TRIAL_TERMINAL
    live = s.scalar(select(func.count()).where(Allocation.task_id == task_id, Allocation.state.in_(st.ALLOC_LIVE)))
    return not live
