"""Experiment and trial lifecycle: the shell around the pure searcher.

Searcher operations become trial rows and allocations; agent and harness reports become state
changes. Every entry point runs inside the caller's transaction and locks the experiment row, so
the searcher's snapshot, the trials and the metric that moved it are committed together or not
at all — a master killed at any instant resumes the exact search from the database.

`reconcile` is level-triggered: it looks at what each trial should be doing and what its
allocation is doing, and acts on the difference. Event handlers only record facts and let the
next reconcile (run at once through `master.notify()`) do the rest.
"""

from __future__ import annotations

import logging
import math
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, defer

from control_plane.config import SchedulerConfig
from control_plane.core import progress
from control_plane.core import states as st
from control_plane.core.expconf import ExperimentConfig, hyperparameters_to_dict
from control_plane.core.searcher import (
    BaseSearchMethod,
    Close,
    Create,
    ExitedReason,
    Operation,
    Shutdown,
    ValidateAfter,
    new_search_method,
    restore_search_method,
)
from control_plane.db.models import Allocation, Experiment, TaskLog, Trial
from control_plane.errors import Conflict, Invalid
from control_plane.master import Master

log = logging.getLogger("shipyard.lifecycle")


# -- searcher plumbing ---------------------------------------------------------------------------
def _lock(s: Session, exp: Experiment) -> Experiment:
    """Serialise searcher updates of one experiment (SELECT … FOR UPDATE on PostgreSQL; SQLite
    transactions already hold the write lock)."""
    s.flush()
    locked = s.get(Experiment, exp.id, with_for_update=True, populate_existing=True)
    assert locked is not None
    return locked


def _config(exp: Experiment) -> ExperimentConfig:
    return ExperimentConfig.from_stored(exp.config)


def _method(exp: Experiment) -> BaseSearchMethod:
    cfg = _config(exp)
    hparams = hyperparameters_to_dict(cfg.hyperparameters)
    state = exp.searcher_state or {}
    if "method" in state:
        return restore_search_method(cfg.searcher, hparams, cfg.searcher_seed, state["method"])
    return new_search_method(cfg.searcher, hparams, cfg.searcher_seed)


def _save(exp: Experiment, method: BaseSearchMethod, shutdown: dict[str, Any] | None = None) -> None:
    state = dict(exp.searcher_state or {})
    state["method"] = method.snapshot()
    if shutdown is not None:
        state["shutdown"] = shutdown
    # What the experiment's progress (reconcile, core/progress.py) takes from the searcher: its own
    # estimate (not the 1.0 of a search that failed: a failed experiment keeps the progress it had)
    # and how many trials it plans.
    if shutdown is None or not shutdown.get("failure"):
        state["progress"] = float(method.progress())
    state["planned_trials"] = getattr(method, "total_trials", None) or getattr(method.searcher_cfg, "max_trials", None)
    exp.searcher_state = state
    exp.searcher_event_seq = (exp.searcher_event_seq or 0) + 1


def trial_work(trial: Trial) -> progress.TrialWork:
    """What the trial's progress is computed from (core/progress.py)."""
    return progress.TrialWork(completed=trial.state == st.TrialState.COMPLETED,
                              steps_completed=trial.steps_completed or 0,
                              target_length=trial.searcher_target_length, reported=trial.progress)


def _update_progress(exp: Experiment, trials: list[Trial]) -> None:
    state = exp.searcher_state or {}
    value = progress.experiment_progress([trial_work(t) for t in trials], state.get("planned_trials"),
                                         float(state.get("progress") or 0.0))
    if value != exp.progress:  # every tick reads it; a write only when it moved
        exp.progress = value


def _trial_by_request(s: Session, exp: Experiment, request_id: str) -> Trial | None:
    return s.scalar(select(Trial).where(Trial.experiment_id == exp.id, Trial.request_id == request_id))


