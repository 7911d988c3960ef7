"""Trials: finding and ordering them, and what a running trial asks of the master besides
metrics and checkpoints (its searcher operation, reporting one complete, progress, and whether
its allocation must stop)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from control_plane.core import metrics as metric_values
from control_plane.core import states as st
from control_plane.core import summary_metrics as summaries
from control_plane.db.models import Allocation, Experiment, Metric, Trial
from control_plane.errors import bad_request
from control_plane.master import Master
from control_plane.services import lifecycle


@dataclass(frozen=True)
class SearcherOperation:
    """`length`: train until this length, then validate (None: nothing to do now). `completed`:
    the searcher is done with the trial."""

    length: int | None
    completed: bool


def searcher_operation(s: Session, trial: Trial) -> SearcherOperation:
    if trial.searcher_closed or trial.state in st.TRIAL_TERMINAL:
        return SearcherOperation(None, True)
    exp = s.get(Experiment, trial.experiment_id)
    stopping = exp is None or exp.state != st.ExperimentState.ACTIVE
    target = trial.searcher_target_length
    done = trial.searcher_completed_length
    if target is not None and (done is None or done < target) and not stopping:
        return SearcherOperation(target, False)
    return SearcherOperation(None, False)


def complete_operation(s: Session, master: Master, trial: Trial, length: int, searcher_metric: float) -> None:
    """The trial's code reports its current operation done. A length already completed (e.g.
    through its validation metrics) is a no-op; any other length than the current one is refused."""
    done = trial.searcher_completed_length
    if done is not None and length <= done:
        return
    if trial.searcher_target_length is None or length != trial.searcher_target_length:
        raise bad_request(f"the trial's current operation is length {trial.searcher_target_length}", "op.length")
    lifecycle.complete_operation(s, master, trial, length, searcher_metric)


def must_stop(alloc: Allocation) -> bool:
    """Should the allocation's process checkpoint and exit (preemption, kill, or already ended)?"""
    return _must_stop(alloc.preempt_requested, alloc.kill_requested, alloc.state)


def _must_stop(preempt_requested: bool | None, kill_requested: bool | None, state: str) -> bool:
    return bool(preempt_requested or kill_requested or state == st.AllocationState.TERMINATED)


_STOP_ROW = select(Allocation.preempt_requested, Allocation.kill_requested, Allocation.state).where(
    Allocation.id == bindparam("allocation_id"))


def must_stop_by_id(s: Session, allocation_id: str) -> bool | None:
    """`must_stop` of the allocation with this id, None if there is none. The preemption long-poll
    asks at every wake-up: one small query, no ORM object."""
    row = s.connection().execute(_STOP_ROW, {"allocation_id": allocation_id}).first()
    return None if row is None else _must_stop(row.preempt_requested, row.kill_requested, row.state)


def stopping_among(s: Session, allocation_ids: Collection[str]) -> set[str]:
    """Which of these allocations must stop (`must_stop`), or are gone: the preemption long-polls
    waiting in a process, checked together in one query (frontdoor/preempt_polls.py)."""
    ids = set(allocation_ids)
    if not ids:
        return set()
    found: set[str] = set()
    stop: set[str] = set()
    for row in s.execute(select(Allocation.id, Allocation.preempt_requested, Allocation.kill_requested,
                                Allocation.state).where(Allocation.id.in_(ids))):
        found.add(row.id)
        if _must_stop(row.preempt_requested, row.kill_requested, row.state):
            stop.add(row.id)
    return stop | (ids - found)


# -- queries ---------------------------------------------------------------------------------------
SORTS = (
    "SORT_BY_UNSPECIFIED", "SORT_BY_ID", "SORT_BY_START_TIME", "SORT_BY_END_TIME", "SORT_BY_STATE",
    "SORT_BY_BEST_VALIDATION_METRIC", "SORT_BY_LATEST_VALIDATION_METRIC", "SORT_BY_BATCHES_PROCESSED",
    "SORT_BY_DURATION", "SORT_BY_RESTARTS", "SORT_BY_CHECKPOINT_SIZE", "SORT_BY_LOG_RETENTION_DAYS",
)


def trials_of(s: Session, experiment_id: int, states: Collection[str] = ()) -> list[Trial]:
    """An experiment's trials in id order, only those in `states` if given (STATE_ACTIVE: every
    state of a trial that has not ended, queued to running)."""
    wanted = set(states)
    if "STATE_ACTIVE" in wanted:
        wanted |= st.TRIAL_ACTIVE_SUBSTATES
    q = select(Trial).where(Trial.experiment_id == experiment_id)
    if wanted:
        q = q.where(Trial.state.in_(wanted))
    return list(s.scalars(q.order_by(Trial.id)))


def _sort_key(sort_by: str, t: Trial, ckpt_size: int, now: datetime) -> Any:
    """A sortable value, or None to put the trial last whatever the direction."""
    if sort_by == "SORT_BY_START_TIME":
        return t.start_time
    if sort_by == "SORT_BY_END_TIME":
        return t.end_time
    if sort_by == "SORT_BY_STATE":
        return t.state
    if sort_by == "SORT_BY_BEST_VALIDATION_METRIC":
        return t.best_validation if t.best_validation == t.best_validation else None  # NaN → last
    if sort_by == "SORT_BY_LATEST_VALIDATION_METRIC":
        value = metric_values.metric_number((t.latest_validation or {}).get("searcherMetric"))
        return value if value is not None and value == value else None
    if sort_by == "SORT_BY_BATCHES_PROCESSED":
        return t.steps_completed
    if sort_by == "SORT_BY_DURATION":
        return ((t.end_time or now) - t.start_time).total_seconds()
    if sort_by == "SORT_BY_RESTARTS":
        return t.restarts
    if sort_by == "SORT_BY_CHECKPOINT_SIZE":
        return ckpt_size
    return t.id


def ordered(trials: list[Trial], sort_by: str, desc: bool, checkpoint_size: dict[int, int], now: datetime) -> list[Trial]:
    """Trials by one of `SORTS` (ties by id); those without a value (no end time, no metric) last
    in either direction."""
    keyed = [(_sort_key(sort_by, t, checkpoint_size.get(t.id, 0), now), t) for t in trials]
    present = [(k, t) for k, t in keyed if k is not None]
    present.sort(key=lambda kt: (kt[0], kt[1].id), reverse=desc)
    return [t for _, t in present] + [t for k, t in keyed if k is None]


def summary_metrics(s: Session, trial_id: int) -> dict[str, dict[str, dict[str, Any]]] | None:
    """The trial's summary metrics (core/summary_metrics.py) from its stored reports, streamed in
    step order; None when it reported none. Computed when asked (one trial's GET), not kept."""
    rows = s.execute(select(Metric.group_name, Metric.metrics).where(Metric.trial_id == trial_id)
                     .order_by(Metric.steps_completed, Metric.id).execution_options(yield_per=1000))
    docs = ((group, (doc or {}).get("validation_metrics" if group == "validation" else "avg_metrics") or {})
            for group, doc in rows)
    return summaries.summarize(docs) or None
