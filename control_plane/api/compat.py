"""Routes only Determined's own clients (0.38.1's `det` and SDK) call, in its shapes.

- `GET /api/v1/trials/{trialId}/workloads`: a trial's training and validation reports and its
  checkpoints as one list of `v1WorkloadContainer`s in step order (`det trial describe`,
  `det experiment describe`).
- `POST /api/v1/runs/start`: what `determined.core.init()` calls first on cluster.
- `GET /checkpoints/{uuid}` (outside /api/v1, as in Determined): a checkpoint's files as a .tar.gz
  (`Accept: application/gzip`) or .zip (`application/zip`), read by the master from the
  checkpoint's storage (services/checkpoint_files.py): `det checkpoint download --mode master`.

The request-level compatibility lives elsewhere: JSON bodies without a Content-Type are read as
JSON (`strict_content_type=False` in api/app.py) and task sessions' token header
(`Grpc-Metadata-x-allocation-token`) is read in api/deps.py.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query
from fastapi.responses import FileResponse
from sqlalchemy.orm import Session
from starlette.background import BackgroundTask

from control_plane.api import deps, serializers
from control_plane.api.wire import INT32_MAX, Id, StrictWire, ts
from control_plane.auth import Principal
from control_plane.core import states as st
from control_plane.db.models import Checkpoint, Metric
from control_plane.errors import bad_request
from control_plane.services import access, checkpoint_files, checkpoints
from control_plane.services import metrics as trial_metrics
from control_plane.services.metrics import MetricRange

router = APIRouter()

# Determined's GetTrialWorkloadsRequest.FilterOption → which kinds of workload it keeps.
_FILTERS: dict[str, frozenset[str]] = {
    "FILTER_OPTION_UNSPECIFIED": frozenset({"training", "validation", "checkpoint"}),
    "FILTER_OPTION_CHECKPOINT": frozenset({"checkpoint"}),
    "FILTER_OPTION_VALIDATION": frozenset({"validation"}),
    "FILTER_OPTION_CHECKPOINT_OR_VALIDATION": frozenset({"validation", "checkpoint"}),
}
_KIND_ORDER = {"training": 0, "validation": 1, "checkpoint": 2}


def _metrics_workload(m: Metric, with_batches: bool) -> dict[str, Any]:
    doc = m.metrics or {}
    metrics: dict[str, Any] = {"avgMetrics": doc.get("validation_metrics", doc.get("avg_metrics", {})) or {}}
    if with_batches and doc.get("batch_metrics") is not None:
        metrics["batchMetrics"] = doc["batch_metrics"]
    return {"metrics": metrics, "numInputs": 0, "totalBatches": m.steps_completed, "endTime": ts(m.report_time)}


def _checkpoint_workload(c: Checkpoint) -> dict[str, Any]:
    return {"uuid": c.uuid, "state": st.checkpoint_wire_state(c.state), "totalBatches": c.steps_completed,
            "endTime": ts(c.report_time), "resources": {k: str(v) for k, v in (c.resources or {}).items()},
            "metadata": c.metadata_ or {}}


@router.get("/api/v1/trials/{trialId}/workloads")
def trial_workloads(
    trialId: Id,
    p: Principal = Depends(deps.principal),
    db: Session = Depends(deps.get_db, scope="function"),
    filter: str | None = None,  # noqa: A002 - Determined's parameter name
    includeBatchMetrics: bool = False,
    removeDeletedCheckpoints: bool = False,
    orderBy: str | None = None,
    offset: Annotated[int, Query(ge=0, le=INT32_MAX)] = 0,
    limit: Annotated[int, Query(ge=0, le=INT32_MAX)] = 0,
) -> dict[str, Any]:
    """Determined's GetTrialWorkloads: every report and checkpoint of the trial, in step order
    (`orderBy=ORDER_BY_DESC` reverses it); `limit` 0 means no limit. `group`, `sortKey` and
    `metricType` are accepted and ignored (Determined sorts by them; the CLI never sends them)."""
    kinds = _FILTERS.get(filter or "FILTER_OPTION_UNSPECIFIED")
    if kinds is None:
        raise bad_request(f"must be one of {', '.join(sorted(_FILTERS))}", "filter")
    desc = serializers.parse_order(orderBy)
    trial = access.get_trial(db, trialId)
    access.require_read_trial(p, trial)
    items: list[tuple[int, int, dict[str, Any]]] = []
    rows, _ = trial_metrics.metric_page(db, trial.id, MetricRange(), 0, 0)
    for m in rows:
        if m.group_name in kinds and m.group_name in ("training", "validation"):
            items.append((m.steps_completed, _KIND_ORDER[m.group_name],
                          {m.group_name: _metrics_workload(m, includeBatchMetrics)}))
    if "checkpoint" in kinds:
        for c in checkpoints.of_trial(db, trial.id):
            if removeDeletedCheckpoints and st.checkpoint_wire_state(c.state) == st.CheckpointState.DELETED:
                continue
            items.append((c.steps_completed, _KIND_ORDER["checkpoint"], {"checkpoint": _checkpoint_workload(c)}))
    items.sort(key=lambda i: (i[0], i[1]), reverse=desc)
    chosen = serializers.page([i[2] for i in items], offset, limit)
    return {"workloads": chosen, "pagination": serializers.pagination_json(offset, limit, len(items), len(chosen))}


class RunPrepareRequest(StrictWire):
    """Determined's v1RunPrepareForReportingRequest (a run is a trial)."""

    run_id: Id
    checkpoint_storage: dict[str, Any] | None = None


@router.post("/api/v1/runs/start")
def run_prepare_for_reporting(
    body: RunPrepareRequest,
    p: Principal = Depends(deps.user_or_allocation),
    db: Session = Depends(deps.get_db, scope="function"),
) -> dict[str, Any]:
    """Determined's RunPrepareForReporting, which `determined.core.init()` calls first on cluster.
    Shipyard keeps each checkpoint's storage on its own row (from the experiment config), so there
    is no storage id to hand out: `storageId` is null and checkpoint reports carry none."""
    access.require_read_trial(p, access.get_trial(db, body.run_id))
    return {"storageId": None}


_ARCHIVE = {"schema": {"type": "string", "format": "binary"}}


@router.get("/checkpoints/{checkpointUuid}", response_model=None, response_class=FileResponse,
            responses={200: {"description": "the checkpoint's files",
                             "content": {"application/gzip": _ARCHIVE, "application/zip": _ARCHIVE}}})
def download_checkpoint(
    checkpointUuid: str,
    accept: Annotated[str, Header()] = "application/gzip",
    p: Principal = Depends(deps.principal),
    db: Session = Depends(deps.get_db, scope="function"),
) -> FileResponse:
    wanted = [m.split(";")[0].strip().lower() for m in accept.split(",")]
    fmt = next((checkpoint_files.FORMATS[m] for m in wanted if m in checkpoint_files.FORMATS),
               "tgz" if any(m in ("*/*", "application/*", "") for m in wanted) else None)
    if fmt is None:
        raise bad_request(f"cannot send {accept!r}: ask for application/gzip or application/zip", "Accept")
    ckpt = checkpoints.get_checkpoint(db, checkpointUuid)
    checkpoints.require_read(p, ckpt)
    path = checkpoint_files.archive(ckpt, fmt)
    media = "application/gzip" if fmt == "tgz" else "application/zip"
    return FileResponse(path, media_type=media, filename=f"{ckpt.uuid}.{'tar.gz' if fmt == 'tgz' else 'zip'}",
                        background=BackgroundTask(path.unlink, missing_ok=True))