def _apply(s: Session, master: Master, exp: Experiment, method: BaseSearchMethod, ops: list[Operation]) -> None:
    queue = list(ops)
    shutdown: dict[str, Any] | None = None
    while queue:
        op = queue.pop(0)
        if isinstance(op, Create):
            if _trial_by_request(s, exp, op.request_id) is None:
                s.add(
                    Trial(
                        experiment_id=exp.id,
                        request_id=op.request_id,
                        hparams=op.hparams,
                        seed=op.trial_seed,
                        state=st.TrialState.QUEUED,
                        task_id=f"{exp.id}.{op.request_id}",
                        start_time=master.clock(),
                    )
                )
                s.flush()
                log.info("event=trial_created experiment_id=%s request_id=%s", exp.id, op.request_id)
            queue.extend(method.trial_created(op.request_id))
        elif isinstance(op, ValidateAfter):
            trial = _trial_by_request(s, exp, op.request_id)
            if trial is not None:
                trial.searcher_target_length = op.length
                trial.rung = op.rung
        elif isinstance(op, Close):
            trial = _trial_by_request(s, exp, op.request_id)
            if trial is not None:
                trial.searcher_closed = True
        elif isinstance(op, Shutdown):
            shutdown = {"failure": op.failure, "reason": op.reason}
            log.info("event=searcher_shutdown experiment_id=%s failure=%s", exp.id, op.failure)
    _save(exp, method, shutdown)
    master.notify(s)


# -- entry points --------------------------------------------------------------------------------
def on_experiment_created(s: Session, master: Master, exp: Experiment) -> None:
    exp = _lock(s, exp)
    method = _method(exp)
    _apply(s, master, exp, method, method.initial_operations())
    reconcile_experiment(s, master, exp)


def set_experiment_state(s: Session, master: Master, exp: Experiment, target: str) -> None:
    """`target`: activate | pause | cancel | kill (or the matching state name)."""
    action = st.experiment_action(target)
    if action is None:
        raise Invalid(f"unknown experiment action {target!r}")
    exp = _lock(s, exp)
    new_state = st.ACTION_TARGETS[action]
    if exp.state in st.EXP_TERMINAL and action in (st.ExperimentAction.CANCEL, st.ExperimentAction.KILL):
        return  # already over: nothing to stop
    if not st.can_transition(exp.state, new_state):
        raise Conflict(f"cannot {action} an experiment in state {exp.state}")
    if exp.state != new_state:
        log.info("event=experiment_state experiment_id=%s from=%s to=%s", exp.id, exp.state, new_state)
        exp.state = new_state
    reconcile_experiment(s, master, exp)
    master.notify(s)


def on_metrics_reported(
    s: Session, master: Master, trial: Trial, group: str, steps_completed: int, metrics: dict[str, Any]
) -> None:
    if group != "validation":
        return
    exp = s.get(Experiment, trial.experiment_id)
    if exp is None:
        return
    metric_name = _config(exp).searcher.metric
    target = trial.searcher_target_length
    if target is None or steps_completed < target or trial.searcher_closed:
        return
    if trial.searcher_completed_length is not None and trial.searcher_completed_length >= target:
        return
    value = metrics.get(metric_name)
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(float(value)):
        warning = (
            f"trial {trial.id} reported validation metrics at step {steps_completed} without the "
            f"searcher metric {metric_name!r} (got {sorted(metrics)[:10]}); the searcher cannot proceed"
        )
        if warning not in (exp.warnings or []):
            exp.warnings = [*(exp.warnings or []), warning]
            log.warning("event=searcher_metric_missing experiment_id=%s trial_id=%s metric=%s",
                        exp.id, trial.id, metric_name)
        return
    complete_operation(s, master, trial, target, float(value))


def complete_operation(s: Session, master: Master, trial: Trial, length: int, metric: float) -> None:
    exp = s.get(Experiment, trial.experiment_id)
    assert exp is not None
    exp = _lock(s, exp)
    s.refresh(trial)
    if trial.searcher_completed_length is not None and trial.searcher_completed_length >= length:
        return  # a retried report: the searcher already has it
    trial.searcher_completed_length = length
    method = _method(exp)
    _apply(s, master, exp, method, method.validation_completed(trial.request_id, metric, length))


