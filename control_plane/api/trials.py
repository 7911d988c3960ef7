"""Trials, their metrics and their logs.

- `GET /api/v1/experiments/{id}/trials`, `GET /api/v1/trials/{id}` (Determined's trialv1Trial).
- Metric reports: `POST /api/v1/trials/{id}/metrics` (Determined), the legacy
  `training_metrics` / `validation_metrics`, and Shipyard's `…/metrics/batch`. Idempotent per
  (trial, group, stepsCompleted): a re-send from the same run is a no-op, a higher trialRunId
  replaces the row (a restarted trial re-reporting a step), a lower one is ignored.
- Metric queries: Determined's streaming `GET /api/v1/trials/metrics/trial_metrics` and
  Shipyard's paged `GET /api/v1/trials/{id}/metrics`.
- Logs: `POST /api/v1/task/logs`, streaming `GET /api/v1/trials/{id}/logs` and
  `GET /api/v1/tasks/{taskId}/logs` (follow keeps the stream open until the task has ended).

Streaming endpoints never hold the request's `deps.get_db` session: FastAPI closes it only after
the response, and on SQLite an open transaction would block the writers the stream waits for.

Streams are newline-delimited JSON objects `{"result": …}` (or `{"error": …}`), exactly what
grpc-gateway sends and what the Determined client's `iter_lines` reads.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse
from pydantic import Field
from sqlalchemy import Select, func, insert, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from control_plane.api import deps, serializers
from control_plane.api.wire import StrictWire, ts
from control_plane.auth import Principal, TokenKind
from control_plane.core import metrics as metric_values
from control_plane.core import states as st
from control_plane.db.models import Allocation, Experiment, Metric, TaskLog, Trial
from control_plane.errors import bad_request, forbidden, not_found
from control_plane.master import Master
from control_plane.services import access, lifecycle

log = logging.getLogger("shipyard.api.trials")
router = APIRouter()

STREAM_MEDIA_TYPE = "application/json"
FOLLOW_POLL_S = 0.25
STREAM_BATCH = 1000
MAX_LOG_LINE_BYTES = 64 * 1024


# -- trials ----------------------------------------------------------------------------------------
_TRIAL_SORTS = (
    "SORT_BY_UNSPECIFIED", "SORT_BY_ID", "SORT_BY_START_TIME", "SORT_BY_END_TIME", "SORT_BY_STATE",
    "SORT_BY_BEST_VALIDATION_METRIC", "SORT_BY_LATEST_VALIDATION_METRIC", "SORT_BY_BATCHES_PROCESSED",
    "SORT_BY_DURATION", "SORT_BY_RESTARTS", "SORT_BY_CHECKPOINT_SIZE", "SORT_BY_LOG_RETENTION_DAYS",
)


def _trial_sort_key(sort_by: str, t: Trial, smaller_is_better: bool, ckpt_size: int, now: datetime) -> Any:
    """A sortable value, or None to put the trial last whatever the direction."""
    if sort_by == "SORT_BY_START_TIME":
        return t.start_time
    if sort_by == "SORT_BY_END_TIME":
        return t.end_time
    if sort_by == "SORT_BY_STATE":
        return t.state
    if sort_by == "SORT_BY_BEST_VALIDATION_METRIC":
        return t.best_validation if t.best_validation == t.best_validation else None  # NaN → last
    if sort_by == "SORT_BY_LATEST_VALIDATION_METRIC":
        value = metric_values.metric_number((t.latest_validation or {}).get("searcherMetric"))
        return value if value is not None and value == value else None
    if sort_by == "SORT_BY_BATCHES_PROCESSED":
        return t.steps_completed
    if sort_by == "SORT_BY_DURATION":
        return ((t.end_time or now) - t.start_time).total_seconds()
    if sort_by == "SORT_BY_RESTARTS":
        return t.restarts
    if sort_by == "SORT_BY_CHECKPOINT_SIZE":
        return ckpt_size
    return t.id


@router.get("/api/v1/experiments/{experimentId}/trials")
def list_trials(
    experimentId: int,
    p: Principal = Depends(deps.principal),
    master: Master = Depends(deps.get_master),
    db: Session = Depends(deps.get_db, scope="function"),
    states: Annotated[list[str], Query()] = [],  # noqa: B006 - FastAPI copies defaults
    sortBy: str | None = None,
    orderBy: str | None = None,
    offset: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=0)] = 0,
) -> dict[str, Any]:
    """`limit` 0 means no limit (Determined)."""
    exp = access.get_experiment(db, experimentId)
    access.require_read_experiment(db, p, exp)
    sort_by = serializers.parse_choice(sortBy, _TRIAL_SORTS, "sortBy", "SORT_BY_ID")
    desc = serializers.parse_order(orderBy)
    wanted = serializers.parse_states(states, st.EXPERIMENT_STATES | st.TRIAL_STATES, "states")
    if "STATE_ACTIVE" in wanted:
        wanted |= st.TRIAL_ACTIVE_SUBSTATES
    q = select(Trial).where(Trial.experiment_id == exp.id)
    if wanted:
        q = q.where(Trial.state.in_(wanted))
    trials = list(db.scalars(q.order_by(Trial.id)))
    now = master.clock()
    ckpts = serializers.trial_checkpoints(db, [t.id for t in trials])
    _, smaller = serializers.searcher_settings(exp.config)
    keyed = [(_trial_sort_key(sort_by, t, smaller, ckpts[t.id].size, now), t) for t in trials]
    present = [(k, t) for k, t in keyed if k is not None]
    missing = [t for k, t in keyed if k is None]
    present.sort(key=lambda kt: (kt[0], kt[1].id), reverse=desc)
    ordered = [t for _, t in present] + missing
    chosen = serializers.page(ordered, offset, limit)
    return {
        "trials": [serializers.trial_json(t, ckpts[t.id], now) for t in chosen],
        "pagination": serializers.pagination_json(offset, limit, len(ordered), len(chosen)),
    }


@router.get("/api/v1/trials/{trialId}")
def get_trial(
    trialId: int,
    p: Principal = Depends(deps.principal),
    master: Master = Depends(deps.get_master),
    db: Session = Depends(deps.get_db, scope="function"),
) -> dict[str, Any]:
    trial = access.get_trial(db, trialId)
    access.require_read_trial(p, trial)
    return {"trial": serializers.trials_json(db, [trial], master.clock())[0]}


# -- metric reports --------------------------------------------------------------------------------
# Determined: a group names a time series; it cannot contain '.' (metric ids are "group.name").
_GROUP_PATTERN = r"^[^.\x00-\x1f\x7f]{1,64}$"


class MetricsBody(StrictWire):
    avg_metrics: dict[str, Any]
    batch_metrics: list[dict[str, Any]] | None = None


class TrialMetricsBody(StrictWire):
    trial_id: int
    trial_run_id: int = Field(ge=0)
    steps_completed: int = Field(ge=0)
    metrics: MetricsBody
    report_time: str | None = None


class ReportMetricsRequest(StrictWire):
    metrics: TrialMetricsBody
    group: str = Field(pattern=_GROUP_PATTERN)


class BatchReportRequest(StrictWire):
    reports: list[ReportMetricsRequest] = Field(min_length=1, max_length=10_000)


_UPSERT_CHUNK = 500  # rows per INSERT: 6 bound values each, well under SQLite's variable limit


def _upsert_statement(db: Session, rows: list[dict[str, Any]] | None) -> Any:
    """Insert reports, or replace a stored one when it comes from a newer run; never a duplicate.
    With `rows`, one multi-row INSERT (PostgreSQL: psycopg2 would send an executemany row by
    row); without, a statement for an executemany (SQLite: one cached, prepared statement)."""
    dialect = postgresql if db.get_bind().dialect.name == "postgresql" else sqlite
    table = Metric.__table__
    stmt = dialect.insert(table)
    if rows is not None:
        stmt = stmt.values(rows)
    return stmt.on_conflict_do_update(
        index_elements=[table.c.trial_id, table.c.group_name, table.c.steps_completed],
        set_={
            "trial_run_id": stmt.excluded.trial_run_id,
            "metrics": stmt.excluded.metrics,
            "report_time": stmt.excluded.report_time,
        },
        where=table.c.trial_run_id < stmt.excluded.trial_run_id,
    )


def _validation_snapshot(
    steps: int, run_id: int, report_time: str | None, metrics: dict[str, Any], metric_name: str | None
) -> dict[str, Any]:
    value = metric_values.metric_number(metrics.get(metric_name)) if metric_name else None
    return {
        "stepsCompleted": steps,
        "trialRunId": run_id,
        "reportTime": report_time,
        "metrics": metrics,
        "searcherMetric": metric_values.wire_float(value),
    }


def _recompute_validations(db: Session, trial: Trial, exp: Experiment) -> None:
    """latest_validation = the highest step's report plus, under "best", the best one so far;
    best_validation = that best searcher metric. Rebuilt from the rows after a replacement."""
    metric_name, smaller = serializers.searcher_settings(exp.config)
    latest: dict[str, Any] | None = None
    best: dict[str, Any] | None = None
    best_value: float | None = None
    for m in db.scalars(
        select(Metric).where(Metric.trial_id == trial.id, Metric.group_name == "validation")
        .order_by(Metric.steps_completed)
    ):
        snap = _validation_snapshot(
            m.steps_completed, m.trial_run_id, ts(m.report_time), m.metrics.get("validation_metrics") or {},
            metric_name,
        )
        latest = snap
        value = metric_values.metric_number(snap["searcherMetric"])
        if value is not None and metric_values.better(value, best_value, smaller):
            best, best_value = snap, value
    trial.latest_validation = None if latest is None else {**latest, "best": best}
    trial.best_validation = best_value


def _note_validation(trial: Trial, exp: Experiment, snap: dict[str, Any]) -> None:
    _, smaller = serializers.searcher_settings(exp.config)
    current = trial.latest_validation or {}
    best = current.get("best")
    latest = {k: v for k, v in current.items() if k != "best"} or None
    if latest is None or snap["stepsCompleted"] >= int(latest.get("stepsCompleted") or 0):
        latest = snap
    value = metric_values.metric_number(snap["searcherMetric"])
    if value is not None and metric_values.better(value, trial.best_validation, smaller):
        best = snap
        trial.best_validation = value
    trial.latest_validation = {**latest, "best": best}


@dataclass
class _Report:
    group: str
    steps: int
    run_id: int
    report_time: datetime
    avg: dict[str, Any]  # json-safe
    doc: dict[str, Any]  # what the metrics row stores


def store_reports(
    db: Session, master: Master, trial: Trial, exp: Experiment, reports: list[tuple[str, TrialMetricsBody, str]]
) -> int:
    """Store (group, report, field path) items of one trial; returns how many changed anything
    (a duplicate, or a report from an older run than the stored one, changes nothing). The
    caller holds the experiment and trial row locks."""
    now = master.clock()
    parsed: list[_Report] = []
    for group, body, where in reports:
        if body.trial_id != trial.id:
            raise bad_request(f"trial {body.trial_id} does not match the trial in the path ({trial.id})",
                              f"{where}.trialId")
        avg = metric_values.json_safe(body.metrics.avg_metrics)
        doc: dict[str, Any] = {"validation_metrics": avg} if group == "validation" else {"avg_metrics": avg}
        if group != "validation" and body.metrics.batch_metrics is not None:
            doc["batch_metrics"] = metric_values.json_safe(body.metrics.batch_metrics)
        report_time = serializers.parse_time(body.report_time, f"{where}.reportTime") or now
        parsed.append(_Report(group, body.steps_completed, body.trial_run_id, report_time, avg, doc))

    # What is stored already, and what earlier items of this same batch will have stored.
    stored_run: dict[tuple[str, int], int] = {}
    steps = sorted({r.steps for r in parsed})
    for i in range(0, len(steps), 500):
        for group, step, run in db.execute(
            select(Metric.group_name, Metric.steps_completed, Metric.trial_run_id)
            .where(Metric.trial_id == trial.id, Metric.steps_completed.in_(steps[i : i + 500]))
        ):
            stored_run[(group, step)] = run
    accepted: list[_Report] = []
    replaced_validation = False
    for r in parsed:
        key = (r.group, r.steps)
        if key in stored_run:
            if stored_run[key] >= r.run_id:
                continue
            replaced_validation |= r.group == "validation"
        stored_run[key] = r.run_id
        accepted.append(r)
    if not accepted:
        return 0

    rows = [{"trial_id": trial.id, "group_name": r.group, "steps_completed": r.steps, "trial_run_id": r.run_id,
             "metrics": r.doc, "report_time": r.report_time} for r in accepted]
    if db.get_bind().dialect.name == "postgresql":
        for i in range(0, len(rows), _UPSERT_CHUNK):
            db.execute(_upsert_statement(db, rows[i : i + _UPSERT_CHUNK]))
    else:
        db.execute(_upsert_statement(db, None), rows)
    trial.steps_completed = max(int(trial.steps_completed or 0), *(r.steps for r in accepted))
    if replaced_validation:
        _recompute_validations(db, trial, exp)
    else:
        metric_name, _ = serializers.searcher_settings(exp.config)
        for r in accepted:
            if r.group == "validation":
                _note_validation(trial, exp, _validation_snapshot(r.steps, r.run_id, ts(r.report_time), r.avg,
                                                                  metric_name))
    db.flush()
    for r in accepted:
        lifecycle.on_metrics_reported(db, master, trial, r.group, r.steps, metric_values.decode_nonfinite(r.avg))
    return len(accepted)


def _writable_trial(db: Session, p: Principal, trial_id: int, groups: set[str]) -> tuple[Trial, Experiment]:
    """Load and lock the trial (its row serialises reports of one trial: steps, best validation).

    Validation reports can move the searcher, which locks the experiment row: for those, lock the
    experiment first (the lifecycle's order, experiment → trial) so the two never deadlock on
    PostgreSQL. Training and custom groups lock only the trial, so the trials of one experiment
    report in parallel."""
    deps.require_trial_access(p, trial_id)
    trial = access.get_trial(db, trial_id)
    exp = access.get_experiment(db, trial.experiment_id, for_update="validation" in groups)
    access.require_trial_writer(p, trial, exp)
    trial = access.get_trial(db, trial_id, for_update=True)
    return trial, exp


@router.post("/api/v1/trials/{trialId}/metrics")
def report_metrics(
    trialId: int,
    body: ReportMetricsRequest,
    p: Principal = Depends(deps.user_or_allocation),
    master: Master = Depends(deps.get_master),
    db: Session = Depends(deps.get_db, scope="function"),
) -> dict[str, Any]:
    trial, exp = _writable_trial(db, p, trialId, {body.group})
    store_reports(db, master, trial, exp, [(body.group, body.metrics, "metrics")])
    return {}


@router.post("/api/v1/trials/{trialId}/metrics/batch")
def report_metrics_batch(
    trialId: int,
    body: BatchReportRequest,
    p: Principal = Depends(deps.user_or_allocation),
    master: Master = Depends(deps.get_master),
    db: Session = Depends(deps.get_db, scope="function"),
) -> dict[str, Any]:
    """Shipyard: many reports of one trial in one transaction (all or nothing)."""
    trial, exp = _writable_trial(db, p, trialId, {r.group for r in body.reports})
    items = [(r.group, r.metrics, f"reports[{i}].metrics") for i, r in enumerate(body.reports)]
    stored = store_reports(db, master, trial, exp, items)
    return {"stored": stored, "duplicates": len(body.reports) - stored}


def _legacy(group: str) -> Callable[..., dict[str, Any]]:
    def handler(
        trialId: int,
        body: TrialMetricsBody,
        p: Principal = Depends(deps.user_or_allocation),
        master: Master = Depends(deps.get_master),
        db: Session = Depends(deps.get_db, scope="function"),
    ) -> dict[str, Any]:
        trial, exp = _writable_trial(db, p, trialId, {group})
        store_reports(db, master, trial, exp, [(group, body, "(body)")])
        return {}

    handler.__name__ = f"report_{group}_metrics"
    return handler


router.post("/api/v1/trials/{trialId}/training_metrics")(_legacy("training"))
router.post("/api/v1/trials/{trialId}/validation_metrics")(_legacy("validation"))


# -- metric queries --------------------------------------------------------------------------------
def _metric_report_json(m: Metric) -> dict[str, Any]:
    """Determined's v1MetricsReport; `metrics` is the stored document ({"avg_metrics", "batch_metrics"}
    or {"validation_metrics"}), as Determined's client expects."""
    end = m.report_time.replace(microsecond=m.report_time.microsecond // 1000 * 1000)
    return {
        "id": m.id,
        "trialId": m.trial_id,
        "trialRunId": m.trial_run_id,
        "totalBatches": m.steps_completed,
        "endTime": ts(end),
        "metrics": m.metrics,
        "group": m.group_name,
        "archived": False,
    }


def _ndjson(obj: dict[str, Any]) -> bytes:
    return (json.dumps(obj, allow_nan=False, separators=(",", ":")) + "\n").encode()


def _stream_error(message: str, code: int = 500) -> bytes:
    return _ndjson({"error": {"grpcCode": 13, "httpCode": code, "message": message, "httpStatus": "Internal Server Error"}})


def _readable_trials(db: Session, p: Principal, trial_ids: list[int]) -> None:
    if not trial_ids:
        raise bad_request("at least one trialIds is required", "trialIds")
    if len(set(trial_ids)) != len(trial_ids):
        raise bad_request("duplicate trial ids", "trialIds")
    found = {t.id: t for t in db.scalars(select(Trial).where(Trial.id.in_(trial_ids)))}
    for tid in trial_ids:
        if tid not in found:
            raise not_found(f"trial {tid}")
        access.require_read_trial(p, found[tid])


def _metrics_stream(
    master: Master, trial_ids: list[int], group: str, start: int | None, end: int | None, limit: int
) -> StreamingResponse:
    async def gen() -> AsyncIterator[bytes]:
        sent = 0
        for tid in sorted(trial_ids):
            after = -1
            while True:
                batch = STREAM_BATCH if not limit else min(STREAM_BATCH, limit - sent)
                if batch <= 0:
                    return

                def fetch(tid: int = tid, after: int = after, batch: int = batch) -> list[dict[str, Any]]:
                    with master.read_sessions() as s:
                        q = select(Metric).where(
                            Metric.trial_id == tid, Metric.group_name == group, Metric.steps_completed > after
                        )
                        if start is not None:
                            q = q.where(Metric.steps_completed >= start)
                        if end is not None:
                            q = q.where(Metric.steps_completed <= end)
                        rows = s.scalars(q.order_by(Metric.steps_completed).limit(batch))
                        return [_metric_report_json(m) for m in rows]

                try:
                    reports = await run_in_threadpool(fetch)
                except Exception:
                    log.exception("event=metrics_stream_error trial_id=%s", tid)
                    yield _stream_error("internal error")
                    return
                if reports:
                    yield _ndjson({"result": {"metrics": reports}})
                    sent += len(reports)
                    after = reports[-1]["totalBatches"]
                if len(reports) < batch:
                    break

    return StreamingResponse(gen(), media_type=STREAM_MEDIA_TYPE)


def _metrics_stream_endpoint(fixed_group: str | None) -> Callable[..., StreamingResponse]:
    def handler(
        p: Principal = Depends(deps.principal),
        master: Master = Depends(deps.get_master),
        trialIds: Annotated[list[int], Query()] = [],  # noqa: B006 - FastAPI copies defaults
        group: str | None = None,
        startBatches: int | None = None,
        endBatches: int | None = None,
        limit: Annotated[int, Query(ge=0)] = 0,
    ) -> StreamingResponse:
        chosen = fixed_group or group
        serializers.reject_nul(group=chosen)
        if not chosen:
            raise bad_request("a metric group is required (e.g. training, validation)", "group")
        with master.read_sessions() as db:
            _readable_trials(db, p, trialIds)
        return _metrics_stream(master, trialIds, chosen, startBatches, endBatches, limit)

    handler.__name__ = f"stream_{fixed_group or 'trial'}_metrics"
    return handler


router.get("/api/v1/trials/metrics/trial_metrics")(_metrics_stream_endpoint(None))
router.get("/api/v1/trials/metrics/training_metrics")(_metrics_stream_endpoint("training"))
router.get("/api/v1/trials/metrics/validation_metrics")(_metrics_stream_endpoint("validation"))


def metric_row_json(m: Metric) -> dict[str, Any]:
    doc = m.metrics or {}
    return {
        "stepsCompleted": m.steps_completed,
        "group": m.group_name,
        "trialRunId": m.trial_run_id,
        "metrics": doc.get("validation_metrics", doc.get("avg_metrics", {})),
        "batchMetrics": doc.get("batch_metrics"),
        "reportTime": ts(m.report_time),
    }


@router.get("/api/v1/trials/{trialId}/metrics")
def list_trial_metrics(
    trialId: int,
    p: Principal = Depends(deps.principal),
    db: Session = Depends(deps.get_db, scope="function"),
    group: str | None = None,
    startStep: int | None = None,
    endStep: int | None = None,
    offset: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=0)] = 0,
) -> dict[str, Any]:
    """Shipyard: a trial's reports in step order, `startStep` ≤ step ≤ `endStep`; limit 0 = all."""
    serializers.reject_nul(group=group)
    trial = access.get_trial(db, trialId)
    access.require_read_trial(p, trial)
    q = select(Metric).where(Metric.trial_id == trial.id)
    if group:
        q = q.where(Metric.group_name == group)
    if startStep is not None:
        q = q.where(Metric.steps_completed >= startStep)
    if endStep is not None:
        q = q.where(Metric.steps_completed <= endStep)
    total = db.scalar(select(func.count()).select_from(q.subquery())) or 0
    q = q.order_by(Metric.steps_completed, Metric.group_name).offset(offset)
    if limit:
        q = q.limit(limit)
    rows = list(db.scalars(q))
    return {"metrics": [metric_row_json(m) for m in rows],
            "pagination": serializers.pagination_json(offset, limit, total, len(rows))}


