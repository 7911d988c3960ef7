"""The HTTP client's error taxonomy and bounded retries, against the fake master."""

from __future__ import annotations

import threading

import pytest

from harness.core import APIError, AuthError, NotFoundError, Session, TransientAPIError
from harness.core._session import RetryPolicy
from tests.harness.fake_master import FakeMaster, free_port

pytestmark = pytest.mark.integration

QUICK = RetryPolicy(max_attempts=4, max_delay_s=10, wait_initial_s=0.01, wait_max_s=0.05)


def test_transient_failures_are_retried_until_the_master_answers(fake_master: FakeMaster) -> None:
    fake_master.fail_with(503)
    s = Session(fake_master.url, "tok", retry=RetryPolicy(max_attempts=50, wait_initial_s=0.01, wait_max_s=0.05))
    timer = threading.Timer(0.3, fake_master.restore)
    timer.start()
    try:
        assert s.post("/api/v1/trials/1/progress", {"progress": 0.5}) == {}
    finally:
        timer.cancel()
    attempts = fake_master.bodies("POST", r"/api/v1/trials/1/progress")
    assert len(attempts) >= 2 and all(a == {"progress": 0.5} for a in attempts)


def test_a_trials_session_outlasts_any_outage(fake_master: FakeMaster) -> None:
    """A trial's session has no attempt or time bound: a master down for longer than the bounded
    policy's 30 attempts (here with waits shrunk to 20 ms) is waited out, the request not lost."""
    policy = RetryPolicy.for_trial({"SHIPYARD_RETRY_WAIT_MAX_S": "0.02"})
    assert (policy.max_attempts, policy.max_delay_s, policy.wait_max_s) == (None, None, 0.02)
    assert RetryPolicy.for_trial({}).wait_max_s == 30.0
    fake_master.refuse()  # connection refused: the master is gone
    s = Session(fake_master.url, "tok", retry=policy)
    timer = threading.Timer(2.0, fake_master.restore)
    timer.start()
    try:
        assert s.post("/api/v1/checkpoints", {"uuid": "c-1"}) == {}
    finally:
        timer.cancel()
    assert fake_master.bodies("POST", r"/api/v1/checkpoints") == [{"uuid": "c-1"}]
    # An answer that says no is still final at once, however patient the policy.
    fake_master.fail_with(404)
    with pytest.raises(NotFoundError):
        s.get("/api/v1/trials/1")


def test_attempts_are_bounded(fake_master: FakeMaster) -> None:
    fake_master.fail_with(502)
    s = Session(fake_master.url, "tok", retry=QUICK)
    with pytest.raises(TransientAPIError) as err:
        s.get("/api/v1/trials/1/searcher/operation")
    assert err.value.status == 502 and "injected failure" in str(err.value)
    assert len([r for r in fake_master.requests if r.method == "GET"]) == QUICK.max_attempts

    refused = Session(f"http://127.0.0.1:{free_port()}", None, retry=QUICK)
    with pytest.raises(TransientAPIError, match="ConnectionError"):
        refused.get("/info")


@pytest.mark.parametrize("status, error", [(404, NotFoundError), (401, AuthError), (403, AuthError),
                                           (400, APIError)])
def test_refusals_are_not_retried(fake_master: FakeMaster, status: int, error: type[APIError]) -> None:
    fake_master.fail_with(status)
    s = Session(fake_master.url, "tok", retry=QUICK)
    with pytest.raises(error) as err:
        s.post("/api/v1/checkpoints", {"uuid": "x"})
    assert not isinstance(err.value, TransientAPIError)
    assert err.value.status == status
    assert len(fake_master.requests) == 1
