"""Experiments: creating one (config, model definition, the searcher's first trials), changing
its description and labels, archiving, deleting, and finding them.

Everything runs in the caller's transaction: a refused request raises a domain error before or
after writing, and the caller's rollback leaves no row behind either way.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Select, delete, func, select, update
from sqlalchemy.orm import Session

from control_plane.auth import Principal
from control_plane.core import states as st
from control_plane.core.expconf import (
    ConfigInvalid,
    ExperimentConfig,
    config_to_dict,
    parse_experiment_config,
)
from control_plane.core.expconf.defaults import merge_storage
from control_plane.core.expconf.secrets import PLACEHOLDER, redacted_left
from control_plane.core.host_access import host_access_refusal
from control_plane.core.metrics import better
from control_plane.core.rbac import Perm
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
from control_plane.errors import FieldProblem, Invalid, bad_request, conflict, not_found
from control_plane.master import Master
from control_plane.services import (
    access,
    authz,
    lifecycle,
    pool_bindings,
    pool_capacity,
    templates,
    workspaces,
)
from control_plane.services.metrics import searcher_goal
from control_plane.services.text import clean_text
from shipyard_common.model_def import (
    ModelDefInvalid,
    ModelFile,
    pack_model_definition,
    validate_model_definition,
)

log = logging.getLogger("shipyard.experiments")

NAME_MAX = 255
LABEL_MAX = 255


# -- create ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class NewExperiment:
    """What a user submits: the config as YAML text and the model definition as v1File entries."""

    config_text: str | None
    model_definition: Sequence[dict[str, Any]] = ()
    activate: bool = True
    parent_id: int | None = None
    project_id: int | None = None  # None: Uncategorized
    template: str | None = None  # a config template to merge under the config


@dataclass(frozen=True)
class ValidatedExperiment:
    config: ExperimentConfig
    config_dict: dict[str, Any]  # the fully defaulted config, as stored
    warnings: list[str]
    files: list[ModelFile]
    archive: bytes
    project_id: int = workspaces.DEFAULT_PROJECT_ID


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


def validate(s: Session, master: Master, new: NewExperiment) -> ValidatedExperiment:
    """Everything that can refuse a submission, checked before anything is written."""
    if new.config_text is None or new.config_text.strip() == "":
        raise bad_request("an experiment config (YAML text) is required", "config")
    if _has_surrogates(new.config_text):
        # What a client sends when it decoded non-UTF-8 bytes with surrogateescape.
        raise bad_request("is not valid UTF-8 text", "config")
    if new.parent_id is not None and s.get(Experiment, new.parent_id) is None:
        raise bad_request(f"experiment {new.parent_id} does not exist", "parentId")
    home = workspaces.home_for_new_experiment(s, new.project_id)
    ws = home.workspace

    try:
        text = templates.apply(s, new.template, new.config_text) if new.template else new.config_text
        cfg, warnings = parse_experiment_config(
            text,
            # Determined's order: the config, then its workspace's storage, then the master's.
            default_checkpoint_storage=merge_storage(ws.checkpoint_storage, master.config.default_checkpoint_storage),
            default_resource_pool=ws.default_compute_pool or master.config.default_resource_pool,
            experiment_seed=secrets.randbelow(2**31),
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
    pool_bindings.require_usable(s, pool.name, ws.id, "config.resources.resource_pool")
    if pool.max_slots_per_agent is not None and cfg.resources.slots_per_trial > pool.max_slots_per_agent:
        raise bad_request(
            f"{cfg.resources.slots_per_trial} slots per trial cannot fit on one agent of pool {pool.name!r} "
            f"(at most {pool.max_slots_per_agent})",
            "config.resources.slots_per_trial",
        )
    unservable = pool_capacity.unservable_reason(s, master, pool.name, cfg.resources.slots_per_trial)
    if unservable is not None:
        raise bad_request(unservable, "config.resources.slots_per_trial")
    if not master.config.allow_task_host_access:
        # On the merged config: the user's, the template's and the workspace's storage alike.
        refused = host_access_refusal(cfg, master.config.default_checkpoint_storage)
        if refused is not None:
            raise bad_request(refused.reason, refused.field)
    if cfg.name is not None and len(cfg.name) > NAME_MAX:
        raise bad_request(f"must be at most {NAME_MAX} characters", "config.name")

    try:
        files = validate_model_definition(list(new.model_definition), max_bytes=master.config.model_def_max_bytes)
        archive = pack_model_definition(files)
    except ModelDefInvalid as e:
        raise Invalid(f"{e.path}: {e.reason}", [FieldProblem(e.path, e.reason)]) from None
    config = config_to_dict(cfg)
    if (left := redacted_left(config)) is not None:  # a config shown back (secrets hidden) and sent again
        raise bad_request(PLACEHOLDER, f"config.{left}")
    return ValidatedExperiment(cfg, config, list(warnings), files, archive, home.project.id)


def create(s: Session, master: Master, owner: Principal, new: NewExperiment) -> tuple[Experiment, ValidatedExperiment]:
    """Store the experiment and its model definition, and let the searcher create its first
    trials (services/lifecycle). Returns the row and what validation made of the submission."""
    v = validate(s, master, new)
    access.require_permission(s, owner, Perm.CREATE_EXPERIMENT, what=f"project {v.project_id}",
                              workspace_id=authz.workspace_of_project(s, v.project_id))
    md = ModelDefinition(
        archive=v.archive,
        size_bytes=len(v.archive),
        sha256=hashlib.sha256(v.archive).hexdigest(),
        file_count=len(v.files),
    )
    s.add(md)
    s.flush()
    exp = Experiment(
        name=v.config.name or "",
        description=v.config.description or "",
        notes="",
        labels=list(dict.fromkeys(v.config.labels)),
        config=v.config_dict,
        original_config=new.config_text,
        state=st.ExperimentState.ACTIVE if new.activate else st.ExperimentState.PAUSED,
        owner_id=owner.user_id,
        archived=False,
        model_definition_id=md.id,
        project_id=v.project_id,
        parent_id=new.parent_id,
        resource_pool=v.config.resources.resource_pool,
        priority=v.config.resources.priority,
        weight=v.config.resources.weight,
        job_id=str(uuid.uuid4()),
        progress=0.0,
        warnings=list(v.warnings),
        start_time=master.clock(),
    )
    s.add(exp)
    s.flush()
    if not exp.name:
        exp.name = f"Experiment {exp.id}"
    lifecycle.on_experiment_created(s, master, exp)
    s.flush()
    s.refresh(exp)
    log.info(
        "event=experiment_created experiment_id=%s owner=%s pool=%s searcher=%s state=%s",
        exp.id, owner.username, exp.resource_pool, v.config_dict["searcher"]["name"], exp.state,
    )
    return exp, v


def model_definition(s: Session, exp: Experiment) -> bytes:
    """The experiment's model definition as the .tar.gz the harness unpacks."""
    md = s.get(ModelDefinition, exp.model_definition_id)
    if md is None:
        raise not_found("model definition")
    return md.archive