def on_trial_early_exit(s: Session, master: Master, trial: Trial, reason: ExitedReason) -> None:
    """The trial's code said it cannot go on (invalid hparams) or the user stopped it."""
    exp = s.get(Experiment, trial.experiment_id)
    assert exp is not None
    exp = _lock(s, exp)
    method = _method(exp)
    trial.searcher_closed = True
    trial.exit_reason = f"early exit: {reason.value}"
    _apply(s, master, exp, method, method.trial_exited_early(trial.request_id, reason))


def kill_trial(s: Session, master: Master, trial: Trial) -> None:
    """The user kills one trial (Determined's KillTrial): its process is killed, it ends
    CANCELED, and the searcher hears it was canceled by the user; the experiment goes on."""
    exp = s.get(Experiment, trial.experiment_id)
    assert exp is not None
    exp = _lock(s, exp)
    s.refresh(trial)
    if trial.state in st.TRIAL_TERMINAL or trial.state == st.TrialState.STOPPING_KILLED:
        return
    log.info("event=trial_kill_requested experiment_id=%s trial_id=%s", exp.id, trial.id)
    trial.state = st.TrialState.STOPPING_KILLED
    trial.exit_reason = "killed by the user"
    if not trial.searcher_closed:
        trial.searcher_closed = True
        method = _method(exp)
        _apply(s, master, exp, method, method.trial_exited_early(trial.request_id, ExitedReason.USER_CANCELED))
    reconcile_experiment(s, master, exp)
    master.notify(s)


def on_checkpoint_reported(s: Session, master: Master, checkpoint: Any) -> None:
    """Checkpoint rows are written by the API; nothing to decide here yet."""


def on_allocation_exited(s: Session, master: Master, alloc: Allocation) -> None:
    """Record what an ended allocation means for its trial; reconcile does the rest."""
    if alloc.trial_id is None:
        return
    trial = s.get(Trial, alloc.trial_id)
    if trial is None or trial.state in st.TRIAL_TERMINAL:
        return
    exp = s.get(Experiment, trial.experiment_id)
    assert exp is not None
    exp = _lock(s, exp)
    failure: str | None = None
    if alloc.end_cause == st.ExitCause.EXITED and alloc.exit_code not in (0, None):
        failure = f"exited with code {alloc.exit_code}"
    elif alloc.end_cause == st.ExitCause.EXITED and alloc.exit_code == 0 and _wants_slot(exp, trial):
        # Determined 0.38's rule: a trial that exits 0 unasked is complete ("just exit 0": its
        # op.report_completed() never reaches the master in 0.38.1), whether or not it validated at
        # the searcher's length. The searcher hears it closed (reconcile); one that wanted more of
        # it (ASHA) counts it as stopped early. An exit the master asked for (a preemption, a
        # pause) ended PREEMPTED (allocations.end_allocation) and runs again.
        done = trial.searcher_completed_length or 0
        master_line(s, master, alloc, f"exited with code 0: the trial is complete (the searcher asked for length "
                                       f"{trial.searcher_target_length}; {done} completed).", level="INFO")
        log.info("event=trial_exited_complete trial_id=%s target=%s completed=%s", trial.id,
                 trial.searcher_target_length, done)
        trial.searcher_closed = True
        return
    if failure is None:
        return
    trial.restarts += 1
    max_restarts = _config(exp).max_restarts
    log.info("event=trial_failed trial_id=%s exit_code=%s restarts=%s max_restarts=%s",
             trial.id, alloc.exit_code, trial.restarts, max_restarts)
    if trial.restarts > max_restarts:
        trial.exit_reason = f"{failure}; {max_restarts} restarts used up"
        _end_trial(s, master, exp, trial, st.TrialState.ERROR)
        method = _method(exp)
        _apply(s, master, exp, method, method.trial_exited_early(trial.request_id, ExitedReason.ERRORED))


def master_line(s: Session, master: Master, alloc: Allocation, text: str, level: str = "WARNING") -> None:
    """A line from the master in the trial's logs (source "master")."""
    s.add(TaskLog(task_id=alloc.task_id, allocation_id=alloc.id, timestamp=master.clock(), level=level,
                  stdtype="stderr", source="master", log=text + "\n"))


