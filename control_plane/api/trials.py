"""Trials: `GET /api/v1/experiments/{id}/trials` and `GET /api/v1/trials/{id}` (Determined's
trialv1Trial). Their metrics are in api/metrics.py, their logs in api/logs.py."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from sqlalchemy.orm import Session

from control_plane.api import deps, serializers
from control_plane.api.wire import INT32_MAX, Id
from control_plane.auth import Principal
from control_plane.core import states as st
from control_plane.master import Master
from control_plane.services import access, lifecycle, pool_capacity, trials

router = APIRouter()


@router.get("/api/v1/experiments/{experimentId}/trials")
def list_trials(
    experimentId: Id,
    p: Principal = Depends(deps.principal),
    master: Master = Depends(deps.get_master),
    db: Session = Depends(deps.get_db, scope="function"),
    states: Annotated[list[str], Query()] = [],  # noqa: B006 - FastAPI copies defaults
    sortBy: str | None = None,
    orderBy: str | None = None,
    offset: Annotated[int, Query(ge=0, le=INT32_MAX)] = 0,
    limit: Annotated[int, Query(ge=0, le=INT32_MAX)] = 0,
) -> dict[str, Any]:
    """`limit` 0 means no limit (Determined)."""
    exp = access.get_experiment(db, experimentId)
    access.require_read_experiment(db, p, exp)
    sort_by = serializers.parse_choice(sortBy, trials.SORTS, "sortBy", "SORT_BY_ID")
    desc = serializers.parse_order(orderBy)
    wanted = serializers.parse_states(states, st.EXPERIMENT_STATES | st.TRIAL_STATES, "states")
    found = trials.trials_of(db, exp.id, wanted)
    now = master.clock()
    ckpts = serializers.trial_checkpoints(db, [t.id for t in found])
    ordered = trials.ordered(found, sort_by, desc, {t.id: ckpts[t.id].size for t in found}, now)
    chosen = serializers.page(ordered, offset, limit)
    reasons = pool_capacity.pending_reasons(db, master, trial_ids=[t.id for t in chosen])
    return {
        "trials": [serializers.trial_json(t, ckpts[t.id], now, reasons.get(t.id)) for t in chosen],
        "pagination": serializers.pagination_json(offset, limit, len(ordered), len(chosen)),
    }


@router.get("/api/v1/trials/{trialId}")
def get_trial(
    trialId: Id,
    p: Principal = Depends(deps.principal),
    master: Master = Depends(deps.get_master),
    db: Session = Depends(deps.get_db, scope="function"),
) -> dict[str, Any]:
    trial = access.get_trial(db, trialId)
    access.require_read_trial(p, trial)
    out = serializers.trials_json(db, [trial], master.clock(), master)[0]
    out["summaryMetrics"] = trials.summary_metrics(db, trial.id)  # one trial's: not in the lists
    return {"trial": out}


@router.post("/api/v1/trials/{trialId}/kill")
def kill_trial(
    trialId: Id,
    p: Principal = Depends(deps.user),
    master: Master = Depends(deps.get_master),
    db: Session = Depends(deps.get_db, scope="function"),
) -> dict[str, Any]:
    """Determined's KillTrial (`det trial kill`): the trial ends CANCELED, the experiment goes on."""
    trial = access.get_trial(db, trialId)
    exp = access.get_experiment(db, trial.experiment_id)
    access.require_owner(p, exp)
    lifecycle.kill_trial(db, master, trial)
    return {}
