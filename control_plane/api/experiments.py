"""Experiments: create (config + model definition), list, get, patch, labels, state changes,
archive and delete. Determined's /api/v1/experiments paths and field names."""

from __future__ import annotations

import logging
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from pydantic import Field
from sqlalchemy.orm import Session

from control_plane.api import deps, serializers
from control_plane.api.wire import INT32_MAX, Id, Int32, StrictWire
from control_plane.auth import Principal
from control_plane.core import states as st
from control_plane.core.expconf.secrets import redact_config
from control_plane.db.models import Experiment
from control_plane.errors import bad_request
from control_plane.master import Master
from control_plane.services import access, experiments, jobs, lifecycle

log = logging.getLogger("shipyard.api.experiments")
router = APIRouter()


# -- create ----------------------------------------------------------------------------------------
class CreateExperimentRequest(StrictWire):
    config: str | None = None
    model_definition: list[Any] | None = None
    validate_only: bool = False
    activate: bool = True
    parent_id: Int32 | None = None
    project_id: Int32 | None = None
    template: str | None = None
    unmanaged: bool | None = None


# What grpc-gateway renders for Determined's empty experimentv1.Experiment (a validateOnly answer).
_EMPTY_EXPERIMENT: dict[str, Any] = {
    "id": 0, "name": "", "description": "", "labels": [], "notes": "", "startTime": "1970-01-01T00:00:00Z",
    "endTime": None, "duration": None, "state": "STATE_UNSPECIFIED", "archived": False, "numTrials": 0,
    "trialIds": [], "userId": 0, "username": "", "resourcePool": "", "searcherType": "", "searcherMetric": None,
    "jobId": "", "progress": 0.0, "projectId": 0, "projectOwnerId": 0, "workspaceId": 0, "config": {},
    "originalConfig": "", "hyperparameters": {}, "checkpointSize": "0", "checkpointCount": 0,
    "bestTrialId": None, "modelDefinitionSize": None, "unmanaged": False,
}


@router.post("/api/v1/experiments")
def create_experiment(
    body: CreateExperimentRequest,
    p: Principal = Depends(deps.user),
    master: Master = Depends(deps.get_master),
    db: Session = Depends(deps.get_db, scope="function"),
) -> dict[str, Any]:
    if body.unmanaged:
        raise bad_request("unmanaged experiments are not supported by Shipyard", "unmanaged")
    new = experiments.NewExperiment(
        config_text=body.config, model_definition=body.model_definition or [], activate=body.activate,
        parent_id=body.parent_id, project_id=body.project_id or None, template=body.template or None,
    )
    if body.validate_only:
        v = experiments.validate(db, master, new)
        # Determined answers an empty (zero-valued) experiment here; its client parses it.
        return {"experiment": _EMPTY_EXPERIMENT, "config": redact_config(v.config_dict), "warnings": [],
                "configWarnings": v.warnings}
    exp, v = experiments.create(db, master, p, new)
    return {
        "experiment": serializers.experiments_json(db, [exp])[0],
        "config": redact_config(v.config_dict),
        "warnings": [],
        "configWarnings": v.warnings,
    }


# -- list / get ------------------------------------------------------------------------------------
_DEFAULT_LIMIT = 100


@router.get("/api/v1/experiments")
def list_experiments(
    p: Principal = Depends(deps.user),
    db: Session = Depends(deps.get_db, scope="function"),
    archived: bool | None = None,
    states: Annotated[list[str], Query()] = [],  # noqa: B006 - FastAPI copies defaults
    labels: Annotated[list[str], Query()] = [],  # noqa: B006
    users: Annotated[list[str], Query()] = [],  # noqa: B006
    userIds: Annotated[list[Int32], Query()] = [],  # noqa: B006
    name: str | None = None,
    description: str | None = None,
    sortBy: str | None = None,
    orderBy: str | None = None,
    offset: Annotated[int, Query(ge=0, le=INT32_MAX)] = 0,
    limit: Annotated[int, Query(ge=-2, le=INT32_MAX)] = 0,
    projectId: Int32 | None = None,
    showTrialData: bool | None = None,
    id_gt: Annotated[Int32 | None, Query(alias="experimentIdFilter.gt")] = None,
    id_gte: Annotated[Int32 | None, Query(alias="experimentIdFilter.gte")] = None,
    id_lt: Annotated[Int32 | None, Query(alias="experimentIdFilter.lt")] = None,
    id_lte: Annotated[Int32 | None, Query(alias="experimentIdFilter.lte")] = None,
    id_incl: Annotated[list[Int32], Query(alias="experimentIdFilter.incl")] = [],  # noqa: B006
    id_not_in: Annotated[list[Int32], Query(alias="experimentIdFilter.notIn")] = [],  # noqa: B006
) -> dict[str, Any]:
    """Determined's limit semantics: 0 → 100, -1 → all, -2 → only the pagination."""
    serializers.reject_nul(name=name, description=description, labels=labels, users=users)
    sort_by = serializers.parse_choice(sortBy, experiments.SORTS, "sortBy", "SORT_BY_ID")
    desc = serializers.parse_order(orderBy)
    flt = experiments.ExperimentFilter(
        archived=archived, states=serializers.parse_states(states, st.EXPERIMENT_STATES, "states"), labels=labels,
        usernames=users, user_ids=userIds, name=name, description=description, id_gt=id_gt, id_gte=id_gte,
        id_lt=id_lt, id_lte=id_lte, id_in=id_incl, id_not_in=id_not_in, project_id=projectId,
    )
    total = experiments.count_experiments(db, flt)
    effective = {0: _DEFAULT_LIMIT, -1: 0, -2: -2}.get(limit, limit)
    if effective == -2:
        return {"experiments": [], "pagination": serializers.pagination_json(offset, limit, total, 0)}
    exps = experiments.list_experiments(db, flt, sort_by=sort_by, desc=desc, offset=offset, limit=effective)
    return {
        "experiments": serializers.experiments_json(db, exps),
        "pagination": serializers.pagination_json(offset, limit, total, len(exps)),
    }


