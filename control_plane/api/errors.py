"""One error shape for every 4xx/5xx, readable by Determined's client (`error.error`) and by
people (`message`, plus `details` naming each bad field)."""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from control_plane.api.openapi import install_openapi
from control_plane.errors import DomainError, FieldProblem, TooManyRequests, http_status

log = logging.getLogger("shipyard.api")




def error_body(status: int, message: str, details: list[FieldProblem]) -> dict[str, Any]:
    reason = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "Error"
    return {
        "error": {"code": status, "reason": reason, "error": message},
        "code": status,
        "message": message,
        "details": [{"field": d.field, "reason": d.reason} for d in details],
    }


def _loc_to_path(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header")]
    out = ""
    for p in parts:
        out += f"[{p}]" if p.isdigit() else (f".{p}" if out else p)
    return out or "(body)"


def domain_error_response(exc: DomainError) -> JSONResponse:
    status = http_status(exc)
    headers = {"Retry-After": str(exc.retry_after_s)} if isinstance(exc, TooManyRequests) else None
    return JSONResponse(error_body(status, exc.message, exc.details), status_code=status, headers=headers)


def unexpected_error_response(path: str) -> JSONResponse:
    """A bug: logged with its traceback (call it in the except block), answered as a bare 500."""
    log.exception("event=unhandled_error path=%s", path)
    return JSONResponse(error_body(500, "internal error", []), status_code=500)


def install_error_handlers(app: FastAPI) -> None:
    # The spec documents these handlers' statuses (400, not FastAPI's 422) and body.
    install_openapi(app)

    @app.exception_handler(DomainError)
    async def _domain_error(_req: Request, exc: DomainError) -> JSONResponse:
        return domain_error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_req: Request, exc: RequestValidationError) -> JSONResponse:
        details = []
        for err in exc.errors():
            msg = err.get("msg", "invalid")
            if err.get("type") == "json_invalid":
                msg = "request body is not valid JSON"
            details.append(FieldProblem(_loc_to_path(tuple(err.get("loc", ()))), msg))
        message = "; ".join(f"{d.field}: {d.reason}" for d in details) or "invalid request"
        return JSONResponse(error_body(400, message, details), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_req: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(error_body(exc.status_code, str(exc.detail), []), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _unexpected(req: Request, exc: Exception) -> JSONResponse:
        return unexpected_error_response(req.url.path)