# -- logs: ingest ----------------------------------------------------------------------------------
LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL", "UNSPECIFIED")


class TaskLogIn(StrictWire):
    task_id: str = Field(min_length=1, max_length=64)
    log: str
    allocation_id: str | None = Field(default=None, max_length=64)
    agent_id: str | None = Field(default=None, max_length=128)
    container_id: str | None = None
    rank_id: int | None = None
    timestamp: str | None = None
    level: str | None = None
    stdtype: str | None = Field(default=None, max_length=16)
    source: str | None = Field(default=None, max_length=32)
    id: int | None = None


class PostTaskLogsRequest(StrictWire):
    logs: list[TaskLogIn] = Field(max_length=100_000)


def _truncate_line(text: str) -> str:
    raw = text.encode("utf-8")
    if len(raw) <= MAX_LOG_LINE_BYTES:
        return text
    kept = raw[:MAX_LOG_LINE_BYTES].decode("utf-8", "ignore")
    newline = "\n" if text.endswith("\n") else ""
    return f"{kept} [shipyard: line truncated, {len(raw) - MAX_LOG_LINE_BYTES} more bytes dropped]{newline}"


def _level(value: str | None, where: str) -> str:
    if value in (None, ""):
        return "INFO"
    name = value.upper().removeprefix("LOG_LEVEL_")
    if name == "WARN":
        name = "WARNING"
    if name not in LOG_LEVELS:
        raise bad_request(f"unknown log level {value!r}", where)
    return name


