"""The job queue: every experiment with live allocations is a job of its pool (and so is each live
command, notebook, TensorBoard or shell, listed but not changed here: its own verbs kill it), ordered as the
priority scheduler orders it — priority (1–99, lower first), then queue position, then submission
time — and the changes an owner or an admin may make to it (priority, weight, max_slots, position,
pool), by job (`det job update`) or by experiment (`det e set`).

A job's place in its queue is one number, its key: `queue_position` when set, else its submission
time in epoch seconds. Moving a job ahead of (behind) another sets its position between that job's
key and its neighbour's, and gives it that job's priority (Determined does the same: a position only
orders jobs of equal priority). Changes go to the experiment row (and its config's `resources`, so
later allocations inherit them) and to the copies its live allocations carry (pending ones also
change pool), in the caller's transaction: one bad update in a request refuses all of them.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from control_plane.auth import Principal
from control_plane.config import SchedulerConfig
from control_plane.core import rbac
from control_plane.core import states as st
from control_plane.core.expconf import ExperimentConfig
from control_plane.db.models import Allocation, Experiment, Project, Task, User
from control_plane.errors import Conflict, FieldProblem, Invalid, NotFound
from control_plane.master import Master
from control_plane.services import access, pool_capacity

log = logging.getLogger("shipyard.jobs")

JOB_QUEUED = "STATE_QUEUED"
JOB_SCHEDULED = "STATE_SCHEDULED"
JOB_STATES = (JOB_QUEUED, JOB_SCHEDULED)
PRIORITY_MIN, PRIORITY_MAX = 1, 99


@dataclass(frozen=True)
class JobView:
    exp: Experiment | None  # None for a command, notebook, TensorBoard or shell (`task`)
    username: str
    priority: int  # the effective priority (the pool's default when the experiment sets none)
    state: str  # JOB_QUEUED (nothing placed yet) or JOB_SCHEDULED
    jobs_ahead: int  # jobs before it in its pool's queue
    allocated_slots: int
    requested_slots: int
    waiting_reason: str | None  # why its pending allocations wait (None: nothing pending, or unknown)
    task: Task | None = None
    workspace_id: int = 1  # its project's workspace (a task's: its own)

    @property
    def pool(self) -> str:
        return self.exp.resource_pool if self.exp is not None else self.task.pool  # type: ignore[union-attr]

    @property
    def job_id(self) -> str:
        return self.exp.job_id if self.exp is not None else self.task.id  # type: ignore[union-attr]


@dataclass(frozen=True)
class JobPage:
    jobs: list[JobView]
    total: int


def default_priority(master: Master, pool: str) -> int:
    cfg = master.config.pool(pool)
    return (cfg.scheduler if cfg else SchedulerConfig()).default_priority


def effective_priority(master: Master, exp: Experiment) -> int:
    return exp.priority if exp.priority is not None else default_priority(master, exp.resource_pool)


def queue_key(exp: Experiment) -> float:
    """The job's place among jobs of equal priority: its queue position, else its submission time."""
    return exp.queue_position if exp.queue_position is not None else exp.start_time.timestamp()


def _order(master: Master, exp: Experiment) -> tuple[int, float, int]:
    return effective_priority(master, exp), queue_key(exp), exp.id


def _live_allocations(s: Session, experiment_ids: Iterable[int] | None = None) -> dict[int, list[Allocation]]:
    q = select(Allocation).where(Allocation.state.in_(st.ALLOC_LIVE), Allocation.experiment_id.is_not(None))
    if experiment_ids is not None:
        q = q.where(Allocation.experiment_id.in_(list(experiment_ids)))
    out: dict[int, list[Allocation]] = defaultdict(list)
    for a in s.scalars(q.order_by(Allocation.created_at, Allocation.id)):
        out[a.experiment_id or 0].append(a)
    return out


Job = tuple[Experiment | Task, list[Allocation]]


def _job_order(master: Master, job: Job) -> tuple[int, float, int | str]:
    """An experiment by `_order`; a task (one allocation) by its allocation's priority, then launch
    time, as the scheduler takes it."""
    what, allocs = job
    if isinstance(what, Experiment):
        return _order(master, what)
    return task_priority(master, what, allocs[0]), what.created_at.timestamp(), what.id


def task_priority(master: Master, task: Task, alloc: Allocation) -> int:
    """A task's priority: what its allocation was given at launch (the pool's default if none)."""
    return alloc.priority or default_priority(master, task.pool)


