"""The master's proxy to a task's own server (issue 29): `/proxy/<task id>/...`, HTTP and
WebSocket, to the address the task reported (services/tasks.py `proxy_target`). The caller is the
task's owner or an admin, by the session they already have (a bearer token, Determined's `auth`
cookie, or the web UI's session cookie): no token in the URL, nothing that outlives the session.
A cookie (a browser) reaches only its own user's tasks, an admin's too (services/tasks.py
`proxy_target`: a task's pages share the master's origin). Another user's request is answered 404,
as for a task that does not exist. The master adds the
task's Jupyter token to the upstream request (JupyterLab's own pages carry it to the owner's browser only). A shell's WebSocket is
relayed as raw bytes to its sshd's TCP port (`det shell open`'s tunnel, cli/tunnel.py); with the
master's shell_tunnel_auth: ssh_key (the default, as Determined) a tunnel without a session gets
through to sshd too, which admits only the owner's key (Determined 0.38.1's tunnel sends none)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from types import SimpleNamespace
from typing import Any

from fastapi import APIRouter, Request, WebSocket
from fastapi.concurrency import run_in_threadpool
from starlette.requests import HTTPConnection
from starlette.responses import Response
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocketDisconnect

from control_plane.api import deps, upstream
from control_plane.api import splice as splice_ext
from control_plane.auth import UI_SESSION_COOKIE, resolve_token
from control_plane.db.engine import transaction
from control_plane.errors import DomainError, bad_request, http_status, unauthenticated
from control_plane.frontdoor.error_shape import domain_error_response
from control_plane.master import Master
from control_plane.services import shells, tasks

log = logging.getLogger("shipyard.proxy")
router = APIRouter()

# Hop-by-hop headers (RFC 9110 7.6.1) and what the master replaces: never passed through.
_DROP_UP = frozenset({b"host", b"connection", b"keep-alive", b"proxy-authorization", b"te", b"trailer", b"upgrade",
                      b"transfer-encoding", b"authorization", b"cookie", b"content-length", b"expect",
                      deps.TASK_TOKEN_HEADER.encode()})  # every credential the master accepts stays here
_DROP_DOWN = frozenset({b"connection", b"keep-alive", b"transfer-encoding", b"trailer", b"upgrade", b"set-cookie"})
# Request bodies up to this size go whole; larger ones stream. A TCP tunnel reads up to CHUNK bytes at a time.
WHOLE_BODY_BYTES = 1 << 20
CHUNK = 1 << 20
# An answer with at least this much of its body still to come moves it with splice(2) where the
# server offers it (api/splice.py): below, the two extra system calls and a pipe cost more than
# the copy through Python they save.
SPLICE_BYTES = 1 << 20
METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]


# A resolved target is reused for this long by the same session for the same task (a proxied page
# loads dozens of files; each would otherwise cost two database reads): a revoked session, a killed
# task or a change of owner stops getting through within TARGET_TTL_S. At most TARGET_CACHE_SIZE
# entries (the oldest go first).
TARGET_TTL_S = 2.0
TARGET_CACHE_SIZE = 4096
# What the access log and the request metrics name a proxied request (its route's template).
_ROUTE = SimpleNamespace(path_format="/proxy/{taskId}/{path}")


class TargetCache:
    """(session token, task id) -> (host:port, Jupyter token) for TARGET_TTL_S (monotonic clock).
    Filled from the route's worker thread, read on the event loop: a lock keeps the two apart."""

    def __init__(self) -> None:
        self._entries: OrderedDict[tuple[str, str], tuple[float, str, str]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, token: str, task_id: str) -> tuple[str, str] | None:
        entry = self._entries.get((token, task_id))
        if entry is None:
            return None
        if entry[0] <= time.monotonic():
            self.drop(token, task_id)
            return None
        return entry[1], entry[2]

    def put(self, token: str, task_id: str, address: str, jtoken: str) -> None:
        with self._lock:
            self._entries[(token, task_id)] = (time.monotonic() + TARGET_TTL_S, address, jtoken)
            self._entries.move_to_end((token, task_id))
            while len(self._entries) > TARGET_CACHE_SIZE:
                self._entries.popitem(last=False)

    def drop(self, token: str, task_id: str) -> None:
        with self._lock:
            self._entries.pop((token, task_id), None)