def _check_log_writer(db: Session, p: Principal, entries: list[TaskLogIn]) -> None:
    """Admin: any task. Allocation token: its own task (and allocation). Agent token: tasks with
    an allocation in its pool (on its own agent when the token is bound to one)."""
    for i, e in enumerate(entries):
        serializers.reject_nul(**{f"logs[{i}].taskId": e.task_id})
    tasks = {e.task_id for e in entries}
    known = set(db.scalars(select(Trial.task_id).where(Trial.task_id.in_(tasks))))
    known |= set(db.scalars(select(Allocation.task_id).where(Allocation.task_id.in_(tasks))))
    for i, e in enumerate(entries):
        if e.task_id not in known:
            raise not_found(f"task {e.task_id!r} (logs[{i}].taskId)")
    if p.kind is TokenKind.USER:
        if not p.admin:
            raise forbidden("only an admin, the task's agent or the task itself can post its logs")
        return
    if p.kind is TokenKind.ALLOCATION:
        own_task: str | None = None
        if p.allocation_id is not None:
            own_task = db.scalar(select(Allocation.task_id).where(Allocation.id == p.allocation_id))
        if own_task is None and p.trial_id is not None:
            own_task = db.scalar(select(Trial.task_id).where(Trial.id == p.trial_id))
        for i, e in enumerate(entries):
            if e.task_id != own_task:
                raise forbidden(f"logs[{i}]: this token belongs to another task")
            if e.allocation_id is not None and p.allocation_id is not None and e.allocation_id != p.allocation_id:
                raise forbidden(f"logs[{i}]: this token belongs to another allocation")
        return
    if p.kind is TokenKind.AGENT:
        allocs = list(db.scalars(select(Allocation).where(Allocation.task_id.in_(tasks))))
        for i, e in enumerate(entries):
            ok = any(
                a.task_id == e.task_id
                and a.pool == p.pool
                and (e.allocation_id is None or a.id == e.allocation_id)
                and (p.agent_id is None or a.agent_id == p.agent_id)
                for a in allocs
            )
            if not ok:
                raise forbidden(f"logs[{i}]: task {e.task_id!r} does not run on an agent of this credential")
        return
    raise forbidden(f"a {p.kind.value} token cannot post logs")