def _wants_slot(exp: Experiment, trial: Trial) -> bool:
    if trial.searcher_closed or trial.searcher_target_length is None:
        return False
    done = trial.searcher_completed_length
    return done is None or done < trial.searcher_target_length


def _end_trial(s: Session, master: Master, exp: Experiment, trial: Trial, state: str) -> None:
    if trial.state in st.TRIAL_TERMINAL:
        return
    trial.state = state
    trial.end_time = master.clock()
    log.info("event=trial_ended experiment_id=%s trial_id=%s state=%s", exp.id, trial.id, state)


# -- level-triggered reconciliation ----------------------------------------------------------------
_ALLOC_TO_TRIAL = {
    st.AllocationState.PENDING: st.TrialState.QUEUED,
    st.AllocationState.ASSIGNED: st.TrialState.STARTING,
    st.AllocationState.PULLING: st.TrialState.PULLING,
    st.AllocationState.STARTING: st.TrialState.STARTING,
    st.AllocationState.RUNNING: st.TrialState.RUNNING,
}


def reconcile_all(s: Session, master: Master) -> None:
    for exp in s.scalars(select(Experiment).where(Experiment.state.not_in(st.EXP_TERMINAL)).order_by(Experiment.id)).all():
        reconcile_experiment(s, master, exp)


def reconcile_experiment(s: Session, master: Master, exp: Experiment) -> None:
    # Experiment row first, then its trials: the same lock order as every other writer
    # (validation reports, state changes), so PostgreSQL never deadlocks between them.
    exp = _lock(s, exp)
    # Every tick reads every trial of every live experiment: their JSON columns are read only when
    # a trial needs them (a trial that ends), not decoded 500 times a tick.
    trials = list(s.scalars(select(Trial).where(Trial.experiment_id == exp.id)
                            .options(defer(Trial.hparams), defer(Trial.latest_validation))))
    live = {
        a.trial_id: a
        for a in s.scalars(
            select(Allocation).where(Allocation.experiment_id == exp.id, Allocation.state.in_(st.ALLOC_LIVE))
        )
    }
    closed_now: list[Trial] = []
    for trial in trials:
        if trial.state in st.TRIAL_TERMINAL:
            continue
        alloc = live.get(trial.id)
        if trial.state == st.TrialState.STOPPING_KILLED:  # the user killed this trial (kill_trial)
            if alloc is None:
                _end_trial(s, master, exp, trial, st.TrialState.CANCELED)
            elif alloc.state == st.AllocationState.PENDING:  # not started anywhere yet: withdraw it
                alloc.state = st.AllocationState.TERMINATED
                alloc.end_cause = st.ExitCause.KILLED
                alloc.ended_at = master.clock()
                _end_trial(s, master, exp, trial, st.TrialState.CANCELED)
            else:
                alloc.kill_requested = True
            continue
        if alloc is not None:
            _steer_live(master, exp, trial, alloc)
            continue
        if exp.state in st.EXP_STOPPING:
            _end_trial(s, master, exp, trial, st.TrialState.CANCELED if exp.state != st.ExperimentState.STOPPING_COMPLETED else st.TrialState.COMPLETED)
        elif trial.searcher_closed:
            _end_trial(s, master, exp, trial, st.TrialState.COMPLETED)
            closed_now.append(trial)
        elif exp.state == st.ExperimentState.ACTIVE and _wants_slot(exp, trial):
            _allocate(s, master, exp, trial)
        else:
            trial.state = st.TrialState.PAUSED if exp.state == st.ExperimentState.PAUSED else st.TrialState.QUEUED
    if closed_now:
        method = _method(exp)
        ops: list[Operation] = []
        for t in closed_now:
            ops.extend(method.trial_closed(t.request_id))
        _apply(s, master, exp, method, ops)
    _update_progress(exp, trials)
    _finish_experiment_if_done(s, master, exp, trials, live)


