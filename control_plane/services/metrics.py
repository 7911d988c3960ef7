"""Metric reports of a trial: storing them, keeping its latest and best validation, and telling
the searcher.

Idempotent per (trial, group, stepsCompleted): a re-send from the same run is a no-op, a higher
trialRunId replaces the stored row (a restarted trial re-reporting a step), a lower one is
ignored. Validation reports move `Trial.latest_validation` / `Trial.best_validation`; a
replacement rebuilds both from the stored rows, so a report can never leave them stale.

One path for every report, however it came (`report_many`; `report` is one request of it): a
batch of training (or custom-group) reports, the bulk of what trials send, is one short write
transaction of two statements (the trial's step count, then one multi-row upsert written as
plain SQL and prepared once per batch size), with the documents encoded by orjson before the
transaction begins and the caller's rights checked in a read transaction before it: on SQLite
the database-wide write lock is held for as little as possible.
A batch with a validation report (which moves the best validation and the searcher) takes the
general path: the experiment and trial rows locked and loaded, `store_reports`.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
from sqlalchemy import Connection, Dialect, bindparam, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from control_plane.auth import Principal, TokenKind
from control_plane.core import metrics as metric_values
from control_plane.core.expconf import ExperimentConfig
from control_plane.db.engine import transaction
from control_plane.db.models import Experiment, Metric, Trial
from control_plane.errors import DomainError, bad_request, not_found
from control_plane.master import Master
from control_plane.services import access, lifecycle
from shipyard_common.wire import rfc3339

log = logging.getLogger("shipyard.metrics")

VALIDATION = "validation"
_UPSERT_CHUNK = 500  # rows per INSERT: 6 bound values each, well under SQLite's variable limit
_SQL_CACHE_SIZE = 64  # SQLite upsert texts kept, one per batch size seen
_STEP_CHUNK = 500


@dataclass(frozen=True)
class MetricReport:
    """One report as the harness sent it; `field` is its path in the request, for errors."""

    group: str
    trial_id: int
    trial_run_id: int
    steps_completed: int
    avg_metrics: dict[str, Any]
    batch_metrics: list[dict[str, Any]] | None = None
    report_time: datetime | None = None
    field: str = "metrics"


@dataclass(frozen=True)
class SearcherGoal:
    metric: str | None
    smaller_is_better: bool


def searcher_goal(config: dict[str, Any]) -> SearcherGoal:
    """The searcher metric of a stored config and its direction, read through the typed config
    (which holds the defaults)."""
    searcher = ExperimentConfig.from_stored(config).searcher
    return SearcherGoal(searcher.metric, searcher.smaller_is_better)


def lock_for_reports(s: Session, trial_id: int, groups: set[str]) -> tuple[Trial, Experiment]:
    """Load and lock the trial (its row serialises reports of one trial: steps, best validation).

    Validation reports can move the searcher, which locks the experiment row: for those, lock the
    experiment first (the lifecycle's order, experiment → trial) so the two never deadlock on
    PostgreSQL. Training and custom groups lock only the trial, so the trials of one experiment
    report in parallel."""
    trial = access.get_trial(s, trial_id)
    exp = access.get_experiment(s, trial.experiment_id, for_update=VALIDATION in groups)
    return access.get_trial(s, trial_id, for_update=True), exp


@dataclass
class _Accepted:
    report: MetricReport
    report_time: datetime
    avg: dict[str, Any]  # json-safe
    doc: dict[str, Any]  # what the metrics row stores


def store_reports(s: Session, master: Master, trial: Trial, exp: Experiment, reports: list[MetricReport]) -> int:
    """Store reports of one trial; returns how many changed anything (a duplicate, or a report
    from an older run than the stored one, changes nothing). The caller holds the experiment and
    trial row locks (`lock_for_reports`)."""
    now = master.clock()
    for r in reports:
        if r.trial_id != trial.id:
            raise bad_request(f"trial {r.trial_id} does not match the trial in the path ({trial.id})",
                              f"{r.field}.trialId")
    accepted, replaced_validation = _new_reports(s, trial, reports)
    if not accepted:
        return 0
    parsed = [_document(r, now) for r in accepted]
    conn = s.connection()
    # A step sent twice in the batch by ever newer runs: the last one is what stays (one row per
    # step in one statement).
    final = {(a.report.group, a.report.steps_completed): a for a in parsed}
    _upsert(conn, trial.id, list(final.values()))
    trial.steps_completed = max(int(trial.steps_completed or 0), *(r.steps_completed for r in accepted))
    goal = searcher_goal(exp.config)
    if replaced_validation:
        recompute_validations(s, trial, goal)
    else:
        for a in parsed:
            if a.report.group == VALIDATION:
                snap = _snapshot(a.report.steps_completed, a.report.trial_run_id, a.report_time, a.avg, goal.metric)
                _note_validation(trial, goal, snap)
    s.flush()
    for a in parsed:
        lifecycle.on_metrics_reported(s, master, trial, a.report.group, a.report.steps_completed,
                                      metric_values.decode_nonfinite(a.avg))
    return len(accepted)


def _new_reports(s: Session, trial: Trial, reports: list[MetricReport]) -> tuple[list[MetricReport], bool]:
    """The reports that change something, compared with what is stored and with earlier items of
    the same batch; and whether one of them replaces a stored validation."""
    stored_run: dict[tuple[str, int], int] = {}
    steps = sorted({r.steps_completed for r in reports})
    for i in range(0, len(steps), _STEP_CHUNK):
        for group, step, run in s.execute(
            select(Metric.group_name, Metric.steps_completed, Metric.trial_run_id)
            .where(Metric.trial_id == trial.id, Metric.steps_completed.in_(steps[i : i + _STEP_CHUNK]))
        ):
            stored_run[(group, step)] = run
    accepted: list[MetricReport] = []
    replaced_validation = False
    for r in reports:
        key = (r.group, r.steps_completed)
        if key in stored_run:
            if stored_run[key] >= r.trial_run_id:
                continue
            replaced_validation |= r.group == VALIDATION
        stored_run[key] = r.trial_run_id
        accepted.append(r)
    return accepted, replaced_validation


def _document(r: MetricReport, now: datetime) -> _Accepted:
    avg = metric_values.json_safe(r.avg_metrics)
    doc: dict[str, Any] = {"validation_metrics": avg} if r.group == VALIDATION else {"avg_metrics": avg}
    if r.group != VALIDATION and r.batch_metrics is not None:
        doc["batch_metrics"] = metric_values.json_safe(r.batch_metrics)
    return _Accepted(r, r.report_time or now, avg, doc)


# -- the hot path ------------------------------------------------------------------------------
_WRITER_ROW = (select(Trial.experiment_id, Experiment.owner_id)
               .join(Experiment, Experiment.id == Trial.experiment_id).where(Trial.id == bindparam("trial_id")))


def authorize_reporter(s: Session, p: Principal, trial_id: int) -> None:
    """404 for an unknown trial, 403 unless `p` may report for it (`access.require_trial_writer`):
    one query, no ORM objects; none for the trial's own allocation token, the reporter of nearly
    every report (a live allocation token's trial exists: deleting an experiment revokes its
    trials' tokens in the same transaction)."""
    if p.kind is TokenKind.ALLOCATION and p.trial_id == trial_id:
        return
    row = s.connection().execute(_WRITER_ROW, {"trial_id": trial_id}).first()
    if row is None:
        raise not_found(f"trial {trial_id}")
    access.require_trial_writer_of(p, trial_id, row.experiment_id, row.owner_id, s)


# One request's reports: the trial of its path, who asks (resolved in the writer's session), how
# to build the reports (their 400s).
Report = tuple[int, Callable[[Session], Principal], Callable[[], list[MetricReport]]]
# A request checked: its place, who asked, the trial, its reports, their documents (None: the
# general path). A write: the same, for the requests whose reports one upsert stores.
_Checked = tuple[int, Principal, int, list[MetricReport], list[_Accepted] | None]
_Write = tuple[list[int], Principal, int, list[MetricReport], list[_Accepted] | None]


def report(master: Master, trial_id: int, caller: Callable[[Session], Principal],
           build: Callable[[], list[MetricReport]]) -> int:
    """One request's reports of one trial (`report_many` of one), all or nothing: how many changed
    anything; its refusal is raised."""
    (answer,) = report_many(master, [(trial_id, caller, build)])
    if isinstance(answer, DomainError):
        raise answer
    return answer


def report_many(master: Master, items: list[Report]) -> list[int | DomainError]:
    """Store requests' reports with one commit: the one way a metric report reaches the database,
    whether its request came alone (`report`) or with others (frontdoor/metric_batches.py).

    Each request is checked on its own, in this order: `caller(s)` resolves who is asking (its
    401/403), then their right to report for the trial (a foreign token gets its 403 whatever it
    sent), then `build()` makes the reports (their 400s). A refusal (its DomainError, in the
    request's place in the answer) leaves the others be; a request stored answers how many of its
    reports changed anything (requests merged into one upsert: the count of the whole upsert is
    the first one's, the others 0). The reports of one trial that share no (group, step) are
    stored by one upsert. A request written alone is all or nothing; a failure of the database
    fails them all (raised): nothing of any is stored. On SQLite the checks run in a read
    transaction, so the database-wide write lock is held only for the writes; on PostgreSQL,
    where readers and writers do not block each other, it is all one transaction on one
    connection."""
    answers: list[int | DomainError] = [0] * len(items)
    writes: list[_Write] = []

    def checked(s: Session) -> list[_Write]:
        accepted: list[_Checked] = []
        for i, (trial_id, caller, build) in enumerate(items):
            try:
                p = caller(s)
                authorize_reporter(s, p, trial_id)
                reports = build()
                accepted.append((i, p, trial_id, reports, _prepare(master, trial_id, reports)))
            except DomainError as e:
                answers[i] = e
        return _merged(accepted)

    def write(s: Session) -> None:
        for indexes, p, trial_id, reports, prepared in writes:
            try:
                answers[indexes[0]] = _store_batch(s, master, p, trial_id, reports, prepared)
            except DomainError as e:
                if len(writes) == 1:
                    raise  # alone in its transaction: rolled back, so nothing of it stays
                for i in indexes:
                    answers[i] = e

    try:
        if master.engine.dialect.name == "sqlite":
            with master.read_sessions() as s:
                writes = checked(s)
            if writes:
                with transaction(master.sessions) as s:
                    write(s)
        else:
            with transaction(master.sessions) as s:
                writes = checked(s)
                write(s)
    except DomainError as e:
        if len(writes) != 1:
            raise
        for i in writes[0][0]:
            answers[i] = e
    return answers


def _merged(accepted: list[_Checked]) -> list[_Write]:
    """The short-path requests of one trial as one write when no two of their reports share a
    (group, step) (one upsert cannot touch a row twice); the others (the general path, a step sent
    twice) each on their own. A merged write's principal is its first request's: the short path
    does not use it (each request's right was checked on its own)."""
    out: list[_Write] = []
    open_by_trial: dict[int, _Write] = {}
    keys_by_trial: dict[int, set[tuple[str, int]]] = {}
    for i, p, trial_id, reports, prepared in accepted:
        if prepared is None:
            out.append(([i], p, trial_id, reports, None))
            continue
        keys = {(r.group, r.steps_completed) for r in reports}
        merged = open_by_trial.get(trial_id)
        if merged is not None and not keys & keys_by_trial[trial_id]:
            merged[0].append(i)
            merged[3].extend(reports)
            assert merged[4] is not None
            merged[4].extend(prepared)
            keys_by_trial[trial_id] |= keys
            continue
        new: _Write = ([i], p, trial_id, list(reports), list(prepared))
        out.append(new)
        open_by_trial[trial_id], keys_by_trial[trial_id] = new, set(keys)
    return out


def report_progress(master: Master, trial_id: int, caller: Callable[[Session], Principal], progress: float) -> None:
    """A trial's progress (0..1, Determined's `report_progress`): who asks and their right to report
    for the trial checked as for metrics (`authorize_reporter`), then one UPDATE, no ORM object. On
    SQLite the checks run in a read transaction, so the write lock is held only for the update."""
    value = min(1.0, progress)
    if master.engine.dialect.name == "sqlite":
        with master.read_sessions() as s:
            authorize_reporter(s, caller(s), trial_id)
        with transaction(master.sessions) as s:
            s.connection().execute(_SET_PROGRESS, {"trial_id": trial_id, "progress": value})
        return
    with transaction(master.sessions) as s:
        authorize_reporter(s, caller(s), trial_id)
        s.connection().execute(_SET_PROGRESS, {"trial_id": trial_id, "progress": value})


_SET_PROGRESS = (update(Trial.__table__).where(Trial.__table__.c.id == bindparam("trial_id"))
                 .values(progress=bindparam("progress")))


def _prepare(master: Master, trial_id: int, reports: list[MetricReport]) -> list[_Accepted] | None:
    """The documents of a batch for the short path (encoded before any write lock is taken), or
    None when the batch needs the general one: a validation report (it moves the best validation
    and the searcher) or a step sent twice."""
    for r in reports:
        if r.trial_id != trial_id:
            raise bad_request(f"trial {r.trial_id} does not match the trial in the path ({trial_id})",
                              f"{r.field}.trialId")
    if not reports or any(r.group == VALIDATION for r in reports) or \
            len({(r.group, r.steps_completed) for r in reports}) < len(reports):
        return None
    now = master.clock()
    return [_document(r, now) for r in reports]


def _store_batch(s: Session, master: Master, p: Principal, trial_id: int, reports: list[MetricReport],
                 prepared: list[_Accepted] | None) -> int:
    if prepared is None:
        trial, exp = lock_for_reports(s, trial_id, {r.group for r in reports})
        access.require_trial_writer(p, trial, exp)
        return store_reports(s, master, trial, exp, reports)
    conn = s.connection()
    # The trial's step count first: every stored report's step is at most the trial's count, so
    # once this batch is stored the count is at least the batch's highest step, whichever of its
    # reports change anything. It also tells a trial deleted since it was authorised.
    top = max(r.steps_completed for r in reports)
    if not _bump_steps(conn, trial_id, top):
        raise not_found(f"trial {trial_id}")
    # Only validation reports concern the searcher (lifecycle.on_metrics_reported); none here.
    try:
        return _upsert(conn, trial_id, prepared)
    except IntegrityError:  # PostgreSQL: the trial was deleted after the count was read
        raise not_found(f"trial {trial_id}") from None


# The upsert: insert reports, or replace a stored one when it comes from a newer run; never a
# duplicate. One statement per batch, as plain SQL whose text is built once (per batch size on
# SQLite): no statement construction or compilation per request.
_ON_CONFLICT = ("ON CONFLICT (trial_id, group_name, steps_completed) DO UPDATE SET "
                "trial_run_id = excluded.trial_run_id, metrics = excluded.metrics, report_time = excluded.report_time "
                "WHERE metrics.trial_run_id < excluded.trial_run_id")
_COLUMNS = "INSERT INTO metrics (trial_id, group_name, steps_completed, trial_run_id, metrics, report_time) "
# PostgreSQL: the whole batch travels as one JSON parameter that the server unpacks, instead of six
# parameters per row that the driver would quote one by one (most of the client's CPU per batch).
_PG_UPSERT = (_COLUMNS + "SELECT %s, r.g, r.s, r.r, r.m, r.t FROM json_to_recordset(%s) "
              "AS r(g text, s bigint, r integer, m json, t timestamptz) " + _ON_CONFLICT)


@functools.lru_cache(maxsize=_SQL_CACHE_SIZE)
def _sqlite_upsert(n: int) -> str:
    return _COLUMNS + "VALUES " + ", ".join(["(?, ?, ?, ?, ?, ?)"] * n) + " " + _ON_CONFLICT


def _upsert(conn: Connection, trial_id: int, docs: list[_Accepted]) -> int:
    """Store reports (no two with the same group and step); returns how many were inserted or
    replaced (a report from the stored run or an older one is left alone and not counted)."""
    changed = 0
    for i in range(0, len(docs), _UPSERT_CHUNK):
        chunk = docs[i : i + _UPSERT_CHUNK]
        bind_time = _bind_time(conn.dialect)
        if conn.dialect.name == "postgresql":
            rows = [{"g": a.report.group, "s": a.report.steps_completed, "r": a.report.trial_run_id, "m": a.doc,
                     "t": bind_time(a.report_time).isoformat()} for a in chunk]
            changed += conn.exec_driver_sql(_PG_UPSERT, (trial_id, _json_text(rows))).rowcount
        else:
            params = tuple(v for a in chunk for v in (trial_id, a.report.group, a.report.steps_completed,
                                                      a.report.trial_run_id, _json_text(a.doc),
                                                      bind_time(a.report_time)))
            changed += conn.exec_driver_sql(_sqlite_upsert(len(chunk)), params).rowcount
    return changed


def _json_text(value: Any) -> str:
    """JSON text as the JSON column would hold it (orjson: compact; values read back the same). A
    value orjson refuses (an integer beyond 64 bits) goes to the standard encoder, as before."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return json.dumps(value)


@functools.cache
def _bind_time(dialect: Dialect) -> Callable[[Any], Any]:
    """The time column's own bind processing (SQLite stores a text form)."""
    proc = Metric.__table__.c.report_time.type.dialect_impl(dialect).bind_processor(dialect)
    return proc if proc is not None else (lambda v: v)


# PostgreSQL: the count moves only if the batch goes beyond it, so a report that does not move
# it (a retry, a late or out-of-order batch, another rank's) takes no lock on the trial's row and
# does not queue behind the trial's other reporters until they commit. The trial exists if the
# SELECT finds it. (Its deletion racing the upsert is the upsert's foreign key error.)
_PG_BUMP = ("WITH bumped AS (UPDATE trials SET steps_completed = %(top)s "
            "WHERE id = %(id)s AND steps_completed < %(top)s RETURNING id) "
            "SELECT count(*) FROM trials WHERE id = %(id)s")
_SQLITE_BUMP = "UPDATE trials SET steps_completed = MAX(steps_completed, ?) WHERE id = ?"


def _bump_steps(conn: Connection, trial_id: int, top: int) -> bool:
    """Raise the trial's step count to at least `top`; False if there is no such trial."""
    if conn.dialect.name == "postgresql":
        return conn.exec_driver_sql(_PG_BUMP, {"top": top, "id": trial_id}).scalar() == 1
    return conn.exec_driver_sql(_SQLITE_BUMP, (top, trial_id)).rowcount == 1


def _snapshot(
    steps: int, run_id: int, report_time: datetime, metrics: dict[str, Any], metric_name: str | None
) -> dict[str, Any]:
    """What `Trial.latest_validation` keeps of a validation report (camelCase: it is shown as is)."""
    value = metric_values.metric_number(metrics.get(metric_name)) if metric_name else None
    return {
        "stepsCompleted": steps,
        "trialRunId": run_id,
        "reportTime": rfc3339(report_time),
        "metrics": metrics,
        "searcherMetric": metric_values.wire_float(value),
    }


def recompute_validations(s: Session, trial: Trial, goal: SearcherGoal) -> None:
    """latest_validation = the highest step's report plus, under "best", the best one so far;
    best_validation = that best searcher metric. Rebuilt from the rows after a replacement."""
    latest: dict[str, Any] | None = None
    best: dict[str, Any] | None = None
    best_value: float | None = None
    for m in s.scalars(
        select(Metric).where(Metric.trial_id == trial.id, Metric.group_name == VALIDATION)
        .order_by(Metric.steps_completed)
    ):
        snap = _snapshot(m.steps_completed, m.trial_run_id, m.report_time,
                         m.metrics.get("validation_metrics") or {}, goal.metric)
        latest = snap
        value = metric_values.metric_number(snap["searcherMetric"])
        if value is not None and metric_values.better(value, best_value, goal.smaller_is_better):
            best, best_value = snap, value
    trial.latest_validation = None if latest is None else {**latest, "best": best}
    trial.best_validation = best_value


def _note_validation(trial: Trial, goal: SearcherGoal, snap: dict[str, Any]) -> None:
    current = trial.latest_validation or {}
    best = current.get("best")
    latest = {k: v for k, v in current.items() if k != "best"} or None
    if latest is None or snap["stepsCompleted"] >= int(latest.get("stepsCompleted") or 0):
        latest = snap
    value = metric_values.metric_number(snap["searcherMetric"])
    if value is not None and metric_values.better(value, trial.best_validation, goal.smaller_is_better):
        best = snap
        trial.best_validation = value
    trial.latest_validation = {**latest, "best": best}


# -- queries -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MetricRange:
    """Which reports of a trial: one group (or all), `start` ≤ step ≤ `end`."""

    group: str | None = None
    start: int | None = None
    end: int | None = None


def metric_page(s: Session, trial_id: int, rng: MetricRange, offset: int, limit: int) -> tuple[list[Metric], int]:
    """A trial's reports in step order and how many match; limit 0 = all."""
    q = select(Metric).where(Metric.trial_id == trial_id)
    if rng.group:
        q = q.where(Metric.group_name == rng.group)
    if rng.start is not None:
        q = q.where(Metric.steps_completed >= rng.start)
    if rng.end is not None:
        q = q.where(Metric.steps_completed <= rng.end)
    total = s.scalar(select(func.count()).select_from(q.subquery())) or 0
    q = q.order_by(Metric.steps_completed, Metric.group_name).offset(offset)
    if limit:
        q = q.limit(limit)
    return list(s.scalars(q)), total


def metrics_after(s: Session, trial_id: int, group: str, after: int, rng: MetricRange, batch: int) -> list[Metric]:
    """The next `batch` reports of one group after step `after` (a stream pages with this)."""
    q = select(Metric).where(Metric.trial_id == trial_id, Metric.group_name == group, Metric.steps_completed > after)
    if rng.start is not None:
        q = q.where(Metric.steps_completed >= rng.start)
    if rng.end is not None:
        q = q.where(Metric.steps_completed <= rng.end)
    return list(s.scalars(q.order_by(Metric.steps_completed).limit(batch)))
