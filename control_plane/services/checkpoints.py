"""Checkpoint metadata: reports from trials, deletion requests, shrinking and user metadata.

The master never touches checkpoint files here. A deletion moves rows to STATE_DELETING; the
checkpoint GC loop deletes the files using the storage config kept on the row and then sets
STATE_DELETED. Checkpoints held by a model version are never deleted (Determined's rule).
"""

from __future__ import annotations

import logging
import math
import uuid as uuidlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from control_plane.auth import Principal, TokenKind
from control_plane.core import metrics as metric_values
from control_plane.core import states as st
from control_plane.db.models import Allocation, Checkpoint, Experiment, Metric, ModelVersion, Trial
from control_plane.errors import Conflict, FieldProblem, Invalid, bad_request, conflict, forbidden, not_found
from control_plane.master import Master
from control_plane.services import access, authz, checkpoint_gc, lifecycle
from control_plane.services.metrics import searcher_goal

log = logging.getLogger("shipyard.checkpoints")

REPORTABLE_STATES = (st.CheckpointState.ACTIVE, st.CheckpointState.COMPLETED, st.CheckpointState.ERROR)


# -- checked values --------------------------------------------------------------------------------
_INT64_MAX = 2**63 - 1  # BigInteger columns (sizes, steps): beyond it the database refuses the row


def canonical_uuid(value: str, field: str) -> str:
    # The uuid names the checkpoint's folder in storage, which GC deletes: only a real UUID.
    try:
        return str(uuidlib.UUID(value))
    except ValueError:
        raise bad_request(f"must be a UUID (got {value[:64]!r})", field) from None


def reportable_state(value: str) -> str:
    state = st.state_name(value)
    if state not in REPORTABLE_STATES:
        raise bad_request(f"must be one of {list(REPORTABLE_STATES)} (got {value!r})", "state")
    return state


def checked_resources(raw: dict[str, int | str], field: str) -> dict[str, int]:
    """A checkpoint's file list: relative paths inside the checkpoint → sizes in bytes."""
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
        if n < 0 or n > _INT64_MAX:
            raise bad_request(f"size must be between 0 and {_INT64_MAX} (got {n})", where)
        out[path] = n
    if sum(out.values()) > _INT64_MAX:  # the checkpoint's size_bytes is a BigInteger column
        raise bad_request(f"sizes add up to more than {_INT64_MAX} bytes", field)
    return out


def steps_of(metadata: dict[str, Any]) -> int:
    value = metadata.get("steps_completed")
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _INT64_MAX:
        raise bad_request(
            "a reported checkpoint needs metadata.steps_completed, a non-negative integer", "metadata.steps_completed"
        )
    return value


# -- report ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CheckpointReport:
    """A checked report (build it with the functions above). The trial is named by any of
    `trial_id`, `task_id`, `allocation_id` or the reporting allocation's token; they must agree."""

    uuid: str
    state: str
    resources: dict[str, int]
    steps_completed: int
    metadata: dict[str, Any]
    report_time: datetime | None = None
    task_id: str | None = None
    allocation_id: str | None = None
    trial_id: int | None = None
    experiment_id: int | None = None


def _resolve_trial(s: Session, p: Principal, report: CheckpointReport) -> Trial:
    """The trial a report belongs to, from every place that names it; they must agree."""
    named: dict[str, int] = {}
    if report.trial_id is not None:
        named["training.trialId"] = report.trial_id
    if report.task_id:
        tid = s.scalar(select(Trial.id).where(Trial.task_id == report.task_id))
        if tid is None:
            raise bad_request(f"no trial runs as task {report.task_id!r}", "taskId")
        named["taskId"] = tid
    if report.allocation_id:
        alloc = s.get(Allocation, report.allocation_id)
        if alloc is None or alloc.trial_id is None:
            raise bad_request(f"no trial allocation {report.allocation_id!r}", "allocationId")
        named["allocationId"] = alloc.trial_id
    if p.kind is TokenKind.ALLOCATION and p.trial_id is not None and not named:
        named["(token)"] = p.trial_id
    if not named:
        raise bad_request("a checkpoint must name its trial (training.trialId, taskId or allocationId)", "training.trialId")
    ids = set(named.values())
    if len(ids) > 1:
        detail = ", ".join(f"{k} → trial {v}" for k, v in named.items())
        raise bad_request(f"the report names different trials ({detail})", next(iter(named)))
    return access.get_trial(s, ids.pop())