def _queue(s: Session, master: Master, pool: str | None = None) -> dict[str, list[Job]]:
    """Each pool's jobs in queue order, each with its live allocations: experiments, and the tasks
    other than trials (commands, notebooks, TensorBoards, shells), each its own job."""
    by_pool: dict[str, list[Job]] = defaultdict(list)
    live = _live_allocations(s)
    if live:
        q = select(Experiment).where(Experiment.id.in_(list(live)))
        if pool is not None:
            q = q.where(Experiment.resource_pool == pool)
        for exp in s.scalars(q):
            by_pool[exp.resource_pool].append((exp, live[exp.id]))
    tq = (select(Task, Allocation).join(Allocation, Allocation.task_id == Task.id)
          .where(Allocation.state.in_(st.ALLOC_LIVE), Allocation.experiment_id.is_(None)))
    if pool is not None:
        tq = tq.where(Task.pool == pool)
    for task, alloc in s.execute(tq):
        by_pool[task.pool].append((task, [alloc]))
    for jobs in by_pool.values():
        jobs.sort(key=lambda j: _job_order(master, j))
    return dict(by_pool)


def _waiting_reason(pending: Sequence[Allocation], cache: pool_capacity.CapacityCache) -> str | None:
    for a in pending:
        # The scheduler's latest word on why it waits; a shape the pool can never host is known
        # here too (before the next placement tick, or after the pool shrank).
        reason = a.waiting_reason or cache.reason(a.pool, a.slots_needed)
        if reason:
            return str(reason)
    return None


def list_jobs(s: Session, master: Master, *, pool: str | None = None, states: Sequence[str] = (),
              offset: int = 0, limit: int = 0, descending: bool = False) -> JobPage:
    """The queue (of `pool`, else of every pool, pool by pool), in queue order (reversed with
    `descending`), filtered by job state, then paginated (`limit` 0: all)."""
    if pool is not None and master.config.pool(pool) is None:
        raise Invalid(f"resourcePool: no resource pool named {pool!r}",
                      [FieldProblem("resourcePool", f"no resource pool named {pool!r}")])
    queue = _queue(s, master, pool)
    owners = {u.id: u.username for u in s.scalars(select(User).where(
        User.id.in_({what.owner_id for jobs in queue.values() for what, _ in jobs})))} if queue else {}
    cache = pool_capacity.CapacityCache(s, master)
    projects = {what.project_id for jobs in queue.values() for what, _ in jobs if isinstance(what, Experiment)}
    workspaces = dict(s.execute(select(Project.id, Project.workspace_id).where(Project.id.in_(projects))).all()) \
        if projects else {}
    views: list[JobView] = []
    for name in sorted(queue):
        for ahead, (what, allocs) in enumerate(queue[name]):
            placed = [a for a in allocs if a.state in st.ALLOC_ON_AGENT]
            pending = [a for a in allocs if a.state == st.AllocationState.PENDING]
            exp = what if isinstance(what, Experiment) else None
            views.append(JobView(
                exp=exp, task=None if exp is not None else what,  # type: ignore[arg-type]
                username=owners.get(what.owner_id, ""),
                priority=effective_priority(master, exp) if exp is not None else task_priority(master, what, allocs[0]),  # type: ignore[arg-type]
                workspace_id=workspaces.get(exp.project_id, rbac.DEFAULT_WORKSPACE_ID) if exp is not None
                else what.workspace_id,
                state=JOB_SCHEDULED if placed else JOB_QUEUED, jobs_ahead=ahead,
                allocated_slots=sum(a.slots_needed for a in placed),
                requested_slots=sum(a.slots_needed for a in allocs),
                waiting_reason=_waiting_reason(pending, cache)))
    if states:
        views = [v for v in views if v.state in states]
    if descending:
        views.reverse()
    total = len(views)
    chosen = views[offset:offset + limit] if limit else views[offset:]
    return JobPage(chosen, total)


def queue_stats(s: Session, master: Master, pools: Sequence[str] = ()) -> list[tuple[str, int, int]]:
    """(pool, queued jobs, scheduled jobs) for each pool asked (every configured pool by default)."""
    names = list(pools) or [p.name for p in master.config.resource_pools]
    for name in names:
        if master.config.pool(name) is None:
            raise Invalid(f"resourcePools: no resource pool named {name!r}",
                          [FieldProblem("resourcePools", f"no resource pool named {name!r}")])
    queue = _queue(s, master)
    out = []
    for name in names:
        jobs = queue.get(name, [])
        scheduled = sum(1 for _, allocs in jobs if any(a.state in st.ALLOC_ON_AGENT for a in allocs))
        out.append((name, len(jobs) - scheduled, scheduled))
    return out