@router.post("/api/v1/task/logs")
def post_task_logs(
    body: PostTaskLogsRequest,
    p: Principal = Depends(deps.principal),
    master: Master = Depends(deps.get_master),
    db: Session = Depends(deps.get_db, scope="function"),
) -> dict[str, Any]:
    if not body.logs:
        return {}
    _check_log_writer(db, p, body.logs)
    now = master.clock()
    clean = serializers.clean_text
    rows = [
        {
            "task_id": e.task_id,
            "allocation_id": clean(e.allocation_id) if e.allocation_id else None,
            "agent_id": clean(e.agent_id) if e.agent_id else None,
            "rank": e.rank_id,
            "timestamp": serializers.parse_time(e.timestamp, f"logs[{i}].timestamp") or now,
            "level": _level(e.level, f"logs[{i}].level"),
            "stdtype": clean(e.stdtype or "stdout"),
            "source": clean(e.source or "task"),
            "log": _truncate_line(clean(e.log)),
        }
        for i, e in enumerate(body.logs)
    ]
    db.execute(insert(TaskLog), rows)  # one executemany, not an ORM object per line
    return {}


# -- logs: streaming -------------------------------------------------------------------------------
def _log_message(row: TaskLog) -> str:
    """Determined's flat form: `[timestamp] <container> [rank=N] || LEVEL: line`."""
    stamp = row.timestamp.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    rank = f" [rank={row.rank}]" if row.rank is not None else ""
    return f"[{stamp}] {' ' * 8}{rank} || {row.level}: {row.log}"


