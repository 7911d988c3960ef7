"""The JSON shapes of Determined's v1Experiment / trialv1Trial / v1Checkpoint, and the parsing of
the query parameters the experiment, trial, metric, log and checkpoint API shares."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from control_plane.api.wire import pagination, ts
from control_plane.core import progress
from control_plane.core import states as st
from control_plane.core.expconf import ExperimentConfig
from control_plane.core.expconf.secrets import redact_config, redact_config_text
from control_plane.core.metrics import wire_float
from control_plane.db.models import Checkpoint, Experiment, ModelDefinition, Trial, User
from control_plane.errors import bad_request
from control_plane.master import Master
from control_plane.services import checkpoints, experiments, lifecycle, pool_capacity, workspaces


def parse_states(values: Sequence[str], allowed: Iterable[str], field_name: str) -> set[str]:
    """Query-parameter states, `STATE_ACTIVE` or `ACTIVE`; unknown ones are a 400."""
    allowed = frozenset(allowed)
    out: set[str] = set()
    for v in values:
        for part in v.split(","):
            part = part.strip()
            if not part:
                continue
            name = st.state_name(part.upper())
            if name not in allowed:
                raise bad_request(f"unknown state {part!r}; expected one of {sorted(allowed)}", field_name)
            out.add(name)
    return out


def parse_order(value: str | None, field_name: str = "orderBy") -> bool:
    """True for descending."""
    if value in (None, "", "ORDER_BY_UNSPECIFIED", "ORDER_BY_ASC", "ASC", "asc"):
        return False
    if value in ("ORDER_BY_DESC", "DESC", "desc"):
        return True
    raise bad_request(f"must be ORDER_BY_ASC or ORDER_BY_DESC (got {value!r})", field_name)


def parse_choice(value: str | None, allowed: Iterable[str], field_name: str, default: str) -> str:
    if value in (None, ""):
        return default
    allowed = tuple(allowed)
    if value not in allowed:
        raise bad_request(f"unknown value {value!r}; expected one of {list(allowed)}", field_name)
    return value


def page(items: Sequence[Any], offset: int, limit: int) -> list[Any]:
    """`limit` 0 means no limit."""
    return list(items[offset : offset + limit] if limit else items[offset:])


def pagination_json(offset: int, limit: int, total: int, returned: int) -> dict[str, Any]:
    return pagination(offset, limit, total, returned).model_dump(by_alias=True)


def reject_nul(**fields: str | Sequence[str] | None) -> None:
    """PostgreSQL refuses NUL in any text parameter (a 500 if it got that far); say no first."""
    for name, value in fields.items():
        values = [value] if isinstance(value, str) else list(value or [])
        if any("\x00" in v for v in values):
            raise bad_request("must not contain NUL characters", name)


def parse_time(value: str | None, field_name: str) -> datetime | None:
    """RFC 3339 (Go's nanoseconds and Python's isoformat both); naive means UTC."""
    if value is None or value == "":
        return None
    try:
        parsed = datetime.fromisoformat(value.strip())
    except (ValueError, AttributeError):
        raise bad_request(f"must be an RFC 3339 timestamp (got {str(value)[:60]!r})", field_name) from None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


@dataclass
class ExperimentExtras:
    """Aggregates shown with an experiment, loaded for a whole page at once."""

    username: str = ""
    display_name: str = ""
    trial_ids: list[int] = field(default_factory=list)
    best_trial_id: int | None = None
    best_metric: float | None = None
    checkpoint_count: int = 0
    checkpoint_size: int = 0
    model_definition_size: int | None = None
    project_id: int = 1
    project_name: str = ""
    project_owner_id: int = 0
    workspace_id: int = 1
    workspace_name: str = ""


def experiment_extras(s: Session, exps: Sequence[Experiment]) -> dict[int, ExperimentExtras]:
    if not exps:
        return {}
    ids = [e.id for e in exps]
    out = {e.id: ExperimentExtras() for e in exps}
    users = {u.id: u for u in s.scalars(select(User).where(User.id.in_({e.owner_id for e in exps})))}
    for e in exps:
        u = users.get(e.owner_id)
        if u is not None:
            out[e.id].username = u.username
            out[e.id].display_name = u.display_name or ""
    for exp_id, trial_id in s.execute(
        select(Trial.experiment_id, Trial.id).where(Trial.experiment_id.in_(ids)).order_by(Trial.id)
    ):
        out[exp_id].trial_ids.append(trial_id)
    for exp_id, best in experiments.best_trials(s, exps).items():
        out[exp_id].best_trial_id, out[exp_id].best_metric = best.trial_id, best.metric
    ckpts = s.execute(
        select(Checkpoint.experiment_id, func.count(), func.coalesce(func.sum(Checkpoint.size_bytes), 0))
        .where(Checkpoint.experiment_id.in_(ids), Checkpoint.state.in_(st.CKPT_LIVE))
        .group_by(Checkpoint.experiment_id)
    )
    for exp_id, count, size in ckpts:
        out[exp_id].checkpoint_count = int(count)
        out[exp_id].checkpoint_size = int(size)
    sizes = s.execute(
        select(Experiment.id, ModelDefinition.size_bytes)
        .join(ModelDefinition, ModelDefinition.id == Experiment.model_definition_id)
        .where(Experiment.id.in_(ids))
    )
    for exp_id, size in sizes:
        out[exp_id].model_definition_size = int(size)
    homes = workspaces.homes(s, [e.project_id for e in exps])
    for e in exps:
        home = homes.get(e.project_id)
        if home is not None:
            x = out[e.id]
            x.project_id, x.project_name, x.project_owner_id = home.project.id, home.project.name, home.project.owner_id or 0
            x.workspace_id, x.workspace_name = home.workspace.id, home.workspace.name
    return out


def experiment_json(exp: Experiment, extra: ExperimentExtras, pending_reason: str | None = None) -> dict[str, Any]:
    searcher = ExperimentConfig.from_stored(exp.config).searcher
    duration = None
    if exp.end_time is not None:
        duration = int((exp.end_time - exp.start_time).total_seconds())  # seconds, like Determined
    return {
        "id": exp.id,
        "name": exp.name,
        "description": exp.description or "",
        "labels": list(exp.labels or []),
        "notes": exp.notes or "",
        "startTime": ts(exp.start_time),
        "endTime": ts(exp.end_time),
        "duration": duration,
        "state": st.state_name(exp.state),
        "archived": bool(exp.archived),
        "numTrials": len(extra.trial_ids),
        "trialIds": extra.trial_ids,
        "userId": exp.owner_id,
        "username": extra.username,
        "displayName": extra.display_name,
        "resourcePool": exp.resource_pool,
        "searcherType": searcher.name,
        "searcherMetric": searcher.metric,
        "jobId": exp.job_id,
        "forkedFrom": exp.parent_id,
        "progress": float(exp.progress or 0.0),
        "projectId": extra.project_id,
        "projectName": extra.project_name,
        "projectOwnerId": extra.project_owner_id,
        "workspaceId": extra.workspace_id,
        "workspaceName": extra.workspace_name,
        "parentArchived": False,
        "config": redact_config(exp.config),
        "originalConfig": redact_config_text(exp.original_config),
        "hyperparameters": exp.config.get("hyperparameters") or {},
        "checkpointSize": str(extra.checkpoint_size),
        "checkpointCount": extra.checkpoint_count,
        "bestTrialId": extra.best_trial_id,
        "bestTrialSearcherMetric": wire_float(extra.best_metric),
        "modelDefinitionSize": extra.model_definition_size,
        "unmanaged": False,
        # Shipyard extras
        "priority": exp.priority,
        "weight": exp.weight,
        "configWarnings": list(exp.warnings or []),
        # Why a queued trial of it can never be placed (its pool has no instance that large).
        "pendingReason": pending_reason,
    }


def experiments_json(s: Session, exps: Sequence[Experiment], master: Master | None = None) -> list[dict[str, Any]]:
    extras = experiment_extras(s, exps)
    reasons = pool_capacity.pending_reasons(s, master, experiment_ids=[e.id for e in exps]) if master else {}
    return [experiment_json(e, extras[e.id], reasons.get(e.id)) for e in exps]


@dataclass
class TrialCheckpoints:
    count: int = 0
    size: int = 0
    by_step: dict[int, Checkpoint] = field(default_factory=dict)


def trial_checkpoints(s: Session, trial_ids: Sequence[int]) -> dict[int, TrialCheckpoints]:
    out = {t: TrialCheckpoints() for t in trial_ids}
    if not trial_ids:
        return out
    for c in s.scalars(
        select(Checkpoint).where(Checkpoint.trial_id.in_(trial_ids), Checkpoint.state.in_(st.CKPT_LIVE))
        .order_by(Checkpoint.report_time)
    ):
        info = out[c.trial_id]  # type: ignore[index]
        info.count += 1
        info.size += c.size_bytes or 0
        info.by_step[c.steps_completed] = c
    return out


def _workload(snapshot: dict[str, Any] | None) -> dict[str, Any] | None:
    if not snapshot:
        return None
    return {
        "metrics": {"avgMetrics": snapshot.get("metrics") or {}, "batchMetrics": []},
        "numInputs": 0,
        "totalBatches": int(snapshot.get("stepsCompleted") or 0),
        "endTime": snapshot.get("reportTime"),
    }


def trial_json(trial: Trial, ckpts: TrialCheckpoints, now: datetime, pending_reason: str | None = None) -> dict[str, Any]:
    latest = trial.latest_validation or {}
    best = latest.get("best") if latest else None
    best_ckpt = None
    if best is not None:
        c = ckpts.by_step.get(int(best.get("stepsCompleted") or 0))
        if c is not None:
            best_ckpt = {
                "uuid": c.uuid,
                "state": st.checkpoint_wire_state(c.state),
                "totalBatches": c.steps_completed,
                "endTime": ts(c.report_time),
                "resources": {k: str(v) for k, v in (c.resources or {}).items()},
                "metadata": c.metadata_ or {},
            }
    end = trial.end_time or now
    return {
        "id": trial.id,
        "experimentId": trial.experiment_id,
        "startTime": ts(trial.start_time),
        "endTime": ts(trial.end_time),
        "state": st.state_name(trial.state),
        "restarts": trial.restarts,
        "hparams": trial.hparams or {},
        "totalBatchesProcessed": int(trial.steps_completed or 0),
        "bestValidation": _workload(best),
        "latestValidation": _workload({k: v for k, v in latest.items() if k != "best"} if latest else None),
        "bestCheckpoint": best_ckpt,
        "searcherMetricValue": wire_float(trial.best_validation),
        "runnerState": "",
        "wallClockTime": max(0.0, (end - trial.start_time).total_seconds()),
        "taskId": trial.task_id,
        "taskIds": [trial.task_id],
        "checkpointCount": ckpts.count,
        "totalCheckpointSize": str(ckpts.size),
        "warmStartCheckpointUuid": None,
        "metadata": {},
        # Shipyard extras
        "requestId": trial.request_id,
        "seed": trial.seed,
        "runId": trial.run_id,
        "rung": trial.rung,
        "searcherTargetLength": trial.searcher_target_length,
        "searcherClosed": bool(trial.searcher_closed),
        "progress": progress.trial_progress(lifecycle.trial_work(trial)),
        "latestCheckpointUuid": trial.latest_checkpoint_uuid,
        "exitReason": trial.exit_reason,
        # Why its queued allocation can never be placed (e.g. its pool now has smaller instances).
        "pendingReason": pending_reason,
    }


def trials_json(s: Session, trials: Sequence[Trial], now: datetime, master: Master | None = None) -> list[dict[str, Any]]:
    ckpts = trial_checkpoints(s, [t.id for t in trials])
    reasons = pool_capacity.pending_reasons(s, master, trial_ids=[t.id for t in trials]) if master else {}
    return [trial_json(t, ckpts[t.id], now, reasons.get(t.id)) for t in trials]


def checkpoint_json(c: Checkpoint, ctx: checkpoints.CheckpointContext) -> dict[str, Any]:
    trial = ctx.trials.get(c.trial_id) if c.trial_id is not None else None
    exp = ctx.experiments.get(c.experiment_id) if c.experiment_id is not None else None
    training: dict[str, Any] = {"trialId": c.trial_id, "experimentId": c.experiment_id}
    if exp is not None:
        training["experimentConfig"] = redact_config(exp.config)
    if trial is not None:
        training["hparams"] = trial.hparams or {}
    if c.trial_id is not None:
        train_doc = ctx.metrics.get((c.trial_id, "training", c.steps_completed))
        if train_doc is not None:
            training["trainingMetrics"] = {
                "avgMetrics": train_doc.get("avg_metrics") or {},
                "batchMetrics": train_doc.get("batch_metrics") or [],
            }
        validation = checkpoints.validation_metrics(c, ctx)
        if validation is not None:
            training["validationMetrics"] = {"avgMetrics": validation, "batchMetrics": []}
        training["searcherMetric"] = wire_float(checkpoints.searcher_metric(c, ctx))
    return {
        "uuid": c.uuid,
        "taskId": c.task_id,
        "allocationId": c.allocation_id,
        "reportTime": ts(c.report_time),
        "resources": {k: str(v) for k, v in (c.resources or {}).items()},
        "metadata": c.metadata_ or {},
        "state": st.checkpoint_wire_state(c.state),
        "training": training,
        "storageId": None,
        # Shipyard extras
        "stepsCompleted": c.steps_completed,
        "sizeBytes": str(c.size_bytes or 0),
    }
