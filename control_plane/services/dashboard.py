"""What the web UI (control_plane/ui) shows: read-only views over the record, each one a few
indexed queries, shaped for a page.

Writes the UI makes (pause, kill, labels, ...) go through the same services as the API; this
module only reads. Metric series are read as (step, value) pairs straight from the JSON column,
never as ORM rows, and downsampled with LTTB (core/downsample.py) before they leave the master."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import yaml
from sqlalchemy import Text, cast, func, literal, select
from sqlalchemy.orm import Session

from control_plane.core import states as st
from control_plane.core.downsample import lttb
from control_plane.core.expconf import ExperimentConfig
from control_plane.core.expconf.secrets import redact_config
from control_plane.core.timeline import Interval, step_series
from control_plane.db.models import (
    Agent,
    Allocation,
    Checkpoint,
    Experiment,
    Instance,
    Metric,
    Model,
    ModelVersion,
    Project,
    ResourcePool,
    ScalingEvent,
    Trial,
    User,
)
from control_plane.master import Master
from control_plane.services import (
    checkpoints,
    consolidation,
    experiments,
    gangs,
    jobs,
    models,
    scaling_history,
)
from control_plane.services.metrics import VALIDATION, searcher_goal
from control_plane.services.pool_settings import effective_pool
from shipyard_common import clouds

# -- experiments ---------------------------------------------------------------------------------
SORTS = ("id", "name", "state", "start", "progress", "owner")
PAGE_SIZES = (25, 50, 100)


@dataclass(frozen=True)
class ExperimentQuery:
    """The experiments list's filters, sort and page, as the page's query string gives them."""

    state: str | None = None  # a state name (STATE_ACTIVE) or None
    label: str | None = None
    owner: str | None = None  # a username
    name: str | None = None  # a part of the name, any case
    archived: bool = False  # show archived experiments too
    workspace_id: int | None = None  # the experiments of this workspace's projects only
    project_id: int | None = None
    sort: str = "id"
    desc: bool = True
    offset: int = 0
    limit: int = 50


@dataclass(frozen=True)
class ExperimentRow:
    id: int
    name: str
    state: str
    progress: float
    owner: str
    labels: list[str]
    searcher: str
    metric: str | None
    best_metric: float | None
    best_trial_id: int | None
    trials: int
    start_time: datetime
    end_time: datetime | None
    duration_s: float
    archived: bool


def _sort_column(sort: str) -> Any:
    return {
        "name": Experiment.name,
        "state": Experiment.state,
        "start": Experiment.start_time,
        "progress": Experiment.progress,
        "owner": select(User.username).where(User.id == Experiment.owner_id).scalar_subquery(),
    }.get(sort, Experiment.id)


def _experiment_filter(q: ExperimentQuery) -> list[Any]:
    where: list[Any] = []
    if not q.archived:
        where.append(Experiment.archived.is_(False))
    if q.state:
        where.append(Experiment.state == q.state)
    if q.name:
        where.append(func.lower(Experiment.name).contains(q.name.lower(), autoescape=True))
    if q.owner:
        where.append(Experiment.owner_id.in_(select(User.id).where(User.username == q.owner)))
    if q.project_id is not None:
        where.append(Experiment.project_id == q.project_id)
    if q.workspace_id is not None:
        where.append(Experiment.project_id.in_(select(Project.id).where(Project.workspace_id == q.workspace_id)))
    if q.label:
        # The labels are a JSON list: its text holds the label as a JSON string, quoted, on both
        # databases (the same encoder wrote it), so a LIKE on that text is exact per label.
        where.append(cast(Experiment.labels, Text).contains(json.dumps(q.label), autoescape=True))
    return where


def experiment_page(s: Session, q: ExperimentQuery, now: datetime) -> tuple[list[ExperimentRow], int]:
    """One page of experiments and how many match. The page is an ORDER BY ... LIMIT on an
    indexed column (ties by id), so it costs the page, not the table: what the filters select is
    counted once, and only the page's rows are loaded with their owners, trial counts and best
    metrics."""
    where = _experiment_filter(q)
    total = s.scalar(select(func.count(Experiment.id)).where(*where)) or 0
    col = _sort_column(q.sort)
    order = [col.desc(), Experiment.id.desc()] if q.desc else [col.asc(), Experiment.id.asc()]
    exps = list(s.scalars(select(Experiment).where(*where).order_by(*order).offset(q.offset).limit(q.limit)))
    if not exps:
        return [], total
    ids = [e.id for e in exps]
    owners = dict(s.execute(select(User.id, User.username).where(User.id.in_({e.owner_id for e in exps}))).all())
    counts = dict(s.execute(select(Trial.experiment_id, func.count(Trial.id))
                            .where(Trial.experiment_id.in_(ids)).group_by(Trial.experiment_id)).all())
    best = experiments.best_trials(s, exps)
    rows = []
    for e in exps:
        searcher = ExperimentConfig.from_stored(e.config).searcher
        b = best.get(e.id)
        rows.append(ExperimentRow(
            id=e.id, name=e.name, state=e.state, progress=float(e.progress or 0.0), owner=owners.get(e.owner_id, ""),
            labels=list(e.labels or []), searcher=searcher.name, metric=searcher.metric,
            best_metric=b.metric if b else None, best_trial_id=b.trial_id if b else None,
            trials=int(counts.get(e.id, 0)), start_time=e.start_time, end_time=e.end_time,
            duration_s=((e.end_time or now) - e.start_time).total_seconds(), archived=bool(e.archived)))
    return rows, total


def usernames(s: Session) -> list[str]:
    return list(s.scalars(select(User.username).order_by(User.username)))


# -- one experiment ------------------------------------------------------------------------------
def config_yaml(config: dict[str, Any]) -> str:
    """The stored (fully defaulted) config as YAML, storage secrets hidden as the API hides them."""
    return yaml.safe_dump(redact_config(config), sort_keys=False, default_flow_style=False)


@dataclass(frozen=True)
class CheckpointRow:
    uuid: str
    trial_id: int | None
    steps: int
    state: str
    size_bytes: int
    report_time: datetime
    registered: bool  # in the model registry (never collected)


@dataclass
class ExperimentView:
    exp: Experiment
    owner: str
    searcher: str
    metric: str | None
    smaller_is_better: bool
    max_length: Any
    trials: list[Trial]
    best_trial_id: int | None
    checkpoints: list[CheckpointRow]
    checkpoint_bytes: int
    config_yaml: str
    job: experiments.JobSummary | None
    hparam_names: list[str] = field(default_factory=list)


def _checkpoint_rows(s: Session, ckpts: Sequence[Checkpoint]) -> list[CheckpointRow]:
    uuids = [c.uuid for c in ckpts]
    registered = set(s.scalars(select(ModelVersion.checkpoint_uuid).where(ModelVersion.checkpoint_uuid.in_(uuids)))) \
        if uuids else set()
    return [CheckpointRow(c.uuid, c.trial_id, int(c.steps_completed or 0), c.state, int(c.size_bytes or 0),
                          c.report_time, c.uuid in registered)
            for c in sorted(ckpts, key=lambda c: (c.trial_id or 0, c.steps_completed or 0))]


def experiment_view(s: Session, exp: Experiment) -> ExperimentView:
    searcher = ExperimentConfig.from_stored(exp.config).searcher
    trials = list(s.scalars(select(Trial).where(Trial.experiment_id == exp.id).order_by(Trial.id)))
    best = experiments.best_trials(s, [exp]).get(exp.id)
    ckpts = _checkpoint_rows(s, checkpoints.of_experiment(s, exp.id))
    names: list[str] = []
    for t in trials:
        for k in (t.hparams or {}):
            if k not in names:
                names.append(k)
    owner = s.scalar(select(User.username).where(User.id == exp.owner_id)) or ""
    return ExperimentView(
        exp=exp, owner=owner, searcher=searcher.name, metric=searcher.metric,
        smaller_is_better=searcher.smaller_is_better,
        max_length=None if searcher.max_length is None else searcher.max_length.model_dump(), trials=trials,
        best_trial_id=best.trial_id if best else None, checkpoints=ckpts,
        checkpoint_bytes=sum(c.size_bytes for c in ckpts if c.state in st.CKPT_LIVE),
        config_yaml=config_yaml(exp.config or {}), job=experiments.job_summary(s, exp), hparam_names=names)


# -- one trial -----------------------------------------------------------------------------------
@dataclass
class TrialView:
    trial: Trial
    exp: Experiment
    metric: str | None
    allocations: list[Allocation]
    checkpoints: list[CheckpointRow]


def trial_view(s: Session, trial: Trial) -> TrialView:
    exp = s.get(Experiment, trial.experiment_id)
    assert exp is not None
    allocs = list(s.scalars(select(Allocation).where(Allocation.trial_id == trial.id)
                            .order_by(Allocation.created_at, Allocation.id)))
    return TrialView(trial=trial, exp=exp, metric=searcher_goal(exp.config).metric, allocations=allocs,
                     checkpoints=_checkpoint_rows(s, checkpoints.of_trial(s, trial.id)))


# -- metric series -------------------------------------------------------------------------------
MAX_POINTS = 1000  # per series on a chart: more than a chart's width in pixels
_KEY_SAMPLE = 20  # reports per group read to find the metric names


def _doc_key(group: str) -> str:
    return "validation_metrics" if group == VALIDATION else "avg_metrics"


def metric_names(s: Session, trial_ids: Sequence[int]) -> dict[str, list[str]]:
    """Each group's metric names, from the first and latest reports of each trial (a name first
    reported in between is found once it is reported again, as the series grows)."""
    found: dict[str, set[str]] = defaultdict(set)
    for tid in trial_ids:
        for group in s.scalars(select(Metric.group_name).where(Metric.trial_id == tid).distinct()):
            base = select(Metric.metrics).where(Metric.trial_id == tid, Metric.group_name == group)
            docs = list(s.scalars(base.order_by(Metric.steps_completed.desc()).limit(_KEY_SAMPLE)))
            docs += list(s.scalars(base.order_by(Metric.steps_completed.asc()).limit(2)))
            for doc in docs:
                values = (doc or {}).get(_doc_key(group)) or {}
                found[group].update(k for k, v in values.items() if _is_number(v))
    return {g: sorted(names) for g, names in sorted(found.items()) if names}


def _is_number(v: Any) -> bool:
    """A value a chart can plot (NaN and ±Inf, stored as strings, are numbers that draw as gaps)."""
    if isinstance(v, bool) or v is None:
        return False
    try:
        float(v)
    except (TypeError, ValueError):
        return False
    return True


@dataclass(frozen=True)
class Series:
    trial_id: int
    group: str
    metric: str
    points: list[tuple[float, float]]  # (steps, value), downsampled
    total: int  # reports stored


EXACT_LIMIT = 20 * MAX_POINTS  # up to this many reports, LTTB runs over every one of them
SAMPLE_FACTOR = 8  # beyond it, over this many times `max_points` reports, one per equal step range


def series(s: Session, trial_id: int, group: str, metric: str, max_points: int = MAX_POINTS) -> Series:
    """One metric of one trial's group as (steps, value) pairs, at most `max_points` of them
    (LTTB). The value is read out of the JSON document by the database (json_extract / #>>), never
    as ORM rows.

    A long series is not read whole: its reports are counted on the (trial, group, steps) index,
    and past `EXACT_LIMIT` one report per equal step range is picked on that index (8x the
    points drawn), only those documents are read, and LTTB chooses among them. A trial with a
    million reports then costs about what one with twenty thousand does; a spike between two picked
    reports can be missed, which at a chart's width of pixels is the usual trade."""
    where = (Metric.trial_id == trial_id, Metric.group_name == group)
    count, lo, hi = s.execute(select(func.count(), func.min(Metric.steps_completed), func.max(Metric.steps_completed))
                              .where(*where)).one()
    key = (str(s.get_bind().url), trial_id, group, metric, max_points, count, lo, hi)
    cached = _SERIES_CACHE.get(key)
    if cached is not None:
        return cached
    value = Metric.metrics[(_doc_key(group), metric)].as_string()
    q = select(Metric.steps_completed, value).where(*where)
    if count > EXACT_LIMIT and max_points > 0:
        width = max(1, -(-(int(hi) - int(lo) + 1) // (SAMPLE_FACTOR * max_points)))
        picked = (select(func.min(Metric.steps_completed)).where(*where)
                  .group_by((Metric.steps_completed - int(lo)) // width))
        q = q.where(Metric.steps_completed.in_(picked.union(select(literal(int(hi))))))
    points: list[tuple[float, float]] = []
    append = points.append
    for step, raw in s.execute(q.order_by(Metric.steps_completed)):
        if raw is None:
            continue
        try:
            x = float(raw)
        except (TypeError, ValueError):
            continue
        if x - x == 0:  # finite (NaN and ±Inf fail this)
            append((step, x))
    out = Series(trial_id, group, metric, lttb(points, max_points), int(count or 0))
    _SERIES_CACHE.put(key, out)
    return out


class _LRU:
    """The last few series drawn, keyed by what the index says of their reports (count, first and
    last step): a page polling a long, finished or idle series reads three index numbers, not the
    series again. A report replaced by a restarted trial's run at an existing step shows once the
    trial reports a new step."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[Any, Series] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Any) -> Series | None:
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: Any, value: Series) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)


_SERIES_CACHE = _LRU(256)


# -- cluster -------------------------------------------------------------------------------------
# Instance prices: shipyard_common/clouds.py (a type it does not list shows no cost rather than a guess).
SPOT_DISCOUNT = 0.35  # a rough spot / on-demand ratio, shown as an estimate


@dataclass(frozen=True)
class AgentRow:
    id: str
    state: str
    enabled: bool
    draining: bool
    slots: int
    busy: int
    instance_id: str | None
    last_seen: datetime


@dataclass(frozen=True)
class InstanceRow:
    launch_id: str
    instance_id: str | None
    instance_type: str
    location: str
    state: str
    agent_id: str | None
    age_s: float
    spot: bool
    cost_per_hour: float | None
    terminate_reason: str | None


@dataclass
class PoolView:
    name: str
    description: str
    provider: str  # the provider type, or "agents join" for a pool without one
    state: str
    error: str | None
    backoff_until: datetime | None
    min_instances: int
    max_instances: int
    # Every effective elastic setting but the unshown ones: (name, value), durations as timedelta.
    settings: list[tuple[str, Any]]
    agents: list[AgentRow]
    slots_total: int
    slots_busy: int
    slots_disabled: int
    instances: list[InstanceRow]
    queue: list[jobs.JobView]
    last_decision: dict[str, Any] | None
    last_decision_at: datetime | None
    cost_per_hour: float | None
    consolidation_moves: list[consolidation.MoveView] = field(default_factory=list)
    # The autoscaler's history, newest first, as the leader recorded it (services/scaling_history.py).
    history: list[ScalingEvent] = field(default_factory=list)

    @property
    def slots_free(self) -> int:
        return max(0, self.slots_total - self.slots_busy - self.slots_disabled)


#: Rows of the autoscaler's history the pool page shows.
POOL_HISTORY_ROWS = 20


def _pool_view(s: Session, master: Master, row: ResourcePool, now: datetime, queue: list[jobs.JobView]) -> PoolView:
    cfg = master.config.pool(row.name)
    ep = effective_pool(cfg) if cfg is not None else None
    agents = list(s.scalars(select(Agent).where(Agent.pool == row.name).order_by(Agent.id)))
    busy = gangs.busy_slots(s.scalars(select(Allocation).where(Allocation.pool == row.name,
                                                               Allocation.state.in_(st.ALLOC_ON_AGENT))))
    agent_rows = [AgentRow(a.id, a.state, bool(a.enabled), a.drain_started_at is not None, len(a.slots or []),
                           busy.get(a.id, 0), a.instance_id, a.last_seen) for a in agents]
    live = [a for a in agent_rows if a.state == st.AgentState.CONNECTED]
    spot = bool(ep and ep.instances.spot)
    instances = []
    for i in s.scalars(select(Instance).where(Instance.pool == row.name, Instance.state != st.InstanceState.TERMINATED)
                       .order_by(Instance.requested_at)):
        # A parked instance (the warm pool) bills its disks only, not its type's hourly price.
        price = None if i.state == st.InstanceState.PARKED else clouds.on_demand_usd_per_hour(i.instance_type)
        if price is not None and spot:
            price = round(price * SPOT_DISCOUNT, 4)
        instances.append(InstanceRow(
            i.launch_id, i.instance_id, i.instance_type, i.location, i.state, i.agent_id,
            (now - (i.launched_at or i.requested_at)).total_seconds(), spot, price, i.terminate_reason))
    priced = [i.cost_per_hour for i in instances if i.cost_per_hour is not None]
    return PoolView(
        name=row.name, description=row.description, provider=(ep.provider if ep else None) or "agents join", state=row.state,
        error=row.error, backoff_until=row.backoff_until if row.backoff_until and row.backoff_until > now else None,
        min_instances=ep.min_instances if ep else 0, max_instances=ep.max_instances if ep else 0,
        settings=list(ep.shown_settings()) if ep else [],
        agents=agent_rows, slots_total=sum(a.slots for a in live), slots_busy=sum(a.busy for a in live),
        slots_disabled=sum(a.slots - a.busy for a in live if not a.enabled), instances=instances, queue=queue,
        last_decision=row.last_decision, last_decision_at=row.last_decision_at,
        cost_per_hour=round(sum(priced), 4) if priced else None,
        consolidation_moves=consolidation.recent_moves(s, row.name),
        history=scaling_history.recent(s, row.name, POOL_HISTORY_ROWS) if ep is not None and ep.elastic else [])


def cluster_view(s: Session, master: Master, now: datetime) -> list[PoolView]:
    configured = [p.name for p in master.config.resource_pools]
    rows = {r.name: r for r in s.scalars(select(ResourcePool).where(ResourcePool.name.in_(configured)))}
    queue: dict[str, list[jobs.JobView]] = defaultdict(list)
    for job in jobs.list_jobs(s, master).jobs:
        queue[job.pool].append(job)
    return [_pool_view(s, master, rows[name], now, queue.get(name, [])) for name in configured if name in rows]


HISTORY_WINDOW = timedelta(hours=1)


def slot_history(s: Session, pool: str, now: datetime, window: timedelta = HISTORY_WINDOW) -> dict[str, Any]:
    """Slots provisioned and slots used in the pool over the last `window`, derived from the record:
    provisioned from the instances' launch and termination times (their agent's slot count, else
    the pool's usual one) and from agents not on an instance (registered until disconnected); used
    from the allocations' assignment and end times. No history table is needed, and a restarted
    master draws the same chart."""
    start = now - window
    agents = list(s.scalars(select(Agent).where(Agent.pool == pool)))
    slots_of = {a.id: len(a.slots or []) for a in agents}
    usual = max(slots_of.values(), default=1) or 1
    provisioned: list[Interval] = []
    on_instance: set[str] = set()
    for i in s.scalars(select(Instance).where(Instance.pool == pool)
                       .where((Instance.terminated_at.is_(None)) | (Instance.terminated_at > start))):
        if i.agent_id:
            on_instance.add(i.agent_id)
        if i.launched_at is None:
            continue
        provisioned.append(Interval(i.launched_at, i.terminated_at, slots_of.get(i.agent_id or "", usual)))
    for a in agents:
        if a.id in on_instance or a.instance_id:
            continue
        end = a.disconnected_at if a.state == st.AgentState.DISCONNECTED else None
        provisioned.append(Interval(a.registered_at, end, len(a.slots or [])))
    used = [Interval(a.assigned_at, a.ended_at, a.slots_needed) for a in s.scalars(
        select(Allocation).where(Allocation.pool == pool, Allocation.assigned_at.is_not(None))
        .where((Allocation.ended_at.is_(None)) | (Allocation.ended_at > start))) if a.assigned_at is not None]
    return {"provisioned": step_series(provisioned, start, now), "used": step_series(used, start, now)}


# -- models --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class VersionRow:
    version: int
    name: str
    checkpoint_uuid: str
    experiment_id: int | None
    trial_id: int | None
    steps: int | None
    size_bytes: int | None
    checkpoint_state: str | None
    created_at: datetime
    # The checkpoint's trial's validation metrics at the checkpoint's step (empty: none reported).
    metrics: dict[str, Any] = field(default_factory=dict)
    comment: str = ""
    labels: list[str] = field(default_factory=list)


@dataclass
class ModelRow:
    model: Model
    owner: str
    versions: list[VersionRow]


def _version_rows(s: Session, versions: Sequence[ModelVersion]) -> list[VersionRow]:
    ckpts = {c.uuid: c for c in s.scalars(select(Checkpoint).where(
        Checkpoint.uuid.in_([v.checkpoint_uuid for v in versions])))} if versions else {}
    ctx = checkpoints.context(s, list(ckpts.values()))
    out = []
    for v in versions:
        c = ckpts.get(v.checkpoint_uuid)
        out.append(VersionRow(
            v.version, v.name, v.checkpoint_uuid, c.experiment_id if c else None, c.trial_id if c else None,
            c.steps_completed if c else None, c.size_bytes if c else None, c.state if c else None, v.created_at,
            (checkpoints.validation_metrics(c, ctx) or {}) if c else {}, v.comment or "", list(v.labels or [])))
    return out


def models_view(s: Session) -> list[ModelRow]:
    rows = models.list_models(s)
    owners = dict(s.execute(select(User.id, User.username)).all()) if rows else {}
    return [ModelRow(m, owners.get(m.owner_id, ""), _version_rows(s, models.list_versions(s, m))) for m in rows]


def model_view(s: Session, name: str) -> ModelRow:
    """One model with its versions, each with its checkpoint and the metrics validated at it."""
    m = models.get_model(s, name)
    owner = s.scalar(select(User.username).where(User.id == m.owner_id)) or ""
    return ModelRow(m, owner, _version_rows(s, models.list_versions(s, m)))
