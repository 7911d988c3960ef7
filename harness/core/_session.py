"""HTTP client for the master's /api/v1, as seen from a trial process.

Errors are sorted into two kinds, because the callers act differently on them:
- TransientAPIError: connection refused/reset, timeouts, 408, 429, 5xx. Worth retrying; the master
  may be restarting (it can be killed at any instant and comes back from its database).
- APIError (NotFoundError, AuthError, ...): the master answered and said no. Retrying is pointless.

`request()` retries transient errors with tenacity (exponential backoff with jitter; bounded attempts
and total delay by default, without a bound for a trial: `RetryPolicy.for_trial`). Long-running background loops (metrics reporter, preemption watcher) call
`request_once()` and run their own policy.
"""

from __future__ import annotations

import json
import logging
import random
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional

import requests
from tenacity import (
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    stop_never,
    wait_random_exponential,
)

from harness.core import _wire
from shipyard_common.retry_after import retry_after_seconds

log = logging.getLogger("harness.core")

_TRANSIENT_STATUS = {408, 429}


class APIError(Exception):
    def __init__(self, method: str, path: str, status: int | None, message: str) -> None:
        self.method = method
        self.path = path
        self.status = status
        self.message = message
        where = f"{method} {path}"
        super().__init__(f"{where}: {status} {message}" if status is not None else f"{where}: {message}")


class TransientAPIError(APIError):
    """The master could not be reached or is temporarily unable to answer. `retry_after_s` is the
    master's own hint (503/429 `Retry-After`, capped), which the retry honours."""

    retry_after_s: float | None = None


def retry_after(resp: requests.Response) -> float | None:
    return retry_after_seconds(resp.headers.get("Retry-After"))


class HonourRetryAfter:
    """tenacity wait: the backoff, but never less than the master's Retry-After (plus jitter up to
    half of it, so shed clients do not all come back in the same instant)."""

    def __init__(self, backoff: Any) -> None:
        self.backoff = backoff

    def __call__(self, state: Any) -> float:
        wait = float(self.backoff(state))
        exc = state.outcome.exception() if state.outcome else None
        hint = getattr(exc, "retry_after_s", None)
        if hint:
            wait = max(wait, hint * (1 + 0.5 * random.random()))
        return wait


class NotFoundError(APIError):
    pass


class AuthError(APIError):
    """401/403: the allocation token is wrong or not allowed to touch this resource."""


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded by default (a tool, a test); `for_trial()` is unbounded. None: no limit."""

    max_attempts: Optional[int] = 30
    max_delay_s: Optional[float] = 300.0
    wait_initial_s: float = 0.25
    wait_max_s: float = 15.0

    @classmethod
    def for_trial(cls, environ: Mapping[str, str]) -> RetryPolicy:
        """A trial's: transient errors are retried for as long as the trial lives, so a master
        that is down for an hour (restarting, being upgraded, its host replaced) costs the trial
        that hour and nothing else; the trial itself ends only when the agent ends it. Waits grow
        to 30 s (SHIPYARD_RETRY_WAIT_MAX_S: tests shrink it)."""
        wait_max = float(environ.get("SHIPYARD_RETRY_WAIT_MAX_S") or 30.0)
        return cls(max_attempts=None, max_delay_s=None, wait_initial_s=min(0.25, wait_max), wait_max_s=wait_max)

    def stop(self) -> Any:
        bounds = [stop_after_attempt(self.max_attempts)] if self.max_attempts is not None else []
        if self.max_delay_s is not None:
            bounds.append(stop_after_delay(self.max_delay_s))
        if not bounds:
            return stop_never
        out = bounds[0]
        for b in bounds[1:]:
            out = out | b
        return out


def _error_message(resp: requests.Response) -> str:
    """Shipyard's error envelope, grpc-gateway's, FastAPI's, or the raw text."""
    try:
        body = resp.json()
    except ValueError:
        return resp.text[:300] or resp.reason
    if isinstance(body, dict):
        for key in ("message", "detail"):
            if isinstance(body.get(key), str) and body[key]:
                return body[key]
        err = body.get("error")
        if isinstance(err, dict):
            return str(err.get("error") or err.get("reason") or err)
        if isinstance(body.get("detail"), list):
            return json.dumps(body["detail"])[:300]
    return str(body)[:300]


