"""GET /metrics: every series exists, and each moves when its cause happens — a request, an agent's
slots, a queued trial, a launch, a termination, a cloud error, a loop tick, the leadership; the
access log names the route template and never a token; several processes add up (multiprocess
mode). Both databases (db_url)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from control_plane import telemetry
from control_plane.api import prometheus
from control_plane.api.app import create_app
from control_plane.db.engine import transaction
from control_plane.db.models import Agent, Allocation
from control_plane.loops import placement
from control_plane.loops.autoscaler import Autoscaler
from control_plane.master import Master
from control_plane.services.leadership import Leadership
from provisioners.base import CloudInstance, CloudState, ErrorKind, ProviderError
from tests.conftest import ROOT
from tests.control_plane.api.test_experiments import create_ok
from tests.control_plane.loops.conftest import (
    ELASTIC,
    FakeClock,
    FakeCloud,
    add_agent,
    add_allocation,
    make_master,
)
from tests.control_plane.services.test_lifecycle import agent_token, register

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

FAMILIES = {
    "shipyard_http_requests", "shipyard_http_request_duration_seconds", "shipyard_loop_tick_duration_seconds",
    "shipyard_instance_launches", "shipyard_instance_terminations", "shipyard_cloud_errors", "shipyard_leader",
    "shipyard_leader_fencing_token", "shipyard_cluster_snapshot_up", "shipyard_pool_slots",
    "shipyard_pool_slots_used", "shipyard_pool_queue_length", "shipyard_pool_queue_oldest_wait_seconds",
    "shipyard_pool_instances", "shipyard_admission_refusals",
}


def parse(text: str) -> tuple[set[str], Samples]:
    families, samples = set(), {}
    for fam in text_string_to_metric_families(text):
        families.add(fam.name)
        for s in fam.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return families, samples


def scrape(client: TestClient) -> Samples:
    r = client.get("/metrics")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    return parse(r.text)[1]


def of(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def requests_of(samples: Samples, route: str, status: int, method: str = "GET") -> float:
    return of(samples, "shipyard_http_requests_total", route=route, method=method, status=str(status))


def test_every_series_exists_and_a_request_moves_its_route_template(client: TestClient,
                                                                      admin_headers: dict[str, str]) -> None:
    route = "/api/v1/experiments/{experimentId}"
    before = scrape(client)
    assert client.get("/api/v1/experiments/424242", headers=admin_headers).status_code == 404
    r = client.get("/metrics")
    families, after = parse(r.text)
    assert FAMILIES <= families, FAMILIES - families
    assert requests_of(after, route, 404) == requests_of(before, route, 404) + 1
    assert of(after, "shipyard_http_request_duration_seconds_count", route=route, method="GET", status="404") == \
        of(before, "shipyard_http_request_duration_seconds_count", route=route, method="GET", status="404") + 1
    assert "/api/v1/experiments/424242" not in r.text  # a template, never a raw path
    assert of(after, "shipyard_cluster_snapshot_up") == 1
    # No secret in any label or value: the admin's login token is nowhere.
    assert admin_headers["Authorization"].split()[1] not in r.text and "admin" not in r.text


def test_health_and_unrouted_requests_and_admission_refusals_count(client: TestClient) -> None:
    before = scrape(client)
    assert client.get("/info").status_code == 200  # answered by the front door, before routing
    assert client.get("/no/such/path").status_code == 404
    admission = client.app.state.admission  # type: ignore[attr-defined]
    limit, queue = admission.limit, admission.queue
    admission.active, admission.queue = limit, 0  # the users' lane is full and queues nothing
    try:
        assert client.get("/api/v1/experiments").status_code == 503
    finally:
        admission.active, admission.queue = 0, queue
    after = scrape(client)
    assert requests_of(after, "/info", 200) == requests_of(before, "/info", 200) + 1
    assert requests_of(after, "unmatched", 404) == requests_of(before, "unmatched", 404) + 1
    assert requests_of(after, "unmatched", 503) == requests_of(before, "unmatched", 503) + 1
    assert refusals(after, "users", "queue_full") == refusals(before, "users", "queue_full") + 1


def refusals(samples: Samples, lane: str, reason: str) -> float:
    return of(samples, "shipyard_admission_refusals_total", lane=lane, reason=reason)


def test_admission_refusals_count_by_lane_and_why(client: TestClient) -> None:
    from control_plane.frontdoor.admission import ServiceRate

    lane = client.app.state.admission  # type: ignore[attr-defined]
    saved = (lane.active, lane.queue, lane.wait_s, lane.served)
    before = scrape(client)
    lane.active, lane.queue, lane.wait_s = lane.limit, 5, 0.05  # full; a request may wait 50 ms
    # No service rate known yet, so the first request queues and times out. The earlier requests'
    # rate, slow on a loaded machine, would otherwise predict a wait over 50 ms: over_wait at once.
    lane.served = ServiceRate()
    try:
        assert client.get("/api/v1/experiments").status_code == 503  # waited its 50 ms in the queue
        lane.served = ServiceRate()
        now = lane.clock()
        for t in (now - 2.5, now - 1.2):  # served 2 in the last 2.5 s: about one a second
            lane.served.record(t)
        assert client.get("/api/v1/experiments").status_code == 503  # a second's wait > 50 ms: at once
    finally:
        lane.active, lane.queue, lane.wait_s, lane.served = saved
    after = scrape(client)
    assert refusals(after, "users", "timed_out") == refusals(before, "users", "timed_out") + 1
    assert refusals(after, "users", "over_wait") == refusals(before, "users", "over_wait") + 1
    assert refusals(after, "cluster", "timed_out") == refusals(before, "cluster", "timed_out")


@pytest.fixture
def clocked(master_config: Any) -> Iterator[tuple[Master, TestClient, FakeClock]]:
    clock = FakeClock()
    master = Master(master_config, clock=clock)
    master.prepare()
    with TestClient(create_app(master)) as client:
        yield master, client, clock
    master.stop()


def test_slots_queue_and_oldest_wait_follow_the_record(clocked: tuple[Master, TestClient, FakeClock],
                                                       ) -> None:
    master, client, clock = clocked
    r = client.post("/api/v1/auth/login", json={"username": "admin", "password": master.config.admin_password})
    headers = {"Authorization": f"Bearer {r.json()['token']}"}
    s = scrape(client)
    assert (of(s, "shipyard_pool_queue_length", pool="default"), of(s, "shipyard_pool_slots", pool="default")) == (0, 0)

    create_ok(client, headers)  # no agent: its trial waits
    clock.advance(seconds=30)
    s = scrape(client)
    assert of(s, "shipyard_pool_queue_length", pool="default") == 1
    assert of(s, "shipyard_pool_queue_oldest_wait_seconds", pool="default") == 30

    register(client, agent_token(master), slots=2)
    s = scrape(client)
    assert of(s, "shipyard_pool_slots", pool="default") == 2
    assert of(s, "shipyard_pool_slots_used", pool="default") == 0

    placement.tick(master)  # the trial lands on the agent
    s = scrape(client)
    assert of(s, "shipyard_pool_slots_used", pool="default") == 1
    assert of(s, "shipyard_pool_queue_length", pool="default") == 0
    assert of(s, "shipyard_pool_queue_oldest_wait_seconds", pool="default") == 0


class ListFails:
    """The cloud edge, whose next list call fails."""

    def __init__(self, inner: FakeCloud) -> None:
        self.inner = inner
        self.fail_next_list = False

    def list(self) -> list[CloudInstance]:
        if self.fail_next_list:
            self.fail_next_list = False
            raise ProviderError(ErrorKind.AUTH, "credentials expired")
        return self.inner.list()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def counters(master: Master) -> Samples:
    return parse(prometheus.render(master).decode())[1]


def moved(before: Samples, after: Samples) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """The launch, termination and cloud-error counters that changed, by how much."""
    names = ("shipyard_instance_launches_total", "shipyard_instance_terminations_total", "shipyard_cloud_errors_total")
    return {k: v - before.get(k, 0.0) for k, v in after.items() if k[0] in names and v != before.get(k, 0.0)}


def key(name: str, **labels: str) -> tuple[str, frozenset[tuple[str, str]]]:
    return (name, frozenset(labels.items()))


def launches(outcome: str) -> tuple[str, frozenset[tuple[str, str]]]:
    return key("shipyard_instance_launches_total", pool=ELASTIC, outcome=outcome)


def terminations(cause: str) -> tuple[str, frozenset[tuple[str, str]]]:
    return key("shipyard_instance_terminations_total", pool=ELASTIC, cause=cause)


def cloud_errors(operation: str, kind: str) -> tuple[str, frozenset[tuple[str, str]]]:
    return key("shipyard_cloud_errors_total", pool=ELASTIC, operation=operation, kind=kind)


def test_launches_terminations_and_cloud_errors_count_with_their_causes(db_url: str, tmp_path: Path) -> None:
    clock = FakeClock()
    master = make_master(db_url, tmp_path / "state", clock)
    try:
        cloud = FakeCloud(clock, cluster_id=master.cluster_id)
        edge = ListFails(cloud)
        scaler = Autoscaler(master, wrap_provider=lambda _pool, _provider: edge)  # type: ignore[arg-type,return-value]

        def step(*, seconds: float = 0) -> dict[Any, float]:
            clock.advance(seconds=seconds)
            before = counters(master)
            scaler.tick()
            return moved(before, counters(master))

        add_allocation(master, "a1")
        assert of(counters(master), "shipyard_pool_queue_length", pool=ELASTIC) == 1
        cloud.errors = [ProviderError(ErrorKind.QUOTA, "vCPU limit reached")]
        assert step() == {launches("failed"): 1, cloud_errors("launch", "quota"): 1}

        assert step(seconds=31) == {launches("launched"): 1}  # the backoff is over
        [inst] = cloud.instances.values()
        assert of(counters(master), "shipyard_pool_instances", pool=ELASTIC, state="starting") == 1

        cloud.set_state(inst.id, CloudState.RUNNING)
        add_agent(master, inst.id, instance_id=inst.id)
        with transaction(master.sessions) as s:  # trial a1 ran there and ended: the agent is idle
            row = s.get(Allocation, "a1")
            assert row is not None
            row.state, row.agent_id, row.ended_at = "terminated", inst.id, clock()
            agent = s.get(Agent, inst.id)
            assert agent is not None
            agent.idle_since = clock()
        assert step(seconds=5) == {}
        snap = counters(master)
        assert of(snap, "shipyard_pool_instances", pool=ELASTIC, state="running") == 1
        assert of(snap, "shipyard_pool_slots", pool=ELASTIC) == 2

        cloud.terminate_errors = [ProviderError(ErrorKind.THROTTLED, "slow down")]
        assert step(seconds=61) == {terminations("idle"): 1, cloud_errors("terminate", "throttled"): 1}
        assert of(counters(master), "shipyard_pool_instances", pool=ELASTIC, state="stopping") == 1

        edge.fail_next_list = True
        assert step(seconds=1) == {cloud_errors("list", "auth"): 1}

        cloud.add("not-ours-launch-id")  # this cluster's tags, no record: an orphan
        assert step(seconds=60) == {terminations("orphan"): 1}

        add_allocation(master, "a2")
        step(seconds=1)  # a new instance for a2
        [inst2] = cloud.instances.values()
        cloud.set_state(inst2.id, CloudState.STOPPED)  # stopped by hand in the console
        # Terminated (its disks would bill), and a2 waits again: a replacement is launched.
        assert step(seconds=1) == {terminations("stopped_outside_master"): 1, launches("launched"): 1}
    finally:
        master.stop()


def test_termination_causes_are_bounded() -> None:
    assert telemetry.termination_cause("idle for 1m1s (max_idle_agent_period 1m)") == "idle"
    assert telemetry.termination_cause("above max_instances 3: shedding newest idle instance") == "above_max_instances"
    assert telemetry.termination_cause("agent did not connect within max_agent_starting_period 10m") == \
        "agent_never_connected"
    assert telemetry.termination_cause("agent disconnected for 5m") == "agent_disconnected"
    assert telemetry.termination_cause("cluster or pool taken down") == "teardown"
    assert telemetry.termination_cause("anything else, e.g. i-0123 with a token abc") == "other"
    assert set(telemetry.TERMINATION_CAUSES) >= {"idle", "orphan", "teardown", "other"}


def test_a_loop_tick_moves_its_histogram(master: Master) -> None:
    name = f"probe-{uuid.uuid4().hex[:8]}"
    ticked = threading.Event()
    master.add_loop(name, ticked.set, 0.01)
    master.start_loops()
    assert ticked.wait(10)
    master.stop()  # joins the loop thread: its tick has been observed
    _, samples = parse(prometheus.render(master).decode())
    assert of(samples, "shipyard_loop_tick_duration_seconds_count", loop=name) >= 1


def test_leader_identity_and_fencing_token(client: TestClient, master: Master) -> None:
    s = scrape(client)
    assert of(s, "shipyard_leader", master_id=master.master_id) == 0  # no lease taken
    master.leadership = Leadership(master.sessions, master.engine, master.master_id, ttl_s=30,
                                   address=master.config.advertised_url)
    master.lead_step()
    assert master.is_leader()
    s = scrape(client)
    assert of(s, "shipyard_leader", master_id=master.master_id) == 1
    assert of(s, "shipyard_leader_fencing_token", master_id=master.master_id) == master.leader_token > 0


def test_metrics_can_be_turned_off(master: Master) -> None:
    master.config.metrics_enabled = False
    with TestClient(create_app(master)) as client:
        assert client.get("/metrics").status_code == 404


def test_the_access_log_names_the_route_and_never_a_token(client: TestClient, admin_headers: dict[str, str],
                                                          caplog: pytest.LogCaptureFixture) -> None:
    secret = admin_headers["Authorization"].split()[1]
    with caplog.at_level(logging.DEBUG, logger="shipyard.access"):
        client.get(f"/api/v1/experiments?token={secret}&access_token={secret}", headers=admin_headers)
        client.post(f"/api/v1/trials/7/metrics?token={secret}", headers=admin_headers, json={"secret": secret})
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "shipyard.access"]
    assert len(lines) == 2, lines
    (user_level, user_line), (trial_level, trial_line) = lines
    assert user_line.startswith("event=http_request method=GET route=/api/v1/experiments status=200 duration_ms=")
    assert user_line.endswith(" client=testclient") and user_level == logging.INFO
    # A trial's report is the cluster's traffic: debug, so thousands of them do not flood the log.
    assert trial_line.startswith("event=http_request method=POST route=/api/v1/trials/{trialId}/metrics status=")
    assert trial_level == logging.DEBUG
    for _, line in lines:
        assert secret not in line and "token" not in line and "?" not in line


def _run(code: str, env: dict[str, str]) -> str:
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_several_processes_add_up_in_multiprocess_mode(db_url: str, tmp_path: Path) -> None:
    """Two processes write to PROMETHEUS_MULTIPROC_DIR (as det-master's API workers and control
    process do); /metrics in a third adds their samples up, with the cluster's state once."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "prom")}
    (tmp_path / "prom").mkdir()
    control = ("from control_plane import telemetry\n"
               "telemetry.observe_loop_tick('placement', 0.2)\n"
               "telemetry.record_leader('leader-1', True, 7)\n"
               "telemetry.terminated('default', 'idle for 2m')\n")
    _run(control, env)
    _run(control.replace("leader-1', True, 7", "leader-2', False, None"), env)
    serve = ("import json, sys\n"
             "from fastapi.testclient import TestClient\n"
             "from control_plane import telemetry\n"
             "from control_plane.api.app import create_app\n"
             "from control_plane.config import load_config\n"
             "from control_plane.master import Master\n"
             "assert telemetry.multiprocess()\n"
             f"m = Master(load_config(env={{}}, db_url={db_url!r}, state_dir={str(tmp_path / 'state')!r},"
             " admin_password='admin-test-pw-1'))\n"
             "m.prepare()\n"
             "with TestClient(create_app(m)) as c:\n"
             "    r = c.get('/metrics')\n"
             "print(json.dumps({'status': r.status_code, 'text': r.text, 'id': m.master_id}))\n"
             "m.stop()\n")
    out = json.loads(_run(serve, env).strip().splitlines()[-1])
    assert out["status"] == 200
    families, samples = parse(out["text"])
    assert FAMILIES - {"shipyard_http_requests", "shipyard_http_request_duration_seconds", "shipyard_cloud_errors",
                       "shipyard_instance_launches", "shipyard_admission_refusals"} <= families
    assert of(samples, "shipyard_loop_tick_duration_seconds_count", loop="placement") == 2
    assert of(samples, "shipyard_instance_terminations_total", pool="default", cause="idle") == 2
    # The ended processes' live gauges are kept until marked dead (the supervisor does).
    assert of(samples, "shipyard_leader", master_id="leader-1") == 1
    assert of(samples, "shipyard_leader_fencing_token", master_id="leader-1") == 7
    assert of(samples, "shipyard_leader", master_id=out["id"]) == 0
    assert out["text"].count('\nshipyard_pool_slots{pool="default"}') == 1