# --------------------------------------------------------------------------------------------
# Changes
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QueueUpdate:
    """One of Determined's v1QueueControl: the job and what to change (None: unchanged)."""

    job_id: str
    priority: int | None = None
    weight: float | None = None
    resource_pool: str | None = None
    ahead_of: str | None = None
    behind_of: str | None = None
    queue_position: float | None = None
    max_slots: int | None = None  # the job's cap on slots held at once (Determined's `e set max-slots`)


def _invalid(field: str, reason: str) -> Invalid:
    return Invalid(f"{field}: {reason}", [FieldProblem(field, reason)])


def _job(s: Session, job_id: str, field: str) -> Experiment:
    exp = s.scalar(select(Experiment).where(Experiment.job_id == job_id))
    task = s.get(Task, job_id) if exp is None else None
    if task is not None:
        raise _invalid(field, f"job {job_id!r} is a {task.kind}: its pool is set when it is launched; "
                              f"det {task.kind} set priority {job_id} N changes its priority, "
                              f"det {task.kind} kill {job_id} stops it")
    if exp is None:
        raise NotFound(f"job {job_id!r} not found", [FieldProblem(field, f"no job {job_id!r}")])
    return exp


def update_jobs(s: Session, master: Master, p: Principal, updates: Sequence[QueueUpdate]) -> None:
    """Apply every update in order, or raise on the first bad one (the caller's transaction then
    rolls back what earlier ones did). The placement loop sees the result on its next tick."""
    if not updates:
        raise _invalid("updates", "at least one update is required")
    for i, u in enumerate(updates):
        _apply(s, master, p, _job(s, u.job_id, f"updates[{i}].jobId"), u, f"updates[{i}]")
        s.flush()
    master.notify(s)


def update_experiment(s: Session, master: Master, p: Principal, exp: Experiment, u: QueueUpdate) -> None:
    """The same change to one experiment's job, named by the experiment (Determined's
    `PATCH /api/v1/experiments/{id}` `resources`, i.e. `det e set priority|weight|max-slots`):
    the same rules, with errors naming `resources.<field>`; `u.job_id` is ignored."""
    _apply(s, master, p, exp, u, "resources")
    s.flush()
    master.notify(s)


def _check_values(u: QueueUpdate, where: str) -> None:
    if u.priority is not None and not PRIORITY_MIN <= u.priority <= PRIORITY_MAX:
        raise _invalid(f"{where}.priority", f"must be between {PRIORITY_MIN} and {PRIORITY_MAX} (lower runs first)")
    if u.weight is not None and not (math.isfinite(u.weight) and u.weight > 0):
        raise _invalid(f"{where}.weight", "must be a finite number greater than 0")
    if u.queue_position is not None and not math.isfinite(u.queue_position):
        raise _invalid(f"{where}.queuePosition", "must be a finite number")
    moves = [name for name, v in (("aheadOf", u.ahead_of), ("behindOf", u.behind_of),
                                  ("queuePosition", u.queue_position)) if v is not None]
    if len(moves) > 1:
        raise _invalid(f"{where}.{moves[1]}", f"give only one of {', '.join(moves)}")
    if u.resource_pool is not None and not u.resource_pool:
        raise _invalid(f"{where}.resourcePool", "must not be empty")
    if all(v is None for v in (u.priority, u.weight, u.resource_pool, u.ahead_of, u.behind_of, u.queue_position,
                               u.max_slots)):
        raise _invalid(where, "nothing to change: give priority, weight, maxSlots, resourcePool, aheadOf, "
                              "behindOf or queuePosition")


def _check_max_slots(exp: Experiment, max_slots: int, field: str) -> None:
    slots = ExperimentConfig.from_stored(exp.config).resources.slots_per_trial
    if max_slots < max(slots, 1):
        raise _invalid(field, f"must be at least the experiment's slots_per_trial ({slots}): a trial needs that "
                              f"many at once")