class Session:
    """Thread-safe: each thread gets its own requests.Session (they are not safe to share)."""

    def __init__(
        self,
        master_url: str,
        token: str | None,
        *,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 30.0,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.master_url = master_url.rstrip("/")
        self._headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.retry = retry or RetryPolicy()
        self._local = threading.local()
        self._all: list[requests.Session] = []
        self._lock = threading.Lock()

    def _http(self) -> requests.Session:
        s = getattr(self._local, "session", None)
        if s is None:
            s = requests.Session()
            s.headers.update(self._headers)
            self._local.session = s
            with self._lock:
                self._all.append(s)
        return s

    def request_once(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        raw_body: bytes | None = None,
        params: Mapping[str, Any] | None = None,
        read_timeout_s: float | None = None,
    ) -> Any:
        """One attempt. Returns the decoded JSON (None for an empty body) or raises an APIError."""
        data = raw_body if raw_body is not None else (_wire.dumps(body) if body is not None else None)
        timeout = (self.connect_timeout_s, read_timeout_s or self.read_timeout_s)
        try:
            resp = self._http().request(method, self.master_url + path, data=data, params=params, timeout=timeout)
        except (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError) as e:
            raise TransientAPIError(method, path, None, f"{type(e).__name__}: {e}") from e
        except requests.RequestException as e:  # bad URL, bad scheme: retrying will not help
            raise APIError(method, path, None, f"{type(e).__name__}: {e}") from e
        status = resp.status_code
        if 200 <= status < 300:
            if not resp.content:
                return None
            try:
                return resp.json()
            except ValueError as e:
                raise APIError(method, path, status, f"response is not JSON: {resp.text[:200]!r}") from e
        message = _error_message(resp)
        if status >= 500 or status in _TRANSIENT_STATUS:
            err = TransientAPIError(method, path, status, message)
            err.retry_after_s = retry_after(resp)
            raise err
        if status == 404:
            raise NotFoundError(method, path, status, message)
        if status in (401, 403):
            raise AuthError(method, path, status, message)
        raise APIError(method, path, status, message)

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """request_once, retrying transient errors as the session's policy says."""
        policy = self.retry

        def _log_retry(state: Any) -> None:
            # Every attempt for the first ten, then every tenth: an hour's outage is not a flood.
            if state.attempt_number <= 10 or state.attempt_number % 10 == 0:
                exc = state.outcome.exception() if state.outcome else None
                log.warning("event=api_retry method=%s path=%s attempt=%d error=%r", method, path,
                            state.attempt_number, str(exc))

        for attempt in Retrying(
            retry=retry_if_exception_type(TransientAPIError),
            stop=policy.stop(),
            wait=HonourRetryAfter(wait_random_exponential(multiplier=policy.wait_initial_s, max=policy.wait_max_s)),
            before_sleep=_log_retry,
            reraise=True,
        ):
            with attempt:
                return self.request_once(method, path, **kwargs)
        raise AssertionError("unreachable")  # pragma: no cover - tenacity either returns or raises

    def get(self, path: str, **kwargs: Any) -> Any:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, body: Any = None, **kwargs: Any) -> Any:
        return self.request("POST", path, body=body if body is not None else {}, **kwargs)

    def patch(self, path: str, body: Any = None, **kwargs: Any) -> Any:
        return self.request("PATCH", path, body=body if body is not None else {}, **kwargs)

    def close(self) -> None:
        with self._lock:
            sessions, self._all = self._all, []
        for s in sessions:
            s.close()
