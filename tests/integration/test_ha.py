"""Two masters against one PostgreSQL behind a load balancer (tests/tcp_balancer.py): both serve the
API, one leads the loops. An elastic experiment (local pool: instances are agent processes)
survives SIGKILL of the leader (the other takes over within 15 s and the experiment completes with
every metric and checkpoint, no instance launched twice, none left behind), and a leader paused
past its lease (SIGSTOP) and resumed (SIGCONT) is refused by the fencing token and stands by."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from sqlalchemy import create_engine, text

from shipyard_common.processes import pid_alive, stop_process_group
from tests.integration.conftest import model_files, trial_config
from tests.pg import free_port
from tests.tcp_balancer import TcpBalancer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300),
              pytest.mark.parametrize("db_url", ["postgres"], indirect=True)]

PASSWORD = "ha-Test-passw0rd"
TAKEOVER_LIMIT_S = 15.0


class MasterProc:
    def __init__(self, name: str, root: Path, db_url: str, port: int, workers: int) -> None:
        self.name, self.root, self.db_url, self.port, self.workers = name, root, db_url, port, workers
        self.url = f"http://127.0.0.1:{port}"
        self.log = root / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        cmd = [sys.executable, "-m", "control_plane", "--config", str(self.root / "master.yaml"),
               "--port", str(self.port), "--state-dir", str(self.root / self.name), "--db", self.db_url]
        env = dict(os.environ, SHIPYARD_ADMIN_PASSWORD=PASSWORD, SHIPYARD_API_WORKERS=str(self.workers))
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, env=env)
        wait_for(lambda: answers(self.url), 40, f"master {self.name} up", self)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def master_id(self) -> str:
        return httpx.get(self.url + "/info", timeout=5).json()["masterId"]

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-2500:] if self.log.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.pid, signal.SIGCONT)
            stop_process_group(self.pid, 1)  # the test is over: no need for a graceful drain


def answers(url: str) -> bool:
    try:
        return httpx.get(url + "/info", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def wait_for(predicate: Any, timeout: float, what: str, *masters: MasterProc) -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
        except httpx.HTTPError as e:
            last = e
        if last and not isinstance(last, Exception):
            return last
        time.sleep(0.2)
    logs = "\n".join(f"--- {m.name} log tail:\n{m.tail()}" for m in masters)
    raise AssertionError(f"timed out waiting for {what}; last={last!r}\n{logs}")


def leader_of(api: httpx.Client) -> dict[str, Any] | None:
    r = api.get("/api/v1/master/leader")
    r.raise_for_status()
    lead = r.json()["leader"]
    return lead


@pytest.fixture
def ha(tmp_path: Path, db_url: str) -> Iterator[dict[str, Any]]:
    root = tmp_path
    ports = [free_port(), free_port()]
    lb = TcpBalancer(ports)
    (root / "master.yaml").write_text(yaml.safe_dump({
        "master_url": lb.url,
        "token_secret_file": str(root / "token-secret"),
        "leader_lease_s": 4,
        "agent_heartbeat_timeout_s": 8,
        "task_kill_grace_s": 3,
        "checkpoint_storage": {"type": "shared_fs", "host_path": str(root / "checkpoints")},
        "resource_pools": [{"name": "default", "description": "elastic local pool", "provider": {
            "type": "local", "min_instances": 0, "max_instances": 2, "max_idle_agent_period": "4s",
            "slots_per_instance": 1, "work_dir": str(root / "instances")}}],
    }))
    a = MasterProc("a", root, db_url, ports[0], workers=2)  # a control process and two API workers
    b = MasterProc("b", root, db_url, ports[1], workers=1)  # one process
    env: dict[str, Any] = {"root": root, "lb": lb, "a": a, "b": b, "db_url": db_url}
    try:
        yield env
    finally:
        for m in (env.get("a2"), b, a):
            if m is not None:
                m.stop()
        for rec in (root / "instances").glob("local-*.json"):  # anything a failed test left running
            import json

            pid = json.loads(rec.read_text()).get("pid")
            if pid:
                stop_process_group(int(pid), 2)
        lb.close()


def instance_rows(db_url: str) -> list[dict[str, Any]]:
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(text("SELECT * FROM instances ORDER BY requested_at"))]
    finally:
        engine.dispose()


def test_the_other_master_takes_over_a_killed_leader_and_fences_a_paused_one(ha: dict[str, Any]) -> None:
    a: MasterProc = ha["a"]
    b: MasterProc = ha["b"]
    lb: TcpBalancer = ha["lb"]
    root: Path = ha["root"]
    a.start()
    b.start()
    a_id, b_id = a.master_id(), b.master_id()
    assert a_id != b_id
    token = httpx.post(lb.url + "/api/v1/auth/login", json={"username": "admin", "password": PASSWORD}).json()["token"]
    api = httpx.Client(base_url=lb.url, headers={"Authorization": f"Bearer {token}"}, timeout=30)
    b_api = httpx.Client(base_url=b.url, headers={"Authorization": f"Bearer {token}"}, timeout=30)
    lead = wait_for(lambda: leader_of(api), 20, "a leader", a, b)
    assert lead["masterId"] == a_id and lead["token"] == 1  # the first master started leads
    assert b_api.get("/api/v1/master/leader").json()["leading"] is False

    cfg = trial_config("ha", length=60, hparams={"step_sleep": 0.2, "validate_every": 10},
                       searcher={"name": "random", "metric": "validation_loss", "max_length": {"batches": 60},
                                 "max_trials": 2, "max_concurrent_trials": 2})
    r = api.post("/api/v1/experiments", json={"config": yaml.safe_dump(cfg), "modelDefinition": model_files()})
    assert r.status_code == 200, r.text
    exp_id = r.json()["experiment"]["id"]

    def trials() -> list[dict[str, Any]]:
        return api.get(f"/api/v1/experiments/{exp_id}/trials").json()["trials"]

    wait_for(lambda: len(trials()) == 2 and all(t["state"] == "STATE_RUNNING" for t in trials())
             and all(t.get("totalBatchesProcessed", 0) > 0 for t in trials()), 90, "both trials running", a, b)

    # SIGKILL the leader's control process: its API workers go with it (PR_SET_PDEATHSIG).
    children = [int(p) for p in subprocess.run(["pgrep", "-P", str(a.pid)], capture_output=True,
                                                 text=True).stdout.split()]
    workers_of_a = [p for p in children if b"api-worker" in Path(f"/proc/{p}/cmdline").read_bytes()]
    assert len(workers_of_a) == 2
    os.kill(a.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    lead = wait_for(lambda: (lambda x: x if x and x["masterId"] == b_id else None)(leader_of(b_api)),
                    TAKEOVER_LIMIT_S + 5, "b to lead", b)
    took = time.monotonic() - killed_at
    print(f"takeover after SIGKILL of the leader: {took:.2f} s")
    assert took < TAKEOVER_LIMIT_S, took
    assert lead["token"] == 2
    wait_for(lambda: not any(pid_alive(p) for p in workers_of_a), 10, "a's API workers to exit", b)

    done = wait_for(lambda: (lambda e: e if e["state"] in ("STATE_COMPLETED", "STATE_ERROR", "STATE_CANCELED")
                             else None)(api.get(f"/api/v1/experiments/{exp_id}").json()["experiment"]),
                    180, "the experiment to end", b)
    assert done["state"] == "STATE_COMPLETED", trials()
    for t in trials():
        assert t["state"] == "STATE_COMPLETED"
        assert t["restarts"] == 0  # the trials ran through the change of leader
        for group, steps in (("training", list(range(1, 61))), ("validation", list(range(10, 61, 10)))):
            got = api.get(f"/api/v1/trials/{t['id']}/metrics", params={"group": group, "limit": 1000}).json()
            assert [m["stepsCompleted"] for m in got["metrics"]] == steps, group
        cks = api.get(f"/api/v1/trials/{t['id']}/checkpoints").json()["checkpoints"]
        assert sorted(ck["metadata"]["steps_completed"] for ck in cks) == list(range(10, 61, 10))

    # Fencing: start a again, pause b (the leader) past its lease; a takes over by expiry. b,
    # resumed, still believes it leads until the token refuses it; then it stands by.
    a2 = MasterProc("a", root, ha["db_url"], a.port, workers=1)
    ha["a2"] = a2
    a2.start()
    a2_id = a2.master_id()
    launched_before = sorted(p.name for p in (root / "instances").iterdir() if p.is_dir())
    lb.disabled.add(b.port)  # the balancer's health check marks the paused master out
    os.killpg(b.pid, signal.SIGSTOP)
    try:
        a2_api = httpx.Client(base_url=a2.url, headers={"Authorization": f"Bearer {token}"}, timeout=30)
        paused_at = time.monotonic()
        lead = wait_for(lambda: (lambda x: x if x and x["masterId"] == a2_id else None)(leader_of(a2_api)),
                        30, "a2 to take over the paused leader's lease", a2, b)
        print(f"takeover of a paused leader (lease 4 s): {time.monotonic() - paused_at:.2f} s")
        assert lead["token"] == 3
    finally:
        os.killpg(b.pid, signal.SIGCONT)
    wait_for(lambda: "event=leadership_lost" in b.log.read_text(errors="replace")
             or "event=write_refused_by_fence" in b.log.read_text(errors="replace"), 20,
             "b to find its token refused", b)
    lost = [line for line in b.log.read_text(errors="replace").splitlines()
            if "event=leadership_lost" in line or "event=write_refused_by_fence" in line]
    assert "token=2" in lost[0], lost
    time.sleep(2)
    final = leader_of(a2_api)
    assert final is not None and (final["masterId"], final["token"]) == (a2_id, 3)  # b did not come back
    assert b_api.get("/api/v1/master/leader").json()["leading"] is False

    # Nothing left behind: the idle instances are terminated and the cloud (the instances'
    # directory) agrees with the record; no launch ran twice.
    wait_for(lambda: not list((root / "instances").glob("local-*.json")), 60, "idle instances terminated", a2, b)
    rows = wait_for(lambda: (lambda rs: rs if rs and all(r["state"] == "terminated" for r in rs) else None)(
        instance_rows(ha["db_url"])), 30, "instance rows closed", a2, b)
    homes = sorted(p.name for p in (root / "instances").iterdir() if p.is_dir())
    assert homes == launched_before  # nothing launched after the pause (b did not act)
    assert sorted(r["instance_id"] for r in rows) == homes  # each launch landed once, each instance has its row
    assert len({r["launch_id"] for r in rows}) == len(rows)