def reporting_trial(s: Session, p: Principal, report: CheckpointReport) -> tuple[Trial, Experiment]:
    """The report's trial and its experiment, the experiment row locked (the lock order of metric
    reports and the lifecycle: experiment, then trial — `record` locks the trial)."""
    trial = _resolve_trial(s, p, report)
    exp = access.get_experiment(s, trial.experiment_id, for_update=True)
    if report.experiment_id not in (None, exp.id):
        raise bad_request(f"trial {trial.id} belongs to experiment {exp.id}", "training.experimentId")
    return trial, exp


def record(s: Session, master: Master, trial: Trial, exp: Experiment, report: CheckpointReport,
           allocation_id: str | None) -> Checkpoint | None:
    """Store a reported checkpoint; a retried report of the same trial is a no-op (None). A
    completed checkpoint at the trial's highest step becomes its latest."""
    trial = access.get_trial(s, trial.id, for_update=True)
    existing = s.get(Checkpoint, report.uuid)
    if existing is not None:
        if existing.trial_id == trial.id or (existing.trial_id is None and existing.experiment_id == exp.id):
            return None
        raise conflict(f"checkpoint {report.uuid} was reported by another trial")

    ckpt = Checkpoint(
        uuid=report.uuid,
        trial_id=trial.id,
        experiment_id=exp.id,
        task_id=report.task_id or trial.task_id,
        allocation_id=report.allocation_id or allocation_id,
        state=report.state,
        report_time=report.report_time or master.clock(),
        steps_completed=report.steps_completed,
        resources=report.resources,
        metadata_=metric_values.json_safe(report.metadata),
        storage=exp.config.get("checkpoint_storage") or {},
        size_bytes=sum(report.resources.values()),
    )
    s.add(ckpt)
    s.flush()
    if report.state == st.CheckpointState.COMPLETED:
        latest = s.get(Checkpoint, trial.latest_checkpoint_uuid) if trial.latest_checkpoint_uuid else None
        if latest is None or report.steps_completed >= latest.steps_completed:
            trial.latest_checkpoint_uuid = report.uuid
    lifecycle.on_checkpoint_reported(s, master, ckpt)
    log.info("event=checkpoint_reported uuid=%s trial_id=%s steps=%s size=%s",
             report.uuid, trial.id, report.steps_completed, ckpt.size_bytes)
    return ckpt


# -- read ------------------------------------------------------------------------------------------
def get_checkpoint(s: Session, value: str) -> Checkpoint:
    try:
        key = str(uuidlib.UUID(value))
    except ValueError:
        raise not_found(f"checkpoint {value[:64]!r}") from None
    ckpt = s.get(Checkpoint, key)
    if ckpt is None:
        raise not_found(f"checkpoint {key}")
    return ckpt


def require_read(p: Principal, ckpt: Checkpoint) -> None:
    if p.kind is TokenKind.USER:
        return
    if p.kind is TokenKind.ALLOCATION and ckpt.trial_id is not None and p.trial_id == ckpt.trial_id:
        return
    raise forbidden("this token cannot read this checkpoint")


# -- read models and lists -----------------------------------------------------------------------
@dataclass
class CheckpointContext:
    """What a checkpoint's JSON needs besides its row: its trial, experiment and the metrics
    reported at its step."""

    trials: dict[int, Trial] = field(default_factory=dict)
    experiments: dict[int, Experiment] = field(default_factory=dict)
    # (trial id, group, step) -> stored metrics document
    metrics: dict[tuple[int, str, int], dict[str, Any]] = field(default_factory=dict)


def context(s: Session, ckpts: Sequence[Checkpoint]) -> CheckpointContext:
    ctx = CheckpointContext()
    trial_ids = {c.trial_id for c in ckpts if c.trial_id is not None}
    if trial_ids:
        ctx.trials = {t.id: t for t in s.scalars(select(Trial).where(Trial.id.in_(trial_ids)))}
    exp_ids = {c.experiment_id for c in ckpts if c.experiment_id is not None}
    if exp_ids:
        ctx.experiments = {e.id: e for e in s.scalars(select(Experiment).where(Experiment.id.in_(exp_ids)))}
    steps = {c.steps_completed for c in ckpts if c.trial_id is not None}
    if trial_ids and steps:
        rows = s.scalars(
            select(Metric).where(
                Metric.trial_id.in_(trial_ids),
                Metric.group_name.in_(("training", "validation")),
                Metric.steps_completed.in_(steps),
            )
        )
        for m in rows:
            ctx.metrics[(m.trial_id, m.group_name, m.steps_completed)] = m.metrics
    return ctx