def target_cache(state: Any) -> TargetCache:
    """The app's cache (one per app: tests run several masters in one process)."""
    cache = getattr(state, "proxy_targets", None)
    if cache is None:
        cache = state.proxy_targets = TargetCache()
    return cache


def _session_token(conn: HTTPConnection) -> tuple[str | None, bool]:
    """The caller's token, and whether it came in a cookie (a browser's session)."""
    header = deps.header_token(conn)
    if header:
        return header, False
    return conn.cookies.get("auth") or conn.cookies.get(UI_SESSION_COOKIE) or None, True


def _cache_key(token: str, by_cookie: bool) -> str:
    """A cookie's entry apart from the same token's in a header: they reach different tasks."""
    return ("cookie " if by_cookie else "header ") + token


def _target(master: Master, conn: HTTPConnection, task_id: str, *, tunnel: bool = False) -> tuple[str, str]:
    """(host:port, jupyter token) for the caller, or a DomainError (401, 404). A WebSocket `tunnel`
    without a session reaches a shell's sshd when the master's shell_tunnel_auth is ssh_key."""
    token, by_cookie = _session_token(conn)
    if not token:
        if tunnel and master.config.shell_tunnel_auth == "ssh_key":
            with master.read_sessions() as s:
                return tasks.shell_target(s, task_id), ""
        raise unauthenticated()
    now = master.clock()
    with master.read_sessions() as s:
        p = resolve_token(s, token, now=now)
        if p is None:
            raise unauthenticated("invalid or expired token")
        address, stale = tasks.proxy_target(s, p, task_id, now, by_cookie=by_cookie)
    if stale:
        with transaction(master.sessions) as s:
            tasks.touch(s, task_id, now)
    jtoken = tasks.jupyter_token(master, task_id)
    target_cache(conn.app.state).put(_cache_key(token, by_cookie), task_id, address, jtoken)
    return address, jtoken


class ProxyFront:
    """ASGI, ahead of admission and the middleware (api/app.py): a bodiless HTTP request to
    /proxy/<task id>/ whose caller's target is in the TargetCache goes straight to the task (no
    thread, no database). Anything else (no session, not cached, a body, which BodyLimits must see)
    takes the route below, through admission, and fills the cache. Traffic still marks the task's
    activity: every resolve does (`touch`), and a cached target is resolved again every TARGET_TTL_S,
    well within ACTIVITY_RESOLUTION (services/tasks.py)."""

    def __init__(self, app: Any, state: Any) -> None:
        self.app, self.state = app, state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/proxy/") and scope["method"] in METHODS:
            task_id = scope["path"][7:].partition("/")[0]
            conn = HTTPConnection(scope)
            token, by_cookie = _session_token(conn)
            key = _cache_key(token, by_cookie) if token else None
            hit = target_cache(self.state).get(key, task_id) if key and not _has_body(conn) else None
            if hit is not None and not shells.split_address(hit[0])[0]:
                scope["route"] = _ROUTE
                if await _forward(scope, receive, send, task_id, *hit, answer_502=False):
                    return
                # Not there (killed, moved): forgotten, and resolved afresh by the route (404, 502, ...).
                target_cache(self.state).drop(key, task_id)  # type: ignore[arg-type]
        await self.app(scope, receive, send)


def _has_body(conn: HTTPConnection) -> bool:
    return conn.headers.get("content-length", "0") != "0" or "transfer-encoding" in conn.headers


# One connection pool per event loop (a process serves on one; tests start several).
_pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, upstream.Pool] = weakref.WeakKeyDictionary()


def _pool() -> upstream.Pool:
    loop = asyncio.get_running_loop()
    pool = _pools.get(loop)
    if pool is None:
        pool = _pools[loop] = upstream.Pool()
    return pool


