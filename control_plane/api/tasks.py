"""What a running trial asks of the master besides metrics and checkpoints: its model
definition, its searcher operation, preemption signals, progress, early exit; and the task list."""

from __future__ import annotations

import base64
import time
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import Field
from sqlalchemy import select
from sqlalchemy.orm import Session
from starlette.responses import Response

from control_plane.api import deps
from control_plane.api.wire import Count64, Id, StrictWire, Wire, ts
from control_plane.auth import Principal, TokenKind
from control_plane.core import states as st
from control_plane.core.searcher import ExitedReason
from control_plane.db.models import Allocation, Trial
from control_plane.errors import bad_request, forbidden, not_found
from control_plane.frontdoor import fastjson, preempt_polls
from control_plane.frontdoor.admission import Ticket
from control_plane.master import Master
from control_plane.services import access, experiments, gangs, lifecycle, trials
from control_plane.services import metrics as trial_metrics

router = APIRouter(route_class=fastjson.FastRoute)


def _trial(db: Session, p: Principal, trial_id: int) -> Trial:
    trial = access.get_trial(db, trial_id)
    access.require_read_trial(p, trial)
    return trial


def _owner_or_allocation(db: Session, p: Principal, trial: Trial) -> None:
    """Writes: the trial's own allocation, the experiment's owner, or an admin."""
    access.require_trial_writer(p, trial, access.get_experiment(db, trial.experiment_id))


@router.get("/api/v1/experiments/{experimentId}/model_def")
def model_def(
    experimentId: Id, p: Principal = Depends(deps.user_or_allocation), db: Session = Depends(deps.get_db, scope="function")
) -> dict[str, Any]:
    exp = access.get_experiment(db, experimentId)
    access.require_read_experiment(db, p, exp)
    return {"b64Tgz": base64.b64encode(experiments.model_definition(db, exp)).decode()}


@router.get("/api/v1/trials/{trialId}/searcher/operation")
def searcher_operation(
    trialId: Id, p: Principal = Depends(deps.user_or_allocation), db: Session = Depends(deps.get_db, scope="function")
) -> dict[str, Any]:
    op = trials.searcher_operation(db, _trial(db, p, trialId))
    if op.length is not None:
        return {"op": {"validateAfter": {"length": op.length}}, "completed": op.completed}
    return {"op": None, "completed": op.completed}


class CompletedOp(Wire):
    length: Count64


class CompleteOperationRequest(StrictWire):
    op: CompletedOp
    searcher_metric: float = Field(allow_inf_nan=True)  # a metric may be NaN or ±Infinity (core/metrics.py)


@router.post("/api/v1/trials/{trialId}/searcher/completed_operation")
def completed_operation(
    trialId: Id,
    body: CompleteOperationRequest,
    p: Principal = Depends(deps.user_or_allocation),
    master: Master = Depends(deps.get_master),
    db: Session = Depends(deps.get_db, scope="function"),
) -> dict[str, Any]:
    trial = _trial(db, p, trialId)
    _owner_or_allocation(db, p, trial)
    trials.complete_operation(db, master, trial, body.op.length, body.searcher_metric)
    return {}


_EXIT_REASONS = {
    "EXITED_REASON_INVALID_HP": ExitedReason.INVALID_HP,
    "EXITED_REASON_USER_REQUESTED_STOP": ExitedReason.USER_CANCELED,
    "EXITED_REASON_UNSPECIFIED": ExitedReason.ERRORED,
}


class EarlyExit(StrictWire):
    reason: str


@router.post("/api/v1/trials/{trialId}/early_exit")
def early_exit(
    trialId: Id,
    body: EarlyExit,
    p: Principal = Depends(deps.user_or_allocation),
    master: Master = Depends(deps.get_master),
    db: Session = Depends(deps.get_db, scope="function"),
) -> dict[str, Any]:
    trial = _trial(db, p, trialId)
    _owner_or_allocation(db, p, trial)
    reason = _EXIT_REASONS.get(body.reason)
    if reason is None:
        raise bad_request(f"must be one of {sorted(_EXIT_REASONS)}", "reason")
    lifecycle.on_trial_early_exit(db, master, trial, reason)
    return {}


class ProgressRequest(StrictWire):
    progress: float = Field(ge=0)
    is_raw: bool = False


async def _progress_fast(request: Request) -> Response | None:
    """The fast path (frontdoor/fastjson.py): a trial reports its progress with every training report,
    so it is handled in one worker thread with one query for the caller, one for the right and one
    update; FastAPI's handling (`progress`) answers what it declines."""
    got = await deps.trial_report(request, ProgressRequest)
    if got is None:
        return None
    trial_id, body, master = got
    caller = deps.caller_in(request, master)
    await run_in_threadpool(trial_metrics.report_progress, master, trial_id, caller, body.progress)
    return fastjson.json_response({})


@router.post("/api/v1/trials/{trialId}/progress")
@fastjson.fast_path(_progress_fast)
def progress(
    trialId: Id, body: ProgressRequest, p: Principal = Depends(deps.user_or_allocation),
    master: Master = Depends(deps.get_master),
) -> dict[str, Any]:
    trial_metrics.report_progress(master, trialId, lambda _s: p, body.progress)
    return {}


