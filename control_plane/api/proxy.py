"""The master's proxy to a task's own server (issue 29): `/proxy/<task id>/...`, HTTP and
WebSocket, to the address the task reported (services/tasks.py `proxy_target`). The caller is the
task's owner or an admin, by the session they already have (a bearer token, Determined's `auth`
cookie, or the web UI's session cookie): no token in the URL, nothing that outlives the session.
Another user's request is answered 404, as for a task that does not exist. The master adds the
task's Jupyter token to the upstream request; the browser never sees it. A shell's WebSocket is
relayed as raw bytes to its sshd's TCP port (`det shell open`'s tunnel, cli/tunnel.py); with the
master's shell_tunnel_auth: ssh_key (the default, as Determined) a tunnel without a session gets
through to sshd too, which admits only the owner's key (Determined 0.38.1's tunnel sends none)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

import httpx
from fastapi import APIRouter, Request, WebSocket
from fastapi.concurrency import run_in_threadpool
from starlette.background import BackgroundTask
from starlette.requests import HTTPConnection
from starlette.responses import Response, StreamingResponse
from starlette.websockets import WebSocketDisconnect

from control_plane.api import deps
from control_plane.auth import UI_SESSION_COOKIE, resolve_token
from control_plane.db.engine import transaction
from control_plane.errors import DomainError, bad_request, http_status, unauthenticated
from control_plane.frontdoor.error_shape import domain_error_response
from control_plane.master import Master
from control_plane.services import shells, tasks

log = logging.getLogger("shipyard.proxy")
router = APIRouter()

# Hop-by-hop headers (RFC 9110 7.6.1) and what the master replaces: never passed through.
_DROP_UP = frozenset({"host", "connection", "keep-alive", "proxy-authorization", "te", "trailer", "upgrade",
                      "transfer-encoding", "authorization", "cookie", "content-length"})
_DROP_DOWN = frozenset({"connection", "keep-alive", "transfer-encoding", "trailer", "upgrade", "content-length",
                        "set-cookie"})
# Bodies and answers up to this size go whole; larger answers come back in pieces of up to CHUNK bytes.
WHOLE_BODY_BYTES = 1 << 20
CHUNK = 1 << 20
METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]


def _target(master: Master, conn: HTTPConnection, task_id: str, *, tunnel: bool = False) -> tuple[str, str]:
    """(host:port, jupyter token) for the caller, or a DomainError (401, 404). A WebSocket `tunnel`
    without a session reaches a shell's sshd when the master's shell_tunnel_auth is ssh_key."""
    token = deps.bearer_token(conn) or conn.cookies.get(UI_SESSION_COOKIE)  # type: ignore[arg-type]
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
        address, stale = tasks.proxy_target(s, p, task_id, now)
    if stale:
        with transaction(master.sessions) as s:
            tasks.touch(s, task_id, now)
    return address, tasks.jupyter_token(master, task_id)


# One pooled client per event loop (a process serves on one; tests start several).
_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = weakref.WeakKeyDictionary()


def _client() -> httpx.AsyncClient:
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None:
        client = _clients[loop] = httpx.AsyncClient(timeout=httpx.Timeout(30.0, read=None), follow_redirects=False)
    return client


async def _body(request: Request) -> bytes | AsyncIterator[bytes] | None:
    """No body, a small one whole (sent with its headers: a streamed empty body goes out chunked,
    a second small packet that meets the upstream's delayed ACK, ~40 ms), a large one streamed."""
    length = request.headers.get("content-length")
    if length is None and "chunked" not in request.headers.get("transfer-encoding", ""):
        return None
    if length is not None and length.isdigit() and int(length) <= WHOLE_BODY_BYTES:
        return await request.body()
    return request.stream()


@router.api_route("/proxy/{taskId}/{path:path}", methods=METHODS, include_in_schema=False)
async def proxy_http(taskId: str, path: str, request: Request) -> Response:
    master: Master = request.app.state.master
    try:
        address, jtoken = await run_in_threadpool(_target, master, request, taskId)
    except DomainError as e:
        return domain_error_response(e)
    if shells.split_address(address)[0]:  # a shell's sshd speaks SSH, not HTTP
        return domain_error_response(bad_request(f"task {taskId} is a shell: open it with det shell open {taskId}"))
    headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _DROP_UP]
    headers.append(("authorization", f"token {jtoken}"))
    url = httpx.URL(f"http://{address}{request.url.path}", query=request.url.query.encode())
    upstream = _client().build_request(request.method, url, headers=headers, content=await _body(request))
    try:
        answer = await _client().send(upstream, stream=True)
    except httpx.HTTPError as e:
        log.warning("event=proxy_upstream_error task_id=%s error=%r", taskId, str(e))
        return Response(f"task {taskId} did not answer: {type(e).__name__}", status_code=502)
    down = [(k, v) for k, v in answer.headers.multi_items() if k.lower() not in _DROP_DOWN]
    raw_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in down]
    length = answer.headers.get("content-length", "")
    if length.isdigit() and int(length) <= WHOLE_BODY_BYTES:  # a small answer whole, in one write
        try:  # as sent (aread would undo a Content-Encoding that the header still names)
            content = b"".join([chunk async for chunk in answer.aiter_raw()])
        finally:
            await answer.aclose()
        whole = Response(content, status_code=answer.status_code)
        whole.raw_headers = [*raw_headers, (b"content-length", str(len(content)).encode())]
        return whole

    async def body() -> AsyncIterator[bytes]:
        async for chunk in answer.aiter_raw(CHUNK):
            yield chunk

    response = StreamingResponse(body(), status_code=answer.status_code, background=BackgroundTask(answer.aclose))
    response.raw_headers = raw_headers
    return response


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
