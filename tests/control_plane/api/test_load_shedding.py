"""Admission control against a real server (uvicorn on a free port, the real app; SQLite and
PostgreSQL): saturation answers 503 with Retry-After (never a hang, never a 500), health answers
from memory while saturated, long-polls hold no connection and no slot while they wait, and a
harness report shed with 503 is retried and stored exactly once.

"Slow" requests are a test-only route added through create_app's `extra_routers` seam: it takes a
database connection and then waits on a gate the test opens, so saturation is reached by
construction, not by timing."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import APIRouter, Depends
from sqlalchemy import func, select, text, update
from sqlalchemy.orm import Session

from control_plane.api import deps
from control_plane.api.app import create_app
from control_plane.api.users import master_info
from control_plane.config import load_config
from control_plane.db.engine import transaction
from control_plane.db.models import Agent, Metric
from control_plane.frontdoor import agent_polls
from control_plane.frontdoor.admission import ServiceRate
from control_plane.loops import placement
from control_plane.master import Master
from harness.core._session import RetryPolicy
from harness.core._session import Session as HarnessSession
from tests.conftest import ADMIN_PASSWORD, TEST_PASSWORD_HASHING
from tests.control_plane.api.test_experiments import create_ok, only_trial
from tests.control_plane.services.test_agents import submit
from tests.control_plane.services.test_preempt_polls import _running
from tests.pg import free_port

pytestmark = pytest.mark.integration

WAIT = 30.0  # an upper bound for things that happen at once; never a measured duration


@dataclass
class Gate:
    """Holds the slow requests inside the handler (with their connection) until opened."""

    opened: threading.Event = field(default_factory=threading.Event)
    entered: int = 0
    cond: threading.Condition = field(default_factory=threading.Condition)
    on_enter: Callable[[int], None] | None = None  # called with the entry's number, in the handler

    def wait_entered(self, n: int) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: self.entered >= n, timeout=WAIT), f"{self.entered} of {n} entered"


def slow_router(gate: Gate) -> APIRouter:
    router = APIRouter()

    # Two paths: one in the users' lane, one in the cluster's (agents' and trials') lane.
    @router.get("/test/slow")
    @router.get("/api/v1/allocations/test-slow")
    def slow(db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
        db.execute(text("SELECT 1"))  # holds a pooled connection from here on
        with gate.cond:
            gate.entered += 1
            gate.cond.notify_all()
            number = gate.entered
        if gate.on_enter is not None:
            gate.on_enter(number)
        gate.opened.wait(WAIT)
        return {"slow": True}

    return router


@dataclass
class Served:
    master: Master
    url: str
    gate: Gate
    admin: dict[str, str]

    @property
    def admission(self) -> Any:
        return self.server.config.app.state.admission  # type: ignore[attr-defined]

    @property
    def cluster_admission(self) -> Any:
        return self.server.config.app.state.cluster_admission  # type: ignore[attr-defined]


@pytest.fixture
def serve(db_url: str, tmp_path: Path) -> Iterator[Any]:
    started: list[tuple[uvicorn.Server, threading.Thread, Master]] = []

    def start(**settings: Any) -> Served:
        config = load_config(env={}, db_url=db_url, state_dir=str(tmp_path / "state"), admin_password=ADMIN_PASSWORD, **TEST_PASSWORD_HASHING,
                             **settings)
        master = Master(config)
        master.prepare()
        gate = Gate()
        app = create_app(master, extra_routers=[slow_router(gate)])
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        started.append((server, thread, master))
        url = f"http://127.0.0.1:{port}"
        for _ in range(int(WAIT / 0.05)):
            if server.started:
                break
            threading.Event().wait(0.05)
        assert server.started
        r = httpx.post(url + "/api/v1/auth/login", json={"username": "admin", "password": ADMIN_PASSWORD})
        assert r.status_code == 200, r.text
        served = Served(master, url, gate, {"Authorization": f"Bearer {r.json()['token']}"})
        served.server = server  # type: ignore[attr-defined]
        return served

    yield start
    for server, thread, master in started:
        server.should_exit = True
        thread.join(timeout=WAIT)
        master.stop()


def in_threads(n: int, fn: Any) -> tuple[list[threading.Thread], list[Any]]:
    results: list[Any] = [None] * n

    def run(i: int) -> None:
        try:
            results[i] = fn(i)
        except Exception as e:  # recorded, asserted by the test
            results[i] = e

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    return threads, results


def settled(check: Any) -> bool:
    """`check()` once the server is done with the requests answered: a slot is given back just
    after the response is sent, so the client may see the answer an instant before."""
    for _ in range(int(WAIT / 0.01)):
        if check():
            return True
        threading.Event().wait(0.01)
    return False


def join(threads: list[threading.Thread]) -> None:
    for t in threads:
        t.join(WAIT)
        assert not t.is_alive()


def test_saturation_sheds_with_503_and_health_answers(serve: Any) -> None:
    s = serve(max_concurrent_requests=2, cluster_concurrent_requests=1, db_pool_size=4, request_queue=1,
              request_queue_wait_s=0.2)
    agent_headers, session = _agent(s, "busy-agent")
    slow, slow_results = in_threads(2, lambda _i: httpx.get(s.url + "/test/slow", timeout=WAIT))
    s.gate.wait_entered(2)

    # Every slot is taken: the excess is refused quickly with 503, Retry-After and the error body.
    excess, excess_results = in_threads(6, lambda _i: httpx.get(s.url + "/api/v1/experiments", headers=s.admin,
                                                               timeout=WAIT))
    join(excess)
    for r in excess_results:
        assert isinstance(r, httpx.Response), r
        assert r.status_code == 503, r.text
        assert int(r.headers["Retry-After"]) >= 1
        assert r.json()["code"] == 503 and r.json()["error"]["code"] == 503
    # A refused POST with a body leaves its connection usable (the body is read and dropped).
    with httpx.Client(base_url=s.url, headers=s.admin, timeout=WAIT) as c:
        for _ in range(2):
            r = c.post("/api/v1/experiments", json={"config": "x" * 10_000})
            assert r.status_code == 503, r.text

    # Health is answered from memory, outside admission, while saturated.
    r = httpx.get(s.url + "/health", timeout=WAIT)
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    r = httpx.get(s.url + "/info", timeout=WAIT)
    assert r.status_code == 200 and r.json()["clusterId"] == s.master.cluster_id
    assert r.json() == master_info(s.master)  # the front door's answer is the route's
    assert s.master.engine.pool.checkedout() <= 2  # the admitted requests' connections only
    # Agents have their own lane: user load does not keep them from polling (their heartbeat).
    r = httpx.get(s.url + "/api/v1/agents/busy-agent/commands", headers=agent_headers,
                  params={"sessionId": session, "timeoutSeconds": 0}, timeout=WAIT)
    assert r.status_code == 200, r.text

    s.gate.opened.set()
    join(slow)
    assert [r.status_code for r in slow_results] == [200, 200]
    r = httpx.get(s.url + "/api/v1/experiments", headers=s.admin, timeout=WAIT)
    assert r.status_code == 200, r.text
    assert settled(lambda: s.admission.active == 0 and s.admission.waiting == 0)


def test_queued_request_gets_the_slot_when_one_frees(serve: Any) -> None:
    s = serve(max_concurrent_requests=1, cluster_concurrent_requests=1, db_pool_size=3, request_queue=4,
              request_queue_wait_s=WAIT)
    slow, slow_results = in_threads(1, lambda _i: httpx.get(s.url + "/test/slow", timeout=WAIT))
    s.gate.wait_entered(1)
    queued, queued_results = in_threads(3, lambda _i: httpx.get(s.url + "/api/v1/experiments", headers=s.admin,
                                                               timeout=WAIT))
    for _ in range(int(WAIT / 0.05)):
        if s.admission.waiting == 3:
            break
        threading.Event().wait(0.05)
    assert s.admission.waiting == 3
    s.gate.opened.set()
    join(slow + queued)
    assert [r.status_code for r in slow_results + queued_results] == [200, 200, 200, 200]
    assert settled(lambda: s.admission.active == 0)


def test_a_cluster_request_queues_longer_than_a_users(serve: Any) -> None:
    # Its clients wait 30 s for an answer: a burst of trial start-ups is worked off in order, not
    # refused and retried. The users' lane, with the same queue, gives up after its own wait.
    s = serve(max_concurrent_requests=1, cluster_concurrent_requests=1, db_pool_size=3, request_queue=4,
              request_queue_wait_s=0.2, cluster_queue_wait_s=WAIT)
    paths = ("/api/v1/allocations/test-slow", "/test/slow")  # the cluster's lane, the users'
    slow, slow_results = in_threads(2, lambda i: httpx.get(s.url + paths[i], timeout=WAIT))
    s.gate.wait_entered(2)
    queued, queued_results = in_threads(2, lambda i: httpx.get(s.url + paths[i], timeout=WAIT))
    assert settled(lambda: s.cluster_admission.waiting == 1)
    join(queued[1:])  # the user's: refused after its 0.2 s
    assert queued_results[1].status_code == 503 and "Retry-After" in queued_results[1].headers
    time.sleep(0.5)  # the cluster's request is still queued, well past the users' wait
    assert s.cluster_admission.waiting == 1
    s.gate.opened.set()
    join(slow + queued[:1])
    assert [r.status_code for r in slow_results + queued_results[:1]] == [200, 200, 200]


def test_a_report_goes_ahead_of_queued_start_ups(serve: Any) -> None:
    # Trial start-ups fill the cluster's lane (its one slot held, its queue full: one more is
    # refused); a running trial's metric report is queued all the same, ahead of them, and is
    # stored as soon as the slot frees: before the start-up queued earlier gets the slot.
    stored_when_entered: dict[int, int] = {}
    s = serve(max_concurrent_requests=1, cluster_concurrent_requests=1, db_pool_size=3, request_queue=1,
              cluster_queue_wait_s=WAIT)
    exp = create_ok(httpx.Client(base_url=s.url, timeout=WAIT), s.admin)
    trial = only_trial(s.master, exp["experiment"]["id"])

    def count_stored(number: int) -> None:
        with s.master.sessions() as db:
            stored_when_entered[number] = db.scalar(
                select(func.count()).select_from(Metric).where(Metric.trial_id == trial.id)) or 0

    s.gate.on_enter = count_stored
    slow, slow_results = in_threads(1, lambda _i: httpx.get(s.url + "/api/v1/allocations/test-slow", timeout=WAIT))
    s.gate.wait_entered(1)
    start, start_results = in_threads(1, lambda _i: httpx.get(s.url + "/api/v1/allocations/test-slow",
                                                              timeout=WAIT))
    assert settled(lambda: s.cluster_admission.waiting == 1)
    refused = httpx.get(s.url + "/api/v1/allocations/test-slow", timeout=WAIT)
    assert refused.status_code == 503  # the queue is full for another start-up
    report = {"group": "training", "metrics": {"trialId": trial.id, "trialRunId": 1, "stepsCompleted": 3,
                                               "metrics": {"avgMetrics": {"loss": 0.5}}}}
    # A batch of reports holds its slot until it is stored (a single report gives it back while it
    # waits for its metric writer, frontdoor/metric_batches.py, so the start-up could pass it there).
    reporter, reported = in_threads(1, lambda _i: httpx.post(s.url + f"/api/v1/trials/{trial.id}/metrics/batch",
                                                             json={"reports": [report]}, headers=s.admin,
                                                             timeout=WAIT))
    assert settled(lambda: s.cluster_admission.waiting == 2)  # ...but not for a report
    s.gate.opened.set()
    join(slow + start + reporter)
    assert reported[0].status_code == 200, reported[0].text
    assert [r.status_code for r in slow_results + start_results] == [200, 200]
    # The start-up (the second to enter) found the report stored: the report had the slot first.
    assert stored_when_entered == {1: 0, 2: 1}


def test_retry_after_grows_as_the_lane_slows(serve: Any) -> None:
    # The lane's clock is a fake one the test moves (the meter records slot releases against it),
    # so the rate the master measures is set by construction: 3 requests served at t=1000.
    s = serve(max_concurrent_requests=1, cluster_concurrent_requests=1, db_pool_size=3, request_queue=2,
              request_queue_wait_s=WAIT, retry_after_s=1, retry_after_max_s=5)
    now = [1000.0]
    s.admission.clock = lambda: now[0]
    s.admission.served = ServiceRate()
    for _ in range(3):
        assert httpx.get(s.url + "/api/v1/experiments", headers=s.admin, timeout=WAIT).status_code == 200
    slow, slow_results = in_threads(1, lambda _i: httpx.get(s.url + "/test/slow", timeout=WAIT))
    s.gate.wait_entered(1)  # the one slot is held (and every earlier release recorded)
    queued, queued_results = in_threads(2, lambda _i: httpx.get(s.url + "/api/v1/experiments", headers=s.admin,
                                                               timeout=WAIT))
    for _ in range(int(WAIT / 0.05)):
        if s.admission.waiting == 2:
            break
        threading.Event().wait(0.05)
    assert s.admission.waiting == 2

    def refused_retry_after(at: float) -> int:
        now[0] = at
        r = httpx.get(s.url + "/api/v1/experiments", headers=s.admin, timeout=WAIT)
        assert r.status_code == 503 and r.json()["code"] == 503, r.text
        return int(r.headers["Retry-After"])

    # 2 queued ahead at 3/s: the floor; the longer nothing more is served, the lower the measured
    # rate and the longer the wait asked for (2 queued at 1.5/s: 2 s; at 0.75/s: 3 s), up to the
    # cap. The clients refused before were told to come back by then: no longer ahead.
    assert [refused_retry_after(t) for t in (1000.5, 1002.0, 1004.0, 1008.0)] == [1, 2, 3, 5]
    s.gate.opened.set()
    join(slow + queued)
    assert [r.status_code for r in slow_results + queued_results] == [200, 200, 200]


def _agent(s: Served, agent_id: str) -> tuple[dict[str, str], str]:
    r = httpx.post(s.url + "/api/v1/agents/tokens", headers=s.admin, json={"resourcePool": "default"})
    assert r.status_code == 200, r.text
    token = r.json()["token"]
    r = httpx.post(s.url + "/api/v1/agents/register", headers={"Authorization": f"Bearer {token}"},
                   json={"agentId": agent_id, "resourcePool": "default", "slots": [{"id": "0", "type": "cpu"}]})
    assert r.status_code == 200, r.text
    body = r.json()
    return {"Authorization": f"Bearer {body.get('agentCredential') or token}"}, body["sessionId"]


def test_long_polls_hold_no_connection_or_slot_while_waiting(serve: Any) -> None:
    # One slot per lane: five long-polls and a GET could not all be served if a waiting poll held
    # its slot, a thread or a connection.
    s = serve(max_concurrent_requests=1, cluster_concurrent_requests=1, db_pool_size=3, request_queue=8,
              request_queue_wait_s=5)
    agents = [_agent(s, f"lp{i}") for i in range(5)]

    def poll(i: int) -> httpx.Response:
        headers, session = agents[i]
        return httpx.get(f"{s.url}/api/v1/agents/lp{i}/commands", headers=headers,
                         params={"sessionId": session, "timeoutSeconds": 3}, timeout=WAIT)

    polls, poll_results = in_threads(5, poll)
    hub = agent_polls.of(s.master)
    for _ in range(int(WAIT / 0.05)):
        if len(hub.waiting) == 5:
            break
        threading.Event().wait(0.05)
    assert len(hub.waiting) == 5  # all five are waiting at once, on the process's poll hub
    assert len(s.master._async_waiters) == 1  # which alone waits for wake-ups
    assert settled(lambda: s.admission.active == 0 and s.cluster_admission.active == 0)
    assert s.master.engine.pool.checkedout() == 0
    r = httpx.get(s.url + "/api/v1/experiments", headers=s.admin, timeout=WAIT)
    assert r.status_code == 200, r.text
    r = httpx.get(s.url + "/health", timeout=WAIT)
    assert r.status_code == 200
    join(polls)
    for r in poll_results:
        assert isinstance(r, httpx.Response), r
        assert r.status_code == 200, r.text
        assert r.json() == {"commands": []}
    assert settled(lambda: s.admission.active == 0)


def test_a_known_agent_is_heard_while_the_cluster_lane_is_full(serve: Any) -> None:
    # The agents' lane is saturated (its one slot held, no queue): any other agent or trial request
    # is refused, but a poll from an agent whose credential this process has verified needs no
    # slot: it waits on the poll hub, is answered, and counts as the agent's heartbeat. An agent the
    # process does not know yet is refused with 503 and Retry-After (its first poll needs the
    # database).
    s = serve(max_concurrent_requests=1, cluster_concurrent_requests=1, db_pool_size=3, request_queue=0,
              request_queue_wait_s=0)
    known, known_session = _agent(s, "known")
    other, other_session = _agent(s, "stranger")
    r = httpx.get(f"{s.url}/api/v1/agents/known/commands", headers=known,
                  params={"sessionId": known_session, "timeoutSeconds": 0}, timeout=WAIT)
    assert r.status_code == 200, r.text  # the full check: the credential is remembered
    long_ago = s.master.clock() - timedelta(minutes=10)
    with transaction(s.master.sessions) as db:
        db.execute(update(Agent).values(last_seen=long_ago))
    slow, _ = in_threads(1, lambda _i: httpx.get(s.url + "/api/v1/allocations/test-slow", timeout=WAIT))
    s.gate.wait_entered(1)
    try:
        r = httpx.post(f"{s.url}/api/v1/agents/known/events", headers=known,
                       json={"sessionId": known_session, "events": []}, timeout=WAIT)
        assert r.status_code == 503 and r.headers["retry-after"]  # the lane is full indeed
        r = httpx.get(f"{s.url}/api/v1/agents/stranger/commands", headers=other,
                      params={"sessionId": other_session, "timeoutSeconds": 3}, timeout=WAIT)
        assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1, r.text
        r = httpx.get(f"{s.url}/api/v1/agents/known/commands", headers=known,
                      params={"sessionId": known_session, "timeoutSeconds": agent_polls.HEARTBEAT_FLUSH_S + 1},
                      timeout=WAIT)
        assert r.status_code == 200, r.text
        assert r.json() == {"commands": []}
        with s.master.read_sessions() as db:
            seen = {a.id: a.last_seen for a in db.query(Agent)}
        assert seen["known"] > long_ago  # heard while it waited
        assert seen["stranger"] == long_ago
    finally:
        s.gate.opened.set()
        join(slow)


def test_a_long_polls_timeout_counts_from_its_arrival_not_from_its_turn(serve: Any) -> None:
    # The preemption poll's first check needs a slot of the agents' and trials' lane, which is
    # held: the poll queues for it, then waits for its 2 s. Its timeout counts from when the
    # front door saw it, so the client is answered about 2 s after asking, not 2 s after its
    # turn came (3.5 s): a harness whose read timeout is the poll's plus a margin is not cut off.
    s = serve(max_concurrent_requests=2, cluster_concurrent_requests=1, db_pool_size=4, request_queue=4,
              request_queue_wait_s=WAIT)
    allocation_id = _running(s.master, 1)[0]
    slow, _ = in_threads(1, lambda _i: httpx.get(s.url + "/api/v1/allocations/test-slow", timeout=WAIT))
    s.gate.wait_entered(1)
    timer = threading.Timer(1.5, s.gate.opened.set)

    def poll(_i: int) -> tuple[float, httpx.Response]:
        began = time.monotonic()
        timer.start()
        r = httpx.get(f"{s.url}/api/v1/allocations/{allocation_id}/signals/preemption", headers=s.admin,
                      params={"timeoutSeconds": 2}, timeout=WAIT)
        return time.monotonic() - began, r

    polls, results = in_threads(1, poll)
    join(polls)
    join(slow)
    elapsed, r = results[0]
    assert r.status_code == 200, r.text
    assert r.json() == {"preempt": False}
    assert 1.9 <= elapsed < 3.0, elapsed


def test_a_poll_with_news_waits_for_a_slot_rather_than_coming_back_empty(serve: Any) -> None:
    # The agents' lane is full and queues nothing: a waiting poll that learns of a start command
    # cannot run its full check at once. It keeps the poll open and asks for a slot again until
    # one frees, then answers the command; answered empty instead, its agent would come straight
    # back to the same news, a round trip each time, for as long as the lane stays full.
    s = serve(max_concurrent_requests=1, cluster_concurrent_requests=1, db_pool_size=3, request_queue=0,
              request_queue_wait_s=0)
    headers, session = _agent(s, "starter")
    r = httpx.get(f"{s.url}/api/v1/agents/starter/commands", headers=headers,
                  params={"sessionId": session, "timeoutSeconds": 0}, timeout=WAIT)
    assert r.status_code == 200 and r.json() == {"commands": []}, r.text  # known from now on
    slow, _ = in_threads(1, lambda _i: httpx.get(s.url + "/api/v1/allocations/test-slow", timeout=WAIT))
    s.gate.wait_entered(1)
    polls, answers = in_threads(1, lambda _i: httpx.get(
        f"{s.url}/api/v1/agents/starter/commands", headers=headers,
        params={"sessionId": session, "timeoutSeconds": 8}, timeout=WAIT))
    hub = agent_polls.of(s.master)
    assert settled(lambda: "starter" in hub.waiting)
    submit(s.master)
    placement.tick(s.master)  # the trial is assigned to the only agent: its start is owed
    threading.Timer(1.5, s.gate.opened.set).start()  # the lane frees after a while
    join(polls)
    join(slow)
    r = answers[0]
    assert isinstance(r, httpx.Response) and r.status_code == 200, r
    assert [c["type"] for c in r.json()["commands"]] == ["start"], r.text


def test_a_poll_whose_agent_hangs_up_stops_counting_at_once(serve: Any) -> None:
    # A waiting poll is its agent's heartbeat: when the agent goes (its connection closes), the
    # poll leaves the hub at once rather than at its timeout.
    s = serve()
    headers, session = _agent(s, "leaver")
    r = httpx.get(f"{s.url}/api/v1/agents/leaver/commands", headers=headers,
                  params={"sessionId": session, "timeoutSeconds": 0}, timeout=WAIT)
    assert r.status_code == 200, r.text  # the full check: the credential is remembered
    hub = agent_polls.of(s.master)
    with pytest.raises(httpx.ReadTimeout):  # the client gives up after 1 s and closes the connection
        httpx.get(f"{s.url}/api/v1/agents/leaver/commands", headers=headers,
                  params={"sessionId": session, "timeoutSeconds": 60}, timeout=httpx.Timeout(WAIT, read=1.0))
    for _ in range(100):  # well before the poll's own 60 s
        if "leaver" not in hub.waiting:
            break
        threading.Event().wait(0.1)
    assert "leaver" not in hub.waiting


def test_log_follow_holds_no_slot_while_waiting(serve: Any) -> None:
    s = serve(max_concurrent_requests=1, cluster_concurrent_requests=1, db_pool_size=3, request_queue=4,
              request_queue_wait_s=5)
    exp = create_ok(httpx.Client(base_url=s.url, timeout=WAIT), s.admin)
    trial = only_trial(s.master, exp["experiment"]["id"])
    with httpx.Client(base_url=s.url, headers=s.admin, timeout=WAIT) as c:
        with c.stream("GET", f"/api/v1/trials/{trial.id}/logs", params={"follow": "true"}) as follow:
            assert follow.status_code == 200
            # The follow stays open (the trial has not ended) and holds nothing between its polls:
            # with a single slot, other requests still get through.
            for _ in range(3):
                r = httpx.get(s.url + "/api/v1/experiments", headers=s.admin, timeout=WAIT)
                assert r.status_code == 200, r.text


def test_harness_report_retried_after_503_is_stored_once(serve: Any, caplog: pytest.LogCaptureFixture) -> None:
    s = serve(max_concurrent_requests=1, cluster_concurrent_requests=1, db_pool_size=3, request_queue=0,
              request_queue_wait_s=0)
    exp = create_ok(httpx.Client(base_url=s.url, timeout=WAIT), s.admin)
    trial = only_trial(s.master, exp["experiment"]["id"])
    # The trial's lane (the cluster's) is the one saturated: a report is a trial's request.
    slow, _ = in_threads(1, lambda _i: httpx.get(s.url + "/api/v1/allocations/test-slow", timeout=WAIT))
    s.gate.wait_entered(1)

    harness = HarnessSession(s.url, s.admin["Authorization"].split()[1],
                             retry=RetryPolicy(max_attempts=50, max_delay_s=WAIT, wait_initial_s=0.05, wait_max_s=1))
    body = {"group": "training", "metrics": {"trialId": trial.id, "trialRunId": 1, "stepsCompleted": 7,
                                             "metrics": {"avgMetrics": {"loss": 0.5}}}}
    caplog.set_level(logging.WARNING, logger="harness.core")
    reporter, results = in_threads(1, lambda _i: harness.post(f"/api/v1/trials/{trial.id}/metrics", body))
    for _ in range(int(WAIT / 0.05)):
        if any("event=api_retry" in rec.getMessage() for rec in caplog.records):
            break
        threading.Event().wait(0.05)
    retries = [rec.getMessage() for rec in caplog.records if "event=api_retry" in rec.getMessage()]
    assert retries and "503" in retries[0]  # the master shed it...
    s.gate.opened.set()
    join(slow + reporter)
    assert not isinstance(results[0], Exception), results[0]  # ...and the retry went through
    harness.close()
    with s.master.sessions() as db:
        stored = db.scalar(select(func.count()).select_from(Metric).where(Metric.trial_id == trial.id))
    assert stored == 1


def test_pool_timeout_is_503_not_500(serve: Any) -> None:
    # Admission keeps requests below the pool, so this takes connections held outside the API
    # (as a runaway background job would): the request that cannot get one is told to retry.
    s = serve(max_concurrent_requests=1, cluster_concurrent_requests=1, db_pool_size=3, db_pool_timeout_s=0.2)
    pool = s.master.engine.pool
    held = [s.master.engine.connect() for _ in range(pool.size() + pool._max_overflow)]  # type: ignore[attr-defined]
    try:
        r = httpx.get(s.url + "/api/v1/experiments", headers=s.admin, timeout=WAIT)
        assert r.status_code == 503, r.text
        assert r.headers["Retry-After"] == "1"
        assert r.json()["code"] == 503
    finally:
        for conn in held:
            conn.close()
    r = httpx.get(s.url + "/api/v1/experiments", headers=s.admin, timeout=WAIT)
    assert r.status_code == 200, r.text


def test_limits_are_checked_against_the_pool(tmp_path: Path) -> None:
    from control_plane.config import ConfigError

    cfg = load_config(env={}, state_dir=str(tmp_path))
    # The defaults leave the background loops their connections.
    assert cfg.request_limit + cfg.cluster_concurrent_requests < cfg.db_pool_size
    cfg = load_config(env={"SHIPYARD_DB_POOL_SIZE": "30", "SHIPYARD_MAX_CONCURRENT_REQUESTS": "20"}, state_dir=str(tmp_path))
    assert (cfg.db_pool_size, cfg.request_limit) == (30, 20)
    with pytest.raises(ConfigError, match="max_concurrent_requests"):
        load_config(env={}, state_dir=str(tmp_path), db_pool_size=8, max_concurrent_requests=8)


@pytest.mark.parametrize(("method", "path", "cluster"), [
    ("POST", "/api/v1/agents/register", True),
    ("GET", "/api/v1/agents/a-1/commands", True),
    ("POST", "/api/v1/agents/a-1/events", True),
    ("POST", "/api/v1/task/logs", True),
    ("GET", "/api/v1/experiments/3/model_def", True),
    ("POST", "/api/v1/trials/7/metrics/batch", True),
    ("POST", "/api/v1/trials/7/searcher/completed_operation", True),
    ("GET", "/api/v1/trials/7/searcher/operation", True),
    ("GET", "/api/v1/allocations/x.1/signals/preemption", True),
    ("POST", "/api/v1/checkpoints", True),
    ("GET", "/api/v1/experiments", False),
    ("GET", "/api/v1/agents", False),
    ("POST", "/api/v1/agents/tokens", False),
    ("GET", "/api/v1/trials/7/metrics", False),
    ("GET", "/api/v1/trials/7/logs", False),
    ("POST", "/api/v1/experiments", False),
])
def test_lanes(method: str, path: str, cluster: bool) -> None:
    from control_plane.frontdoor.admission import is_cluster_request

    assert is_cluster_request(method, path) is cluster


@pytest.mark.parametrize(("method", "path", "report"), [
    ("POST", "/api/v1/task/logs", True),
    ("POST", "/api/v1/trials/7/metrics", True),
    ("POST", "/api/v1/trials/7/metrics/batch", True),
    ("POST", "/api/v1/trials/7/training_metrics", True),
    ("POST", "/api/v1/trials/7/validation_metrics", True),
    ("POST", "/api/v1/trials/7/progress", True),
    ("GET", "/api/v1/trials/7/metrics", False),
    ("GET", "/api/v1/task/logs", False),
    ("POST", "/api/v1/trials/7/searcher/completed_operation", False),
    ("POST", "/api/v1/agents/a-1/events", False),
    ("POST", "/api/v1/trials/x/progress", False),
    ("POST", "/api/v1/trials/7/progress/more", False),
])
def test_reports_go_ahead_in_the_cluster_lane(method: str, path: str, report: bool) -> None:
    from control_plane.frontdoor.admission import is_cluster_request, is_report_request

    assert is_report_request(method, path) is report
    if report:  # the cluster's traffic: its lane, its log level
        assert is_cluster_request(method, path)