# -- changes ---------------------------------------------------------------------------------------
def check_label(label: str, field_name: str) -> str:
    if not label or not label.strip():
        raise bad_request("a label must not be empty", field_name)
    if len(label) > LABEL_MAX:
        raise bad_request(f"a label must be at most {LABEL_MAX} characters", field_name)
    if "\x00" in label:
        raise bad_request("a label must not contain NUL characters", field_name)
    return label


@dataclass(frozen=True)
class ExperimentEdit:
    """The user-editable fields; None leaves a field as it is."""

    name: str | None = None
    description: str | None = None
    notes: str | None = None
    labels: list[str] | None = None


def edit(s: Session, exp: Experiment, change: ExperimentEdit) -> None:
    if change.name is not None:
        if not change.name.strip():
            raise bad_request("must not be empty", "name")
        exp.name = clean_text(change.name)
    if change.description is not None:
        exp.description = clean_text(change.description)
    if change.notes is not None:
        exp.notes = clean_text(change.notes)
    if change.labels is not None:
        exp.labels = list(dict.fromkeys(check_label(x, f"labels[{i}]") for i, x in enumerate(change.labels)))
    s.flush()


def add_label(exp: Experiment, label: str) -> list[str]:
    check_label(label, "label")
    if label not in (exp.labels or []):
        exp.labels = [*(exp.labels or []), label]
    return list(exp.labels)


def remove_label(exp: Experiment, label: str) -> list[str]:
    exp.labels = [x for x in (exp.labels or []) if x != label]
    return list(exp.labels)


def archive(exp: Experiment) -> None:
    if exp.state not in st.EXP_TERMINAL:
        raise conflict(f"experiment {exp.id} is {exp.state}; only a finished experiment can be archived")
    exp.archived = True


def unarchive(exp: Experiment) -> None:
    exp.archived = False