def _log_fields(row: TaskLog) -> dict[str, Any]:
    return {
        "id": str(row.id),
        "timestamp": ts(row.timestamp),
        "message": _log_message(row),
        "log": row.log,
        "level": f"LOG_LEVEL_{row.level}",
        "agentId": row.agent_id,
        "containerId": None,
        "rankId": row.rank,
        "stdtype": row.stdtype,
        "source": row.source,
    }


def _trial_log_json(row: TaskLog, trial_id: int) -> dict[str, Any]:
    return {"trialId": trial_id, **_log_fields(row)}


def _task_log_json(row: TaskLog) -> dict[str, Any]:
    return {"taskId": row.task_id, "allocationId": row.allocation_id, **_log_fields(row)}


class LogFilter:
    def __init__(
        self,
        *,
        levels: list[str],
        stdtypes: list[str],
        sources: list[str],
        agent_ids: list[str],
        rank_ids: list[int],
        allocation_ids: list[str],
        search_text: str | None,
        enable_regex: bool,
        timestamp_after: str | None,
        timestamp_before: str | None,
    ) -> None:
        self.levels = [_level(v, "levels") for v in levels]
        self.stdtypes, self.sources, self.agent_ids = stdtypes, sources, agent_ids
        self.rank_ids, self.allocation_ids = rank_ids, allocation_ids
        self.after = serializers.parse_time(timestamp_after, "timestampAfter")
        self.before = serializers.parse_time(timestamp_before, "timestampBefore")
        self.search_text = search_text or None
        self.regex: re.Pattern[str] | None = None
        if self.search_text and enable_regex:
            try:
                self.regex = re.compile(self.search_text)
            except re.error as e:
                raise bad_request(f"invalid regular expression: {e}", "searchText") from None

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
        return self.regex is None or self.regex.search(row.log) is not None


