"""Retry-After, as the harness and the agent read it: a shedding master's hint, honoured, capped."""

from __future__ import annotations

import httpx
import requests
from tenacity import RetryCallState, Retrying, wait_fixed

from agent_bootstrap.agent import client as agent_client
from harness.core import _session
from shipyard_common.retry_after import RETRY_AFTER_CAP_S


def _requests_response(headers: dict[str, str]) -> requests.Response:
    r = requests.Response()
    r.status_code = 503
    r.headers.update(headers)
    return r


def test_harness_reads_retry_after_seconds_capped() -> None:
    assert _session.retry_after(_requests_response({"Retry-After": "2"})) == 2.0
    assert _session.retry_after(_requests_response({"Retry-After": "9999"})) == RETRY_AFTER_CAP_S
    assert _session.retry_after(_requests_response({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"})) is None
    assert _session.retry_after(_requests_response({"Retry-After": "nan"})) is None
    assert _session.retry_after(_requests_response({})) is None


def test_harness_wait_is_never_shorter_than_retry_after() -> None:
    err = _session.TransientAPIError("POST", "/x", 503, "busy")
    err.retry_after_s = 3.0
    state = RetryCallState(Retrying(), None, (), {})
    state.set_exception((type(err), err, None))
    wait = _session.HonourRetryAfter(wait_fixed(0.1))
    assert 3.0 <= wait(state) <= 4.5
    err.retry_after_s = None
    assert wait(state) == 0.1


def test_agent_reads_retry_after_seconds_capped() -> None:
    assert agent_client.retry_after(httpx.Response(503, headers={"Retry-After": "1"})) == 1.0
    assert agent_client.retry_after(httpx.Response(503, headers={"Retry-After": "600"})) == RETRY_AFTER_CAP_S
    assert agent_client.retry_after(httpx.Response(503)) is None