def _apply(s: Session, master: Master, p: Principal, exp: Experiment, u: QueueUpdate, where: str) -> None:
    job = exp.job_id or f"experiment-{exp.id}"
    access.require_owner(p, exp)  # its owner, or a role that changes experiments in its workspace
    _check_values(u, where)
    if u.max_slots is not None:
        _check_max_slots(exp, u.max_slots, f"{where}.maxSlots")
    if exp.state in st.EXP_TERMINAL:
        raise Conflict(f"job {job!r} (experiment {exp.id}) has ended ({exp.state}): it is in no queue")
    if u.resource_pool is not None and u.resource_pool != exp.resource_pool:
        _check_pool(s, master, exp, u.resource_pool, f"{where}.resourcePool")
        log.info("event=job_moved job_id=%s experiment_id=%s from=%s to=%s", exp.job_id, exp.id,
                 exp.resource_pool, u.resource_pool)
        exp.resource_pool = u.resource_pool
    if u.priority is not None:
        exp.priority = u.priority
    if u.weight is not None:
        exp.weight = float(u.weight)
    if u.queue_position is not None:
        exp.queue_position = float(u.queue_position)
    anchor_id = u.ahead_of if u.ahead_of is not None else u.behind_of
    if anchor_id is not None:
        field = f"{where}.{'aheadOf' if u.ahead_of is not None else 'behindOf'}"
        _move(s, master, exp, anchor_id, ahead=u.ahead_of is not None, field=field)
    # The config's resources follow the row, so later allocations inherit the change.
    changes: dict[str, Any] = {"resource_pool": exp.resource_pool, "weight": exp.weight}
    if exp.priority is not None:
        changes["priority"] = exp.priority
    if u.max_slots is not None:
        changes["max_slots"] = u.max_slots
    resources = ExperimentConfig.from_stored(exp.config).resources.model_copy(update=changes)
    exp.config = {**exp.config, "resources": resources.model_dump(mode="json")}
    priority = effective_priority(master, exp)
    for alloc in _live_allocations(s, [exp.id]).get(exp.id, []):
        alloc.priority = priority
        alloc.weight = exp.weight
        if alloc.state == st.AllocationState.PENDING:
            alloc.pool = exp.resource_pool
    log.info("event=job_updated job_id=%s experiment_id=%s pool=%s priority=%s weight=%s queue_position=%s "
             "max_slots=%s", job, exp.id, exp.resource_pool, priority, exp.weight, exp.queue_position,
             resources.max_slots)


def _check_pool(s: Session, master: Master, exp: Experiment, pool: str, field: str) -> None:
    cfg = master.config.pool(pool)
    if cfg is None:
        names = [x.name for x in master.config.resource_pools]
        raise _invalid(field, f"no resource pool named {pool!r}; pools are {names}")
    slots = ExperimentConfig.from_stored(exp.config).resources.slots_per_trial
    if cfg.max_slots_per_agent is not None and slots > cfg.max_slots_per_agent:
        raise _invalid(field, f"{slots} slots per trial cannot fit on one agent of pool {pool!r} "
                              f"(at most {cfg.max_slots_per_agent})")
    reason = pool_capacity.unservable_reason(s, master, pool, slots)
    if reason is not None:
        raise _invalid(field, reason)


def _move(s: Session, master: Master, exp: Experiment, anchor_id: str, *, ahead: bool, field: str) -> None:
    anchor = _job(s, anchor_id, field)
    if anchor.id == exp.id:
        raise _invalid(field, "a job cannot be moved relative to itself")
    if anchor.resource_pool != exp.resource_pool:
        raise _invalid(field, f"job {anchor_id!r} is in resource pool {anchor.resource_pool!r}, this job in "
                              f"{exp.resource_pool!r}: queue positions are per pool (move the job first)")
    queue = [e for e, _ in _queue(s, master, exp.resource_pool).get(exp.resource_pool, [])
             if isinstance(e, Experiment) and e.id != exp.id]  # tasks keep their places
    at = next((i for i, e in enumerate(queue) if e.id == anchor.id), None)
    if at is None:
        raise _invalid(field, f"job {anchor_id!r} is not queued (it has nothing running or waiting)")
    priority = effective_priority(master, anchor)
    exp.priority = priority  # a position only orders jobs of equal priority
    neighbour_at = at - 1 if ahead else at + 1
    neighbour = queue[neighbour_at] if 0 <= neighbour_at < len(queue) else None
    if neighbour is not None and effective_priority(master, neighbour) != priority:
        neighbour = None
    here = queue_key(anchor)
    if neighbour is None:
        exp.queue_position = here - 1.0 if ahead else here + 1.0
        return
    there = queue_key(neighbour)
    middle = (here + there) / 2
    if not (min(here, there) < middle < max(here, there)):
        # Bisected down to the float's resolution: spread the pool's keys out evenly (same order,
        # same first and last key, so jobs submitted later still come after them) and try again.
        _spread(queue)
        _move(s, master, exp, anchor_id, ahead=ahead, field=field)
        return
    exp.queue_position = middle


def _spread(queue: list[Experiment]) -> None:
    keys = [queue_key(e) for e in queue]
    lo, hi = min(keys), max(keys)
    if len(queue) < 2 or hi - lo < len(queue) * 1e-6 * max(1.0, abs(hi)):
        raise Conflict("the queue positions of this pool are too close to order further; set queuePosition explicitly")
    step = (hi - lo) / (len(queue) - 1)
    for i, e in enumerate(queue):
        e.queue_position = lo + i * step
