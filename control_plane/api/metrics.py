"""Metric reports and queries of trials.

- Reports: `POST /api/v1/trials/{id}/metrics` (Determined), the legacy `training_metrics` /
  `validation_metrics`, and Shipyard's `…/metrics/batch`. FastAPI's handling, the fast path and
  the express lane (frontdoor/) all end in `services/metrics.report_many` (idempotent per trial,
  group and step).
- Queries: Determined's streaming `GET /api/v1/trials/metrics/trial_metrics` (and its training /
  validation forms) and Shipyard's paged `GET /api/v1/trials/{id}/metrics`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response, StreamingResponse
from pydantic import Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from control_plane.api import deps, serializers
from control_plane.api.streams import STREAM_BATCH, STREAM_MEDIA_TYPE, ndjson, stream_error
from control_plane.api.wire import INT32_MAX, Count32, Count64, Id, Int32, Int64, StrictWire, ts
from control_plane.auth import Principal
from control_plane.db.models import Metric, Trial
from control_plane.errors import bad_request, not_found
from control_plane.frontdoor import fastjson, metric_batches
from control_plane.master import Master
from control_plane.services import access
from control_plane.services import metrics as trial_metrics
from control_plane.services.metrics import MetricRange, MetricReport

log = logging.getLogger("shipyard.api.metrics")
router = APIRouter(route_class=fastjson.FastRoute)


# -- reports ---------------------------------------------------------------------------------------
# Determined: a group names a time series; it cannot contain '.' (metric ids are "group.name").
_GROUP_PATTERN = r"^[^.\x00-\x1f\x7f]{1,64}$"


class MetricsBody(StrictWire):
    avg_metrics: dict[str, Any]
    batch_metrics: list[dict[str, Any]] | None = None


class TrialMetricsBody(StrictWire):
    trial_id: Id
    trial_run_id: Count32
    steps_completed: Count64
    metrics: MetricsBody
    report_time: str | None = None


class ReportMetricsRequest(StrictWire):
    metrics: TrialMetricsBody
    group: str = Field(pattern=_GROUP_PATTERN)


class BatchReportRequest(StrictWire):
    reports: list[ReportMetricsRequest] = Field(min_length=1, max_length=10_000)


def _report(group: str, body: TrialMetricsBody, where: str) -> MetricReport:
    return MetricReport(
        group=group,
        trial_id=body.trial_id,
        trial_run_id=body.trial_run_id,
        steps_completed=body.steps_completed,
        avg_metrics=body.metrics.avg_metrics,
        batch_metrics=body.metrics.batch_metrics,
        report_time=serializers.parse_time(body.report_time, f"{where}.reportTime"),
        field=where,
    )


Items = list[tuple[str, TrialMetricsBody, str]]  # (group, report, its path in the request)


# Every report route, whichever lane it came by, ends in one service operation,
# `services/metrics.report_many`: alone (`_store`, through `report`) or with the single reports
# that arrive meanwhile (the front door's metric writer, frontdoor/metric_batches.py).
def _request(trial_id: int, caller: Callable[[Session], Principal], items: Items) -> trial_metrics.Report:
    """One request's reports as the service takes them: `caller` resolves who asks in the
    service's own transaction, then their right to the trial, then the reports are built."""
    return trial_id, _checked_caller(caller, trial_id), _builder(items)


def _store(master: Master, trial_id: int, caller: Callable[[Session], Principal], items: Items) -> int:
    """Runs in one worker thread: each transaction begins and ends there, never across an await."""
    return trial_metrics.report(master, *_request(trial_id, caller, items))


def _checked_caller(caller: Callable[[Session], Principal], trial_id: int) -> Callable[[Session], Principal]:
    def who(s: Session) -> Principal:
        p = caller(s)
        deps.require_trial_access(p, trial_id)
        return p

    return who


def _builder(items: Items) -> Callable[[], list[MetricReport]]:
    return lambda: [_report(group, body, where) for group, body, where in items]


def _batch_answer(stored: int, sent: int) -> dict[str, Any]:
    return {"stored": stored, "duplicates": sent - stored}


# The fast path (frontdoor/fastjson.py) of each report route: the body parsed from bytes, the
# caller and the reports handled in one worker thread, the answer encoded by orjson. FastAPI's own handling
# (the endpoints below, same logic) answers whatever the fast path declines.
def _fast(model: type[StrictWire], items: Callable[[Any], Items],
          answer: Callable[[int, int], dict[str, Any]], *, grouped: bool = False) -> fastjson.FastHandler:
    """`grouped`: a route of single reports, written together with others
    (frontdoor/metric_batches.py)."""

    async def handler(request: Request) -> Response | None:
        got = await deps.trial_report(request, model)
        if got is None:
            return None
        trial_id, body, master = got
        batch = items(body)
        caller = deps.caller_in(request, master)
        if grouped and batch[0][0] != trial_metrics.VALIDATION:
            # A single training (or custom-group) report: written with the others that arrive
            # meanwhile (frontdoor/metric_batches.py), its admission slot given back while it waits.
            # A validation report moves the best validation and the searcher: on its own.
            await metric_batches.of(master).submit(request.scope, _request(trial_id, caller, batch))
            return fastjson.json_response({})

        def work() -> dict[str, Any]:
            return answer(_store(master, trial_id, caller, batch), len(batch))

        return fastjson.json_response(await run_in_threadpool(work))

    return handler