def _job_summary_json(summary: experiments.JobSummary | None) -> dict[str, Any] | None:
    if summary is None:
        return None
    return {
        "state": "STATE_SCHEDULED" if summary.scheduled else "STATE_QUEUED",
        "jobsAhead": summary.jobs_ahead,
        "requestedSlots": summary.requested_slots,
        "allocatedSlots": summary.allocated_slots,
    }


@router.get("/api/v1/experiments/{experimentId}")
def get_experiment(
    experimentId: Id,
    p: Principal = Depends(deps.principal),
    master: Master = Depends(deps.get_master),
    db: Session = Depends(deps.get_db, scope="function"),
) -> dict[str, Any]:
    exp = access.get_experiment(db, experimentId)
    access.require_read_experiment(db, p, exp)
    return {
        "experiment": serializers.experiments_json(db, [exp], master)[0],
        "config": redact_config(exp.config),
        "jobSummary": _job_summary_json(experiments.job_summary(db, exp)),
    }


# -- changes ---------------------------------------------------------------------------------------
def _owned(db: Session, p: Principal, experiment_id: int) -> Experiment:
    exp = access.get_experiment(db, experiment_id)
    access.require_owner(p, exp)
    return exp


def _state_action(action: str) -> Any:
    def handler(
        experimentId: Id,
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
    experimentId: Id, p: Principal = Depends(deps.user), db: Session = Depends(deps.get_db, scope="function")
) -> dict[str, Any]:
    experiments.archive(_owned(db, p, experimentId))
    return {}


@router.post("/api/v1/experiments/{experimentId}/unarchive")
def unarchive_experiment(
    experimentId: Id, p: Principal = Depends(deps.user), db: Session = Depends(deps.get_db, scope="function")
) -> dict[str, Any]:
    experiments.unarchive(_owned(db, p, experimentId))
    return {}


class PatchResources(StrictWire):
    max_slots: Int32 | None = None
    priority: Int32 | None = None
    weight: float | None = None


class PatchExperimentRequest(StrictWire):
    id: Int32 | None = None
    name: str | None = Field(default=None, max_length=experiments.NAME_MAX)
    description: str | None = None
    notes: str | None = None
    labels: list[str] | None = None
    resources: PatchResources | None = None
    checkpoint_storage: dict[str, Any] | None = None


@router.patch("/api/v1/experiments/{experimentId}")
def patch_experiment(
    experimentId: Id,
    body: PatchExperimentRequest,
    p: Principal = Depends(deps.user),
    master: Master = Depends(deps.get_master),
    db: Session = Depends(deps.get_db, scope="function"),
) -> dict[str, Any]:
    exp = _owned(db, p, experimentId)
    if body.id is not None and body.id != experimentId:
        raise bad_request(f"does not match the experiment in the path ({experimentId})", "id")
    if body.checkpoint_storage is not None:
        raise bad_request("changing checkpoint storage of an existing experiment is not supported",
                          "checkpointStorage")
    change = experiments.ExperimentEdit(name=body.name, description=body.description, notes=body.notes,
                                        labels=body.labels)
    experiments.edit(db, exp, change)
    r = body.resources  # `det e set priority|weight|max-slots`: the job queue's change
    # (all null, as `det e set max-slots <id> none` sends, changes nothing, as in Determined)
    if r is not None and any(v is not None for v in (r.priority, r.weight, r.max_slots)):
        jobs.update_experiment(db, master, p, exp, jobs.QueueUpdate(job_id=exp.job_id or "", priority=r.priority,
                                                                     weight=r.weight, max_slots=r.max_slots))
    return {"experiment": serializers.experiments_json(db, [exp])[0]}


@router.put("/api/v1/experiments/{experimentId}/labels/{label}")
def put_label(
    experimentId: Id, label: str, p: Principal = Depends(deps.user), db: Session = Depends(deps.get_db, scope="function")
) -> dict[str, Any]:
    return {"labels": experiments.add_label(_owned(db, p, experimentId), label)}


@router.delete("/api/v1/experiments/{experimentId}/labels/{label}")
def delete_label(
    experimentId: Id, label: str, p: Principal = Depends(deps.user), db: Session = Depends(deps.get_db, scope="function")
) -> dict[str, Any]:
    exp = _owned(db, p, experimentId)
    serializers.reject_nul(label=label)
    return {"labels": experiments.remove_label(exp, label)}


@router.delete("/api/v1/experiments/{experimentId}")
def delete_experiment(
    experimentId: Id,
    p: Principal = Depends(deps.user),
    master: Master = Depends(deps.get_master),
    db: Session = Depends(deps.get_db, scope="function"),
) -> dict[str, Any]:
    """Removes the experiment, its trials, metrics, logs and model definition. Its checkpoints
    stay as rows in state STATE_DELETING for the checkpoint GC worker, which deletes the files
    (the row keeps the storage config) and then marks them STATE_DELETED."""
    exp = access.get_experiment(db, experimentId, for_update=True)
    access.require_owner(p, exp)
    experiments.delete_experiment(db, master, exp, p)
    return {}
