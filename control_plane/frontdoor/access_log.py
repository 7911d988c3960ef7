"""Every HTTP request, counted and logged where it enters the application: a plain ASGI wrapper
around the front door (api/app.py), so requests refused by admission (503) and health answered from
memory count too.

The route label is the template the router matched (`/api/v1/trials/{trial_id}/metrics`), never the
raw path; the health paths answered before routing are their own template, and anything else with
no route (a 404, a refusal before routing) is `unmatched`. The log line is one structured event:

    event=http_request method=GET route=/api/v1/experiments/{experiment_id} status=200 duration_ms=3.1 client=10.0.0.7

It never holds a query string, a header or a body (tokens travel there). The cluster's own traffic
(agents' polls, trials' reports: admission's cluster lane) logs at debug level, users' requests at
info. Cost: a dict lookup, a counter, a histogram, and a log record only when its level is on."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from control_plane import telemetry
from control_plane.frontdoor.admission import is_cluster_request

log = logging.getLogger("shipyard.access")

_FORMAT = "event=http_request method=%s route=%s status=%d duration_ms=%.1f client=%s"


class RequestTelemetry:
    def __init__(self, app: ASGIApp, fixed_paths: Iterable[str] = ()) -> None:
        self.app = app
        # Paths answered before routing (health): their own template.
        self.fixed_paths = frozenset(fixed_paths)
        # (method, route template) -> log level: every path of one template is in the same lane.
        self._levels: dict[tuple[str, str], int] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500  # what the server answers if the application fails before a response starts

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            seconds = time.perf_counter() - start
            method: str = scope["method"]
            if method not in telemetry.METHODS:
                method = "OTHER"  # the client chose it: bounded before it becomes a label or a key
            route = scope.get("route")
            template = getattr(route, "path_format", None) if route is not None else None
            if template is None:
                template = scope["path"] if scope["path"] in self.fixed_paths else telemetry.UNMATCHED
            telemetry.observe_request(template, method, status, seconds)
            key = (method, template)
            level = self._levels.get(key)
            if level is None:
                level = logging.DEBUG if is_cluster_request(method, scope["path"]) else logging.INFO
                if template != telemetry.UNMATCHED:
                    self._levels[key] = level
            if log.isEnabledFor(level):
                client = scope.get("client")
                log.log(level, _FORMAT, method, template, status,
                        seconds * 1000, client[0] if client else "-")
