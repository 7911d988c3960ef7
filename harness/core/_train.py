"""Training metrics and progress.

On a cluster, reports go to the background MetricsReporter (see _reporter.py): the calling
thread only validates cheaply, makes a shallow copy of the metrics dict (so the loop can reuse
its dict) and enqueues. Off-cluster they are printed and kept in memory in `LocalMetricsSink`.
"""

from __future__ import annotations

import enum
import logging
import math
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol, TextIO

from harness.core._distributed import DistributedContext
from harness.core._session import APIError, NotFoundError, Session

if TYPE_CHECKING:
    from harness.tensorboard.manager import TensorboardManager

log = logging.getLogger("harness.core")

TRAINING = "training"
VALIDATION = "validation"


class EarlyExitReason(enum.Enum):
    INVALID_HP = "EXITED_REASON_INVALID_HP"
    USER_REQUESTED_STOP = "EXITED_REASON_USER_REQUESTED_STOP"


class MetricsSink(Protocol):
    def report(self, group: str, steps_completed: int, metrics: dict[str, Any],
               batch_metrics: list[Any] | None = None) -> None: ...
    def report_progress(self, progress: float) -> None: ...
    def flush(self, timeout: float | None = None) -> bool: ...


@dataclass
class MetricsReport:
    group: str
    steps_completed: int
    metrics: dict[str, Any]
    batch_metrics: list[Any] | None = None
    report_time: float = 0.0


@dataclass
class LocalMetricsSink:
    """Off-cluster: every report is kept (for inspection and tests) and printed one line each."""

    echo: bool = True
    stream: TextIO | None = None
    reports: list[MetricsReport] = field(default_factory=list)
    progress: float | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def report(self, group: str, steps_completed: int, metrics: dict[str, Any],
               batch_metrics: list[Any] | None = None) -> None:
        with self._lock:
            self.reports.append(MetricsReport(group, steps_completed, metrics, batch_metrics, time.time()))
        if self.echo:
            shown = " ".join(f"{k}={_fmt(v)}" for k, v in metrics.items())
            print(f"[harness] {group} steps_completed={steps_completed} {shown}", file=self.stream or sys.stdout)

    def report_progress(self, progress: float) -> None:
        self.progress = progress

    def flush(self, timeout: float | None = None) -> bool:
        return True

    def by_group(self, group: str) -> list[MetricsReport]:
        with self._lock:
            return [r for r in self.reports if r.group == group]


def _fmt(v: Any) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