def _log_stream(
    master: Master,
    task_id: str,
    flt: LogFilter,
    render: Callable[[TaskLog], dict[str, Any]],
    is_over: Callable[[Session], bool],
    *,
    follow: bool,
    limit: int,
    desc: bool,
) -> StreamingResponse:
    """Pages through a task's logs by id. With follow, polls for new lines until the task is over
    and one more poll after that found nothing (lines shipped just before the end still arrive)."""

    async def gen() -> AsyncIterator[bytes]:
        cursor: int | None = None
        sent = 0
        over_seen = False
        while True:

            def fetch(cursor: int | None = cursor) -> tuple[list[dict[str, Any]], int | None, int, bool]:
                with master.read_sessions() as s:
                    over = is_over(s) if follow else False
                    q = flt.apply(select(TaskLog).where(TaskLog.task_id == task_id))
                    if cursor is not None:
                        q = q.where(TaskLog.id < cursor if desc else TaskLog.id > cursor)
                    q = q.order_by(TaskLog.id.desc() if desc else TaskLog.id.asc()).limit(STREAM_BATCH)
                    rows = list(s.scalars(q))
                    last = rows[-1].id if rows else cursor
                    return [render(r) for r in rows if flt.keep(r)], last, len(rows), over

            try:
                lines, cursor, fetched, over = await run_in_threadpool(fetch)
            except Exception:
                log.exception("event=log_stream_error task_id=%s", task_id)
                yield _stream_error("internal error")
                return
            for line in lines:
                yield _ndjson({"result": line})
                sent += 1
                if limit and sent >= limit:
                    return
            if fetched == STREAM_BATCH:
                continue
            if not follow or (over_seen and fetched == 0):
                return
            # `over` is read before the rows, so every line written before the task ended is in
            # this poll or a later one; after the end, keep going until a poll finds nothing
            # (lines the agent ships just after the process exited still arrive).
            over_seen = over_seen or over
            await asyncio.sleep(FOLLOW_POLL_S / 5 if over_seen else FOLLOW_POLL_S)

    return StreamingResponse(gen(), media_type=STREAM_MEDIA_TYPE)