async def _request_body(scope: Scope, receive: Receive) -> tuple[bytes | AsyncIterator[bytes], bytes]:
    """The caller's body and the header that frames it upstream: none, a small one whole (sent with
    its headers: a streamed body goes out in a second small packet that meets the upstream's delayed
    ACK, ~40 ms), or a large or chunked one streamed as it arrives."""
    headers = dict(scope["headers"])
    length = headers.get(b"content-length")
    if length is None and b"chunked" not in headers.get(b"transfer-encoding", b""):
        return b"", b""
    if length is not None and length.isdigit() and int(length) <= WHOLE_BODY_BYTES:
        parts = []
        while True:
            message = await receive()
            parts.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(parts)
        return body, b"content-length: %d\r\n" % len(body)

    async def stream() -> AsyncIterator[bytes]:
        while True:
            message = await receive()
            if message.get("body"):
                yield message["body"]
            if not message.get("more_body"):
                return

    return stream(), (b"content-length: %b\r\n" % length if length is not None else b"transfer-encoding: chunked\r\n")


async def _forward(scope: Scope, receive: Receive, send: Send, task_id: str, address: str, jtoken: str, *,
                   answer_502: bool = True) -> bool:
    """The request to the task and its answer back, as sent (no decoding: the Content-Encoding the
    headers name still applies), streamed as it arrives. False when the task did not answer: then
    a 502 was sent, or nothing (`answer_502` False)."""
    body, framing = await _request_body(scope, receive)
    target = scope.get("raw_path") or scope["path"].encode()
    if scope.get("query_string"):
        target += b"?" + scope["query_string"]
    head = b"".join([scope["method"].encode(), b" ", target, b" HTTP/1.1\r\nhost: ", address.encode(),
                     b"\r\nauthorization: token ", jtoken.encode(), b"\r\n", framing,
                     *[b"%b: %b\r\n" % kv for kv in scope["headers"] if kv[0] not in _DROP_UP], b"\r\n"])
    try:
        answer = await _pool().request(address, head, body, head_only=scope["method"] == "HEAD")
    except upstream.UpstreamError as e:
        return await _bad_gateway(send, task_id, e) if answer_502 else False
    watcher = None
    try:
        down = [(k, v) for k, v in answer.headers if k not in _DROP_DOWN]
        await send({"type": "http.response.start", "status": answer.status, "headers": down})
        if not answer.complete:  # a caller who leaves ends the upstream answer too
            watcher = asyncio.ensure_future(_on_disconnect(receive, answer))
        splice = scope.get("extensions", {}).get(splice_ext.EXTENSION)
        rest = answer.take_rest(SPLICE_BYTES) if splice is not None else None
        if rest is not None:  # a large body: the rest of it moves in the kernel (api/splice.py)
            first, fd, count = rest
            if first:
                await send({"type": "http.response.body", "body": first, "more_body": True})
            moved = await splice(fd, count, stop=answer.stopped)
            answer.spliced(moved == count)
            await send({"type": "http.response.body", "body": b""})  # nothing, when it failed
            return True
        async for chunk in answer.body():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    except upstream.UpstreamError as e:  # the task went away in the middle of its answer
        log.warning("event=proxy_upstream_error task_id=%s error=%r", task_id, str(e))
    finally:
        if watcher is not None:
            watcher.cancel()
        answer.release()
    return True


async def _on_disconnect(receive: Receive, answer: upstream.Answer) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    answer.abort()