class TrainContext:
    def __init__(
        self,
        sink: MetricsSink,
        dist: DistributedContext,
        *,
        session: Session | None = None,
        trial_id: int | None = None,
        experiment_id: int | None = None,
        searcher_metric: str | None = None,
        smaller_is_better: bool = True,
        tensorboard: TensorboardManager | None = None,
    ) -> None:
        self._sink = sink
        self._tensorboard = tensorboard
        self._dist = dist
        self._session = session
        self._trial_id = trial_id
        self._experiment_id = experiment_id
        self._searcher_metric = searcher_metric
        self._smaller_is_better = smaller_is_better

    def _report(self, group: str, steps_completed: int, metrics: dict[str, Any],
                batch_metrics: list[Any] | None, any_rank: bool = False) -> None:
        if type(steps_completed) is not int:
            steps_completed = _as_steps(steps_completed)
        if steps_completed < 0:
            raise ValueError(f"steps_completed must be >= 0, got {steps_completed}")
        if not isinstance(metrics, dict):
            raise TypeError(f"metrics must be a dict, got {type(metrics).__name__}")
        if batch_metrics is not None:
            batch_metrics = list(batch_metrics)
        if not self._dist.is_chief:
            # With several workers the chief reports for the trial; a worker's own report is kept
            # only when asked for, under a group of its own (it must not replace the chief's).
            if not any_rank:
                return
            group = f"{group}_rank{self._dist.rank}"
        metrics = dict(metrics)
        self._sink.report(group, steps_completed, metrics, batch_metrics)
        if self._tensorboard is not None:
            self._tensorboard.report(group, steps_completed, metrics, batch_metrics)

    def report_training_metrics(self, steps_completed: int, metrics: dict[str, Any],
                                batch_metrics: list[dict[str, Any]] | None = None, *,
                                any_rank: bool = False) -> None:
        """Queue training metrics; returns immediately (see _reporter.py for delivery guarantees).
        With several workers only the chief's report is sent, unless `any_rank`: a worker's then
        goes under the group `training_rank<N>`."""
        self._report(TRAINING, steps_completed, metrics, batch_metrics, any_rank)

    def report_validation_metrics(self, steps_completed: int, metrics: dict[str, Any], *,
                                  any_rank: bool = False) -> None:
        """Queue validation metrics. The one named by searcher.metric drives the searcher (the
        chief's: a worker's, with `any_rank`, goes under `validation_rank<N>`)."""
        for name, value in metrics.items():
            if value is None:
                # Determined fails the trial on a None validation metric: it is always a bug.
                raise ValueError(f"validation metric {name!r} is None")
        self._report(VALIDATION, steps_completed, metrics, None, any_rank)

    def report_metrics(self, group: str, steps_completed: int, metrics: dict[str, Any], *,
                       any_rank: bool = False) -> None:
        """Queue metrics of any group ("training", "validation", or your own name without '.')."""
        if not isinstance(group, str) or not group or "." in group:
            raise ValueError(f"metrics group must be a non-empty string without '.', got {group!r}")
        self._report(group, steps_completed, metrics, None, any_rank)

    def report_progress(self, progress: float) -> None:
        """Fraction of the trial's training done, in [0, 1]. Only the latest value is sent."""
        progress = float(progress)
        if not 0.0 <= progress <= 1.0:
            raise ValueError(f"progress must be between 0 and 1, got {progress}")
        if self._dist.is_chief:
            self._sink.report_progress(progress)

    def get_tensorboard_path(self) -> Path | None:
        """The directory whose TensorBoard files are synced to checkpoint storage (None off-cluster)."""
        return None if self._tensorboard is None else self._tensorboard.base_path

    def upload_tensorboard_files(self, selector: Optional[Callable[[Path], bool]] = None,
                                 mangler: Optional[Callable[[Path, int], Path]] = None) -> None:
        """MANUAL mode: upload the TensorBoard files under `get_tensorboard_path()` that changed
        (in the background, at most once a second; `selector` picks files, `mangler(relpath, rank)`
        renames them). In AUTO mode the harness does this itself: RuntimeError, as in Determined."""
        if self._tensorboard is None:
            log.info("event=upload_tensorboard_files off_cluster=true")
            return
        if self._tensorboard.write_metrics:
            raise RuntimeError("upload_tensorboard_files can only be used in MANUAL mode")
        self._tensorboard.upload(selector, mangler)

    def report_early_exit(self, reason: EarlyExitReason) -> None:
        reason = EarlyExitReason(reason)
        if self._session is None:
            log.info("event=early_exit reason=%s off_cluster=true", reason.value)
            return
        try:
            self._session.post(f"/api/v1/trials/{self._trial_id}/early_exit", {"reason": reason.value})
        except APIError as e:
            if e.status == 400:
                log.warning("event=early_exit_already_reported trial_id=%s", self._trial_id)
                return
            raise

    def get_experiment_best_validation(self) -> float | None:
        """Best searcher-metric value reported so far across the experiment (None if none yet)."""
        if self._session is None:
            return self._local_best_validation()
        try:
            resp = self._session.get(
                f"/api/v1/experiments/{self._experiment_id}/searcher/best_searcher_validation_metric"
            )
        except NotFoundError:
            return None
        value = resp.get("metric") if isinstance(resp, dict) else None
        return None if value is None else float(value)

    def _local_best_validation(self) -> float | None:
        if not isinstance(self._sink, LocalMetricsSink) or not self._searcher_metric:
            return None
        values = [r.metrics[self._searcher_metric] for r in self._sink.by_group(VALIDATION)
                  if isinstance(r.metrics.get(self._searcher_metric), (int, float))]
        values = [float(v) for v in values if not math.isnan(v)]
        if not values:
            return None
        return min(values) if self._smaller_is_better else max(values)


def _as_steps(value: Any) -> int:
    try:
        steps = int(value)
    except (TypeError, ValueError):
        raise TypeError(f"steps_completed must be an integer, got {value!r}") from None
    if steps != value:
        raise TypeError(f"steps_completed must be an integer, got {value!r}")
    return steps