def _steer_live(master: Master, exp: Experiment, trial: Trial, alloc: Allocation) -> None:
    trial.state = _ALLOC_TO_TRIAL.get(alloc.state, trial.state)
    stop = exp.state != st.ExperimentState.ACTIVE or not _wants_slot(exp, trial)
    if stop and alloc.state == st.AllocationState.PENDING:
        # Not started anywhere yet: simply withdraw it.
        alloc.state = st.AllocationState.TERMINATED
        alloc.end_cause = st.ExitCause.KILLED
        alloc.ended_at = master.clock()
        log.info("event=allocation_withdrawn allocation_id=%s trial_id=%s", alloc.id, trial.id)
    elif exp.state == st.ExperimentState.STOPPING_KILLED:
        if not alloc.kill_requested:
            alloc.kill_requested = True
            log.info("event=kill_requested allocation_id=%s trial_id=%s", alloc.id, trial.id)
    elif stop and request_preemption(alloc, master.clock()):
        log.info("event=preempt_requested allocation_id=%s trial_id=%s reason=%s", alloc.id, trial.id,
                 "searcher" if exp.state == st.ExperimentState.ACTIVE else exp.state)


def request_preemption(alloc: Allocation, now: datetime) -> bool:
    """Ask an allocation to stop gracefully (its trial sees `should_preempt`, checkpoints and
    exits); the preemption grace (`preemption_grace_s`) runs from this first request. False if it
    was already asked."""
    if alloc.preempt_requested:
        return False
    alloc.preempt_requested = True
    alloc.preempt_requested_at = now
    return True


def _allocate(s: Session, master: Master, exp: Experiment, trial: Trial) -> None:
    pool_cfg = master.config.pool(exp.resource_pool)
    default_priority = (pool_cfg.scheduler if pool_cfg else SchedulerConfig()).default_priority
    trial.run_id += 1
    alloc = Allocation(
        id=f"{trial.task_id}.{trial.run_id}",
        task_id=trial.task_id,
        trial_id=trial.id,
        experiment_id=exp.id,
        pool=exp.resource_pool,
        slots_needed=_config(exp).resources.slots_per_trial,
        priority=exp.priority if exp.priority is not None else default_priority,
        weight=exp.weight,
        state=st.AllocationState.PENDING,
        run_id=trial.run_id,
        restored_checkpoint_uuid=trial.latest_checkpoint_uuid,
        created_at=master.clock(),
    )
    s.add(alloc)
    trial.state = st.TrialState.QUEUED
    log.info("event=allocation_requested allocation_id=%s trial_id=%s pool=%s slots=%s",
             alloc.id, trial.id, alloc.pool, alloc.slots_needed)
    master.notify(s)


def _finish_experiment_if_done(
    s: Session, master: Master, exp: Experiment, trials: list[Trial], live: dict[int | None, Allocation]
) -> None:
    if any(a.state in st.ALLOC_LIVE for a in live.values()):
        return
    if any(t.state not in st.TRIAL_TERMINAL for t in trials):
        return
    shutdown = (exp.searcher_state or {}).get("shutdown")
    final: str | None = None
    if exp.state == st.ExperimentState.STOPPING_CANCELED:
        final = st.ExperimentState.CANCELED
    elif exp.state == st.ExperimentState.STOPPING_KILLED:
        final = st.ExperimentState.CANCELED
    elif exp.state == st.ExperimentState.STOPPING_ERROR:
        final = st.ExperimentState.ERROR
    elif exp.state in (st.ExperimentState.ACTIVE, st.ExperimentState.STOPPING_COMPLETED) and shutdown is not None:
        final = st.ExperimentState.ERROR if shutdown.get("failure") else st.ExperimentState.COMPLETED
    if final is None:
        return
    exp.state = st.transition(exp.state, final)
    exp.end_time = master.clock()
    if final == st.ExperimentState.COMPLETED:
        exp.progress = 1.0
    log.info("event=experiment_ended experiment_id=%s state=%s", exp.id, final)
    from control_plane.services import checkpoint_gc

    checkpoint_gc.on_experiment_ended(s, master, exp)
