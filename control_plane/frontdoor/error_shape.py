"""One error shape for every 4xx/5xx, readable by Determined's client (`error.error`) and by
people (`message`, plus `details` naming each bad field). The front door answers its refusals in
it (admission's 503, the body limits' 413, the express lane's domain errors) and api/errors.py
every error of the routes."""

from __future__ import annotations

import json
import logging
from http import HTTPStatus
from typing import Any

from starlette.responses import JSONResponse

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


def error_json(status: int, message: str, details: list[FieldProblem]) -> bytes:
    """`error_body` encoded, for answers sent as bytes outside any framework response."""
    return json.dumps(error_body(status, message, details)).encode()


def domain_error_response(exc: DomainError) -> JSONResponse:
    status = http_status(exc)
    headers = {"Retry-After": str(exc.retry_after_s)} if isinstance(exc, TooManyRequests) else None
    return JSONResponse(error_body(status, exc.message, exc.details), status_code=status, headers=headers)


def unexpected_error_response(path: str) -> JSONResponse:
    """A bug: logged with its traceback (call it in the except block), answered as a bare 500."""
    log.exception("event=unhandled_error path=%s", path)
    return JSONResponse(error_body(500, "internal error", []), status_code=500)
