"""Checkpoint metadata: report, get, list (per experiment / per trial), delete, patch, metadata,
and `det checkpoint rm` (removing some files: services/checkpoint_files.py).

Deletion never touches checkpoint files here. `DELETE /api/v1/checkpoints` moves the rows to
STATE_DELETING (shown as STATE_DELETED: the request cannot be undone); the checkpoint GC worker
deletes the files using the storage config kept on the row and then sets STATE_DELETED.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from pydantic import Field
from sqlalchemy.orm import Session

from control_plane.api import deps, serializers
from control_plane.api.wire import INT32_MAX, Count64, Id, Int32, StrictWire
from control_plane.auth import Principal
from control_plane.core import states as st
from control_plane.db.models import Checkpoint
from control_plane.errors import bad_request
from control_plane.master import Master
from control_plane.services import access, checkpoint_files, checkpoints

router = APIRouter()


# -- report ----------------------------------------------------------------------------------------
class TrainingIn(StrictWire):
    """Determined's v1CheckpointTrainingMetadata. Its client sends it empty; the trial is then
    found from the task or allocation."""

    trial_id: Int32 | None = None
    experiment_id: Int32 | None = None
    experiment_config: dict[str, Any] | None = None
    hparams: dict[str, Any] | None = None
    searcher_metric: float | str | None = None
    training_metrics: dict[str, Any] | None = None
    validation_metrics: dict[str, Any] | None = None


class CheckpointIn(StrictWire):
    uuid: str = Field(min_length=1, max_length=64)
    task_id: str | None = Field(default=None, max_length=64)
    allocation_id: str | None = Field(default=None, max_length=64)
    report_time: str | None = None
    resources: dict[str, Count64 | str] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)
    state: str = st.CheckpointState.COMPLETED
    training: TrainingIn | None = None
    storage_id: Int32 | None = None


@router.post("/api/v1/checkpoints")
def report_checkpoint(
    body: CheckpointIn,
    p: Principal = Depends(deps.user_or_allocation),
    master: Master = Depends(deps.get_master),
    db: Session = Depends(deps.get_db, scope="function"),
) -> dict[str, Any]:
    ckpt_uuid = checkpoints.canonical_uuid(body.uuid, "uuid")
    report = checkpoints.CheckpointReport(
        uuid=ckpt_uuid,
        state=checkpoints.reportable_state(body.state),
        resources=checkpoints.checked_resources(body.resources, "resources"),
        steps_completed=checkpoints.steps_of(body.metadata),
        metadata=body.metadata,
        report_time=serializers.parse_time(body.report_time, "reportTime"),
        task_id=body.task_id,
        allocation_id=body.allocation_id,
        trial_id=body.training.trial_id if body.training is not None else None,
        experiment_id=body.training.experiment_id if body.training is not None else None,
    )
    trial, exp = checkpoints.reporting_trial(db, p, report)
    access.require_trial_writer(p, trial, exp)
    checkpoints.record(db, master, trial, exp, report, p.allocation_id)
    return {}


# -- read ------------------------------------------------------------------------------------------
@router.get("/api/v1/checkpoints/{checkpointUuid}")
def get_checkpoint(
    checkpointUuid: str, p: Principal = Depends(deps.principal), db: Session = Depends(deps.get_db, scope="function")
) -> dict[str, Any]:
    ckpt = checkpoints.get_checkpoint(db, checkpointUuid)
    checkpoints.require_read(p, ckpt)
    return {"checkpoint": serializers.checkpoint_json(ckpt, checkpoints.context(db, [ckpt]))}


def _list(
    db: Session,
    ckpts: list[Checkpoint],
    *,
    states: list[str],
    sort_by_attr: str | None,
    sort_by_metric: str | None,
    order_by: str | None,
    offset: int,
    limit: int,
) -> dict[str, Any]:
    ckpts = checkpoints.with_wire_states(ckpts, serializers.parse_states(states, st.CKPT_WIRE_STATES, "states"))
    attr = serializers.parse_choice(sort_by_attr, checkpoints.SORTS, "sortByAttr", "SORT_BY_UNSPECIFIED")
    if sort_by_metric and attr != "SORT_BY_UNSPECIFIED":
        raise bad_request("give either sortByAttr or sortByMetric, not both", "sortByMetric")
    desc = serializers.parse_order(order_by)
    ctx = checkpoints.context(db, ckpts)
    ordered = checkpoints.ordered(ckpts, ctx, attr=attr, metric=sort_by_metric,
                                  desc=None if order_by in (None, "", "ORDER_BY_UNSPECIFIED") else desc)
    chosen = serializers.page(ordered, offset, limit)
    return {
        "checkpoints": [serializers.checkpoint_json(c, ctx) for c in chosen],
        "pagination": serializers.pagination_json(offset, limit, len(ordered), len(chosen)),
    }


@router.get("/api/v1/experiments/{id}/checkpoints")
def list_experiment_checkpoints(
    id: Id,
    p: Principal = Depends(deps.principal),
    db: Session = Depends(deps.get_db, scope="function"),
    states: Annotated[list[str], Query()] = [],  # noqa: B006 - FastAPI copies defaults
    sortByAttr: str | None = None,
    sortByMetric: str | None = None,
    orderBy: str | None = None,
    offset: Annotated[int, Query(ge=0, le=INT32_MAX)] = 0,
    limit: Annotated[int, Query(ge=0, le=INT32_MAX)] = 0,
) -> dict[str, Any]:
    exp = access.get_experiment(db, id)
    access.require_read_experiment(db, p, exp)
    ckpts = checkpoints.of_experiment(db, exp.id)
    return _list(db, ckpts, states=states, sort_by_attr=sortByAttr, sort_by_metric=sortByMetric,
                 order_by=orderBy, offset=offset, limit=limit)


@router.get("/api/v1/trials/{id}/checkpoints")
def list_trial_checkpoints(
    id: Id,
    p: Principal = Depends(deps.principal),
    db: Session = Depends(deps.get_db, scope="function"),
    states: Annotated[list[str], Query()] = [],  # noqa: B006
    sortByAttr: str | None = None,
    sortByMetric: str | None = None,
    orderBy: str | None = None,
    offset: Annotated[int, Query(ge=0, le=INT32_MAX)] = 0,
    limit: Annotated[int, Query(ge=0, le=INT32_MAX)] = 0,
) -> dict[str, Any]:
    trial = access.get_trial(db, id)
    access.require_read_trial(p, trial)
    ckpts = checkpoints.of_trial(db, trial.id)
    return _list(db, ckpts, states=states, sort_by_attr=sortByAttr, sort_by_metric=sortByMetric,
                 order_by=orderBy, offset=offset, limit=limit)


# -- delete / patch / metadata ---------------------------------------------------------------------
class DeleteCheckpointsRequest(StrictWire):
    checkpoint_uuids: list[str] = Field(min_length=1, max_length=100_000)


@router.delete("/api/v1/checkpoints")
def delete_checkpoints(
    body: DeleteCheckpointsRequest,
    p: Principal = Depends(deps.user),
    master: Master = Depends(deps.get_master),
    db: Session = Depends(deps.get_db, scope="function"),
) -> dict[str, Any]:
    ckpts = checkpoints.owned_checkpoints(db, p, body.checkpoint_uuids, "checkpointUuids")
    checkpoints.request_deletion(db, master, ckpts, p)
    return {}


class CheckpointsRemoveFilesRequest(StrictWire):
    checkpoint_uuids: list[str] = Field(min_length=1, max_length=100_000)
    checkpoint_globs: list[str] = Field(default_factory=list, max_length=1000)


@router.post("/api/v1/checkpoints/rm")
def remove_checkpoint_files(
    body: CheckpointsRemoveFilesRequest,
    p: Principal = Depends(deps.user),
    master: Master = Depends(deps.get_master),
    db: Session = Depends(deps.get_db, scope="function"),
) -> dict[str, Any]:
    """Determined's CheckpointsRemoveFiles (`det checkpoint rm`): see services/checkpoint_files.py."""
    checkpoint_files.remove_files(db, master, p, body.checkpoint_uuids, body.checkpoint_globs)
    return {}


