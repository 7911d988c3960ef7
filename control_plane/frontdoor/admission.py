"""Admission control: a request path that cannot deadlock or starve.

Every request that may touch the database takes a slot before anything of it runs (its
dependencies included). There are at most `limit` slots, the limit is below the connection pool's
size and AnyIO's worker-thread limit is above it, so an admitted request always finds a thread and a
connection at once: no thread ever waits on a connection held by a request that waits for a thread.
Past the limit a bounded queue waits briefly; beyond that the answer is 503 with `Retry-After`, in
microseconds, from the event loop alone (no thread, no database) — never a 30 s hang. `Retry-After`
grows with the pressure: about the time the lane needs to serve the requests queued ahead at the
rate it has served them lately (`retry_after`, pure), between `retry_after_s` and a cap.

Two lanes, each with its own slots and queue: the cluster's (agents and trials: registration,
heartbeats, events, task specs, model definitions, logs, metrics, checkpoints, searcher;
`is_cluster_request`) and the users' (everything else), so no amount of user load keeps an agent
from heartbeating or a trial from reporting. In the cluster's lane the trials' reports (metrics,
progress, task logs: small writes of bounded cost that arrive steadily; `is_report_request`) go
ahead of the rest of the queue: a burst of trial start-ups (hundreds of task specs, events and
model definitions at once, each a heavier transaction) is served after them, so the trials already
running never wait behind it (until another has waited `URGENT_AGE_S`: then they take turns).
That lane queues longer (`cluster_queue_wait_s`: its clients wait 30 s for an answer), so such a
burst is worked off in order rather than refused and retried. Health (`/info`, `/health`)
bypasses both: `AdmissionControl` is the application's front door (api/app.py's
`ShipyardApp`), in front of every middleware and of routing, and answers health from memory itself.
Long-polls and log follows hold no slot while they wait: the preemption poll gives its slot back
(`Ticket.release`), a log follow takes one for each short read (`Ticket.take_turn`), and the
agents' command poll takes one only when it needs the database (`is_self_admitted`).

Single event loop (uvicorn's); the bookkeeping is guarded by a lock anyway because a waiter may be
granted from whichever task releases a slot.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio.to_thread
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from control_plane import telemetry
from control_plane.frontdoor.error_shape import error_json

TICKET_KEY = "shipyard.admission"
# A rejected request's body is read and dropped (up to this much) so the connection stays usable
# for the client's retry; a bigger one closes the connection instead.
_DRAIN_MAX_BYTES = 1024 * 1024


# How far back the service rate looks: long enough to smooth a burst, short enough to follow a
# master that slows down.
RATE_WINDOW_S = 10


def next_return(cursor: float, now: float, queued: int, served_per_s: float, *, floor_s: int,
                cap_s: int) -> tuple[int, float]:
    """The Retry-After of a client refused now, and the lane's new return cursor.

    Refused clients come back when told, so the lane hands out return times as a schedule: the
    cursor is the moment up to which the lane's capacity is already promised (to the queue, then
    to the clients refused before). A new refusal is told to come back at the cursor (not before
    the queue ahead has drained) and moves it on by one request's worth of service (1 / rate).
    Clients come back spread at the rate the lane serves, and a client refused again on its return
    takes one new place: it is never counted twice. The cursor stays within `cap_s` of now. With
    no measured rate, the floor, and the cursor is left alone. Pure."""
    cap_s = max(cap_s, floor_s)
    if served_per_s <= 0 or math.isnan(served_per_s):
        return floor_s, cursor
    start = max(cursor, now + queued / served_per_s)
    wait = start - now
    seconds = cap_s if wait >= cap_s else max(floor_s, math.ceil(wait))
    return seconds, min(start + 1.0 / served_per_s, now + cap_s)


def queue_admits(ahead: int, served_per_s: float, wait_s: float) -> bool:
    """Whether a request that finds `ahead` requests queued should queue too: only if the lane,
    at its recent rate, serves them and it within `wait_s`. A request that would only time out in
    the queue is refused at once instead, so the queue holds what can be served in time and a
    refused client learns when to come back (the Retry-After) without occupying a place meanwhile.
    With no measured rate, the count bound (`queue`) alone decides. Pure."""
    if served_per_s <= 0 or math.isnan(served_per_s):
        return True
    return (ahead + 1) / served_per_s <= wait_s


MIN_MEASURED_S = 1.0
# How long a waiter lets urgent ones go ahead of it before they take turns (Admission.release).
URGENT_AGE_S = 5.0


@dataclass
class ServiceRate:
    """Requests served (slots released) per second over the last `window_s` seconds, in one-second
    buckets. Time is passed in (`now`, monotonic seconds): no clock is read here."""

    window_s: int = RATE_WINDOW_S
    _buckets: deque[list[int]] = field(default_factory=deque)  # [second, count], oldest first
    _since: float = 0.0  # the first release since the window was last empty

    def record(self, now: float) -> None:
        second = int(now)
        self._trim(second)
        if not self._buckets:
            self._since = now
        if self._buckets and self._buckets[-1][0] == second:
            self._buckets[-1][1] += 1
        else:
            self._buckets.append([second, 1])
        self._trim(second)

    def per_s(self, now: float) -> float:
        """Served requests divided by the time since the oldest bucket in the window began (at
        least one second), so a burst after an idle spell is not diluted by the idle seconds.
        Unmeasured (0.0) until releases have been seen for `MIN_MEASURED_S`: the first few
        releases after an idle spell (three in 30 ms) would otherwise read as a rate of 3/s and
        refuse a burst the lane serves in a blink."""
        self._trim(int(now))
        if not self._buckets or now - self._since < MIN_MEASURED_S:
            return 0.0
        span = max(1.0, now - self._buckets[0][0])
        return sum(c for _, c in self._buckets) / span

    def _trim(self, second: int) -> None:
        while self._buckets and self._buckets[0][0] <= second - self.window_s:
            self._buckets.popleft()


@dataclass(eq=False)
class _Waiter:
    loop: asyncio.AbstractEventLoop
    fut: asyncio.Future[None]
    urgent: bool = False
    since: float = 0.0  # when it began to wait (the lane's clock)
    granted: bool = False


@dataclass
class Admission:
    """At most `limit` holders; up to `queue` more wait up to `wait_s` for a slot, first come first
    served (a released slot is handed to the oldest waiter, so a steady stream of new arrivals
    cannot starve it), except that an `urgent` waiter goes before the others (the trials' reports
    in the cluster's lane) until the oldest of them has waited `URGENT_AGE_S`; then the two take
    turns, so that none starves. A request the queue could not serve within `wait_s` at the lane's
    recent rate is refused at once (`queue_admits`; an urgent one counts only the urgent ahead of
    it)."""

    limit: int
    queue: int
    wait_s: float
    retry_after_s: int
    # The longest Retry-After this lane sends (at least retry_after_s).
    retry_after_max_s: int = 30
    active: int = 0
    clock: Callable[[], float] = time.monotonic
    served: ServiceRate = field(default_factory=ServiceRate)
    name: str = "users"  # the lane, as /metrics names it
    # Up to when the lane's capacity is promised to the clients told to come back (next_return):
    # those refused are a queue too, only outside, and their returns are spread at the service rate.
    _return_cursor: float = 0.0
    _waiters: deque[_Waiter] = field(default_factory=deque)
    _urgent: deque[_Waiter] = field(default_factory=deque)
    _last_urgent: bool = False  # whether the last slot handed over went to an urgent waiter
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def waiting(self) -> int:
        return len(self._waiters) + len(self._urgent)

    def retry_after(self) -> int:
        """The Retry-After for a request refused now: its place in the lane's return schedule
        (`next_return`), after the queue ahead of it and the clients refused before it."""
        with self._lock:
            now = self.clock()
            seconds, self._return_cursor = next_return(
                self._return_cursor, now, self.waiting, self.served.per_s(now),
                floor_s=self.retry_after_s, cap_s=self.retry_after_max_s)
            return seconds

    async def acquire(self, wait_s: float | None = None, *, urgent: bool = False) -> bool:
        with self._lock:
            if self.active < self.limit and not self.waiting:
                self.active += 1
                return True
            ahead = len(self._urgent) if urgent else self.waiting
            if ahead >= self.queue:
                telemetry.refused(self.name, "queue_full")
                return False
            budget = self.wait_s if wait_s is None else wait_s
            if not queue_admits(ahead, self.served.per_s(self.clock()), budget):
                # it would time out in the queue: refuse now, with a Retry-After that says when
                telemetry.refused(self.name, "over_wait")
                return False
            loop = asyncio.get_running_loop()
            w = _Waiter(loop, loop.create_future(), urgent, self.clock())
            (self._urgent if urgent else self._waiters).append(w)
        try:
            await asyncio.wait({w.fut}, timeout=self.wait_s if wait_s is None else wait_s)
        except BaseException:  # cancelled (client gone): give back a slot handed over meanwhile
            if self._granted_or_leave(w):
                self.release()
            raise
        granted = self._granted_or_leave(w)
        if not granted:
            telemetry.refused(self.name, "timed_out")
        return granted

    def _granted_or_leave(self, w: _Waiter) -> bool:
        """True if the waiter was handed a slot (even in the instant its wait timed out); otherwise
        it leaves the queue."""
        with self._lock:
            if not w.granted:
                (self._urgent if w.urgent else self._waiters).remove(w)
            return w.granted

    def release(self) -> None:
        with self._lock:
            self.served.record(self.clock())
            if self.waiting:
                # Urgent first; but once the oldest other waiter has waited URGENT_AGE_S, the two
                # take turns, so that a lane flooded with reports still serves its other requests
                # (an agent's first poll, a trial's start) at half its pace rather than never.
                urgent = bool(self._urgent) and not (
                    self._waiters and self._last_urgent
                    and self.clock() - self._waiters[0].since >= URGENT_AGE_S)
                w = (self._urgent if urgent else self._waiters).popleft()
                self._last_urgent = urgent
                w.granted = True  # the slot passes over: `active` stays the same
                w.loop.call_soon_threadsafe(_grant, w.fut)
            else:
                self.active -= 1


def _grant(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class Ticket:
    """One request's slot. Released by the middleware when the request ends; a long-poll or a
    stream may give it back earlier and take one again (idempotent both ways). `arrived`: when the
    front door saw the request (monotonic): a long-poll's timeout counts from there, so time spent
    queued for a slot or a thread is not added to the client's wait."""

    def __init__(self, admission: Admission | None, urgent: bool = False) -> None:
        self.admission = admission
        self.urgent = urgent  # goes ahead of the lane's other waiters
        self.held = False
        self.arrived = time.monotonic()

    async def acquire(self, wait_s: float | None = None) -> bool:
        if self.held or self.admission is None:
            self.held = True
            return True
        self.held = await self.admission.acquire(wait_s, urgent=self.urgent)
        return self.held

    def release(self) -> None:
        if self.held:
            self.held = False
            if self.admission is not None:
                self.admission.release()

    async def take_turn(self) -> None:
        """For a stream whose headers are already sent (a 503 is no longer possible): wait as long
        as it takes, without holding anything, until a slot is free."""
        while not await self.acquire():
            await asyncio.sleep(self.admission.retry_after_s if self.admission else 0)


def ticket(scope: Scope) -> Ticket:
    t = scope.get(TICKET_KEY)
    return t if isinstance(t, Ticket) else Ticket(None)


def saturated_body(message: str = "the master is busy; retry later") -> bytes:
    return error_json(503, message, [])


# A refusal is answered from bytes built once (per Retry-After value): no JSON encoding, no
# header building per request, and a Content-Length, so the server writes it in one piece.
_SATURATED = saturated_body()
_REFUSAL_HEADERS: dict[int, tuple[tuple[bytes, bytes], ...]] = {}


def _refusal_headers(retry_after_s: int) -> tuple[tuple[bytes, bytes], ...]:
    headers = _REFUSAL_HEADERS.get(retry_after_s)
    if headers is None:
        headers = ((b"content-type", b"application/json"), (b"content-length", str(len(_SATURATED)).encode()),
                   (b"retry-after", str(retry_after_s).encode()))
        _REFUSAL_HEADERS[retry_after_s] = headers
    return headers


# The cluster's own traffic: what agents and trials send (docs/PROTOCOL.md, the harness). It gets
# its own lane, so that however many users keep the master busy, agents still heartbeat, fetch
# what they start and ship logs, and trials still report: user load never fails a trial.
_CLUSTER_ANY_METHOD = re.compile(
    r"^/api/v1/(agents/register|agents/[^/]+/(commands|events)|task/logs|agent/package|allocations/.+"
    r"|experiments/\d+/(model_def|searcher/best_searcher_validation_metric)|trials/\d+/searcher/operation"
    r"|checkpoints/[^/]+)$"
)
_CLUSTER_WRITES = re.compile(r"^/api/v1/(trials/\d+/.+|checkpoints)$")


# Routes that take their slot themselves, only for what needs the database: the agents' command
# long-poll waits on the process's poll hub and, for an agent the process knows, needs no slot at
# all (frontdoor/agent_polls.py), so a saturated master still hears every polling agent.
_SELF_ADMITTED = re.compile(r"^/api/v1/agents/[^/]+/commands$")


def is_self_admitted(method: str, path: str) -> bool:
    return method == "GET" and bool(_SELF_ADMITTED.match(path))


def busy_response(t: Ticket) -> Response:
    """The refusal a self-admitted route answers when its slot does not come (as the front door's)."""
    seconds = t.admission.retry_after() if t.admission is not None else 1
    return Response(_SATURATED, status_code=503, media_type="application/json",
                    headers={"Retry-After": str(seconds)})


def is_cluster_request(method: str, path: str) -> bool:
    """Agents' and trials' requests (by path: the lane is chosen before any credential is read)."""
    if _CLUSTER_ANY_METHOD.match(path):
        return True
    return method != "GET" and bool(_CLUSTER_WRITES.match(path))


# The trials' reports: what a running trial sends steadily (harness/core's reporter, an agent's log
# shipper), the cluster's requests that go ahead of the rest of its lane's queue.
_REPORTS = re.compile(
    r"^/api/v1/(task/logs|trials/\d+/(metrics|metrics/batch|training_metrics|validation_metrics|progress))$")


def is_report_request(method: str, path: str) -> bool:
    return method == "POST" and bool(_REPORTS.match(path))


def is_page_navigation(method: str, path: str, headers: Any) -> bool:
    """A browser loading one of the web UI's pages or sending one of its forms (not the API, not an
    htmx fragment, not a script's request): a refusal is then a page that says so (and, for a page
    load, loads itself again after the Retry-After) instead of a JSON body the user cannot act on."""
    if path.startswith(("/api/", "/ui/")):
        return False
    accept = b""
    for key, value in headers:
        if key == b"hx-request":
            return False
        if key == b"accept":
            accept = value
    return b"text/html" in accept


def busy_page(retry_after_s: int, *, reload: bool) -> bytes:
    """A form is never sent again by itself: the user is told to go back and send it again."""
    seconds = int(retry_after_s)
    refresh = f'<meta http-equiv="refresh" content="{seconds}">' if reload else ""
    then = (f"this page loads again in {seconds} s." if reload
            else f"nothing was done; go back and send the form again in {seconds} s.")
    return (
        f"<!doctype html><html lang=en><head><meta charset=utf-8>{refresh}"
        "<title>Shipyard: the master is busy</title></head><body><main><h1>The master is busy</h1>"
        f'<p id="busy-message">It is serving other requests; {then}</p></main></body></html>'
    ).encode()


class AdmissionControl:
    """The front door, a plain ASGI callable in front of the whole application (outside every
    middleware, routing included): health answered from memory, then a slot per request for
    everything else that is not exempt, from the cluster's lane for agents and trials and from the
    users' lane for the rest. A refusal costs the event loop a few microseconds: nothing of the
    application runs for it, and its answer is pre-built bytes."""

    def __init__(self, app: ASGIApp, admission: Admission, cluster: Admission, exempt: frozenset[str],
                 threads: int, health: Mapping[str, Callable[[], Any]] | None = None) -> None:
        self.app = app
        self.admission = admission
        self.cluster = cluster
        self.exempt = exempt
        self.threads = threads
        # GET path -> what it answers (JSON), computed from memory on the event loop.
        self.health = dict(health or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if path in self.exempt:
            answer = self.health.get(path)
            if answer is not None and scope["method"] == "GET":
                await _send_json(send, answer())
            else:
                await self.app(scope, receive, send)
            return
        # AnyIO's limiter belongs to the running event loop, so it is sized here rather than at
        # import; every admitted request uses at most one worker thread at a time.
        limiter = anyio.to_thread.current_default_thread_limiter()
        if limiter.total_tokens != self.threads:
            limiter.total_tokens = self.threads
        method = scope["method"]
        lane = self.cluster if is_cluster_request(method, path) else self.admission
        t = Ticket(lane, urgent=is_report_request(method, path))
        if not is_self_admitted(method, path) and not await t.acquire():
            page = is_page_navigation(method, path, scope["headers"])
            await self._reject(lane, receive, send, page=page, reload=page and method == "GET")
            return
        scope[TICKET_KEY] = t
        try:
            await self.app(scope, receive, send)
        finally:
            t.release()

    @staticmethod
    async def _reject(lane: Admission, receive: Receive, send: Send, *, page: bool = False,
                      reload: bool = False) -> None:
        keep_alive = await _drain(receive)
        seconds = lane.retry_after()
        body = busy_page(seconds, reload=reload) if page else _SATURATED
        headers: Any = _refusal_headers(seconds) if not page else (
            (b"content-type", b"text/html; charset=utf-8"), (b"content-length", str(len(body)).encode()),
            (b"retry-after", str(seconds).encode()), (b"cache-control", b"no-store"))
        if not keep_alive:
            headers = [*headers, (b"connection", b"close")]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body})


async def _send_json(send: Send, content: Any) -> None:
    body = json.dumps(content, ensure_ascii=False, separators=(",", ":")).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def _drain(receive: Receive) -> bool:
    """Read and drop a small request body; False if it was too big (or the client left)."""
    seen = 0
    while True:
        msg: Message = await receive()
        if msg["type"] != "http.request":
            return False
        seen += len(msg.get("body", b""))
        if seen > _DRAIN_MAX_BYTES:
            return False
        if not msg.get("more_body", False):
            return True
