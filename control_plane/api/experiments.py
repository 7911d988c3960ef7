"""Experiments: create (config + model definition), list, get, patch, labels, state changes,
archive and delete. Determined's /api/v1/experiments paths and field names."""

from __future__ import annotations

import hashlib
import logging
import secrets
import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from pydantic import Field
from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from control_plane.api import deps, serializers
from control_plane.api.wire import StrictWire
from control_plane.auth import Principal
from control_plane.core import states as st
from control_plane.core.expconf import ConfigInvalid, config_to_dict, parse_experiment_config
from control_plane.db.models import (
    Allocation,
    Checkpoint,
    Experiment,
    Metric,
    ModelDefinition,
    ModelVersion,
    TaskLog,
    Token,
    Trial,
    User,
)
from control_plane.errors import FieldProblem, Invalid, bad_request, conflict
from control_plane.master import Master
from control_plane.services import access, lifecycle
from shipyard_common.model_def import ModelDefInvalid, pack_model_definition, validate_model_definition

log = logging.getLogger("shipyard.api.experiments")
router = APIRouter()

_NAME_MAX = 255
_LABEL_MAX = 255


# -- create ----------------------------------------------------------------------------------------
class CreateExperimentRequest(StrictWire):
    config: str | None = None
    model_definition: list[Any] | None = None
    validate_only: bool = False
    activate: bool = True
    parent_id: int | None = None
    project_id: int | None = None
    template: str | None = None
    unmanaged: bool | None = None


def _config_problems(e: ConfigInvalid) -> Invalid:
    details = [FieldProblem(f"config.{fe.path}" if fe.path else "config", fe.reason) for fe in e.errors]
    message = "invalid experiment configuration: " + "; ".join(f"{d.field}: {d.reason}" for d in details)
    return Invalid(message, details)