class PatchResources(StrictWire):
    resources: dict[str, Count64 | str] = Field(default_factory=dict)


class PatchCheckpoint(StrictWire):
    uuid: str
    resources: PatchResources | None = None


class PatchCheckpointsRequest(StrictWire):
    checkpoints: list[PatchCheckpoint] = Field(min_length=1, max_length=100_000)


@router.patch("/api/v1/checkpoints")
def patch_checkpoints(
    body: PatchCheckpointsRequest, p: Principal = Depends(deps.user), db: Session = Depends(deps.get_db, scope="function")
) -> dict[str, Any]:
    """Determined's semantics: empty resources → the checkpoint is deleted; otherwise its file list
    (and size) shrink to what is left."""
    owned = checkpoints.owned_checkpoints(db, p, [c.uuid for c in body.checkpoints], "checkpoints")
    ckpts = {c.uuid: c for c in owned}
    for i, patch in enumerate(body.checkpoints):
        if patch.resources is None:
            continue
        c = ckpts[checkpoints.canonical_uuid(patch.uuid, f"checkpoints[{i}].uuid")]
        checkpoints.set_resources(c, checkpoints.checked_resources(patch.resources.resources,
                                                                  f"checkpoints[{i}].resources.resources"))
    return {}


class MetadataCheckpoint(StrictWire):
    metadata: dict[str, Any] = Field(default_factory=dict)
    uuid: str | None = None
    # The rest of a v1Checkpoint may be echoed back by clients; it is ignored.
    resources: dict[str, Any] | None = None
    state: str | None = None
    training: dict[str, Any] | None = None
    task_id: str | None = None
    allocation_id: str | None = None
    report_time: str | None = None
    storage_id: Int32 | None = None


class PostMetadataRequest(StrictWire):
    checkpoint: MetadataCheckpoint


@router.post("/api/v1/checkpoints/{checkpointUuid}/metadata")
def post_checkpoint_metadata(
    checkpointUuid: str,
    body: PostMetadataRequest,
    p: Principal = Depends(deps.user_or_allocation),
    db: Session = Depends(deps.get_db, scope="function"),
) -> dict[str, Any]:
    """Replaces the checkpoint's user metadata (Determined's PostCheckpointMetadata)."""
    ckpt = checkpoints.get_checkpoint(db, checkpointUuid)
    checkpoints.require_metadata_writer(db, p, ckpt)
    return {"metadata": checkpoints.set_metadata(ckpt, body.checkpoint.metadata)}
