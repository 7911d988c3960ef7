"""The job queue over HTTP, in Determined's shapes: `GET /api/v1/job-queues-v2` (v1RBACJob, each
job `full`), `GET /api/v1/job-queues` (v1Job), `GET /api/v1/job-queues/stats` (v1RPQueueStat) and
`POST /api/v1/job-queues` (v1QueueControl updates). The queue and its rules are in
control_plane/services/jobs.py. A job here is an experiment or a command, notebook, TensorBoard or
shell; `waitingReason` is Shipyard's own
(additive) field: why a queued job's allocations wait."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from pydantic import Field
from sqlalchemy.orm import Session

from control_plane.api import deps, serializers
from control_plane.api.wire import Count32, Int32, StrictWire, ts
from control_plane.auth import Principal
from control_plane.master import Master
from control_plane.services import jobs as service
from control_plane.services import tasks

router = APIRouter()

_JOB_STATES = (*service.JOB_STATES, "STATE_SCHEDULED_BACKFILLED")


_TASK_TYPES = {"command": "TYPE_COMMAND", "notebook": "TYPE_NOTEBOOK", "tensorboard": "TYPE_TENSORBOARD",
               "shell": "TYPE_SHELL"}


def job_json(v: service.JobView) -> dict[str, Any]:
    """Determined's v1Job, plus `waitingReason`."""
    exp = v.exp
    if exp is None:
        return _task_job_json(v)
    return {
        "summary": {"state": v.state, "jobsAhead": v.jobs_ahead},
        "type": "TYPE_EXPERIMENT",
        "submissionTime": ts(exp.start_time),
        "username": v.username,
        "userId": exp.owner_id,
        "resourcePool": exp.resource_pool,
        "isPreemptible": True,
        "priority": v.priority,
        "weight": exp.weight,
        "entityId": str(exp.id),
        "jobId": exp.job_id,
        "requestedSlots": v.requested_slots,
        "allocatedSlots": v.allocated_slots,
        "name": exp.name,
        "progress": exp.progress,
        "workspaceId": v.workspace_id,
        "waitingReason": v.waiting_reason,
    }


def _task_job_json(v: service.JobView) -> dict[str, Any]:
    """A command, notebook, TensorBoard or shell as Determined lists it: its own job, not preemptible."""
    task = v.task
    assert task is not None
    return {
        "summary": {"state": v.state, "jobsAhead": v.jobs_ahead},
        "type": _TASK_TYPES.get(task.kind, "TYPE_UNSPECIFIED"),
        "submissionTime": ts(task.created_at),
        "username": v.username,
        "userId": task.owner_id,
        "resourcePool": task.pool,
        "isPreemptible": False,
        "priority": v.priority,
        "weight": tasks.config_of(task).resources.weight,
        "entityId": task.id,
        "jobId": task.id,
        "requestedSlots": v.requested_slots,
        "allocatedSlots": v.allocated_slots,
        "name": task.description,
        "progress": None,
        "workspaceId": v.workspace_id,
        "waitingReason": v.waiting_reason,
    }


def _page(db: Session, master: Master, resourcePool: str | None, states: list[str], offset: int, limit: int,
          orderBy: str | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    serializers.reject_nul(resourcePool=resourcePool)
    chosen = serializers.parse_states(states, _JOB_STATES, "states")
    page = service.list_jobs(db, master, pool=resourcePool or None, states=sorted(chosen), offset=offset,
                             limit=limit, descending=serializers.parse_order(orderBy))
    return ([job_json(v) for v in page.jobs],
            serializers.pagination_json(offset, limit, page.total, len(page.jobs)))


@router.get("/api/v1/job-queues-v2")
def get_jobs_v2(
    _p: Principal = Depends(deps.user),
    master: Master = Depends(deps.get_master),
    db: Session = Depends(deps.get_db, scope="function"),
    resourcePool: str | None = None,
    states: Annotated[list[str], Query()] = [],  # noqa: B006 - FastAPI copies defaults
    offset: Annotated[Count32, Query()] = 0,
    limit: Annotated[Count32, Query()] = 0,
    orderBy: str | None = None,
) -> dict[str, Any]:
    """The queue (of `resourcePool`, else every pool's, pool by pool) in queue order; `limit` 0: all."""
    jobs, pagination = _page(db, master, resourcePool, states, offset, limit, orderBy)
    return {"jobs": [{"full": j} for j in jobs], "pagination": pagination}


@router.get("/api/v1/job-queues")
def get_jobs(
    _p: Principal = Depends(deps.user),
    master: Master = Depends(deps.get_master),
    db: Session = Depends(deps.get_db, scope="function"),
    resourcePool: str | None = None,
    states: Annotated[list[str], Query()] = [],  # noqa: B006
    offset: Annotated[Count32, Query()] = 0,
    limit: Annotated[Count32, Query()] = 0,
    orderBy: str | None = None,
) -> dict[str, Any]:
    jobs, pagination = _page(db, master, resourcePool, states, offset, limit, orderBy)
    return {"jobs": jobs, "pagination": pagination}


@router.get("/api/v1/job-queues/stats")
def get_job_queue_stats(
    _p: Principal = Depends(deps.user),
    master: Master = Depends(deps.get_master),
    db: Session = Depends(deps.get_db, scope="function"),
    resourcePools: Annotated[list[str], Query()] = [],  # noqa: B006
) -> dict[str, Any]:
    serializers.reject_nul(resourcePools=resourcePools)
    return {"results": [
        {"resourcePool": pool, "stats": {"queuedCount": queued, "scheduledCount": scheduled}, "aggregates": []}
        for pool, queued, scheduled in service.queue_stats(db, master, resourcePools)
    ]}


class QueueControl(StrictWire):
    """Determined's v1QueueControl (null means unchanged); `queuePosition` is Shipyard's own."""

    job_id: str = Field(min_length=1, max_length=64)
    priority: Int32 | None = None
    weight: float | None = None
    resource_pool: str | None = Field(default=None, max_length=64)
    ahead_of: str | None = Field(default=None, max_length=64)
    behind_of: str | None = Field(default=None, max_length=64)
    queue_position: float | None = None


class UpdateJobQueueRequest(StrictWire):
    updates: list[QueueControl] = Field(max_length=1000)


@router.post("/api/v1/job-queues")
def update_job_queue(
    body: UpdateJobQueueRequest,
    p: Principal = Depends(deps.user),
    master: Master = Depends(deps.get_master),
    db: Session = Depends(deps.get_db, scope="function"),
) -> dict[str, Any]:
    """All the updates, in order, or none (the first bad one is the answer: 400/403/404/409)."""
    service.update_jobs(db, master, p, [
        service.QueueUpdate(job_id=u.job_id, priority=u.priority, weight=u.weight, resource_pool=u.resource_pool,
                            ahead_of=u.ahead_of, behind_of=u.behind_of, queue_position=u.queue_position)
        for u in body.updates
    ])
    return {}