def _log_params(
    follow: bool = False,
    limit: Annotated[int, Query(ge=0)] = 0,
    orderBy: str | None = None,
    levels: Annotated[list[str], Query()] = [],  # noqa: B006
    stdtypes: Annotated[list[str], Query()] = [],  # noqa: B006
    sources: Annotated[list[str], Query()] = [],  # noqa: B006
    agentIds: Annotated[list[str], Query()] = [],  # noqa: B006
    rankIds: Annotated[list[int], Query()] = [],  # noqa: B006
    containerIds: Annotated[list[str], Query()] = [],  # noqa: B006
    allocationIds: Annotated[list[str], Query()] = [],  # noqa: B006
    searchText: str | None = None,
    enableRegex: bool = False,
    timestampAfter: str | None = None,
    timestampBefore: str | None = None,
) -> tuple[LogFilter, bool, int, bool]:
    serializers.reject_nul(stdtypes=stdtypes, sources=sources, agentIds=agentIds, allocationIds=allocationIds,
                       searchText=searchText)
    desc = serializers.parse_order(orderBy)
    if follow and desc:
        raise bad_request("follow cannot be combined with ORDER_BY_DESC", "orderBy")
    flt = LogFilter(
        levels=levels, stdtypes=stdtypes, sources=sources, agent_ids=agentIds, rank_ids=rankIds,
        allocation_ids=allocationIds, search_text=searchText, enable_regex=enableRegex,
        timestamp_after=timestampAfter, timestamp_before=timestampBefore,
    )
    return flt, follow, limit, desc


