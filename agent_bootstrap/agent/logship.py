"""Task output → log lines → batches → the master.

Two halves:
  LineAssembler  bytes from a pipe → text lines (utf-8, errors replaced), each at most
                 MAX_LINE_BYTES of utf-8; a longer line is split into chunks. A line keeps its
                 trailing newline (as Determined ships them), so joining the chunks gives the output.
  LogShipper     a thread that batches lines (by count and by age), sends each batch through a
                 LogSink, keeps a failed batch and retries it with backoff (order preserved, nothing
                 lost), and bounds its buffer: `add` never blocks, so a task's pipes are always drained.
                 When the bound is hit during a long outage the oldest waiting lines are dropped and a
                 marker line says how many.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal, Protocol

from agent_bootstrap.agent.client import (
    AuthRefused,
    MasterClient,
    MasterUnavailable,
    RequestRefused,
    backoff_delay,
)
from shipyard_common.wire import rfc3339

log = logging.getLogger("shipyard.agent.logs")

MAX_LINE_BYTES = 64 * 1024


# ---------------------------------------------------------------------------------------------
# Lines


def split_utf8(text: str, max_bytes: int = MAX_LINE_BYTES) -> list[str]:
    """`text` in pieces whose utf-8 encoding is at most `max_bytes`, cut on character boundaries."""
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return [text]
    out = []
    start = 0
    while start < len(data):
        end = min(start + max_bytes, len(data))
        # Back off over continuation bytes (10xxxxxx) so no character is cut in half.
        while end < len(data) and end > start and (data[end] & 0xC0) == 0x80:
            end -= 1
        out.append(data[start:end].decode("utf-8"))
        start = end
    return out


class LineAssembler:
    """Feed raw bytes as they come from a pipe; get back complete lines (or chunks of long ones)."""

    def __init__(self, max_bytes: int = MAX_LINE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._buf = bytearray()

    def _emit(self, raw: bytes) -> list[str]:
        # errors="replace" may grow the text (one bad byte becomes a 3-byte U+FFFD), hence the re-split.
        return split_utf8(raw.decode("utf-8", errors="replace"), self.max_bytes)

    def feed(self, data: bytes) -> list[str]:
        self._buf += data
        out: list[str] = []
        while self._buf:
            nl = self._buf.find(b"\n", 0, self.max_bytes)
            if nl != -1:
                out += self._emit(bytes(self._buf[: nl + 1]))
                del self._buf[: nl + 1]
                continue
            if len(self._buf) <= self.max_bytes:
                break  # maybe the newline is in the next read
            cut = self.max_bytes
            # Do not split a utf-8 sequence between two chunks (at most 3 continuation bytes).
            back = cut
            while back > cut - 4 and (self._buf[back] & 0xC0) == 0x80:
                back -= 1
            if back > cut - 4 and back > 0:
                cut = back
            out += self._emit(bytes(self._buf[:cut]))
            del self._buf[:cut]
        return out

    def finish(self) -> list[str]:
        """What is left at end of stream: a last line without its newline."""
        if not self._buf:
            return []
        rest = bytes(self._buf)
        self._buf.clear()
        return self._emit(rest)


# ---------------------------------------------------------------------------------------------
# Shipping


@dataclass(frozen=True)
class LogLine:
    allocation_id: str
    task_id: str
    text: str
    stdtype: Literal["stdout", "stderr"] = "stdout"
    source: Literal["task", "agent"] = "task"
    level: str = "LOG_LEVEL_INFO"
    token: str | None = field(default=None, repr=False)
    timestamp: datetime = field(default_factory=lambda: datetime.now(timezone.utc))

    @property
    def size(self) -> int:
        return len(self.text) + 200  # the entry's other fields, roughly


class SinkUnavailable(Exception):
    """The batch could not be delivered now; keep it and retry (not before `retry_after_s`, the
    master's Retry-After when it is shedding load)."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class SinkRefused(Exception):
    """The batch can never be delivered (e.g. its token was revoked); drop it."""


class LogSink(Protocol):
    def send(self, batch: list[LogLine]) -> None:
        """Deliver one batch (all lines of one allocation) or raise SinkUnavailable/SinkRefused."""


class HttpLogSink:
    """POST /api/v1/task/logs with the allocation's token; where that token is refused (the master
    revokes it when the allocation ends, and the last lines may be in flight then), the agent token,
    which the protocol also accepts for tasks this agent runs."""

    def __init__(self, client: MasterClient, agent_id: str) -> None:
        self.client = client
        self.agent_id = agent_id

    def entries(self, batch: list[LogLine]) -> list[dict[str, Any]]:
        return [{"taskId": line.task_id, "allocationId": line.allocation_id, "agentId": self.agent_id,
                 "log": line.text, "timestamp": rfc3339(line.timestamp), "level": line.level,
                 "stdtype": line.stdtype, "source": line.source} for line in batch]

    def send(self, batch: list[LogLine]) -> None:
        entries = self.entries(batch)
        token = batch[0].token if batch else None
        try:
            try:
                self.client.post_task_logs(entries, token=token)
            except AuthRefused:
                if token is None:
                    raise
                self.client.post_task_logs(entries, token=None)
        except MasterUnavailable as e:
            raise SinkUnavailable(e.message, e.retry_after_s) from None
        except (AuthRefused, RequestRefused) as e:
            raise SinkRefused(e.message) from None


class LogShipper:
    def __init__(self, sink: LogSink, *, flush_interval: float = 0.25, batch_lines: int = 500,
                 max_buffer_bytes: int = 64 * 1024 * 1024, max_batch_bytes: int = 4 * 1024 * 1024,
                 retry_base: float = 0.25, retry_cap: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.sink = sink
        self.flush_interval = flush_interval
        self.batch_lines = batch_lines
        self.max_buffer_bytes = max_buffer_bytes
        self.max_batch_bytes = max_batch_bytes
        self.retry_base = retry_base
        self.retry_cap = retry_cap
        self._clock = clock
        self._cond = threading.Condition()
        self._queue: deque[tuple[float, LogLine]] = deque()  # (time added, line)
        self._queued_bytes = 0
        self._inflight: list[LogLine] = []
        self._dropped: dict[str, int] = {}
        self._flush_now = False
        self._closing = False
        self.retry_after_s: float | None = None  # the last failure's Retry-After
        self._close_deadline: float | None = None
        self._thread: threading.Thread | None = None
        self.failures = 0  # consecutive failed sends, for backoff
        self.sent_lines = 0
        self.dropped_lines = 0

    # -- producers ----------------------------------------------------------------------------

    def add(self, line: LogLine) -> None:
        """Queue one line; never blocks on the network."""
        with self._cond:
            self._queue.append((self._clock(), line))
            self._queued_bytes += line.size
            while self._queued_bytes > self.max_buffer_bytes and len(self._queue) > 1:
                _, old = self._queue.popleft()
                self._queued_bytes -= old.size
                self._dropped[old.allocation_id] = self._dropped.get(old.allocation_id, 0) + 1
                self.dropped_lines += 1
            if len(self._queue) >= self.batch_lines:
                self._cond.notify_all()

    def pending(self, allocation_id: str | None = None) -> int:
        with self._cond:
            return self._pending_locked(allocation_id)

    def _pending_locked(self, allocation_id: str | None) -> int:
        if allocation_id is None:
            return len(self._queue) + len(self._inflight)
        return (sum(1 for _, line in self._queue if line.allocation_id == allocation_id)
                + sum(1 for line in self._inflight if line.allocation_id == allocation_id))

    # -- the shipping step (also callable without the thread) ----------------------------------

    def _next_batch_locked(self) -> list[LogLine]:
        if not self._queue:
            return []
        first = self._queue[0][1]
        alloc = first.allocation_id
        batch: list[LogLine] = []
        dropped = self._dropped.pop(alloc, 0)
        if dropped:
            batch.append(LogLine(allocation_id=alloc, task_id=first.task_id, token=first.token,
                                 source="agent", level="LOG_LEVEL_WARNING", stdtype="stderr",
                                 text=f"[shipyard-agent] {dropped} log lines dropped while the master "
                                      "was unreachable\n"))
        size = 0
        while self._queue and len(batch) < self.batch_lines:
            line = self._queue[0][1]
            if line.allocation_id != alloc or (batch and size + line.size > self.max_batch_bytes):
                break
            self._queue.popleft()
            self._queued_bytes -= line.size
            size += line.size
            batch.append(line)
        return batch

    def ship_once(self) -> bool:
        """Send the in-flight batch (or the next one). True when it was delivered or dropped as
        undeliverable, False when the sink is unavailable (the batch stays in flight)."""
        with self._cond:
            if not self._inflight:
                self._inflight = self._next_batch_locked()
            batch = list(self._inflight)
        if not batch:
            return True
        try:
            self.sink.send(batch)
        except SinkUnavailable as e:
            self.failures += 1
            self.retry_after_s = e.retry_after_s
            if self.failures == 1 or self.failures % 20 == 0:
                log.warning("event=log_ship_failed lines=%d allocation=%s failures=%d error=%r",
                            len(batch), batch[0].allocation_id, self.failures, str(e))
            return False
        except SinkRefused as e:
            log.warning("event=log_batch_dropped lines=%d allocation=%s error=%r",
                        len(batch), batch[0].allocation_id, str(e))
        else:
            self.sent_lines += len(batch)
        self.failures = 0
        with self._cond:
            self._inflight = []
            self._cond.notify_all()
        return True

    def flush(self) -> bool:
        """Ship everything queued now; False as soon as the sink is unavailable."""
        while self.pending():
            if not self.ship_once():
                return False
        return True

    # -- the thread ------------------------------------------------------------------------------

    def start(self) -> LogShipper:
        self._thread = threading.Thread(target=self._run, name="log-shipper", daemon=True)
        self._thread.start()
        return self

    def _due_locked(self) -> bool:
        if self._inflight:
            return True
        if not self._queue:
            return False
        return (self._flush_now or self._closing or len(self._queue) >= self.batch_lines
                or self._clock() - self._queue[0][0] >= self.flush_interval)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._due_locked():
                    if self._closing:
                        return
                    wait = self.flush_interval
                    if self._queue:
                        wait = max(0.0, self.flush_interval - (self._clock() - self._queue[0][0]))
                    self._cond.wait(timeout=wait)
            while True:
                with self._cond:
                    if not (self._inflight or self._queue):
                        self._flush_now = False
                        break
                if not self.ship_once():
                    delay = max(backoff_delay(self.failures, self.retry_base, self.retry_cap, random.random()),
                                self.retry_after_s or 0.0)  # a shedding master's Retry-After
                    with self._cond:
                        if self._closing:
                            left = (self._close_deadline or 0.0) - self._clock()
                            if left <= 0:
                                return
                            self._cond.wait(timeout=min(delay, left))
                        else:
                            # Woken early by close() so the final flush does not sit out a backoff.
                            self._cond.wait_for(lambda: self._closing, timeout=delay)
                    break

    def drain(self, allocation_id: str, timeout: float) -> bool:
        """Wait until every line of `allocation_id` queued so far has been shipped (or dropped)."""
        deadline = self._clock() + timeout
        with self._cond:
            self._flush_now = True
            self._cond.notify_all()
            while self._pending_locked(allocation_id):
                left = deadline - self._clock()
                if left <= 0:
                    return False
                self._cond.wait(timeout=min(left, 0.1))
        return True

    def close(self, timeout: float = 5.0) -> bool:
        """Ship what is left (within `timeout`), then stop. True when nothing was left behind."""
        with self._cond:
            self._close_deadline = self._clock() + timeout
            self._closing = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout + 1.0)
        else:
            deadline = self._close_deadline
            while self.pending() and self._clock() < deadline:
                if not self.ship_once():
                    break
        left = self.pending()
        if left:
            log.warning("event=log_lines_unshipped lines=%d", left)
        return left == 0
