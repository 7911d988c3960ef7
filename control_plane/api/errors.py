"""Every error of the routes answered in the one error shape (frontdoor/error_shape.py): domain
errors by their status (`control_plane.errors.http_status`), FastAPI's validation errors as 400s
naming each bad field, HTTP errors by their status, anything else a logged 500."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from control_plane.api.openapi import install_openapi
from control_plane.errors import DomainError, FieldProblem
from control_plane.frontdoor.error_shape import domain_error_response, error_body, unexpected_error_response


def _loc_to_path(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header")]
    out = ""
    for p in parts:
        out += f"[{p}]" if p.isdigit() else (f".{p}" if out else p)
    return out or "(body)"


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