def delete_experiment(s: Session, master: Master, exp: Experiment, by: Principal) -> None:
    """Removes the experiment, its trials, metrics, logs and model definition. Its checkpoints
    stay as rows in state STATE_DELETING for the checkpoint GC worker, which deletes the files
    (the row keeps the storage config) and then marks them STATE_DELETED. The caller holds the
    experiment's row lock."""
    if exp.state not in st.EXP_TERMINAL:
        raise conflict(f"experiment {exp.id} is {exp.state}; only a finished experiment can be deleted")
    live = s.scalar(
        select(func.count()).where(Allocation.experiment_id == exp.id, Allocation.state.in_(st.ALLOC_LIVE))
    )
    if live:
        raise conflict(f"experiment {exp.id} still has {live} running allocations")
    registered = list(
        s.scalars(
            select(ModelVersion.checkpoint_uuid)
            .join(Checkpoint, Checkpoint.uuid == ModelVersion.checkpoint_uuid)
            .where(Checkpoint.experiment_id == exp.id)
        )
    )
    if registered:
        raise conflict(
            f"experiment {exp.id} has checkpoints registered in the model registry: {sorted(set(registered))}"
        )

    exp_id = exp.id
    trials = list(s.execute(select(Trial.id, Trial.task_id).where(Trial.experiment_id == exp_id)))
    trial_ids = [t for t, _ in trials]
    task_ids = {task for _, task in trials}
    task_ids.update(s.scalars(select(Allocation.task_id).where(Allocation.experiment_id == exp_id)))
    now = master.clock()
    s.execute(
        update(Checkpoint)
        .where(Checkpoint.experiment_id == exp_id, Checkpoint.state.not_in(st.CKPT_GONE))
        .values(state=st.CheckpointState.DELETING)
    )
    s.execute(update(Checkpoint).where(Checkpoint.experiment_id == exp_id).values(trial_id=None))
    if trial_ids:
        s.execute(delete(Metric).where(Metric.trial_id.in_(trial_ids)))
        s.execute(
            update(Token).where(Token.trial_id.in_(trial_ids), Token.revoked_at.is_(None)).values(revoked_at=now)
        )
    if task_ids:
        s.execute(delete(TaskLog).where(TaskLog.task_id.in_(task_ids)))
    s.execute(delete(Allocation).where(Allocation.experiment_id == exp_id))
    s.execute(delete(Trial).where(Trial.experiment_id == exp_id))
    md_id = exp.model_definition_id
    s.delete(exp)
    s.flush()
    if s.scalar(select(func.count()).where(Experiment.model_definition_id == md_id)) == 0:
        s.execute(delete(ModelDefinition).where(ModelDefinition.id == md_id))
    master.notify(s)
    log.info("event=experiment_deleted experiment_id=%s trials=%s by=%s", exp_id, len(trial_ids), by.username)


# -- queries ---------------------------------------------------------------------------------------
SORTS = (
    "SORT_BY_UNSPECIFIED", "SORT_BY_ID", "SORT_BY_DESCRIPTION", "SORT_BY_START_TIME", "SORT_BY_END_TIME",
    "SORT_BY_STATE", "SORT_BY_NUM_TRIALS", "SORT_BY_PROGRESS", "SORT_BY_USER", "SORT_BY_NAME",
    "SORT_BY_FORKED_FROM", "SORT_BY_RESOURCE_POOL", "SORT_BY_PROJECT_ID", "SORT_BY_CHECKPOINT_SIZE",
    "SORT_BY_CHECKPOINT_COUNT", "SORT_BY_SEARCHER_METRIC_VAL",
)


@dataclass
class ExperimentFilter:
    """Which experiments a list shows; empty lists and None mean "any"."""

    archived: bool | None = None
    states: set[str] = field(default_factory=set)
    labels: list[str] = field(default_factory=list)
    usernames: list[str] = field(default_factory=list)
    user_ids: list[int] = field(default_factory=list)
    name: str | None = None
    description: str | None = None
    id_gt: int | None = None
    id_gte: int | None = None
    id_lt: int | None = None
    id_lte: int | None = None
    id_in: list[int] = field(default_factory=list)
    id_not_in: list[int] = field(default_factory=list)
    project_id: int | None = None  # None or 0: every project


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
        "SORT_BY_PROJECT_ID": Experiment.project_id,
        "SORT_BY_CHECKPOINT_SIZE": ckpt_size,
        "SORT_BY_CHECKPOINT_COUNT": ckpt_count,
    }.get(sort_by, Experiment.id)


