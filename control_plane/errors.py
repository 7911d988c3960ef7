"""Domain errors: what the master refuses and why, in the domain's words.

Services, cores' shells and the API raise these. Each kind's HTTP status is in one table here
(`HTTP_STATUS`, read through `http_status`); `frontdoor/error_shape.py` builds Determined's error
body from it, which the routes (`api/errors.py`) and the web UI answer with. Nothing else below the
HTTP layer knows about HTTP."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FieldProblem:
    field: str
    reason: str


class DomainError(Exception):
    def __init__(self, message: str, details: list[FieldProblem] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details or []


class Invalid(DomainError):
    """The input is wrong: a field, a config, a request that can never succeed as sent."""


class Unauthenticated(DomainError):
    """No valid credential."""


class PermissionDenied(DomainError):
    """A valid credential that may not do this."""


class NotFound(DomainError):
    """The thing named does not exist (or the caller may not know it exists)."""


class Conflict(DomainError):
    """The request is valid but the current state forbids it (wrong state, duplicate, stale)."""


class TooLarge(DomainError):
    """A body or a value beyond its limit."""


class TooManyRequests(DomainError):
    """The caller already has as much of this under way as it may (a per-user limit); retry later."""

    def __init__(self, message: str, retry_after_s: int = 1, details: list[FieldProblem] | None = None) -> None:
        super().__init__(message, details)
        self.retry_after_s = retry_after_s


class Internal(DomainError):
    """The record is inconsistent: a bug, never the caller's fault."""


# The HTTP status of each kind of error: the one table the API (api/errors.py) and the web UI
# (ui/routes.py) both answer with.
HTTP_STATUS: dict[type[DomainError], int] = {
    Invalid: 400,
    Unauthenticated: 401,
    PermissionDenied: 403,
    NotFound: 404,
    Conflict: 409,
    TooLarge: 413,
    TooManyRequests: 429,
    Internal: 500,
}


def http_status(exc: DomainError) -> int:
    for cls in type(exc).__mro__:
        if cls in HTTP_STATUS:
            return HTTP_STATUS[cls]  # type: ignore[index]
    return 500


def bad_request(message: str, field: str | None = None) -> Invalid:
    details = [FieldProblem(field, message)] if field else []
    return Invalid(f"{field}: {message}" if field else message, details)


def not_found(what: str) -> NotFound:
    return NotFound(f"{what} not found")


def forbidden(message: str = "permission denied") -> PermissionDenied:
    return PermissionDenied(message)


def unauthenticated(message: str = "authentication required") -> Unauthenticated:
    return Unauthenticated(message)


def conflict(message: str) -> Conflict:
    return Conflict(message)


class NotLeader(Exception):
    """A control loop tried to commit without holding the leadership lease (another master process
    took it over): the transaction is rolled back, nothing is written. Not a domain error: no
    request ever sees it (API requests are not fenced)."""
