"""Background shipping of metrics reports to the master.

The training loop calls `report()`; that costs a lock, a tuple and a deque append (plus the
shallow copy TrainContext makes). A daemon thread drains the buffer in order, encodes the reports
(JSON, non-finite floats as "NaN"/"Infinity"/"-Infinity") and posts them in batches:

    POST /api/v1/trials/{id}/metrics/batch {"reports": [ReportTrialMetricsRequest, ...]}

falling back to one `POST /api/v1/trials/{id}/metrics` per report when the batch endpoint answers
404 (a master without it). Batching is natural: whatever piled up while the previous request was
in flight goes in the next one, up to `max_batch`.

Surviving a master outage:
- Transient failures (refused, reset, timeout, 5xx, 429) are retried with exponential backoff and
  jitter, without an attempt limit while the trial runs: the master is expected back.
  The batch at the head is retried before anything newer, so the master sees reports in order.
- The master stores metrics idempotently per (trial, group, stepsCompleted), so re-sending a batch
  whose response was lost is safe.
- While the master is unreachable, the sender moves what waits in memory to a spool on disk
  (`_spool.MetricsSpool`, in `spool_dir`, the trial's work dir; at most `spool_max_bytes`) at
  every retry, and replays it oldest first once the master answers: the order is always the
  batch in flight, then the spool, then memory. An outage of any length costs disk, not memory.
- Memory is bounded too (`max_buffered`, 100k reports by default). When the spool is full (or
  there is none) and memory is full, `report()` BLOCKS until the sender makes room: a long outage
  slows training down instead of dropping metrics or growing without bound.
- `close()` flushes with a deadline (`flush_timeout_s`; a trial's has none unless
  SHIPYARD_METRICS_FLUSH_TIMEOUT_S sets one: its metrics wait for the master as long as it lives);
  what cannot be delivered by then is counted in `stats.lost` and logged.

Permanent rejections (4xx) of a report are logged, counted in `stats.rejected` and raised as a
MetricsReportError from the next `report()` (or `close()`), as Determined's Core API does; a
rejected batch is re-sent report by report so one bad report does not take its neighbours down.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Optional

from tenacity import Retrying, retry_if_exception_type, wait_random_exponential

from harness.core import _wire
from harness.core._session import APIError, HonourRetryAfter, NotFoundError, Session, TransientAPIError
from harness.core._spool import MetricsSpool

log = logging.getLogger("harness.core")

# (group, steps_completed, metrics, batch_metrics, report_time_epoch_s)
_Item = tuple[str, int, dict[str, Any], Optional[list[Any]], float]


class MetricsReportError(RuntimeError):
    """The master refused a metrics report (or reports could not be delivered before the deadline)."""


class _GaveUp(Exception):
    """The flush deadline passed while the master was still unreachable."""


@dataclass(frozen=True)
class ReporterConfig:
    max_buffered: int = 100_000
    max_batch: int = 1000
    backoff_initial_s: float = 0.1
    backoff_max_s: float = 10.0
    flush_timeout_s: Optional[float] = 300.0  # None: close() waits for the master however long
    spool_dir: Optional[str] = None  # None: no spool, memory only
    spool_max_bytes: int = 256 * 1024 * 1024

    @classmethod
    def for_trial(cls, environ: Mapping[str, str], work_dir: str) -> ReporterConfig:
        """A trial's: spooled in its work dir (SHIPYARD_METRICS_SPOOL_MAX_BYTES, default 256 MiB),
        waits between retries up to 10 s (less when SHIPYARD_RETRY_WAIT_MAX_S is lower: tests
        shrink it), and no flush deadline (SHIPYARD_METRICS_FLUSH_TIMEOUT_S sets one)."""
        defaults = cls()
        wait_max = min(defaults.backoff_max_s, float(environ.get("SHIPYARD_RETRY_WAIT_MAX_S") or defaults.backoff_max_s))
        flush = environ.get("SHIPYARD_METRICS_FLUSH_TIMEOUT_S")
        return cls(backoff_initial_s=min(defaults.backoff_initial_s, wait_max), backoff_max_s=wait_max,
                   flush_timeout_s=float(flush) if flush else None, spool_dir=work_dir,
                   spool_max_bytes=int(environ.get("SHIPYARD_METRICS_SPOOL_MAX_BYTES") or defaults.spool_max_bytes))


@dataclass
class ReporterStats:
    sent: int = 0  # reports the master acknowledged
    requests: int = 0  # successful HTTP requests carrying metrics
    retries: int = 0  # transient failures retried
    rejected: int = 0  # reports the master refused (4xx)
    lost: int = 0  # reports dropped because the flush deadline passed
    spooled: int = 0  # reports moved to the disk spool during outages
    spool_peak_bytes: int = 0
    batch_endpoint: bool = True  # False once the master answered 404 to /metrics/batch


class MetricsReporter:
    def __init__(
        self,
        session: Session,
        trial_id: int,
        trial_run_id: int,
        config: ReporterConfig | None = None,
    ) -> None:
        self.config = config or ReporterConfig()
        if self.config.max_buffered < 1 or self.config.max_batch < 1:
            raise ValueError("max_buffered and max_batch must be at least 1")
        self._session = session
        self._trial_id = trial_id
        self._trial_run_id = trial_run_id
        self._batch_path = f"/api/v1/trials/{trial_id}/metrics/batch"
        self._single_path = f"/api/v1/trials/{trial_id}/metrics"
        self._progress_path = f"/api/v1/trials/{trial_id}/progress"

        lock = threading.Lock()
        self._not_empty = threading.Condition(lock)  # the sender waits here
        self._changed = threading.Condition(lock)  # blocked producers and flush() wait here
        self._buf: deque[_Item] = deque()
        self._max = self.config.max_buffered
        self._enqueued = 0  # reports accepted by report()
        self._done = 0  # reports delivered, rejected or lost
        self._progress: float | None = None
        self._progress_busy = False
        self._sender_idle = False
        self._closing = False
        self._stopped = False
        self._deadline: float | None = None
        self._wake = threading.Event()
        self._error: MetricsReportError | None = None
        # The disk spool: made at the first outage, touched only by the sender thread.
        self._spool: MetricsSpool | None = None
        self._spool_broken = self.config.spool_dir is None
        self.stats = ReporterStats()
        self._thread = threading.Thread(target=self._run, name="harness-metrics-reporter", daemon=True)
        self._started = False

    # ---- caller side (training loop) -------------------------------------------------------------

    def start(self) -> None:
        if not self._started:
            self._started = True
            self._thread.start()

    def report(self, group: str, steps_completed: int, metrics: dict[str, Any],
               batch_metrics: list[Any] | None = None) -> None:
        """Enqueue one report. `metrics`/`batch_metrics` must already be the caller's copies."""
        if self._error is not None:
            self._raise_pending()
        item = (group, steps_completed, metrics, batch_metrics, time.time())
        with self._not_empty:
            if self._closing:
                raise RuntimeError("metrics reporter is closed")
            if len(self._buf) >= self._max:
                self._wait_for_room()
            self._buf.append(item)
            self._enqueued += 1
            if self._sender_idle:  # Condition.notify() is pure Python; skip it when nobody waits
                self._not_empty.notify()

    def report_progress(self, progress: float) -> None:
        """Only the latest progress matters, so it overwrites instead of queueing."""
        with self._not_empty:
            if self._closing:
                raise RuntimeError("metrics reporter is closed")
            self._progress = progress
            self._not_empty.notify()

    def _wait_for_room(self) -> None:
        # Called with the lock held.
        log.warning("event=metrics_buffer_full trial_id=%s buffered=%d action=blocking_training_loop",
                    self._trial_id, len(self._buf))
        t0 = time.monotonic()
        while len(self._buf) >= self._max:
            if self._stopped:
                raise MetricsReportError("metrics reporter stopped; cannot accept more reports")
            self._changed.wait(1.0)
        log.info("event=metrics_buffer_room trial_id=%s blocked_s=%.3f", self._trial_id, time.monotonic() - t0)

    def _raise_pending(self) -> None:
        err, self._error = self._error, None
        if err is not None:
            raise err

    @property
    def pending(self) -> int:
        with self._changed:
            return self._enqueued - self._done

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything enqueued so far is delivered (or given up). False on timeout."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            target = self._enqueued
            while self._done < target or self._progress is not None or self._progress_busy:
                if self._stopped:
                    return self._done >= target
                remaining = None if end is None else end - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._changed.wait(remaining if remaining is not None else 1.0)
        return True

    def close(self, timeout: float | None = None) -> ReporterStats:
        """Flush with a deadline (`timeout`, else the config's; None there: none), stop the sender,
        and raise a pending MetricsReportError if any."""
        timeout = self.config.flush_timeout_s if timeout is None else timeout
        with self._not_empty:
            if not self._closing:
                self._closing = True
                self._deadline = None if timeout is None else time.monotonic() + timeout
            self._not_empty.notify_all()
        self._wake.set()  # cut a backoff sleep short: try once more right now
        if self._started:
            self._thread.join(None if timeout is None else timeout + 10)
        else:
            self._drop_unsent("reporter never started")
        self._raise_pending()
        return self.stats

    # ---- sender side (background thread) -----------------------------------------------------------

    def _spooled(self) -> int:
        return self._spool.count if self._spool is not None else 0

    def _run(self) -> None:
        try:
            while True:
                spooled: list[bytes] = []
                with self._not_empty:
                    while (not self._buf and not self._spooled() and self._progress is None
                           and not self._closing):
                        self._sender_idle = True
                        self._not_empty.wait()
                        self._sender_idle = False
                    if not self._buf and not self._spooled() and self._progress is None:
                        return  # closing and drained
                    batch: list[_Item] = []
                    if not self._spooled():  # the spool holds older reports than memory
                        batch = [self._buf.popleft() for _ in range(min(len(self._buf), self.config.max_batch))]
                    progress, self._progress = self._progress, None
                    self._progress_busy = progress is not None
                    self._changed.notify_all()  # room for blocked producers
                try:
                    if self._spool is not None and self._spool.count:
                        spooled = self._peek_spool()
                    if spooled:
                        self._ship(spooled)
                        assert self._spool is not None
                        self._spool.pop(spooled)
                    elif batch:
                        self._ship([_wire.dumps(self._body(item)) for item in batch])
                    if progress is not None:
                        self._ship_progress(progress)
                except _GaveUp:
                    self._drop_unsent("master unreachable at flush deadline", in_flight=len(batch))
                    return
                except Exception as e:  # never let a bug kill the sender silently
                    log.exception("event=metrics_sender_error trial_id=%s", self._trial_id)
                    self._set_error(MetricsReportError(f"metrics sender failed: {e!r}"))
                with self._changed:
                    self._done += len(batch) + len(spooled)
                    self._progress_busy = False
                    self._changed.notify_all()
        finally:
            if self._spool is not None:
                self._spool.close()
            with self._changed:
                self._stopped = True
                self._changed.notify_all()

    def _peek_spool(self) -> list[bytes]:
        """The oldest spooled reports; an unreadable spool counts its reports as lost."""
        assert self._spool is not None
        try:
            return self._spool.peek(self.config.max_batch)
        except OSError as e:
            lost = self._spool.count
            log.error("event=metrics_spool_unreadable trial_id=%s path=%s lost=%d error=%r", self._trial_id,
                      self._spool.path, lost, str(e))
            self._spool.close()
            self._spool, self._spool_broken = None, True
            self.stats.lost += lost
            with self._changed:
                self._done += lost
                self._changed.notify_all()
            self._set_error(MetricsReportError(f"{lost} metrics reports were lost with the spool: {e}"))
            return []

    def _spill(self) -> None:
        """Move what waits in memory to the disk spool, oldest first, as far as it fits. Only the
        sender removes from the left of the buffer, so the copied prefix is still there to drop."""
        if self._spool_broken:
            return
        with self._not_empty:
            items = list(self._buf)
        if not items:
            return
        try:
            if self._spool is None:
                assert self.config.spool_dir is not None
                self._spool = MetricsSpool(self.config.spool_dir, self.config.spool_max_bytes)
                log.warning("event=metrics_spool_opened trial_id=%s path=%s max_bytes=%d", self._trial_id,
                         self._spool.path, self.config.spool_max_bytes)
            taken = self._spool.append([_wire.dumps(self._body(item)) for item in items])
        except OSError as e:
            # Unwritable (full disk, read-only dir): memory alone from now on, blocking when full.
            log.warning("event=metrics_spool_unavailable trial_id=%s dir=%s error=%r", self._trial_id,
                        self.config.spool_dir, str(e))
            self._spool_broken = True
            return
        if not taken:
            return
        self.stats.spooled += taken
        self.stats.spool_peak_bytes = max(self.stats.spool_peak_bytes, self._spool.live_bytes)
        with self._changed:
            for _ in range(taken):
                self._buf.popleft()
            self._changed.notify_all()  # room for a blocked producer

    def _drop_unsent(self, why: str, in_flight: int = 0) -> None:
        with self._changed:
            lost = in_flight + len(self._buf) + self._spooled()
            self._buf.clear()
            self._progress = None
            self._progress_busy = False
            self._done = self._enqueued
            self._changed.notify_all()
        if self._spool is not None:
            self._spool.close()
            self._spool = None
        if lost:
            self.stats.lost += lost
            log.error("event=metrics_lost trial_id=%s count=%d reason=%r", self._trial_id, lost, why)
            self._set_error(MetricsReportError(f"{lost} metrics reports were not delivered: {why}"))

    def _set_error(self, err: MetricsReportError) -> None:
        if self._error is None:
            self._error = err

    def _body(self, item: _Item) -> dict[str, Any]:
        group, steps, metrics, batch_metrics, t = item
        inner: dict[str, Any] = {"avgMetrics": metrics}
        if batch_metrics is not None:
            inner["batchMetrics"] = batch_metrics
        return {
            "group": group,
            "metrics": {
                "trialId": self._trial_id,
                "trialRunId": self._trial_run_id,
                "stepsCompleted": steps,
                "metrics": inner,
                "reportTime": _wire.rfc3339(t),
            },
        }

    def _ship(self, encoded: list[bytes]) -> None:
        """Deliver encoded reports (one `_wire.dumps` of a body each: encoded one by one so a report
        with NaN or numpy values does not push the whole batch off the C encoder's fast path, and
        reused if we fall back to single posts)."""
        if self.stats.batch_endpoint:
            try:
                self._send(self._batch_path, b'{"reports":[' + b",".join(encoded) + b"]}")
                self.stats.sent += len(encoded)
                return
            except NotFoundError:
                self.stats.batch_endpoint = False
                log.info("event=metrics_batch_unsupported trial_id=%s action=one_request_per_report",
                         self._trial_id)
            except APIError as e:
                if len(encoded) == 1:
                    self._reject(encoded[0], e)
                    return
                log.warning("event=metrics_batch_rejected trial_id=%s size=%d error=%r action=resend_singly",
                            self._trial_id, len(encoded), str(e))
        for raw in encoded:
            try:
                self._send(self._single_path, raw)
                self.stats.sent += 1
            except APIError as e:
                self._reject(raw, e)

    def _ship_progress(self, progress: float) -> None:
        try:
            self._send(self._progress_path, _wire.dumps({"progress": progress, "isRaw": False}))
        except APIError as e:
            # Progress only feeds the UI; a refusal is worth a log line, not a failed trial.
            log.warning("event=progress_rejected trial_id=%s error=%r", self._trial_id, str(e))

    def _reject(self, raw: bytes, e: APIError) -> None:
        self.stats.rejected += 1
        body = json.loads(raw)
        group, steps = body["group"], body["metrics"]["stepsCompleted"]
        log.error("event=metrics_rejected trial_id=%s group=%s steps_completed=%s error=%r",
                  self._trial_id, group, steps, str(e))
        self._set_error(MetricsReportError(
            f"master rejected {group} metrics at steps_completed={steps}: {e}"
        ))

    def _send(self, path: str, raw: bytes) -> None:
        """POST until it succeeds, the master answers with a permanent error, or the deadline passes."""
        def _stop(_state: Any) -> bool:
            return self._deadline is not None and time.monotonic() >= self._deadline

        def _before_sleep(state: Any) -> None:
            self.stats.retries += 1
            if state.attempt_number == 1 or state.attempt_number % 10 == 0:
                exc = state.outcome.exception() if state.outcome else None
                log.warning("event=metrics_send_retry trial_id=%s attempt=%d pending=%d spooled=%d error=%r",
                            self._trial_id, state.attempt_number, len(self._buf), self._spooled(), str(exc))

        sleep: Callable[[float], None] = self._sleep
        try:
            for attempt in Retrying(
                retry=retry_if_exception_type(TransientAPIError),
                wait=HonourRetryAfter(wait_random_exponential(multiplier=self.config.backoff_initial_s,
                                                              max=self.config.backoff_max_s)),
                stop=_stop,
                sleep=sleep,
                before_sleep=_before_sleep,
                reraise=True,
            ):
                with attempt:
                    self._session.request_once("POST", path, raw_body=raw)
        except TransientAPIError as e:
            raise _GaveUp(str(e)) from e
        self.stats.requests += 1

    def _sleep(self, seconds: float) -> None:
        # The master is unreachable: what piled up in memory goes to disk while we wait.
        self._spill()
        if self._deadline is not None:
            seconds = max(0.0, min(seconds, self._deadline - time.monotonic()))
        if self._wake.wait(seconds):
            self._wake.clear()
