"""The Core API's TensorBoard side (Determined's TensorboardMode.AUTO): every training and
validation report becomes scalars in event files, which are synced to checkpoint storage.

`report()` runs on the training thread and only appends to a bounded queue; a daemon thread turns
reports into records (`events.scalars_for_report`), writes them (`writer.EventFileWriter`) and asks
the uploader (`sync.TensorboardSync`) for a pass, which it batches to at most one a second.
`close()` writes what is queued, closes the file and makes the final upload (then removes the local
directory, unless an upload failed: the files stay for whoever looks).
"""

from __future__ import annotations

import logging
import shutil
import threading
from collections import deque
from typing import Any, Optional

from harness.tensorboard.events import scalars_for_report
from harness.tensorboard.sync import TensorboardSync
from harness.tensorboard.writer import EventFileWriter

log = logging.getLogger("harness.tensorboard")

_Report = tuple[str, int, dict, Optional[list]]


class TensorboardManager:
    def __init__(self, sync: TensorboardSync, *, write_metrics: bool = True, max_pending: int = 100_000,
                 writer: Optional[EventFileWriter] = None, remove_local: bool = False) -> None:
        self.sync = sync
        self.remove_local = remove_local
        self.write_metrics = write_metrics
        self.writer = writer or EventFileWriter(sync.base_path)
        self._max_pending = max_pending
        self._queue: deque[_Report] = deque()
        self._cond = threading.Condition()
        self._closing = False
        self._thread: Optional[threading.Thread] = None
        self.dropped = 0  # reports not written because the queue was full (the writer fell behind)
        self.written = 0  # scalars written

    @property
    def base_path(self) -> Any:
        return self.sync.base_path

    def start(self) -> TensorboardManager:
        self.sync.start()
        if self.write_metrics:
            self._thread = threading.Thread(target=self._run, name="harness-tensorboard", daemon=True)
            self._thread.start()
        return self

    def report(self, group: str, steps_completed: int, metrics: dict, batch_metrics: Optional[list]) -> None:
        """Queue one report (training thread; cheap). Groups other than training and validation
        are written as nothing, as Determined does."""
        if not self.write_metrics or group not in ("training", "validation"):
            return
        with self._cond:
            if len(self._queue) >= self._max_pending:
                self.dropped += 1
                if self.dropped == 1:
                    log.warning("event=tensorboard_queue_full max_pending=%d: reports are not written "
                                "to TensorBoard until the writer catches up", self._max_pending)
                return
            self._queue.append((group, steps_completed, metrics, batch_metrics))
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue:
                    return
                batch = list(self._queue)
                self._queue.clear()
            try:
                self._write(batch)
            except Exception:  # noqa: BLE001 (TensorBoard must never take the trial down)
                log.exception("event=tensorboard_write_failed")

    def _write(self, batch: list) -> None:
        for group, steps, metrics, batch_metrics in batch:
            scalars = scalars_for_report(group, steps, metrics, batch_metrics)
            self.writer.add_scalars(scalars)
            self.written += len(scalars)
        self.writer.flush()
        self.sync.request()

    def upload(self, selector: Any = None, mangler: Any = None) -> None:
        """MANUAL mode's `upload_tensorboard_files`: a pass over the files the user wrote."""
        self.sync.request(selector, mangler)

    def close(self) -> None:
        """Write what is queued, close the file, stop the threads, final upload (AUTO mode)."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
        try:
            self.writer.close()
        except OSError:
            log.exception("event=tensorboard_close_failed")
        failures = self.sync.failures
        n = self.sync.close(final_pass=self.write_metrics)
        if self.remove_local and self.sync.failures == failures:
            shutil.rmtree(self.sync.base_path, ignore_errors=True)
        log.info("event=tensorboard_closed scalars=%d dropped=%d files_uploaded=%d final_pass=%d "
                 "failures=%d storage=%s/%s", self.written, self.dropped, self.sync.uploads, n,
                 self.sync.failures, self.sync.storage.describe(), self.sync.storage_path)
