"""`GET /api/v1/resource-pools`: pools, their capacity, queue, last scaling decision, the autoscaler's
recent history (from the database: the same whichever API worker answers) and instances."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Query
from sqlalchemy import select
from sqlalchemy.orm import Session

from control_plane.api import deps
from control_plane.api.wire import ts
from control_plane.auth import Principal
from control_plane.core import states as st
from control_plane.db.models import Agent, Allocation, Instance, ResourcePool, ScalingEvent
from control_plane.errors import bad_request, not_found
from control_plane.master import Master
from control_plane.services import consolidation, scaling_history
from control_plane.services.pool_settings import EffectivePool, effective_pool, seconds

router = APIRouter()


def pool_json(master: Master, s: Session, row: ResourcePool) -> dict[str, Any]:
    cfg = master.config.pool(row.name)
    agents = list(s.scalars(select(Agent).where(Agent.pool == row.name)))
    connected = [a for a in agents if a.state == st.AgentState.CONNECTED]
    allocs = list(s.scalars(select(Allocation).where(Allocation.pool == row.name, Allocation.state.in_(st.ALLOC_LIVE))))
    instances = list(s.scalars(select(Instance).where(Instance.pool == row.name, Instance.state != st.InstanceState.TERMINATED)))
    slots_total = sum(len(a.slots) for a in connected)
    slots_used = sum(a.slots_needed for a in allocs if a.state in st.ALLOC_ON_AGENT)
    ep = effective_pool(cfg) if cfg is not None else None
    return {
        "name": row.name,
        "description": row.description,
        # Determined's enum has no "local": such pools say UNSPECIFIED (`provider` names them).
        "type": _POOL_TYPES.get((ep.provider if ep else None) or "static", "RESOURCE_POOL_TYPE_UNSPECIFIED"),
        "defaultComputePool": row.name == master.config.default_resource_pool,
        "defaultAuxPool": row.name == master.config.default_resource_pool,
        "numAgents": len(connected),
        "slotsAvailable": slots_total,
        "slotsUsed": slots_used,
        "slotType": "TYPE_CUDA" if any(sl.get("type") == "cuda" for a in connected for sl in a.slots) else "TYPE_CPU",
        "schedulerType": "SCHEDULER_TYPE_" + (cfg.scheduler.type.upper() if cfg else "PRIORITY"),
        "preemptible": bool(cfg and cfg.scheduler.preemption),
        "minAgents": ep.min_instances if ep else 0,
        "maxAgents": ep.max_instances if ep else 0,
        "provider": ep.provider if ep else None,
        # Every effective elastic setting (durations in seconds), as the autoscaler acts on them;
        # null for a pool without a provider or with an unusable one (then `error` says why).
        "settings": _settings_json(ep),
        "queuedAllocations": sum(1 for a in allocs if a.state == st.AllocationState.PENDING),
        "runningAllocations": sum(1 for a in allocs if a.state in st.ALLOC_ON_AGENT),
        "state": row.state,
        "error": row.error,
        "backoffUntil": ts(row.backoff_until),
        "lastDecision": row.last_decision,
        "lastDecisionAt": ts(row.last_decision_at),
        # Subnets/zones skipped after capacity errors, as the autoscaler last recorded them.
        "capacityCooldowns": _cooldowns(row.last_decision),
        # A pool of several instance types or capacities: each with its slots and estimated $/h
        # (the price catalogue, shipyard_common/prices.json); the last decision's launches are in it.
        "capacity": ep.instances.capacity if ep else "",
        "instanceTypes": [{"instanceType": o.instance_type, "capacity": "spot" if o.spot else "on-demand",
                           "slots": o.slots, "usdPerHour": o.usd_per_hour} for o in (ep.instances.offers if ep else ())],
        # Work moved off instances by consolidation, newest first: why, and the estimated saving.
        "consolidationMoves": [
            {"at": ts(m.at), "launchId": m.launch_id, "instanceId": m.instance_id, "allocationId": m.allocation_id,
             "trialId": m.trial_id, "reason": m.reason, "saving": m.saving, "savingUnit": m.saving_unit,
             "replacementLaunchId": m.replacement_launch_id, "pending": m.pending}
            for m in consolidation.recent_moves(s, row.name)
        ],
        # The autoscaler's decisions that changed something, and steady runs collapsed, newest first.
        "scalingHistory": [event_json(e) for e in scaling_history.recent(s, row.name, POOL_HISTORY_ROWS)],
        **_determined_pool_fields(master, ep, slots_total, len(connected), allocs),
        "instances": [
            {"launchId": i.launch_id, "instanceId": i.instance_id, "state": i.state, "agentId": i.agent_id,
             "location": i.location, "instanceType": i.instance_type, "capacity": i.capacity,
             "launchedAt": ts(i.launched_at or i.requested_at),
             # An instance being stopped bills until the cloud says it is gone: why, and since when.
             "terminateReason": i.terminate_reason, "terminateRequestedAt": ts(i.terminate_requested_at)}
            for i in instances
        ],
    }


#: History rows in a pool's answer; `/scaling-history` pages further.
POOL_HISTORY_ROWS = 20


def event_json(row: ScalingEvent) -> dict[str, Any]:
    """One autoscaler history row (services/scaling_history.py) in the API's style."""
    d = row.detail or {}
    return {"id": row.id, "at": ts(row.at), "until": ts(row.until), "kind": row.kind, "launch": row.launch,
            "terminate": row.terminate, "ticks": row.ticks, "reasons": list(d.get("reasons") or []),
            "launches": list(d.get("launches") or []), "terminations": list(d.get("terminations") or []),
            "moves": d.get("moves")}


