"""Searcher operations: "train until `length` units, validate, report the searcher metric".

On a cluster, operations come from `GET /api/v1/trials/{id}/searcher/operation`
→ `{"op": {"validateAfter": {"length": N}} | null, "completed": bool}` (Determined ≤0.26 shape).
`op: null, completed: false` means the searcher is waiting on other trials (e.g. an ASHA rung),
so we poll again. Lengths are absolute (train *until* N), in the unit configured in the
experiment's searcher section; that is what makes resuming after a restart simple.

Iteration stops when the master says `completed`, or when the trial is preempted (the
preemption is acknowledged so the master knows to resume the trial later).
"""

from __future__ import annotations

import enum
import logging
import random
import threading
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from harness.core import _wire
from harness.core._distributed import DistributedContext
from harness.core._preempt import PreemptContext
from harness.core._session import Session
from harness.core._train import TrainContext

log = logging.getLogger("harness.core")


class Unit(enum.Enum):
    EPOCHS = "EPOCHS"
    RECORDS = "RECORDS"
    BATCHES = "BATCHES"


def parse_max_length(experiment_config: dict[str, Any]) -> int | None:
    """searcher.max_length is `100` or `{"batches": 100}`."""
    ml = (experiment_config.get("searcher") or {}).get("max_length")
    if isinstance(ml, dict):
        ml = next(iter(ml.values()), None)
    return ml if isinstance(ml, int) and not isinstance(ml, bool) else None


def parse_units(experiment_config: dict[str, Any]) -> Unit | None:
    searcher = experiment_config.get("searcher") or {}
    names = {"records": Unit.RECORDS, "epochs": Unit.EPOCHS, "batches": Unit.BATCHES}
    if "unit" in searcher:
        return names.get(str(searcher["unit"]).lower())
    ml = searcher.get("max_length")
    if isinstance(ml, dict) and len(ml) == 1:
        return names.get(next(iter(ml)))
    return None


class OperationSource(Protocol):
    def next_length(self, after: int | None) -> int | None:
        """The next operation's length greater than `after`, or None when there is no more work."""
        ...

    def completed(self, length: int, searcher_metric: Any) -> None: ...


class MasterOperationSource:
    def __init__(self, session: Session, trial_id: int, preempt: PreemptContext,
                 flush_metrics: Callable[[], object], poll_interval_s: float = 1.0,
                 poll_interval_max_s: float = 5.0) -> None:
        self._session = session
        self._trial_id = trial_id
        self._preempt = preempt
        self._flush_metrics = flush_metrics
        self._poll_interval_s = poll_interval_s
        self._poll_interval_max_s = poll_interval_max_s
        self._stop = threading.Event()

    def next_length(self, after: int | None) -> int | None:
        interval = self._poll_interval_s
        while True:
            if self._preempt.should_preempt():
                log.info("event=searcher_stop reason=preempted trial_id=%s", self._trial_id)
                return None
            resp = self._session.get(f"/api/v1/trials/{self._trial_id}/searcher/operation") or {}
            if resp.get("completed"):
                log.info("event=searcher_stop reason=completed trial_id=%s", self._trial_id)
                return None
            op = resp.get("op") or {}
            length = (op.get("validateAfter") or {}).get("length")
            if length is not None:
                length = int(length)
                # The master may still show the op we just completed; that is not new work.
                if after is None or length > after:
                    return length
            # Nothing to do yet (other trials must report first): poll again, gently.
            self._stop.wait(interval * random.uniform(0.8, 1.2))
            interval = min(self._poll_interval_max_s, interval * 1.5)

    def completed(self, length: int, searcher_metric: Any) -> None:
        # Validation metrics reported before this call must reach the master first: they are the
        # record the searcher decision is based on.
        self._flush_metrics()
        self._session.post(
            f"/api/v1/trials/{self._trial_id}/searcher/completed_operation",
            {"op": {"length": length}, "searcherMetric": _wire.jsonable(searcher_metric)},
        )


class LocalOperationSource:
    """Off-cluster: exactly one operation of a fixed length."""

    def __init__(self, length: int) -> None:
        self.length = length
        self.results: list[tuple[int, Any]] = []

    def next_length(self, after: int | None) -> int | None:
        return self.length if after is None else None

    def completed(self, length: int, searcher_metric: Any) -> None:
        self.results.append((length, searcher_metric))
        log.info("event=searcher_op_completed length=%d searcher_metric=%r off_cluster=true", length, searcher_metric)


class SearcherOperation:
    def __init__(self, source: OperationSource, train: TrainContext, length: int, is_chief: bool) -> None:
        self._source = source
        self._train = train
        self._length = length
        self._is_chief = is_chief
        self._completed = False

    @property
    def length(self) -> int:
        """Train until this many units (absolute, not incremental), then validate."""
        return self._length

    @property
    def completed(self) -> bool:
        return self._completed

    def report_progress(self, length: float) -> None:
        """Progress in the op's unit; sent (asynchronously) as a fraction of the op's length."""
        if not self._is_chief:
            raise RuntimeError("op.report_progress() may only be called by the chief worker")
        if self._completed and length != self._length:
            raise RuntimeError("op.report_progress() called after op.report_completed()")
        self._train.report_progress(min(1.0, max(0.0, float(length) / self._length)) if self._length else 1.0)

    def report_completed(self, searcher_metric: Any) -> None:
        if not self._is_chief:
            raise RuntimeError("op.report_completed() may only be called by the chief worker")
        if self._completed:
            raise RuntimeError("op.report_completed() may only be called once per operation")
        self._source.completed(self._length, searcher_metric)
        self._completed = True


class SearcherContext:
    def __init__(self, source: OperationSource, train: TrainContext, dist: DistributedContext,
                 units: Unit | None = None) -> None:
        self._source = source
        self._train = train
        self._dist = dist
        self._units = units

    def operations(self) -> Iterator[SearcherOperation]:
        """Yield operations until the searcher has no more work for this trial or it is preempted.
        Each yielded op must be completed with `op.report_completed(metric)` before the next one.
        With several workers, all call this in step; the chief asks the master and broadcasts."""
        last: int | None = None
        while True:
            length = self._source.next_length(last) if self._dist.is_chief else None
            if self._dist.size > 1:
                length = self._dist.broadcast(length)
            if length is None:
                return
            op = SearcherOperation(self._source, self._train, length, self._dist.is_chief)
            yield op
            if self._dist.is_chief and not op.completed:
                raise RuntimeError("call op.report_completed(searcher_metric) before asking for the next operation")
            last = length

    def acknowledge_out_of_ops(self) -> None:
        """Kept for Determined compatibility; nothing to do."""

    def get_configured_units(self) -> Unit | None:
        return self._units
