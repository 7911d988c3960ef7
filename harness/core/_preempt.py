"""Preemption: the master asks the trial to stop (searcher closed it, experiment paused, scheduler).

A daemon thread long-polls `GET /api/v1/allocations/{id}/signals/preemption?timeoutSeconds=60`
(the master answers early when preemption is requested) and keeps the latest answer, so
`should_preempt()` is a plain attribute read: cheap enough to call every batch.
Once the answer is true it stays true and the thread stops polling.

Acknowledging (`POST …/signals/ack_preemption`) tells the master the process is stopping on its
request and expects to be resumed; an exit 0 without it reads as "the trial finished".
"""

from __future__ import annotations

import logging
import random
import threading

from harness.core._distributed import DistributedContext
from harness.core._session import APIError, Session

log = logging.getLogger("harness.core")


class _PreemptionWatcher(threading.Thread):
    def __init__(self, session: Session, allocation_id: str, poll_timeout_s: int = 60,
                 backoff_max_s: float = 30.0) -> None:
        super().__init__(name="harness-preemption-watcher", daemon=True)
        self._session = session
        self._path = f"/api/v1/allocations/{allocation_id}/signals/preemption"
        self._allocation_id = allocation_id
        self._poll_timeout_s = poll_timeout_s
        self._backoff_max_s = backoff_max_s
        self._stop_event = threading.Event()
        self.preempt = False
        self.polls = 0

    def run(self) -> None:
        failures = 0
        while not self._stop_event.is_set():
            try:
                resp = self._session.request_once(
                    "GET", self._path, params={"timeoutSeconds": self._poll_timeout_s},
                    read_timeout_s=self._poll_timeout_s + 15,
                )
                self.polls += 1
                failures = 0
                if isinstance(resp, dict) and resp.get("preempt"):
                    self.preempt = True
                    log.info("event=preemption_signal allocation_id=%s", self._allocation_id)
                    return
            except APIError as e:
                # Keep polling through outages: a missed preemption is worse than a few requests.
                failures += 1
                delay = random.uniform(0, min(self._backoff_max_s, 0.5 * 2 ** min(failures, 10)))
                delay = max(delay, getattr(e, "retry_after_s", None) or 0.0)  # a shedding master's hint
                if failures == 1 or failures % 10 == 0:
                    log.warning("event=preemption_poll_failed allocation_id=%s failures=%d error=%r",
                                self._allocation_id, failures, str(e))
                self._stop_event.wait(delay)

    def close(self) -> None:
        # The in-flight long poll cannot be interrupted; the thread is a daemon and its answer is
        # ignored after close.
        self._stop_event.set()


class PreemptContext:
    def __init__(
        self,
        dist: DistributedContext,
        session: Session | None = None,
        allocation_id: str | None = None,
        poll_timeout_s: int = 60,
    ) -> None:
        self._dist = dist
        self._session = session
        self._allocation_id = allocation_id
        self._watcher: _PreemptionWatcher | None = None
        if session is not None and allocation_id and dist.is_chief:
            self._watcher = _PreemptionWatcher(session, allocation_id, poll_timeout_s)
        self._ack_sent = False
        self._started = False

    def start(self) -> PreemptContext:
        if not self._started:
            self._started = True
            if self._watcher is not None:
                self._watcher.start()
        return self

    def close(self) -> None:
        if self._watcher is not None:
            self._watcher.close()

    def should_preempt(self, auto_ack: bool = True) -> bool:
        """True once the master asked this trial to stop. Never blocks on the network (for one
        process); with several workers it is a broadcast from the chief, so all must call it."""
        out = bool(self._watcher is not None and self._watcher.preempt)
        if out and auto_ack and not self._ack_sent:
            self.acknowledge_preemption_signal()
        if self._dist.size > 1:
            out = bool(self._dist.broadcast(out if self._dist.is_chief else None))
        return out

    def acknowledge_preemption_signal(self) -> None:
        if self._session is None or not self._allocation_id or self._ack_sent:
            return
        self._session.post(f"/api/v1/allocations/{self._allocation_id}/signals/ack_preemption", {})
        self._ack_sent = True
        log.info("event=preemption_acknowledged allocation_id=%s", self._allocation_id)