def _has_surrogates(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


@router.post("/api/v1/experiments")
def create_experiment(
    body: CreateExperimentRequest,
    p: Principal = Depends(deps.user),
    master: Master = Depends(deps.get_master),
    db: Session = Depends(deps.get_db, scope="function"),
) -> dict[str, Any]:
    if body.unmanaged:
        raise bad_request("unmanaged experiments are not supported by Shipyard", "unmanaged")
    if body.template:
        raise bad_request("config templates are not supported by Shipyard", "template")
    if body.config is None or body.config.strip() == "":
        raise bad_request("an experiment config (YAML text) is required", "config")
    if _has_surrogates(body.config):
        # What a client sends when it decoded non-UTF-8 bytes with surrogateescape.
        raise bad_request("is not valid UTF-8 text", "config")
    if body.parent_id is not None and db.get(Experiment, body.parent_id) is None:
        raise bad_request(f"experiment {body.parent_id} does not exist", "parentId")

    seed = secrets.randbelow(2**31)
    try:
        cfg, warnings = parse_experiment_config(
            body.config,
            default_checkpoint_storage=master.config.default_checkpoint_storage,
            default_resource_pool=master.config.default_resource_pool,
            experiment_seed=seed,
            max_grid_trials=master.config.max_grid_trials,
            # Like Determined, an ASHA max_length too short for max_rungs lowers the rung count,
            # with a warning on the experiment, rather than refusing the config.
            refuse_short_asha_rungs=False,
        )
    except ConfigInvalid as e:
        raise _config_problems(e) from None

    pool = master.config.pool(cfg.resources.resource_pool)
    if pool is None:
        names = [x.name for x in master.config.resource_pools]
        raise bad_request(
            f"no resource pool named {cfg.resources.resource_pool!r}; pools are {names}",
            "config.resources.resource_pool",
        )
    if pool.max_slots_per_agent is not None and cfg.resources.slots_per_trial > pool.max_slots_per_agent:
        raise bad_request(
            f"{cfg.resources.slots_per_trial} slots per trial cannot fit on one agent of pool {pool.name!r} "
            f"(at most {pool.max_slots_per_agent})",
            "config.resources.slots_per_trial",
        )
    if cfg.name is not None and len(cfg.name) > _NAME_MAX:
        raise bad_request(f"must be at most {_NAME_MAX} characters", "config.name")

    try:
        files = validate_model_definition(body.model_definition or [], max_bytes=master.config.model_def_max_bytes)
        archive = pack_model_definition(files)
    except ModelDefInvalid as e:
        raise Invalid(f"{e.path}: {e.reason}", [FieldProblem(e.path, e.reason)]) from None

    config = config_to_dict(cfg)
    if body.validate_only:
        return {"experiment": None, "config": serializers.redact_config(config), "warnings": [],
                "configWarnings": warnings}

    md = ModelDefinition(
        archive=archive,
        size_bytes=len(archive),
        sha256=hashlib.sha256(archive).hexdigest(),
        file_count=len(files),
    )
    db.add(md)
    db.flush()
    now = master.clock()
    exp = Experiment(
        name=cfg.name or "",
        description=cfg.description or "",
        notes="",
        labels=list(dict.fromkeys(cfg.labels)),
        config=config,
        original_config=body.config,
        state=st.EXP_ACTIVE if body.activate else st.EXP_PAUSED,
        owner_id=p.user_id,
        archived=False,
        model_definition_id=md.id,
        parent_id=body.parent_id,
        resource_pool=cfg.resources.resource_pool,
        priority=cfg.resources.priority,
        weight=cfg.resources.weight,
        job_id=str(uuid.uuid4()),
        progress=0.0,
        warnings=list(warnings),
        start_time=now,
    )
    db.add(exp)
    db.flush()
    if not exp.name:
        exp.name = f"Experiment {exp.id}"
    lifecycle.on_experiment_created(db, master, exp)
    db.flush()
    db.refresh(exp)
    log.info(
        "event=experiment_created experiment_id=%s owner=%s pool=%s searcher=%s state=%s",
        exp.id, p.username, exp.resource_pool, config["searcher"]["name"], exp.state,
    )
    return {
        "experiment": serializers.experiments_json(db, [exp])[0],
        "config": serializers.redact_config(config),
        "warnings": [],
        "configWarnings": warnings,
    }


# -- list / get ------------------------------------------------------------------------------------
_SORTS = (
    "SORT_BY_UNSPECIFIED", "SORT_BY_ID", "SORT_BY_DESCRIPTION", "SORT_BY_START_TIME", "SORT_BY_END_TIME",
    "SORT_BY_STATE", "SORT_BY_NUM_TRIALS", "SORT_BY_PROGRESS", "SORT_BY_USER", "SORT_BY_NAME",
    "SORT_BY_FORKED_FROM", "SORT_BY_RESOURCE_POOL", "SORT_BY_PROJECT_ID", "SORT_BY_CHECKPOINT_SIZE",
    "SORT_BY_CHECKPOINT_COUNT", "SORT_BY_SEARCHER_METRIC_VAL",
)
_DEFAULT_LIMIT = 100


def _sort_column(sort_by: str) -> Any:
    trials = select(func.count(Trial.id)).where(Trial.experiment_id == Experiment.id).scalar_subquery()
    live = Checkpoint.state.in_(st.CKPT_LIVE)
    ckpt_count = select(func.count()).where(Checkpoint.experiment_id == Experiment.id, live).scalar_subquery()
    ckpt_size = (
        select(func.coalesce(func.sum(Checkpoint.size_bytes), 0))
        .where(Checkpoint.experiment_id == Experiment.id, live)
        .scalar_subquery()
    )
    username = select(User.username).where(User.id == Experiment.owner_id).scalar_subquery()
    return {
        "SORT_BY_DESCRIPTION": Experiment.description,
        "SORT_BY_START_TIME": Experiment.start_time,
        "SORT_BY_END_TIME": Experiment.end_time,
        "SORT_BY_STATE": Experiment.state,
        "SORT_BY_NUM_TRIALS": trials,
        "SORT_BY_PROGRESS": Experiment.progress,
        "SORT_BY_USER": username,
        "SORT_BY_NAME": Experiment.name,
        "SORT_BY_FORKED_FROM": Experiment.parent_id,
        "SORT_BY_RESOURCE_POOL": Experiment.resource_pool,
        "SORT_BY_CHECKPOINT_SIZE": ckpt_size,
        "SORT_BY_CHECKPOINT_COUNT": ckpt_count,
    }.get(sort_by, Experiment.id)


@router.get("/api/v1/experiments")
def list_experiments(
    p: Principal = Depends(deps.user),
    db: Session = Depends(deps.get_db, scope="function"),
    archived: bool | None = None,
    states: Annotated[list[str], Query()] = [],  # noqa: B006 - FastAPI copies defaults
    labels: Annotated[list[str], Query()] = [],  # noqa: B006
    users: Annotated[list[str], Query()] = [],  # noqa: B006
    userIds: Annotated[list[int], Query()] = [],  # noqa: B006
    name: str | None = None,
    description: str | None = None,
    sortBy: str | None = None,
    orderBy: str | None = None,
    offset: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=-2)] = 0,
    projectId: int | None = None,
    showTrialData: bool | None = None,
    id_gt: Annotated[int | None, Query(alias="experimentIdFilter.gt")] = None,
    id_gte: Annotated[int | None, Query(alias="experimentIdFilter.gte")] = None,
    id_lt: Annotated[int | None, Query(alias="experimentIdFilter.lt")] = None,
    id_lte: Annotated[int | None, Query(alias="experimentIdFilter.lte")] = None,
    id_incl: Annotated[list[int], Query(alias="experimentIdFilter.incl")] = [],  # noqa: B006
    id_not_in: Annotated[list[int], Query(alias="experimentIdFilter.notIn")] = [],  # noqa: B006
) -> dict[str, Any]:
    """Determined's limit semantics: 0 → 100, -1 → all, -2 → only the pagination."""
    serializers.reject_nul(name=name, description=description, labels=labels, users=users)
    sort_by = serializers.parse_choice(sortBy, _SORTS, "sortBy", "SORT_BY_ID")
    desc = serializers.parse_order(orderBy)
    wanted_states = serializers.parse_states(states, st.EXPERIMENT_STATES, "states")

    q = select(Experiment)
    if archived is not None:
        q = q.where(Experiment.archived == archived)
    if wanted_states:
        q = q.where(Experiment.state.in_(wanted_states))
    if name:
        q = q.where(func.lower(Experiment.name).contains(name.lower(), autoescape=True))
    if description:
        q = q.where(func.lower(Experiment.description).contains(description.lower(), autoescape=True))
    if userIds:
        q = q.where(Experiment.owner_id.in_(userIds))
    if users:
        q = q.where(Experiment.owner_id.in_(select(User.id).where(User.username.in_(users))))
    for op, value in (("gt", id_gt), ("gte", id_gte), ("lt", id_lt), ("lte", id_lte)):
        if value is not None:
            q = q.where(
                {"gt": Experiment.id > value, "gte": Experiment.id >= value,
                 "lt": Experiment.id < value, "lte": Experiment.id <= value}[op]
            )
    if id_incl:
        q = q.where(Experiment.id.in_(id_incl))
    if id_not_in:
        q = q.where(Experiment.id.not_in(id_not_in))
    if labels:
        # Labels live in a JSON list; match them here rather than with dialect-specific JSON SQL.
        wanted = set(labels)
        ids = [i for i, ls in db.execute(q.with_only_columns(Experiment.id, Experiment.labels))
               if wanted <= set(ls or [])]
        q = q.where(Experiment.id.in_(ids))

    total = db.scalar(select(func.count()).select_from(q.subquery())) or 0
    effective = {0: _DEFAULT_LIMIT, -1: 0, -2: -2}.get(limit, limit)
    if effective == -2:
        return {"experiments": [], "pagination": serializers.pagination_json(offset, limit, total, 0)}

    if sort_by == "SORT_BY_SEARCHER_METRIC_VAL":
        exps = _sorted_by_searcher_metric(db, list(db.scalars(q)), desc)
        exps = serializers.page(exps, offset, effective)
    else:
        col = _sort_column(sort_by)
        key = col.desc() if desc else col.asc()
        if sort_by == "SORT_BY_END_TIME":
            key = key.nulls_last()
        q = q.order_by(key, Experiment.id.desc() if desc else Experiment.id.asc()).offset(offset)
        if effective:
            q = q.limit(effective)
        exps = list(db.scalars(q))
    return {
        "experiments": serializers.experiments_json(db, exps),
        "pagination": serializers.pagination_json(offset, limit, total, len(exps)),
    }