def _filtered(s: Session, flt: ExperimentFilter) -> Select[tuple[Experiment]]:
    q = select(Experiment)
    if flt.archived is not None:
        q = q.where(Experiment.archived == flt.archived)
    if flt.states:
        q = q.where(Experiment.state.in_(flt.states))
    if flt.name:
        q = q.where(func.lower(Experiment.name).contains(flt.name.lower(), autoescape=True))
    if flt.description:
        q = q.where(func.lower(Experiment.description).contains(flt.description.lower(), autoescape=True))
    if flt.user_ids:
        q = q.where(Experiment.owner_id.in_(flt.user_ids))
    if flt.usernames:
        q = q.where(Experiment.owner_id.in_(select(User.id).where(User.username.in_(flt.usernames))))
    if flt.id_gt is not None:
        q = q.where(Experiment.id > flt.id_gt)
    if flt.id_gte is not None:
        q = q.where(Experiment.id >= flt.id_gte)
    if flt.id_lt is not None:
        q = q.where(Experiment.id < flt.id_lt)
    if flt.id_lte is not None:
        q = q.where(Experiment.id <= flt.id_lte)
    if flt.id_in:
        q = q.where(Experiment.id.in_(flt.id_in))
    if flt.id_not_in:
        q = q.where(Experiment.id.not_in(flt.id_not_in))
    if flt.project_id:
        q = q.where(Experiment.project_id == flt.project_id)
    if flt.labels:
        # Labels live in a JSON list; match them here rather than with dialect-specific JSON SQL.
        wanted = set(flt.labels)
        ids = [i for i, ls in s.execute(q.with_only_columns(Experiment.id, Experiment.labels))
               if wanted <= set(ls or [])]
        q = q.where(Experiment.id.in_(ids))
    return q


def count_experiments(s: Session, flt: ExperimentFilter) -> int:
    return s.scalar(select(func.count()).select_from(_filtered(s, flt).subquery())) or 0


def list_experiments(
    s: Session, flt: ExperimentFilter, *, sort_by: str, desc: bool, offset: int, limit: int
) -> list[Experiment]:
    """One page of the filtered experiments; `limit` 0 = all. By the searcher metric, experiments
    without one come last whichever the direction."""
    q = _filtered(s, flt)
    if sort_by == "SORT_BY_SEARCHER_METRIC_VAL":
        exps = list(s.scalars(q))
        best = best_trials(s, exps)
        with_metric = [e for e in exps if e.id in best]
        with_metric.sort(key=lambda e: (best[e.id].metric, e.id), reverse=desc)
        ordered = with_metric + [e for e in exps if e.id not in best]
        return ordered[offset : offset + limit] if limit else ordered[offset:]
    col = _sort_column(sort_by)
    key = col.desc() if desc else col.asc()
    if sort_by == "SORT_BY_END_TIME":
        key = key.nulls_last()
    q = q.order_by(key, Experiment.id.desc() if desc else Experiment.id.asc()).offset(offset)
    if limit:
        q = q.limit(limit)
    return list(s.scalars(q))


@dataclass(frozen=True)
class BestTrial:
    trial_id: int
    metric: float


def best_trials(s: Session, exps: Sequence[Experiment]) -> dict[int, BestTrial]:
    """Each experiment's trial with the best searcher metric (the first one on a tie); experiments
    without a validated trial are absent."""
    smaller = {e.id: searcher_goal(e.config).smaller_is_better for e in exps}
    out: dict[int, BestTrial] = {}
    if not exps:
        return out
    rows = s.execute(
        select(Trial.experiment_id, Trial.id, Trial.best_validation)
        .where(Trial.experiment_id.in_(smaller), Trial.best_validation.is_not(None))
        .order_by(Trial.id)
    )
    for exp_id, trial_id, value in rows:
        current = out.get(exp_id)
        if better(value, current.metric if current else None, smaller[exp_id]):
            out[exp_id] = BestTrial(trial_id, value)
    return out


@dataclass(frozen=True)
class JobSummary:
    """Where an unfinished experiment's allocations stand in its pool's queue."""

    scheduled: bool
    jobs_ahead: int
    requested_slots: int
    allocated_slots: int


def job_summary(s: Session, exp: Experiment) -> JobSummary | None:
    if exp.state in st.EXP_TERMINAL:
        return None
    allocs = list(
        s.scalars(select(Allocation).where(Allocation.experiment_id == exp.id, Allocation.state.in_(st.ALLOC_LIVE)))
    )
    requested = sum(a.slots_needed for a in allocs)
    allocated = sum(a.slots_needed for a in allocs if a.state in st.ALLOC_ON_AGENT)
    pending = [a for a in allocs if a.state == st.AllocationState.PENDING]
    jobs_ahead = 0
    if pending:
        first = min(a.created_at for a in pending)
        jobs_ahead = s.scalar(
            select(func.count(func.distinct(Allocation.experiment_id))).where(
                Allocation.pool == exp.resource_pool,
                Allocation.state == st.AllocationState.PENDING,
                Allocation.created_at < first,
                Allocation.experiment_id != exp.id,
            )
        ) or 0
    return JobSummary(bool(allocated), int(jobs_ahead), requested, allocated)
