"""The express lane: the hot report routes answered by their fast path straight from the front
door, past FastAPI's middleware stack and router.

A trial's metric report, progress and log batch go, after admission, through eight ASGI layers
(error and exception middleware, body limits, FastAPI's exit stack, its telemetry wrapper) and a
router that tries a hundred and fifty routes one regular expression at a time; with the fast path
itself (frontdoor/fastjson.py) that stack had become a sixth of an API worker's CPU under a cluster's
load. Here the front door (frontdoor/admission.py) hands a POST whose path matches one of the routes
that have a fast path to that route's handler directly, with what those layers would have given
it: the route and its path parameters in the scope (the access log and /metrics label it by its
template), the body limit (only a request that declares a Content-Length within
`body_limit` comes here; anything else takes the usual path, which enforces it while reading),
and the error shape (a domain error becomes its 4xx, anything unexpected a logged 500). A request
the fast path declines (`None`: a body it does not take as is) goes on to the whole application
with its body replayed, so it gets exactly the answer it always got.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from control_plane.config import MasterConfig
from control_plane.errors import DomainError
from control_plane.frontdoor import fastjson
from control_plane.frontdoor.error_shape import domain_error_response, unexpected_error_response
from control_plane.frontdoor.limits import body_limit, content_length

log = logging.getLogger("shipyard.api")


class ExpressLane:
    def __init__(self, app: FastAPI, full: ASGIApp, config: MasterConfig) -> None:
        self.app = app
        self.full = full  # the whole application, for everything else
        self.config = config
        self.routes: list[tuple[APIRoute, fastjson.FastHandler]] = []
        for route in _served_routes(app.routes):
            handler = fastjson.fast_handler(route) if isinstance(route, APIRoute) else None
            if handler is not None and route.methods == {"POST"}:
                self.routes.append((route, handler))

    def match(self, scope: Scope) -> tuple[APIRoute, fastjson.FastHandler, dict[str, Any]] | None:
        if scope["method"] != "POST":
            return None
        for route, handler in self.routes:
            found, child = route.matches(scope)
            if found is Match.FULL:
                return route, handler, child
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        hit = self.match(scope) if scope["type"] == "http" else None
        declared = content_length(scope) if hit is not None else None
        if hit is None or declared is None or declared > body_limit(self.config, "POST", scope["path"]) or (
                self.config.body_budget_bytes and declared > self.config.body_spool_bytes):  # frontdoor/body_budget.py
            await self.full(scope, receive, send)
            return
        route, handler, child = hit
        scope.update(child)
        scope["route"] = route
        scope["app"] = self.app
        request = Request(scope, receive)
        try:
            response = await handler(request)
        except DomainError as e:
            response = domain_error_response(e)
        except Exception:
            response = unexpected_error_response(scope["path"])
        if response is None:  # declined: the usual path answers, with the body already read
            await self.full(scope, replay_body(await request.body(), receive), send)
            return
        await response(scope, receive, send)


def _served_routes(routes: list[Any]) -> Iterator[Any]:
    """The routes the application serves at their own path: those of routers included without a
    prefix, read from the routers themselves. (fastapi.routing.iter_route_contexts gives the same,
    but builds each route's effective copy, dependencies and all, to do it: half a second of every
    application's start, for routes a request may never reach.)"""
    for route in routes:
        router = getattr(route, "original_router", None)  # an included router
        if router is None:
            yield route
        elif not route.include_context.prefix:
            yield from _served_routes(router.routes)


def replay_body(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # after the body: the disconnect, when it comes

    return replayed