def validation_metrics(c: Checkpoint, ctx: CheckpointContext) -> dict[str, Any] | None:
    """The validation metrics reported at the checkpoint's step, if any."""
    if c.trial_id is None:
        return None
    doc = ctx.metrics.get((c.trial_id, "validation", c.steps_completed))
    return None if doc is None else doc.get("validation_metrics") or doc.get("avg_metrics") or {}


def searcher_metric(c: Checkpoint, ctx: CheckpointContext) -> float | None:
    """The experiment's searcher metric at the checkpoint's step, if reported."""
    exp = ctx.experiments.get(c.experiment_id) if c.experiment_id is not None else None
    validation = validation_metrics(c, ctx)
    if exp is None or validation is None:
        return None
    metric = searcher_goal(exp.config).metric
    return metric_values.metric_number(validation.get(metric)) if metric else None


SORTS = (
    "SORT_BY_UNSPECIFIED", "SORT_BY_UUID", "SORT_BY_TRIAL_ID", "SORT_BY_BATCH_NUMBER", "SORT_BY_END_TIME",
    "SORT_BY_STATE", "SORT_BY_SEARCHER_METRIC",
)


def of_experiment(s: Session, experiment_id: int) -> list[Checkpoint]:
    return list(s.scalars(select(Checkpoint).where(Checkpoint.experiment_id == experiment_id)))


def of_trial(s: Session, trial_id: int) -> list[Checkpoint]:
    return list(s.scalars(select(Checkpoint).where(Checkpoint.trial_id == trial_id)))


def with_wire_states(ckpts: list[Checkpoint], states: set[str]) -> list[Checkpoint]:
    """Those whose state as shown (STATE_DELETING shows as STATE_DELETED) is one of `states`."""
    return [c for c in ckpts if st.checkpoint_wire_state(c.state) in states] if states else ckpts


def ordered(ckpts: list[Checkpoint], ctx: CheckpointContext, *, attr: str, metric: str | None,
            desc: bool | None) -> list[Checkpoint]:
    """By one of `SORTS` or by a validation metric's value; by a metric, checkpoints without one
    (or with NaN) come last in either direction. `desc` None: ascending, except by the searcher
    metric, which then puts the best first whichever direction "best" is."""

    def metric_key(c: Checkpoint) -> float | None:
        if metric:
            value = metric_values.metric_number((validation_metrics(c, ctx) or {}).get(metric))
        else:
            value = searcher_metric(c, ctx)
        return None if value is None or math.isnan(value) else value

    if metric or attr == "SORT_BY_SEARCHER_METRIC":
        if attr == "SORT_BY_SEARCHER_METRIC" and desc is None:
            smaller = all(
                searcher_goal(e.config).smaller_is_better for e in ctx.experiments.values()
            ) if ctx.experiments else True
            desc = not smaller
        keyed = [(metric_key(c), c) for c in ckpts]
        present = sorted(((k, c) for k, c in keyed if k is not None), key=lambda kc: (kc[0], kc[1].uuid),
                         reverse=bool(desc))
        return [c for _, c in present] + [c for k, c in keyed if k is None]

    def key(c: Checkpoint) -> Any:
        return {
            "SORT_BY_UUID": (c.uuid,),
            "SORT_BY_TRIAL_ID": (c.trial_id or 0, c.uuid),
            "SORT_BY_BATCH_NUMBER": (c.steps_completed, c.uuid),
            "SORT_BY_STATE": (st.checkpoint_wire_state(c.state), c.uuid),
        }.get(attr, (c.report_time, c.uuid))

    return sorted(ckpts, key=key, reverse=bool(desc))


