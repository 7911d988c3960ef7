"""Checkpoint metadata: report, get, list (per experiment / per trial), delete, patch, metadata.

The master never touches checkpoint files here. `DELETE /api/v1/checkpoints` moves the rows to
STATE_DELETING (shown as STATE_DELETED: the request cannot be undone); the checkpoint GC worker
deletes the files using the storage config kept on the row and then sets STATE_DELETED.
"""

from __future__ import annotations

import logging
import math
import uuid as uuidlib
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from pydantic import Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from control_plane.api import deps, serializers
from control_plane.api.wire import StrictWire
from control_plane.auth import Principal, TokenKind
from control_plane.core import metrics as metric_values
from control_plane.core import states as st
from control_plane.db.models import Allocation, Checkpoint, Experiment, ModelVersion, Trial
from control_plane.errors import FieldProblem, Invalid, bad_request, conflict, forbidden, not_found
from control_plane.master import Master
from control_plane.services import access, lifecycle

log = logging.getLogger("shipyard.api.checkpoints")
router = APIRouter()


# -- report ----------------------------------------------------------------------------------------
class TrainingIn(StrictWire):
    """Determined's v1CheckpointTrainingMetadata. Its client sends it empty; the trial is then
    found from the task or allocation."""

    trial_id: int | None = None
    experiment_id: int | None = None
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
    resources: dict[str, int | str] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)
    state: str = st.CKPT_COMPLETED
    training: TrainingIn | None = None
    storage_id: int | None = None


_REPORTABLE_STATES = (st.CKPT_ACTIVE, st.CKPT_COMPLETED, st.CKPT_ERROR)


def _canonical_uuid(value: str, field: str) -> str:
    # The uuid names the checkpoint's folder in storage, which GC deletes: only a real UUID.
    try:
        return str(uuidlib.UUID(value))
    except ValueError:
        raise bad_request(f"must be a UUID (got {value[:64]!r})", field) from None


