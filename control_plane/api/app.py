"""The FastAPI application: routers, error shape, and request-size limits."""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from control_plane.api import (
    agent_package,
    agents,
    checkpoints,
    experiments,
    logs,
    metrics,
    models,
    pools,
    tasks,
    trials,
    users,
)
from control_plane.api.errors import error_body, install_error_handlers
from control_plane.master import Master


class BodySizeLimit:
    """Refuse bodies over the limit with a 413 before they are buffered whole."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._reject(send)
            return
        seen = 0
        too_big = False

        async def limited() -> Message:
            nonlocal seen, too_big
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.max_bytes:
                    too_big = True
                    raise _TooLarge()
            return msg

        try:
            await self.app(scope, limited, send)
        except _TooLarge:
            await self._reject(send)

    async def _reject(self, send: Send) -> None:
        body = json.dumps(error_body(413, f"request body larger than {self.max_bytes} bytes", [])).encode()
        await send({"type": "http.response.start", "status": 413, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})


class _TooLarge(Exception):
    pass


def create_app(master: Master, extra_routers: list[Any] | None = None) -> FastAPI:
    app = FastAPI(
        title="Shipyard",
        version=__import__("control_plane").__version__,
        description="Elastic control plane for deep-learning training; Determined-compatible /api/v1.",
        docs_url="/docs",
    )
    app.state.master = master
    install_error_handlers(app)
    for module in (users, experiments, trials, metrics, logs, checkpoints, agents, tasks, pools, models, agent_package):
        app.include_router(module.router)
    for router in extra_routers or []:
        app.include_router(router)
    app.add_middleware(BodySizeLimit, max_bytes=master.config.max_request_bytes)
    return app