async def _bad_gateway(send: Send, task_id: str, e: Exception) -> bool:
    log.warning("event=proxy_upstream_error task_id=%s error=%r", task_id, str(e))
    body = f"task {task_id} did not answer: {type(e).__name__}".encode()
    await send({"type": "http.response.start", "status": 502,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
    return False


class _Forward(Response):
    """The route's answer: the request forwarded as ProxyFront forwards a cached one (and the cached
    target forgotten when the task did not answer)."""

    def __init__(self, task_id: str, address: str, jtoken: str, forget: Callable[[], None]) -> None:  # noqa: D107
        self.task_id, self.address, self.jtoken, self.forget = task_id, address, jtoken, forget
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not await _forward(scope, receive, send, self.task_id, self.address, self.jtoken):
            self.forget()


@router.api_route("/proxy/{taskId}/{path:path}", methods=METHODS, include_in_schema=False)
async def proxy_http(taskId: str, path: str, request: Request) -> Response:
    master: Master = request.app.state.master
    try:
        address, jtoken = await run_in_threadpool(_target, master, request, taskId)
    except DomainError as e:
        return domain_error_response(e)
    if shells.split_address(address)[0]:  # a shell's sshd speaks SSH, not HTTP
        return domain_error_response(bad_request(f"task {taskId} is a shell: open it with det shell open {taskId}"))
    token, by_cookie = _session_token(request)
    key = _cache_key(token or "", by_cookie)
    return _Forward(taskId, address, jtoken, lambda: target_cache(request.app.state).drop(key, taskId))


@router.websocket("/proxy/{taskId}/{path:path}")
async def proxy_websocket(websocket: WebSocket, taskId: str, path: str) -> None:
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    master: Master = websocket.app.state.master
    try:
        address, jtoken = await run_in_threadpool(lambda: _target(master, websocket, taskId, tunnel=True))
    except DomainError as e:
        if "websocket.http.response" in websocket.scope.get("extensions", {}):  # the real status (401, 404)
            await websocket.send_denial_response(domain_error_response(e))
        else:
            await websocket.close(code=4000 + http_status(e), reason=str(e)[:120])
        return
    user, hostport = shells.split_address(address)
    if user:  # a shell: the WebSocket carries the SSH connection's bytes to its sshd
        await _relay_tcp(websocket, taskId, hostport)
        return
    query = websocket.url.query
    url = f"ws://{address}{websocket.url.path}" + (f"?{query}" if query else "")
    offered = [p.strip() for p in websocket.headers.get("sec-websocket-protocol", "").split(",") if p.strip()]
    try:
        upstream = await connect(url, additional_headers={"Authorization": f"token {jtoken}"},
                                 subprotocols=offered or None, max_size=None, open_timeout=15)  # type: ignore[arg-type]
    except (OSError, TimeoutError, ConnectionClosed, Exception) as e:  # noqa: BLE001 (any refusal: close with why)
        log.warning("event=proxy_ws_upstream_error task_id=%s error=%r", taskId, str(e))
        await websocket.close(code=1011, reason="the task did not accept the connection")
        return
    await websocket.accept(subprotocol=upstream.subprotocol)

    async def down() -> None:
        async for message in upstream:
            if isinstance(message, bytes):
                await websocket.send_bytes(message)
            else:
                await websocket.send_text(message)

    async def up(message: dict[str, Any]) -> None:
        if message.get("bytes") is not None:
            await upstream.send(message["bytes"])
        elif message.get("text") is not None:
            await upstream.send(message["text"])

    await _relay(websocket, down(), up, upstream.close)


async def _relay(websocket: WebSocket, down: Coroutine[Any, Any, None],
                 up: Callable[[dict[str, Any]], Awaitable[None]], close_upstream: Callable[[], Awaitable[None]]) -> None:
    """Run `down` (upstream to the caller) and pass each caller message `up` until either side ends."""

    async def pump_up() -> None:
        while True:
            message: Any = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            await up(message)

    pumps = [asyncio.create_task(down), asyncio.create_task(pump_up())]
    try:
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in pumps:
            t.cancel()
        await close_upstream()
        with contextlib.suppress(RuntimeError, WebSocketDisconnect):
            await websocket.close()


async def _relay_tcp(websocket: WebSocket, task_id: str, hostport: str) -> None:
    """Binary WebSocket messages to a TCP connection and back, until either side closes."""
    host, _, port = hostport.rpartition(":")
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), timeout=15)
    except (OSError, TimeoutError, ValueError) as e:
        log.warning("event=proxy_tcp_upstream_error task_id=%s error=%r", task_id, str(e))
        await websocket.close(code=1011, reason="the task did not accept the connection")
        return
    await websocket.accept()

    async def down() -> None:
        while chunk := await reader.read(CHUNK):
            await websocket.send_bytes(chunk)

    async def up(message: dict[str, Any]) -> None:
        data = message.get("bytes") if message.get("bytes") is not None else (message.get("text") or "").encode()
        writer.write(data)
        await writer.drain()

    async def close() -> None:
        writer.close()

    await _relay(websocket, down(), up, close)