def _resources(raw: dict[str, int | str], field: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for path, size in raw.items():
        where = f"{field}[{path[:80]!r}]"
        parts = path.split("/")
        if not path or path.startswith("/") or ".." in parts or "\x00" in path or "\\" in path:
            raise bad_request("must be a relative path inside the checkpoint", where)
        try:
            n = int(size)
        except (TypeError, ValueError):
            raise bad_request(f"size must be an integer (got {size!r})", where) from None
        if n < 0:
            raise bad_request(f"size must be >= 0 (got {n})", where)
        out[path] = n
    return out


def _steps(metadata: dict[str, Any]) -> int:
    value = metadata.get("steps_completed")
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise bad_request(
            "a reported checkpoint needs metadata.steps_completed, a non-negative integer", "metadata.steps_completed"
        )
    return value


def _resolve_trial(db: Session, p: Principal, body: CheckpointIn) -> Trial:
    """The trial a report belongs to, from every place that names it; they must agree."""
    named: dict[str, int] = {}
    if body.training is not None and body.training.trial_id is not None:
        named["training.trialId"] = body.training.trial_id
    if body.task_id:
        tid = db.scalar(select(Trial.id).where(Trial.task_id == body.task_id))
        if tid is None:
            raise bad_request(f"no trial runs as task {body.task_id!r}", "taskId")
        named["taskId"] = tid
    if body.allocation_id:
        alloc = db.get(Allocation, body.allocation_id)
        if alloc is None or alloc.trial_id is None:
            raise bad_request(f"no trial allocation {body.allocation_id!r}", "allocationId")
        named["allocationId"] = alloc.trial_id
    if p.kind is TokenKind.ALLOCATION and p.trial_id is not None and not named:
        named["(token)"] = p.trial_id
    if not named:
        raise bad_request("a checkpoint must name its trial (training.trialId, taskId or allocationId)", "training.trialId")
    ids = set(named.values())
    if len(ids) > 1:
        detail = ", ".join(f"{k} → trial {v}" for k, v in named.items())
        raise bad_request(f"the report names different trials ({detail})", next(iter(named)))
    return access.get_trial(db, ids.pop())


@router.post("/api/v1/checkpoints")
def report_checkpoint(
    body: CheckpointIn,
    p: Principal = Depends(deps.user_or_allocation),
    master: Master = Depends(deps.get_master),
    db: Session = Depends(deps.get_db, scope="function"),
) -> dict[str, Any]:
    ckpt_uuid = _canonical_uuid(body.uuid, "uuid")
    serializers.reject_nul(taskId=body.task_id, allocationId=body.allocation_id)
    state = st.state_name(body.state)
    if state not in _REPORTABLE_STATES:
        raise bad_request(f"must be one of {list(_REPORTABLE_STATES)} (got {body.state!r})", "state")
    resources = _resources(body.resources, "resources")
    steps = _steps(body.metadata)
    report_time = serializers.parse_time(body.report_time, "reportTime") or master.clock()

    trial = _resolve_trial(db, p, body)
    # Same lock order as metric reports and the lifecycle: experiment, then trial.
    exp = access.get_experiment(db, trial.experiment_id, for_update=True)
    if body.training is not None and body.training.experiment_id not in (None, exp.id):
        raise bad_request(f"trial {trial.id} belongs to experiment {exp.id}", "training.experimentId")
    access.require_trial_writer(p, trial, exp)
    trial = access.get_trial(db, trial.id, for_update=True)

    existing = db.get(Checkpoint, ckpt_uuid)
    if existing is not None:
        if existing.trial_id == trial.id or (existing.trial_id is None and existing.experiment_id == exp.id):
            return {}  # a retried report
        raise conflict(f"checkpoint {ckpt_uuid} was reported by another trial")

    ckpt = Checkpoint(
        uuid=ckpt_uuid,
        trial_id=trial.id,
        experiment_id=exp.id,
        task_id=body.task_id or trial.task_id,
        allocation_id=body.allocation_id or p.allocation_id,
        state=state,
        report_time=report_time,
        steps_completed=steps,
        resources=resources,
        metadata_=metric_values.json_safe(body.metadata),
        storage=exp.config.get("checkpoint_storage") or {},
        size_bytes=sum(resources.values()),
    )
    db.add(ckpt)
    db.flush()
    if state == st.CKPT_COMPLETED:
        latest = db.get(Checkpoint, trial.latest_checkpoint_uuid) if trial.latest_checkpoint_uuid else None
        if latest is None or steps >= latest.steps_completed:
            trial.latest_checkpoint_uuid = ckpt_uuid
    lifecycle.on_checkpoint_reported(db, master, ckpt)
    log.info("event=checkpoint_reported uuid=%s trial_id=%s steps=%s size=%s",
             ckpt_uuid, trial.id, steps, ckpt.size_bytes)
    return {}


# -- read ------------------------------------------------------------------------------------------
def _get_checkpoint(db: Session, value: str) -> Checkpoint:
    try:
        key = str(uuidlib.UUID(value))
    except ValueError:
        raise not_found(f"checkpoint {value[:64]!r}") from None
    ckpt = db.get(Checkpoint, key)
    if ckpt is None:
        raise not_found(f"checkpoint {key}")
    return ckpt


def _require_read(p: Principal, ckpt: Checkpoint) -> None:
    if p.kind is TokenKind.USER:
        return
    if p.kind is TokenKind.ALLOCATION and ckpt.trial_id is not None and p.trial_id == ckpt.trial_id:
        return
    raise forbidden("this token cannot read this checkpoint")


@router.get("/api/v1/checkpoints/{checkpointUuid}")
def get_checkpoint(
    checkpointUuid: str, p: Principal = Depends(deps.principal), db: Session = Depends(deps.get_db, scope="function")
) -> dict[str, Any]:
    ckpt = _get_checkpoint(db, checkpointUuid)
    _require_read(p, ckpt)
    return {"checkpoint": serializers.checkpoint_json(ckpt, serializers.checkpoint_context(db, [ckpt]))}


_CKPT_SORTS = (
    "SORT_BY_UNSPECIFIED", "SORT_BY_UUID", "SORT_BY_TRIAL_ID", "SORT_BY_BATCH_NUMBER", "SORT_BY_END_TIME",
    "SORT_BY_STATE", "SORT_BY_SEARCHER_METRIC",
)


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
    wanted = serializers.parse_states(states, st.CKPT_WIRE_STATES, "states")
    if wanted:
        ckpts = [c for c in ckpts if st.checkpoint_wire_state(c.state) in wanted]
    attr = serializers.parse_choice(sort_by_attr, _CKPT_SORTS, "sortByAttr", "SORT_BY_UNSPECIFIED")
    if sort_by_metric and attr != "SORT_BY_UNSPECIFIED":
        raise bad_request("give either sortByAttr or sortByMetric, not both", "sortByMetric")
    desc = serializers.parse_order(order_by)
    ctx = serializers.checkpoint_context(db, ckpts)

    def metric_key(c: Checkpoint) -> float | None:
        if sort_by_metric:
            validation = serializers.checkpoint_validation(c, ctx) or {}
            value = metric_values.metric_number(validation.get(sort_by_metric))
        else:
            value = serializers.checkpoint_searcher_metric(c, ctx)
        return None if value is None or math.isnan(value) else value

    if sort_by_metric or attr == "SORT_BY_SEARCHER_METRIC":
        if attr == "SORT_BY_SEARCHER_METRIC" and order_by in (None, "", "ORDER_BY_UNSPECIFIED"):
            # Best first, whichever direction "best" is for this experiment's metric.
            smaller = all(
                serializers.searcher_settings(e.config)[1] for e in ctx.experiments.values()
            ) if ctx.experiments else True
            desc = not smaller
        keyed = [(metric_key(c), c) for c in ckpts]
        present = sorted(((k, c) for k, c in keyed if k is not None), key=lambda kc: (kc[0], kc[1].uuid), reverse=desc)
        ordered = [c for _, c in present] + [c for k, c in keyed if k is None]
    else:
        def key(c: Checkpoint) -> Any:
            return {
                "SORT_BY_UUID": (c.uuid,),
                "SORT_BY_TRIAL_ID": (c.trial_id or 0, c.uuid),
                "SORT_BY_BATCH_NUMBER": (c.steps_completed, c.uuid),
                "SORT_BY_STATE": (st.checkpoint_wire_state(c.state), c.uuid),
            }.get(attr, (c.report_time, c.uuid))

        ordered = sorted(ckpts, key=key, reverse=desc)
    chosen = serializers.page(ordered, offset, limit)
    return {
        "checkpoints": [serializers.checkpoint_json(c, ctx) for c in chosen],
        "pagination": serializers.pagination_json(offset, limit, len(ordered), len(chosen)),
    }


@router.get("/api/v1/experiments/{id}/checkpoints")
def list_experiment_checkpoints(
    id: int,
    p: Principal = Depends(deps.principal),
    db: Session = Depends(deps.get_db, scope="function"),
    states: Annotated[list[str], Query()] = [],  # noqa: B006 - FastAPI copies defaults
    sortByAttr: str | None = None,
    sortByMetric: str | None = None,
    orderBy: str | None = None,
    offset: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=0)] = 0,
) -> dict[str, Any]:
    exp = access.get_experiment(db, id)
    access.require_read_experiment(db, p, exp)
    ckpts = list(db.scalars(select(Checkpoint).where(Checkpoint.experiment_id == exp.id)))
    return _list(db, ckpts, states=states, sort_by_attr=sortByAttr, sort_by_metric=sortByMetric,
                 order_by=orderBy, offset=offset, limit=limit)