def _allocation(db: Session, p: Principal, allocation_id: str) -> Allocation:
    if p.kind is TokenKind.ALLOCATION and p.allocation_id != allocation_id:
        raise forbidden("this token belongs to another allocation")
    alloc = db.get(Allocation, allocation_id)
    if alloc is None:
        raise not_found(f"allocation {allocation_id}")
    return alloc


def _preempt_state(master: Master, p: Principal, allocation_id: str) -> bool:
    if p.kind is TokenKind.ALLOCATION and p.allocation_id != allocation_id:
        raise forbidden("this token belongs to another allocation")
    with master.read_sessions() as s:
        stop = trials.must_stop_by_id(s, allocation_id)
    if stop is None:
        raise not_found(f"allocation {allocation_id}")
    return stop


@router.get("/api/v1/allocations/{allocationId}/signals/preemption")
async def preemption_signal(
    allocationId: str,
    timeoutSeconds: float = 0,
    p: Principal = Depends(deps.user_or_allocation),
    master: Master = Depends(deps.get_master),
    slot: Ticket = Depends(deps.ticket),
) -> dict[str, Any]:
    deadline = slot.arrived + max(0.0, min(timeoutSeconds, 600.0))
    preempt = await run_in_threadpool(_preempt_state, master, p, allocationId)
    remaining = deadline - time.monotonic()
    if preempt or remaining <= 0 or master.stopping.is_set():
        return {"preempt": preempt}
    # The wait holds no thread, connection or admission slot (frontdoor/admission.py): the process's
    # preemption poll hub (frontdoor/preempt_polls.py) checks every waiting poll in one query per
    # wake-up and every 2 s, and answers this one when its allocation must stop.
    slot.release()
    return {"preempt": await preempt_polls.of(master).wait(allocationId, remaining)}


@router.get("/api/v1/allocations/{allocationId}/resources/{resourcesId}/rendezvous")
def rendezvous(
    allocationId: str, resourcesId: str, p: Principal = Depends(deps.user_or_allocation),
    db: Session = Depends(deps.get_db, scope="function"),
) -> dict[str, Any]:
    """Where every process group of the trial runs, this one's rank and every group's slots
    (Determined's shape). A trial across agents has one group per agent; its resources id is the
    agent's id (DET_RESOURCES_ID)."""
    alloc = _allocation(db, p, allocationId)
    if p.kind is not TokenKind.ALLOCATION and alloc.trial_id is not None:
        _trial(db, p, alloc.trial_id)
    if alloc.state not in st.ALLOC_ON_AGENT:
        raise not_found(f"allocation {allocationId} is not running ({alloc.state})")
    return {"rendezvousInfo": gangs.rendezvous(db, alloc, resourcesId)}


class AckPreemption(Wire):
    allocation_id: str | None = None


@router.post("/api/v1/allocations/{allocationId}/signals/ack_preemption")
def ack_preemption(
    allocationId: str, body: AckPreemption | None = None, p: Principal = Depends(deps.user_or_allocation),
    db: Session = Depends(deps.get_db, scope="function"),
) -> dict[str, Any]:
    _allocation(db, p, allocationId)
    return {}


def allocation_json(a: Allocation) -> dict[str, Any]:
    return {
        "allocationId": a.id,
        "taskId": a.task_id,
        "name": f"Trial {a.trial_id}" if a.trial_id is not None else a.task_id,
        "schedulerType": "priority",
        "resources": [{"allocationId": a.id, "resourcesId": agent_id, "agentDevices": {agent_id: {"devices": []}}}
                      for agent_id, _ in gangs.held(a)],
        "trialId": a.trial_id,
        "experimentId": a.experiment_id,
        "resourcePool": a.pool,
        "slotsNeeded": a.slots_needed,
        "priority": a.priority,
        "state": a.state,
        "agentId": a.agent_id,
        "slotIds": a.slot_ids,
        "registeredTime": ts(a.created_at),
        "startedTime": ts(a.started_at),
        "endedTime": ts(a.ended_at),
        "exitCode": a.exit_code,
        "exitReason": a.exit_reason,
        "endCause": a.end_cause,
        "preemptRequested": a.preempt_requested,
        "killRequested": a.kill_requested,
        "processGroups": [{"agentId": p["agent"], "slotIds": p["slots"], "state": p["state"], "exitCode": p["exit_code"]}
                          for p in gangs.parts(a)] if gangs.is_gang(a) else [],
    }


@router.get("/api/v1/tasks")
def list_tasks(_p: Principal = Depends(deps.user), db: Session = Depends(deps.get_db, scope="function"),
               includeEnded: bool = False) -> dict[str, Any]:
    q = select(Allocation).order_by(Allocation.created_at)
    if not includeEnded:
        q = q.where(Allocation.state.in_(st.ALLOC_LIVE))
    allocs = list(db.scalars(q))
    return {"allocationIdToSummary": {a.id: allocation_json(a) for a in allocs}}