def _sorted_by_searcher_metric(db: Session, exps: list[Experiment], desc: bool) -> list[Experiment]:
    """By each experiment's best trial metric; experiments without one last, either direction."""
    extras = serializers.experiment_extras(db, exps)
    with_metric = [e for e in exps if extras[e.id].best_metric is not None]
    without = [e for e in exps if extras[e.id].best_metric is None]
    with_metric.sort(key=lambda e: (extras[e.id].best_metric, e.id), reverse=desc)
    return with_metric + without


def job_summary(db: Session, exp: Experiment) -> dict[str, Any] | None:
    if exp.state in st.EXP_TERMINAL:
        return None
    allocs = list(
        db.scalars(select(Allocation).where(Allocation.experiment_id == exp.id, Allocation.state.in_(st.ALLOC_LIVE)))
    )
    requested = sum(a.slots_needed for a in allocs)
    allocated = sum(a.slots_needed for a in allocs if a.state in st.ALLOC_ON_AGENT)
    pending = [a for a in allocs if a.state == st.ALLOC_PENDING]
    jobs_ahead = 0
    if pending:
        first = min(a.created_at for a in pending)
        jobs_ahead = db.scalar(
            select(func.count(func.distinct(Allocation.experiment_id))).where(
                Allocation.pool == exp.resource_pool,
                Allocation.state == st.ALLOC_PENDING,
                Allocation.created_at < first,
                Allocation.experiment_id != exp.id,
            )
        ) or 0
    return {
        "state": "STATE_SCHEDULED" if allocated else "STATE_QUEUED",
        "jobsAhead": int(jobs_ahead),
        "requestedSlots": requested,
        "allocatedSlots": allocated,
    }


