"""The hot routes' fast path: metric reports, log batches, long-polls.

FastAPI handles a request in several steps that each cost CPU: the body is decoded with the
standard `json` module and then validated by Pydantic from Python objects, every synchronous
dependency and the endpoint run in a worker thread of their own (a hop through the event loop each),
and the answer is encoded by `json.dumps`. For the routes a cluster calls thousands of times a
minute that is most of the master's CPU per request.

`FastRoute` keeps the route as declared (its OpenAPI entry, its dependencies, its errors) and puts
a fast path in front of it: `fast_path(handler)` attaches `handler(request)` to an endpoint; the
handler parses the body straight from bytes (`parse_body`: pydantic-core's own JSON parser, no
intermediate Python objects), does the work in one worker thread and answers with orjson
(`json_response`). When it returns None — a body it does not accept as is, a missing token —
FastAPI's usual handling runs on the same request (the body already read is reused), so every
malformed request gets exactly the 4xx it always got, with its field and reason.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import orjson
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response

FastHandler = Callable[[Request], Awaitable[Response | None]]
_FAST_ATTR = "__shipyard_fast_path__"

E = TypeVar("E", bound=Callable[..., Any])
M = TypeVar("M", bound=BaseModel)


def fast_path(handler: FastHandler) -> Callable[[E], E]:
    """Decorator: `handler` answers the endpoint's well-formed requests (a route of a `FastRoute`
    router); None from it hands the request to FastAPI's usual path."""

    def attach(endpoint: E) -> E:
        setattr(endpoint, _FAST_ATTR, handler)
        return endpoint

    return attach


def fast_handler(route: APIRoute) -> FastHandler | None:
    """The route's fast path, if it has one (frontdoor/express.py serves it from the front door)."""
    return getattr(route.endpoint, _FAST_ATTR, None) if isinstance(route, FastRoute) else None


class FastRoute(APIRoute):
    """An APIRoute that tries its endpoint's fast path (if it has one) before FastAPI's handling."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        usual = super().get_route_handler()
        fast: FastHandler | None = getattr(self.endpoint, _FAST_ATTR, None)
        if fast is None:
            return usual

        async def handler(request: Request) -> Response:
            response = await fast(request)
            return response if response is not None else await usual(request)

        return handler


def json_response(content: Any, status_code: int = 200) -> Response:
    """What FastAPI's JSONResponse sends (compact JSON, UTF-8), encoded by orjson."""
    return Response(orjson.dumps(content), status_code=status_code, media_type="application/json")


def _json_content_type(request: Request) -> bool:
    """As FastAPI reads a body: no Content-Type (the app is not strict about it) or a JSON one."""
    value = request.headers.get("content-type")
    if not value:
        return True
    media = value.split(";", 1)[0].strip().lower()
    return media.startswith("application/") and (media == "application/json" or media.endswith("+json"))


async def parse_body(request: Request, model: type[M]) -> M | None:
    """The request's body as `model`, or None when it is anything else than a valid JSON document
    of that model (empty, not JSON, invalid, over its size limit): the caller then lets FastAPI's
    usual path answer it."""
    if not _json_content_type(request):
        return None
    try:
        body = await request.body()
    except Exception:  # over the body limit: FastAPI's path reports it (frontdoor/limits.py)
        return None
    if not body:
        return None
    try:
        return model.model_validate_json(body)
    except ValidationError:
        return None


def path_int(request: Request, name: str, low: int, high: int) -> int | None:
    """An integer path parameter within [low, high], or None (FastAPI's path answers the 400)."""
    raw = request.path_params.get(name)
    if not isinstance(raw, str) or not raw.isascii() or not raw.isdigit() or len(raw) > 19:
        return None
    value = int(raw)
    return value if low <= value <= high else None


def dumps(content: Any) -> bytes:
    return orjson.dumps(content)