# -- changes ---------------------------------------------------------------------------------------
def owned_checkpoints(s: Session, p: Principal, uuids: list[str], field: str) -> list[Checkpoint]:
    """Load and lock the named checkpoints, each of which `p` must own (through its experiment)
    or, for one without an experiment, be an admin. In request order, without repeats."""
    keys = [canonical_uuid(value, f"{field}[{i}]") for i, value in enumerate(uuids)]
    found = {c.uuid: c for c in s.scalars(select(Checkpoint).where(Checkpoint.uuid.in_(keys)).with_for_update())}
    exp_ids = {c.experiment_id for c in found.values() if c.experiment_id is not None}
    exps = {e.id: e for e in s.scalars(select(Experiment).where(Experiment.id.in_(exp_ids)))}
    for c in found.values():  # authorized first: the 404 below is for those who may change the rest
        exp = exps.get(c.experiment_id) if c.experiment_id is not None else None
        if exp is None:
            if not authz.is_cluster_admin(s, p):
                raise forbidden(f"checkpoint {c.uuid} has no experiment; only an admin can change it")
            continue
        access.require_owner(p, exp)
    missing = [k for k in keys if k not in found]
    if missing:
        raise not_found(f"checkpoints {missing}")
    return [found[k] for k in dict.fromkeys(keys)]


def refuse_registered(s: Session, ckpts: list[Checkpoint]) -> None:
    """A 400 naming each checkpoint held by a model version: their files are never deleted."""
    registered = sorted(set(s.scalars(
        select(ModelVersion.checkpoint_uuid).where(ModelVersion.checkpoint_uuid.in_([c.uuid for c in ckpts]))
    )))
    if registered:
        raise Invalid(f"these checkpoints are in the model registry and cannot be deleted: {registered}",
            [FieldProblem("checkpointUuids", f"{u} is registered in the model registry") for u in registered],
        )


def request_deletion(s: Session, master: Master, ckpts: list[Checkpoint], by: Principal) -> int:
    """Mark the checkpoints for the GC loop (STATE_DELETING); refuses, changing nothing, if any is
    in the model registry. A trial whose latest checkpoint goes falls back to its newest remaining
    completed one. Returns how many were newly marked."""
    refuse_registered(s, ckpts)
    marked = 0
    for c in ckpts:
        if c.state not in st.CKPT_GONE:
            c.state = st.CheckpointState.DELETING
            marked += 1
    doomed = {c.uuid for c in ckpts}
    trial_ids = {c.trial_id for c in ckpts if c.trial_id is not None}
    for trial in s.scalars(select(Trial).where(Trial.id.in_(trial_ids))):
        if trial.latest_checkpoint_uuid in doomed:
            trial.latest_checkpoint_uuid = s.scalar(
                select(Checkpoint.uuid)
                .where(Checkpoint.trial_id == trial.id, Checkpoint.state == st.CheckpointState.COMPLETED)
                .order_by(Checkpoint.steps_completed.desc(), Checkpoint.report_time.desc())
                .limit(1)
            )
    master.notify(s)
    log.info("event=checkpoints_delete_requested count=%s marked=%s by=%s", len(ckpts), marked, by.username)
    return marked


def set_resources(ckpt: Checkpoint, resources: dict[str, int]) -> None:
    """Determined's semantics: no files left → the checkpoint is deleted; otherwise its file list
    (and size) shrink to what is left."""
    if not resources:
        ckpt.state, ckpt.resources, ckpt.size_bytes = st.CheckpointState.DELETED, {}, 0
        return
    if set(resources) < set(ckpt.resources or {}):
        ckpt.state = st.CheckpointState.PARTIALLY_DELETED
    ckpt.resources, ckpt.size_bytes = resources, sum(resources.values())


def require_metadata_writer(s: Session, p: Principal, ckpt: Checkpoint) -> None:
    """The checkpoint's own trial, its experiment's owner, or an admin."""
    exp = s.get(Experiment, ckpt.experiment_id) if ckpt.experiment_id is not None else None
    if p.kind is TokenKind.ALLOCATION:
        if ckpt.trial_id is None or p.trial_id != ckpt.trial_id:
            raise forbidden("this token belongs to another trial")
    elif exp is not None:
        access.require_owner(p, exp)
    elif not authz.is_cluster_admin(s, p):
        raise forbidden("only an admin can change this checkpoint")


def set_metadata(ckpt: Checkpoint, metadata: dict[str, Any]) -> dict[str, Any]:
    ckpt.metadata_ = metric_values.json_safe(metadata)
    return ckpt.metadata_


def collect_garbage(s: Session, master: Master, exp: Experiment) -> list[str]:
    """Apply the experiment's checkpoint GC policy now (`det experiment gc`); the uuids marked."""
    if exp.state not in st.EXP_TERMINAL:
        raise Conflict("checkpoint GC runs on ended experiments only")
    doomed = checkpoint_gc.mark_for_gc(s, exp)
    master.notify(s)
    return doomed
