"""What a request may carry: a body within its limit, enforced while it is read, and a URL
without NUL characters.

PostgreSQL cannot hold NUL in any text parameter (the driver refuses the query: a 500), so a NUL
in the path or in a query parameter is a 400 naming the parameter, for every operation at once
(in a JSON body, the request models refuse it: shipyard_common/wire_model.py `StrictWire`).

A declared Content-Length over the limit is refused at once (413, nothing read). A chunked body
(or one that lies about its length) is counted as it arrives and refused with a 413 at the first
chunk past the limit, so the master never buffers more than the limit. The 413 is guaranteed
whatever the application does with the failed read (FastAPI turns a failing body read into its
own 400): once the limit is crossed, whatever response the application starts is replaced.

Only creating an experiment needs a big body (its model definition travels base64 inside the
JSON); every other request gets the much smaller `max_body_bytes`. The 413 names the setting.

A body over `body_spool_bytes` (or chunked) goes through frontdoor/body_budget.py instead: spooled
to disk as it arrives, within the caller's and the host's budgets of request-body memory.
"""

from __future__ import annotations

import logging
from urllib.parse import parse_qsl

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from control_plane.config import MasterConfig
from control_plane.errors import FieldProblem
from control_plane.frontdoor.body_budget import BodyBudget, spooled
from control_plane.frontdoor.error_shape import error_json
from control_plane.master import Master

log = logging.getLogger("shipyard.api.limits")

# (method, path) → which MasterConfig limit applies; anything else gets max_body_bytes.
LARGE_BODIES = frozenset({("POST", "/api/v1/experiments")})


def body_limit(config: MasterConfig, method: str, path: str) -> int:
    return limit_and_setting(config, method, path)[0]


def limit_and_setting(config: MasterConfig, method: str, path: str) -> tuple[int, str]:
    """The route's body limit and the master setting it comes from (named in the 413)."""
    if (method, path.rstrip("/") or "/") in LARGE_BODIES or config.max_request_bytes < config.max_body_bytes:
        return config.max_request_bytes, "max_request_bytes"
    return config.max_body_bytes, "max_body_bytes"


class _TooLarge(Exception):
    pass


class BodyLimits:
    """ASGI middleware: 413 for a body over its route's limit, before it is read whole."""

    def __init__(self, app: ASGIApp, config: MasterConfig, master: Master | None = None) -> None:
        self.app = app
        self.config = config
        budget = BodyBudget(master) if master is not None else None
        self.budget = budget if budget is not None and budget.enabled else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        nul = _nul_in_url(scope)
        if nul is not None:
            await _send_error(send, 400, f"{nul}: must not contain NUL characters", nul)
            return
        limit, setting = limit_and_setting(self.config, scope["method"], scope["path"])
        declared = content_length(scope)

        async def reject(send: Send, limit: int) -> None:
            log.info("event=request_body_too_large method=%s path=%s limit=%s", scope["method"], scope["path"], limit)
            await _send_error(send, 413, f"request body larger than {limit} bytes ({setting})", None, close=True)

        if declared is not None and declared > limit:
            await reject(send, limit)
            return
        if self.budget is not None and self.budget.wants(scope, declared):
            await spooled(self.app, self.budget, scope, receive, send, limit=limit, declared=declared,
                          too_large=reject)
            return
        seen = 0
        over = False
        started = False

        async def counted() -> Message:
            nonlocal seen, over
            if over:  # the app asks again after the failed read: there is nothing more for it
                raise _TooLarge()
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > limit:
                    over = True
                    raise _TooLarge()
            return msg

        async def guarded(msg: Message) -> None:
            nonlocal started
            if over:
                # Whatever the app answers to the failed read (FastAPI: a 400) becomes the 413.
                if msg["type"] == "http.response.start" and not started:
                    started = True
                    await reject(send, limit)
                return
            if msg["type"] == "http.response.start":
                started = True
            await send(msg)

        try:
            await self.app(scope, counted, guarded)
        except _TooLarge:
            if not started:
                await reject(send, limit)


def content_length(scope: Scope) -> int | None:
    """The Content-Length the request declares, None if none (or not a number)."""
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


def _nul_in_url(scope: Scope) -> str | None:
    """The name of the first query parameter holding a NUL ("path" for the path), or None."""
    if "\x00" in scope.get("path", ""):
        return "path"
    query = scope.get("query_string", b"")
    if b"%00" in query or b"\x00" in query:
        for name, value in parse_qsl(query.decode("latin-1"), keep_blank_values=True):
            if "\x00" in name or "\x00" in value:
                return name.replace("\x00", "") or "query"
    return None


async def _send_error(send: Send, status: int, message: str, field: str | None, *, close: bool = False) -> None:
    details = [FieldProblem(field, "must not contain NUL characters")] if field else []
    body = error_json(status, message, details)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:  # the rest of an over-long body is not read: the connection cannot be reused
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