_POOL_TYPES = {"static": "RESOURCE_POOL_TYPE_STATIC", "aws": "RESOURCE_POOL_TYPE_AWS", "gcp": "RESOURCE_POOL_TYPE_GCP"}


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w.title() for w in rest)


def _settings_json(ep: EffectivePool | None) -> dict[str, Any] | None:
    if ep is None or ep.elastic is None:
        return None
    return {_camel(name): seconds(value) for name, value in ep.shown_settings()}


def _determined_pool_fields(master: Master, ep: EffectivePool | None, slots_total: int, agents: int,
                            allocs: list[Allocation]) -> dict[str, Any]:
    """The rest of Determined's v1ResourcePool, which its client (0.38.1) requires: what Shipyard
    has no notion of (Docker images for agents, aux containers) is empty or zero."""
    return {
        "schedulerFittingPolicy": "FITTING_POLICY_" + (ep.config.scheduler.fitting_policy.upper() if ep else "BEST"),
        "location": ep.instances.location if ep else "",
        "imageId": ep.instances.image if ep else "",
        "instanceType": ep.instances.instance_type if ep else "",
        "masterUrl": master.config.advertised_url,
        "masterCertName": "",
        "startupScript": "",
        "containerStartupScript": "",
        "agentDockerNetwork": "",
        "agentDockerRuntime": "",
        "agentDockerImage": "",
        "agentFluentImage": "",
        "maxIdleAgentPeriod": seconds(ep.elastic.max_idle_agent_period) if ep and ep.elastic else 0.0,
        "maxAgentStartingPeriod": seconds(ep.elastic.max_agent_starting_period) if ep and ep.elastic else 0.0,
        "details": {},
        "slotsPerAgent": slots_total // agents if agents else 0,
        "auxContainerCapacity": 0,
        "auxContainersRunning": 0,
        "auxContainerCapacityPerAgent": 0,
        "clusterName": master.config.cluster_name,
        "resourceManagerMetadata": {},
        "accelerator": "",
        "stats": {"queuedCount": sum(1 for a in allocs if a.state == st.AllocationState.PENDING),
                  "scheduledCount": sum(1 for a in allocs if a.state in st.ALLOC_ON_AGENT)},
    }


def _cooldowns(decision: Any) -> list[dict[str, Any]]:
    """Rewritten by every autoscaler tick and launch, ended cool-downs dropped (provisioners/capacity.py)."""
    entries = decision.get("capacity") if isinstance(decision, dict) else None
    return [{"location": c.get("location"), "instanceType": c.get("instance_type"), "until": c.get("until"),
             "code": c.get("code"), "error": c.get("error"), "failures": c.get("failures")}
            for c in entries or [] if isinstance(c, dict)]


@router.get("/api/v1/resource-pools")
def list_pools(
    _p: Principal = Depends(deps.user), master: Master = Depends(deps.get_master), db: Session = Depends(deps.get_db, scope="function")
) -> dict[str, Any]:
    rows = list(db.scalars(select(ResourcePool).order_by(ResourcePool.name)))
    names = {p.name for p in master.config.resource_pools}
    return {"resourcePools": [pool_json(master, db, r) for r in rows if r.name in names]}


@router.get("/api/v1/resource-pools/{name}")
def get_pool(
    name: str, _p: Principal = Depends(deps.user), master: Master = Depends(deps.get_master),
    db: Session = Depends(deps.get_db, scope="function"),
) -> dict[str, Any]:
    row = db.get(ResourcePool, name)
    if row is None or master.config.pool(name) is None:
        raise not_found(f"resource pool {name}")
    return {"resourcePool": pool_json(master, db, row)}


@router.get("/api/v1/resource-pools/{name}/scaling-history")
def get_scaling_history(
    name: str, limit: int = Query(scaling_history.DEFAULT_LIMIT, ge=1, le=scaling_history.MAX_LIMIT),
    _p: Principal = Depends(deps.user), master: Master = Depends(deps.get_master),
    db: Session = Depends(deps.get_db, scope="function"),
) -> dict[str, Any]:
    """The autoscaler's history of the pool, newest first, as the leader recorded it."""
    if master.config.pool(name) is None:
        raise not_found(f"resource pool {name}")
    return {"events": [event_json(e) for e in scaling_history.recent(db, name, limit)]}


def _elastic(master: Master, name: str) -> Any:
    if master.config.pool(name) is None:
        raise not_found(f"resource pool {name}")
    if master.autoscaler is None or name not in master.autoscaler.elastic_pools():
        raise bad_request(f"resource pool {name!r} has no provider to tear down", "name")
    return master.autoscaler


@router.post("/api/v1/resource-pools/{name}/teardown")
def teardown_pool(name: str, _p: Principal = Depends(deps.admin), master: Master = Depends(deps.get_master)) -> dict[str, Any]:
    """Stop launching in this pool and terminate all its instances (before deleting the pool, or
    taking the cluster down). Trials on them are requeued as infrastructure failures."""
    count = _elastic(master, name).terminate_all(name)
    master.notify()
    return {"terminated": count}


@router.post("/api/v1/resource-pools/{name}/enable")
def enable_pool(name: str, _p: Principal = Depends(deps.admin), master: Master = Depends(deps.get_master)) -> dict[str, Any]:
    _elastic(master, name).enable(name)
    master.notify()
    return {}
