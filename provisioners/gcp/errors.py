"""How a Compute Engine failure is sorted into the provider taxonomy (provisioners/base.py): HTTP
errors by their reasons, then their status; finished zone operations by their error codes (GCE's two
vocabularies for the same conditions). Capacity moves the launch on to the next zone; a quota is
labelled with its region, or the project for project-wide quotas; auth, invalid and rate-limit errors
stop the launch.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import requests
from google.api_core import exceptions as gexc
from google.auth import exceptions as auth_exc
from google.cloud import compute_v1

from provisioners.base import ErrorKind, ErrorScope, ProviderError
from shipyard_common.clouds import gcp_region


class GceOperationError(Exception):
    """A zone operation that finished with `error.errors[]`."""

    def __init__(self, errors: Sequence[tuple[str, str]], http_status: int = 0) -> None:
        self.errors = list(errors)
        self.http_status = http_status
        super().__init__("; ".join(f"{c}: {m}" for c, m in self.errors) or "operation failed")


def _norm(code: str) -> str:
    # "quotaExceeded" and "QUOTA_EXCEEDED" are the same condition in GCE's two vocabularies
    # (HTTP error reasons and operation error codes).
    return re.sub(r"[^A-Z]", "", code.upper())


_CAPACITY = {
    "ZONERESOURCEPOOLEXHAUSTED",
    "ZONERESOURCEPOOLEXHAUSTEDWITHDETAILS",
    "RESOURCEPOOLEXHAUSTED",
    "RESOURCEEXHAUSTED",
    "STOCKOUT",
}
_QUOTA = {"QUOTAEXCEEDED", "QUOTALIMITEXCEEDED"}
_THROTTLED = {
    "RATELIMITEXCEEDED",
    "USERRATELIMITEXCEEDED",
    "RESOURCEOPERATIONRATEEXCEEDED",
    "OPERATIONRATEEXCEEDED",
    "RATELIMITED",
}
_AUTH = {
    "FORBIDDEN",
    "AUTHERROR",
    "PERMISSIONDENIED",
    "INSUFFICIENTPERMISSIONS",
    "UNAUTHORIZED",
    "ACCESSDENIED",
}
_INVALID = {
    "INVALID",
    "INVALIDFIELDVALUE",
    "INVALIDPARAMETER",
    "INVALIDUSAGE",
    "BADREQUEST",
    "REQUIRED",
    "RESOURCENOTFOUND",
    "NOTFOUND",
    "UNSUPPORTEDOPERATION",
    "CONDITIONNOTMET",
    "RESOURCEINUSEBYANOTHERRESOURCE",
}
_TRANSIENT_CAUSES: tuple[type[BaseException], ...] = (
    gexc.ServerError,
    gexc.DeadlineExceeded,
    requests.exceptions.ConnectionError,
    requests.exceptions.Timeout,
    auth_exc.TransportError,
)


def _kind_of_code(code: str) -> ErrorKind | None:
    n = _norm(code)
    if n in _CAPACITY:
        return ErrorKind.CAPACITY
    if n in _QUOTA:
        return ErrorKind.QUOTA
    if n in _THROTTLED:
        return ErrorKind.THROTTLED
    if n in _AUTH:
        return ErrorKind.AUTH
    if n in _INVALID or n.startswith("INVALID"):
        return ErrorKind.INVALID
    return None


def _kind_of_status(status: int) -> ErrorKind:
    if status == 429:
        return ErrorKind.THROTTLED
    if status in (401, 403):
        return ErrorKind.AUTH
    if status in (400, 404, 409, 412, 422):
        return ErrorKind.INVALID
    return ErrorKind.UNKNOWN


def _scope_and_location(kind: ErrorKind, zone: str, message: str) -> tuple[ErrorScope, str]:
    if kind is ErrorKind.CAPACITY:
        return ErrorScope.ZONE, zone
    if kind is ErrorKind.QUOTA:
        # GPUS_ALL_REGIONS and similar project-wide quotas cannot be escaped by changing region.
        if "ALL_REGIONS" in message.upper() or "GLOBAL" in message.upper():
            return ErrorScope.CLOUD, zone
        return ErrorScope.REGION, gcp_region(zone) if zone else ""
    if kind in (ErrorKind.THROTTLED, ErrorKind.AUTH):
        return ErrorScope.CLOUD, zone
    return ErrorScope.REGION, zone


def classify_error(exc: BaseException, zone: str = "") -> ProviderError:
    """Sort any failure of a Compute Engine call into the provider error taxonomy."""
    if isinstance(exc, ProviderError):
        return exc
    if isinstance(exc, GceOperationError):
        # Several errors can come back; the most specific recognised code decides.
        for code, message in exc.errors:
            kind = _kind_of_code(code)
            if kind is not None:
                scope, location = _scope_and_location(kind, zone, message)
                return ProviderError(kind, str(exc), scope=scope, code=code, location=location)
        code = exc.errors[0][0] if exc.errors else ""
        kind = _kind_of_status(exc.http_status) if exc.http_status else ErrorKind.UNKNOWN
        scope, location = _scope_and_location(kind, zone, str(exc))
        return ProviderError(kind, str(exc), scope=scope, code=code, location=location)
    if isinstance(exc, gexc.GoogleAPICallError):
        reasons = [e.get("reason", "") for e in exc.errors if isinstance(e, dict)]
        if exc.reason:
            reasons.insert(0, exc.reason)
        status = int(exc.code) if isinstance(exc.code, int) else 0
        kind: ErrorKind | None = ErrorKind.THROTTLED if status == 429 else None
        code = next((r for r in reasons if r), "") or (str(status) if status else type(exc).__name__)
        if kind is None:
            for r in reasons:
                k = _kind_of_code(r)
                # A 403 "forbidden" is auth, but a 403 "rateLimitExceeded"/"quotaExceeded" is not;
                # reasons take precedence over the status code.
                if k is not None:
                    kind, code = k, r
                    break
        if kind is None or (kind is ErrorKind.INVALID and status >= 500):
            kind = _kind_of_status(status)
        scope, location = _scope_and_location(kind, zone, exc.message or "")
        return ProviderError(kind, exc.message or str(exc), scope=scope, code=code, location=location)
    if isinstance(exc, auth_exc.DefaultCredentialsError | auth_exc.RefreshError):
        return ProviderError(
            ErrorKind.AUTH,
            f"GCP credentials: {exc}",
            scope=ErrorScope.CLOUD,
            code=type(exc).__name__,
            location=zone,
        )
    return ProviderError(
        ErrorKind.UNKNOWN, f"{type(exc).__name__}: {exc}", code=type(exc).__name__, location=zone
    )


def is_transient(exc: BaseException) -> bool:
    if not isinstance(exc, ProviderError):
        return False
    return exc.kind is ErrorKind.THROTTLED or isinstance(exc.__cause__, _TRANSIENT_CAUSES)


def is_timeout(exc: BaseException) -> bool:
    return isinstance(exc.__cause__, requests.exceptions.Timeout | gexc.DeadlineExceeded)


def operation_error(op: compute_v1.Operation) -> GceOperationError | None:
    errs = [(e.code, e.message) for e in op.error.errors] if op.error else []
    if not errs and not op.http_error_status_code:
        return None
    if not errs:
        # Some failures carry only an HTTP status on the operation.
        if op.http_error_status_code < 400:
            return None
        errs = [(str(op.http_error_status_code), op.http_error_message or "operation failed")]
    return GceOperationError(errs, op.http_error_status_code)