@router.get("/api/v1/experiments/{experimentId}")
def get_experiment(
    experimentId: int,
    p: Principal = Depends(deps.principal),
    db: Session = Depends(deps.get_db, scope="function"),
) -> dict[str, Any]:
    exp = access.get_experiment(db, experimentId)
    access.require_read_experiment(db, p, exp)
    return {
        "experiment": serializers.experiments_json(db, [exp])[0],
        "config": serializers.redact_config(exp.config),
        "jobSummary": job_summary(db, exp),
    }


# -- changes ---------------------------------------------------------------------------------------
def _owned(db: Session, p: Principal, experiment_id: int) -> Experiment:
    exp = access.get_experiment(db, experiment_id)
    access.require_owner(p, exp)
    return exp


def _state_action(action: str) -> Any:
    def handler(
        experimentId: int,
        p: Principal = Depends(deps.user),
        master: Master = Depends(deps.get_master),
        db: Session = Depends(deps.get_db, scope="function"),
    ) -> dict[str, Any]:
        exp = _owned(db, p, experimentId)
        lifecycle.set_experiment_state(db, master, exp, action)
        log.info("event=experiment_%s experiment_id=%s by=%s", action, exp.id, p.username)
        return {}

    handler.__name__ = f"{action}_experiment"
    return handler


for _action in ("activate", "pause", "cancel", "kill"):
    router.post(f"/api/v1/experiments/{{experimentId}}/{_action}")(_state_action(_action))


@router.post("/api/v1/experiments/{experimentId}/archive")
def archive_experiment(
    experimentId: int, p: Principal = Depends(deps.user), db: Session = Depends(deps.get_db, scope="function")
) -> dict[str, Any]:
    exp = _owned(db, p, experimentId)
    if exp.state not in st.EXP_TERMINAL:
        raise conflict(f"experiment {exp.id} is {exp.state}; only a finished experiment can be archived")
    exp.archived = True
    return {}


@router.post("/api/v1/experiments/{experimentId}/unarchive")
def unarchive_experiment(
    experimentId: int, p: Principal = Depends(deps.user), db: Session = Depends(deps.get_db, scope="function")
) -> dict[str, Any]:
    exp = _owned(db, p, experimentId)
    exp.archived = False
    return {}


def _check_label(label: str, field: str) -> str:
    if not label or not label.strip():
        raise bad_request("a label must not be empty", field)
    if len(label) > _LABEL_MAX:
        raise bad_request(f"a label must be at most {_LABEL_MAX} characters", field)
    if "\x00" in label:
        raise bad_request("a label must not contain NUL characters", field)
    return label


class PatchResources(StrictWire):
    max_slots: int | None = None
    priority: int | None = None
    weight: float | None = None


class PatchExperimentRequest(StrictWire):
    id: int | None = None
    name: str | None = Field(default=None, max_length=_NAME_MAX)
    description: str | None = None
    notes: str | None = None
    labels: list[str] | None = None
    resources: PatchResources | None = None
    checkpoint_storage: dict[str, Any] | None = None


@router.patch("/api/v1/experiments/{experimentId}")
def patch_experiment(
    experimentId: int,
    body: PatchExperimentRequest,
    p: Principal = Depends(deps.user),
    db: Session = Depends(deps.get_db, scope="function"),
) -> dict[str, Any]:
    exp = _owned(db, p, experimentId)
    if body.id is not None and body.id != experimentId:
        raise bad_request(f"does not match the experiment in the path ({experimentId})", "id")
    if body.resources is not None:
        raise bad_request("changing resources of an existing experiment is not supported", "resources")
    if body.checkpoint_storage is not None:
        raise bad_request("changing checkpoint storage of an existing experiment is not supported",
                          "checkpointStorage")
    if body.name is not None:
        if not body.name.strip():
            raise bad_request("must not be empty", "name")
        exp.name = serializers.clean_text(body.name)
    if body.description is not None:
        exp.description = serializers.clean_text(body.description)
    if body.notes is not None:
        exp.notes = serializers.clean_text(body.notes)
    if body.labels is not None:
        exp.labels = list(dict.fromkeys(_check_label(x, f"labels[{i}]") for i, x in enumerate(body.labels)))
    db.flush()
    return {"experiment": serializers.experiments_json(db, [exp])[0]}