@router.get("/api/v1/trials/{trialId}/logs")
def trial_logs(
    trialId: int,
    p: Principal = Depends(deps.principal),
    master: Master = Depends(deps.get_master),
    params: tuple[LogFilter, bool, int, bool] = Depends(_log_params),
) -> StreamingResponse:
    with master.read_sessions() as db:
        trial = access.get_trial(db, trialId)
        access.require_read_trial(p, trial)
    flt, follow, limit, desc = params

    def over(s: Session) -> bool:
        state = s.scalar(select(Trial.state).where(Trial.id == trialId))
        return state is None or state in st.TRIAL_TERMINAL

    return _log_stream(master, trial.task_id, flt, lambda r: _trial_log_json(r, trialId), over,
                       follow=follow, limit=limit, desc=desc)


@router.get("/api/v1/tasks/{taskId}/logs")
def task_logs(
    taskId: str,
    p: Principal = Depends(deps.principal),
    master: Master = Depends(deps.get_master),
    params: tuple[LogFilter, bool, int, bool] = Depends(_log_params),
) -> StreamingResponse:
    serializers.reject_nul(taskId=taskId)
    with master.read_sessions() as db:
        trial = db.scalar(select(Trial).where(Trial.task_id == taskId))
        if trial is not None:
            access.require_read_trial(p, trial)
        else:
            if db.scalar(select(func.count()).where(Allocation.task_id == taskId)) == 0:
                raise not_found(f"task {taskId!r}")
            if p.kind is not TokenKind.USER:
                raise forbidden(f"a {p.kind.value} token cannot read this task's logs")
    flt, follow, limit, desc = params
    trial_id = trial.id if trial is not None else None

    def over(s: Session) -> bool:
        if trial_id is not None:
            state = s.scalar(select(Trial.state).where(Trial.id == trial_id))
            return state is None or state in st.TRIAL_TERMINAL
        live = s.scalar(
            select(func.count()).where(Allocation.task_id == taskId, Allocation.state.in_(st.ALLOC_LIVE))
        )
        return not live

    return _log_stream(master, taskId, flt, _task_log_json, over, follow=follow, limit=limit, desc=desc)
