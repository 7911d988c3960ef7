"""The agent's side of docs/PROTOCOL.md over HTTP, with one error taxonomy the daemon acts on:

  MasterUnavailable  connection refused/reset, timeouts, 5xx, 408/429: retry with backoff
  AuthRefused        401/403: the credential or its scope is wrong; retrying cannot help
  StaleSession       409 on commands/events: the session was replaced; register again
  RequestRefused     any other 4xx: this request is wrong; do not repeat it

Wire shapes are the protocol's models (shipyard_common.agent_protocol, the same the master parses),
validated at this edge; the rest of the agent never sees dicts.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from typing import Any

import httpx
from pydantic import ValidationError

from shipyard_common.agent_protocol import (
    COMMANDS_PATH,
    EVENTS_PATH,
    INTERRUPTION_PATH,
    REGISTER_PATH,
    EventsRequest,
    InterruptionRequest,
    RegisterRequest,
    RegisterResponse,
    TaskEvent,
)
from shipyard_common.retry_after import retry_after_seconds


class MasterError(Exception):
    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class MasterUnavailable(MasterError):
    """`retry_after_s`: the master's Retry-After on a 503/429 (it is shedding load), capped; whoever
    retries waits at least that long."""

    retry_after_s: float | None = None


def retry_after(resp: httpx.Response) -> float | None:
    return retry_after_seconds(resp.headers.get("retry-after"))


class AuthRefused(MasterError):
    pass


class StaleSession(MasterError):
    pass


class RequestRefused(MasterError):
    pass


def backoff_delay(attempt: int, base: float, cap: float, rand: float) -> float:
    """Wait before reconnect attempt `attempt` (1-based): exponential from `base`, capped at `cap`,
    with jitter `rand` in [0, 1) taking off up to half, so agents that lost the same master do not
    all come back in the same instant. Always within [base/2, cap]."""
    exp = base * (2 ** min(max(attempt - 1, 0), 30))
    ceiling = min(cap, exp)
    return max(min(base, cap) / 2, ceiling * (1 - 0.5 * min(max(rand, 0.0), 1.0)))


def _error_message(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return resp.text.strip()[:300] or resp.reason_phrase
    if isinstance(body, dict):
        if isinstance(body.get("message"), str) and body["message"]:
            return body["message"]
        err = body.get("error")
        if isinstance(err, dict) and isinstance(err.get("error"), str):
            return err["error"]
        if isinstance(body.get("detail"), str):
            return body["detail"]
    return resp.text.strip()[:300]


class MasterClient:
    """One HTTP client to the master. Not shared between threads: each loop of the agent makes its
    own (they are cheap), so a long-poll never holds up an event or a log batch."""

    def __init__(self, master_url: str, agent_token: str | Callable[[], str], *, timeout: float = 30.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.master_url = master_url.rstrip("/")
        # A callable is asked at every request: the agent swaps its enrolment token for its own
        # credential once it has one, and every client it made sees the change.
        self._token: Callable[[], str] = agent_token if callable(agent_token) else (lambda: agent_token)
        self._timeout = timeout
        self._http = httpx.Client(base_url=self.master_url, timeout=timeout, transport=transport,
                                  headers={"User-Agent": "shipyard-agent"})

    def close(self) -> None:
        self._http.close()

    def _request(self, method: str, path: str, *, token: str | None = None, json: Any = None,
                 params: dict[str, Any] | None = None, timeout: float | None = None) -> Any:
        headers = {"Authorization": f"Bearer {token or self._token()}"}
        try:
            resp = self._http.request(method, path, json=json, params=params, headers=headers,
                                      timeout=timeout if timeout is not None else self._timeout)
        except httpx.RequestError as e:
            # The URL and the reason, never the headers (they hold the token).
            raise MasterUnavailable(f"{method} {path}: {type(e).__name__}: {e}") from None
        status = resp.status_code
        if status < 400:
            if not resp.content:
                return {}
            try:
                return resp.json()
            except ValueError:
                raise MasterUnavailable(f"{method} {path}: answer is not JSON", status) from None
        message = _error_message(resp)
        if status in (401, 403):
            raise AuthRefused(message, status)
        if status == 409:
            raise StaleSession(message, status)
        if status >= 500 or status in (408, 425, 429):
            err = MasterUnavailable(f"{method} {path}: {status} {message}", status)
            err.retry_after_s = retry_after(resp)
            raise err
        raise RequestRefused(f"{method} {path}: {status} {message}", status)

    def register(self, req: RegisterRequest, token: str | None = None) -> RegisterResponse:
        body = self._request("POST", REGISTER_PATH, json=req.to_wire(), token=token)
        try:
            return RegisterResponse.model_validate(body)
        except ValidationError as e:
            raise MasterUnavailable(f"register: unexpected answer: {e.errors()[0]['msg']}") from None

    def commands(self, agent_id: str, session_id: str, timeout_s: float) -> list[dict[str, Any]]:
        """Raw commands; the daemon parses each one so a single bad command is reported, not fatal."""
        body = self._request("GET", COMMANDS_PATH.format(agentId=agent_id),
                             params={"sessionId": session_id, "timeoutSeconds": timeout_s},
                             timeout=timeout_s + self._timeout)
        commands = body.get("commands") if isinstance(body, dict) else None
        return [c for c in commands if isinstance(c, dict)] if isinstance(commands, list) else []

    def post_events(self, agent_id: str, session_id: str, events: list[TaskEvent]) -> None:
        self._request("POST", EVENTS_PATH.format(agentId=agent_id),
                      json=EventsRequest(session_id=session_id, events=events).to_wire())

    def post_interruption(self, agent_id: str, req: InterruptionRequest) -> None:
        self._request("POST", INTERRUPTION_PATH.format(agentId=agent_id), json=req.to_wire())

    def post_task_logs(self, entries: list[dict[str, Any]], token: str | None = None) -> None:
        self._request("POST", "/api/v1/task/logs", json={"logs": entries}, token=token)

    def fetch_model_definition(self, path: str, token: str | None) -> bytes:
        body = self._request("GET", path if path.startswith("/") else "/" + path, token=token)
        b64 = body.get("b64Tgz") if isinstance(body, dict) else None
        if not isinstance(b64, str):
            raise RequestRefused(f"GET {path}: answer has no b64Tgz")
        try:
            return base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError):
            raise RequestRefused(f"GET {path}: b64Tgz is not base64") from None