@router.put("/api/v1/experiments/{experimentId}/labels/{label}")
def put_label(
    experimentId: int, label: str, p: Principal = Depends(deps.user), db: Session = Depends(deps.get_db, scope="function")
) -> dict[str, Any]:
    exp = _owned(db, p, experimentId)
    _check_label(label, "label")
    if label not in (exp.labels or []):
        exp.labels = [*(exp.labels or []), label]
    return {"labels": list(exp.labels)}


@router.delete("/api/v1/experiments/{experimentId}/labels/{label}")
def delete_label(
    experimentId: int, label: str, p: Principal = Depends(deps.user), db: Session = Depends(deps.get_db, scope="function")
) -> dict[str, Any]:
    exp = _owned(db, p, experimentId)
    serializers.reject_nul(label=label)
    exp.labels = [x for x in (exp.labels or []) if x != label]
    return {"labels": list(exp.labels)}


@router.delete("/api/v1/experiments/{experimentId}")
def delete_experiment(
    experimentId: int,
    p: Principal = Depends(deps.user),
    master: Master = Depends(deps.get_master),
    db: Session = Depends(deps.get_db, scope="function"),
) -> dict[str, Any]:
    """Removes the experiment, its trials, metrics, logs and model definition. Its checkpoints
    stay as rows in state STATE_DELETING for the checkpoint GC worker, which deletes the files
    (the row keeps the storage config) and then marks them STATE_DELETED."""
    exp = access.get_experiment(db, experimentId, for_update=True)
    access.require_owner(p, exp)
    if exp.state not in st.EXP_TERMINAL:
        raise conflict(f"experiment {exp.id} is {exp.state}; only a finished experiment can be deleted")
    live = db.scalar(
        select(func.count()).where(Allocation.experiment_id == exp.id, Allocation.state.in_(st.ALLOC_LIVE))
    )
    if live:
        raise conflict(f"experiment {exp.id} still has {live} running allocations")
    registered = list(
        db.scalars(
            select(ModelVersion.checkpoint_uuid)
            .join(Checkpoint, Checkpoint.uuid == ModelVersion.checkpoint_uuid)
            .where(Checkpoint.experiment_id == exp.id)
        )
    )
    if registered:
        raise conflict(
            f"experiment {exp.id} has checkpoints registered in the model registry: {sorted(set(registered))}"
        )

    trials = list(db.execute(select(Trial.id, Trial.task_id).where(Trial.experiment_id == exp.id)))
    trial_ids = [t for t, _ in trials]
    task_ids = {task for _, task in trials}
    task_ids.update(db.scalars(select(Allocation.task_id).where(Allocation.experiment_id == exp.id)))
    now = master.clock()
    db.execute(
        update(Checkpoint)
        .where(Checkpoint.experiment_id == exp.id, Checkpoint.state.not_in(st.CKPT_GONE))
        .values(state=st.CKPT_DELETING)
    )
    db.execute(update(Checkpoint).where(Checkpoint.experiment_id == exp.id).values(trial_id=None))
    if trial_ids:
        db.execute(delete(Metric).where(Metric.trial_id.in_(trial_ids)))
        db.execute(
            update(Token).where(Token.trial_id.in_(trial_ids), Token.revoked_at.is_(None)).values(revoked_at=now)
        )
    if task_ids:
        db.execute(delete(TaskLog).where(TaskLog.task_id.in_(task_ids)))
    db.execute(delete(Allocation).where(Allocation.experiment_id == exp.id))
    db.execute(delete(Trial).where(Trial.experiment_id == exp.id))
    md_id = exp.model_definition_id
    db.delete(exp)
    db.flush()
    if db.scalar(select(func.count()).where(Experiment.model_definition_id == md_id)) == 0:
        db.execute(delete(ModelDefinition).where(ModelDefinition.id == md_id))
    master.notify(db)
    log.info("event=experiment_deleted experiment_id=%s trials=%s by=%s", experimentId, len(trial_ids), p.username)
    return {}