def _one(group: str | None) -> Callable[[Any], Items]:
    if group is None:
        return lambda body: [(body.group, body.metrics, "metrics")]
    return lambda body: [(group, body, "(body)")]


def _batch_items(body: BatchReportRequest) -> Items:
    return [(r.group, r.metrics, f"reports[{i}].metrics") for i, r in enumerate(body.reports)]


def _empty(_stored: int, _sent: int) -> dict[str, Any]:
    return {}


@router.post("/api/v1/trials/{trialId}/metrics")
@fastjson.fast_path(_fast(ReportMetricsRequest, _one(None), _empty, grouped=True))
def report_metrics(
    trialId: Id,
    body: ReportMetricsRequest,
    p: Principal = Depends(deps.user_or_allocation),
    master: Master = Depends(deps.get_master),
) -> dict[str, Any]:
    _store(master, trialId, lambda _s: p, _one(None)(body))
    return {}


@router.post("/api/v1/trials/{trialId}/metrics/batch")
@fastjson.fast_path(_fast(BatchReportRequest, _batch_items, _batch_answer))
def report_metrics_batch(
    trialId: Id,
    body: BatchReportRequest,
    p: Principal = Depends(deps.user_or_allocation),
    master: Master = Depends(deps.get_master),
) -> dict[str, Any]:
    """Shipyard: many reports of one trial in one transaction (all or nothing)."""
    items = _batch_items(body)
    return _batch_answer(_store(master, trialId, lambda _s: p, items), len(items))


def _legacy(group: str) -> Callable[..., dict[str, Any]]:
    @fastjson.fast_path(_fast(TrialMetricsBody, _one(group), _empty, grouped=True))
    def handler(
        trialId: Id,
        body: TrialMetricsBody,
        p: Principal = Depends(deps.user_or_allocation),
        master: Master = Depends(deps.get_master),
    ) -> dict[str, Any]:
        _store(master, trialId, lambda _s: p, _one(group)(body))
        return {}

    handler.__name__ = f"report_{group}_metrics"
    return handler


router.post("/api/v1/trials/{trialId}/training_metrics")(_legacy("training"))
router.post("/api/v1/trials/{trialId}/validation_metrics")(_legacy("validation"))


# -- queries ---------------------------------------------------------------------------------------
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


def _metrics_stream(master: Master, trial_ids: list[int], group: str, rng: MetricRange, limit: int) -> StreamingResponse:
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
                        rows = trial_metrics.metrics_after(s, tid, group, after, rng, batch)
                        return [_metric_report_json(m) for m in rows]

                try:
                    reports = await run_in_threadpool(fetch)
                except Exception:
                    log.exception("event=metrics_stream_error trial_id=%s", tid)
                    yield stream_error("internal error")
                    return
                if reports:
                    yield ndjson({"result": {"metrics": reports}})
                    sent += len(reports)
                    after = reports[-1]["totalBatches"]
                if len(reports) < batch:
                    break

    return StreamingResponse(gen(), media_type=STREAM_MEDIA_TYPE)


def _metrics_stream_endpoint(fixed_group: str | None) -> Callable[..., StreamingResponse]:
    def handler(
        p: Principal = Depends(deps.principal),
        master: Master = Depends(deps.get_master),
        trialIds: Annotated[list[Int32], Query()] = [],  # noqa: B006 - FastAPI copies defaults
        group: str | None = None,
        startBatches: Int64 | None = None,
        endBatches: Int64 | None = None,
        limit: Annotated[int, Query(ge=0, le=INT32_MAX)] = 0,
    ) -> StreamingResponse:
        chosen = fixed_group or group
        serializers.reject_nul(group=chosen)
        if not chosen:
            raise bad_request("a metric group is required (e.g. training, validation)", "group")
        with master.read_sessions() as db:
            _readable_trials(db, p, trialIds)
        return _metrics_stream(master, trialIds, chosen, MetricRange(start=startBatches, end=endBatches), limit)

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
    trialId: Id,
    p: Principal = Depends(deps.principal),
    db: Session = Depends(deps.get_db, scope="function"),
    group: str | None = None,
    startStep: Int64 | None = None,
    endStep: Int64 | None = None,
    offset: Annotated[int, Query(ge=0, le=INT32_MAX)] = 0,
    limit: Annotated[int, Query(ge=0, le=INT32_MAX)] = 0,
) -> dict[str, Any]:
    """Shipyard: a trial's reports in step order, `startStep` ≤ step ≤ `endStep`; limit 0 = all."""
    serializers.reject_nul(group=group)
    trial = access.get_trial(db, trialId)
    access.require_read_trial(p, trial)
    rows, total = trial_metrics.metric_page(db, trial.id, MetricRange(group, startStep, endStep), offset, limit)
    return {"metrics": [metric_row_json(m) for m in rows],
            "pagination": serializers.pagination_json(offset, limit, total, len(rows))}