@router.get("/api/v1/trials/{id}/checkpoints")
def list_trial_checkpoints(
    id: int,
    p: Principal = Depends(deps.principal),
    db: Session = Depends(deps.get_db, scope="function"),
    states: Annotated[list[str], Query()] = [],  # noqa: B006
    sortByAttr: str | None = None,
    sortByMetric: str | None = None,
    orderBy: str | None = None,
    offset: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=0)] = 0,
) -> dict[str, Any]:
    trial = access.get_trial(db, id)
    access.require_read_trial(p, trial)
    ckpts = list(db.scalars(select(Checkpoint).where(Checkpoint.trial_id == trial.id)))
    return _list(db, ckpts, states=states, sort_by_attr=sortByAttr, sort_by_metric=sortByMetric,
                 order_by=orderBy, offset=offset, limit=limit)


# -- delete / patch / metadata ---------------------------------------------------------------------
def _owned_checkpoints(db: Session, p: Principal, uuids: list[str], field: str) -> list[Checkpoint]:
    keys: list[str] = []
    for i, value in enumerate(uuids):
        keys.append(_canonical_uuid(value, f"{field}[{i}]"))
    found = {c.uuid: c for c in db.scalars(select(Checkpoint).where(Checkpoint.uuid.in_(keys)).with_for_update())}
    missing = [k for k in keys if k not in found]
    if missing:
        raise not_found(f"checkpoints {missing}")
    exp_ids = {c.experiment_id for c in found.values() if c.experiment_id is not None}
    exps = {e.id: e for e in db.scalars(select(Experiment).where(Experiment.id.in_(exp_ids)))}
    for c in found.values():
        exp = exps.get(c.experiment_id) if c.experiment_id is not None else None
        if exp is None:
            if not p.admin:
                raise forbidden(f"checkpoint {c.uuid} has no experiment; only an admin can change it")
            continue
        access.require_owner(p, exp)
    return [found[k] for k in dict.fromkeys(keys)]


