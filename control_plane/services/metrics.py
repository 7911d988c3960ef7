"""Metric reports of a trial: storing them, keeping its latest and best validation, and telling
the searcher.

Idempotent per (trial, group, stepsCompleted): a re-send from the same run is a no-op, a higher
trialRunId replaces the stored row (a restarted trial re-reporting a step), a lower one is
ignored. Validation reports move `Trial.latest_validation` / `Trial.best_validation`; a
replacement rebuilds both from the stored rows, so a report can never leave them stale.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from control_plane.core import metrics as metric_values
from control_plane.core.expconf import ExperimentConfig
from control_plane.db.models import Experiment, Metric, Trial
from control_plane.errors import bad_request
from control_plane.master import Master
from control_plane.services import access, lifecycle
from shipyard_common.wire import rfc3339

log = logging.getLogger("shipyard.metrics")

VALIDATION = "validation"
_UPSERT_CHUNK = 500  # rows per INSERT: 6 bound values each, well under SQLite's variable limit
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
    rows = [{"trial_id": trial.id, "group_name": a.report.group, "steps_completed": a.report.steps_completed,
             "trial_run_id": a.report.trial_run_id, "metrics": a.doc, "report_time": a.report_time} for a in parsed]
    if s.get_bind().dialect.name == "postgresql":
        for i in range(0, len(rows), _UPSERT_CHUNK):
            s.execute(_upsert_statement(s, rows[i : i + _UPSERT_CHUNK]))
    else:
        s.execute(_upsert_statement(s, None), rows)
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


def _upsert_statement(s: Session, rows: list[dict[str, Any]] | None) -> Any:
    """Insert reports, or replace a stored one when it comes from a newer run; never a duplicate.
    With `rows`, one multi-row INSERT (PostgreSQL: psycopg2 would send an executemany row by
    row); without, a statement for an executemany (SQLite: one cached, prepared statement)."""
    dialect = postgresql if s.get_bind().dialect.name == "postgresql" else sqlite
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