class DeleteCheckpointsRequest(StrictWire):
    checkpoint_uuids: list[str] = Field(min_length=1, max_length=100_000)


@router.delete("/api/v1/checkpoints")
def delete_checkpoints(
    body: DeleteCheckpointsRequest,
    p: Principal = Depends(deps.user),
    master: Master = Depends(deps.get_master),
    db: Session = Depends(deps.get_db, scope="function"),
) -> dict[str, Any]:
    ckpts = _owned_checkpoints(db, p, body.checkpoint_uuids, "checkpointUuids")
    registered = sorted(set(db.scalars(
        select(ModelVersion.checkpoint_uuid).where(ModelVersion.checkpoint_uuid.in_([c.uuid for c in ckpts]))
    )))
    if registered:
        # Determined's rule: model versions keep their checkpoints.
        raise Invalid(f"these checkpoints are in the model registry and cannot be deleted: {registered}",
            [FieldProblem("checkpointUuids", f"{u} is registered in the model registry") for u in registered],
        )
    marked = 0
    for c in ckpts:
        if c.state not in st.CKPT_GONE:
            c.state = st.CKPT_DELETING
            marked += 1
    trial_ids = {c.trial_id for c in ckpts if c.trial_id is not None}
    for trial in db.scalars(select(Trial).where(Trial.id.in_(trial_ids))):
        if trial.latest_checkpoint_uuid in {c.uuid for c in ckpts}:
            trial.latest_checkpoint_uuid = db.scalar(
                select(Checkpoint.uuid)
                .where(Checkpoint.trial_id == trial.id, Checkpoint.state == st.CKPT_COMPLETED)
                .order_by(Checkpoint.steps_completed.desc(), Checkpoint.report_time.desc())
                .limit(1)
            )
    master.notify(db)
    log.info("event=checkpoints_delete_requested count=%s marked=%s by=%s", len(ckpts), marked, p.username)
    return {}


class PatchResources(StrictWire):
    resources: dict[str, int | str] = Field(default_factory=dict)


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
    ckpts = {c.uuid: c for c in _owned_checkpoints(db, p, [c.uuid for c in body.checkpoints], "checkpoints")}
    for i, patch in enumerate(body.checkpoints):
        if patch.resources is None:
            continue
        c = ckpts[_canonical_uuid(patch.uuid, f"checkpoints[{i}].uuid")]
        resources = _resources(patch.resources.resources, f"checkpoints[{i}].resources.resources")
        if not resources:
            c.state, c.resources, c.size_bytes = st.CKPT_DELETED, {}, 0
            continue
        if set(resources) < set(c.resources or {}):
            c.state = st.CKPT_PARTIALLY_DELETED
        c.resources, c.size_bytes = resources, sum(resources.values())
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
    storage_id: int | None = None


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
    ckpt = _get_checkpoint(db, checkpointUuid)
    exp = db.get(Experiment, ckpt.experiment_id) if ckpt.experiment_id is not None else None
    if p.kind is TokenKind.ALLOCATION:
        if ckpt.trial_id is None or p.trial_id != ckpt.trial_id:
            raise forbidden("this token belongs to another trial")
    elif exp is not None:
        access.require_owner(p, exp)
    elif not p.admin:
        raise forbidden("only an admin can change this checkpoint")
    ckpt.metadata_ = metric_values.json_safe(body.checkpoint.metadata)
    return {"metadata": ckpt.metadata_}
