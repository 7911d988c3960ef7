"""A `det-agent --runtime docker` against a real `det-master` and a real Docker engine: a trial in a
container reports metrics and a checkpoint; an agent killed and restarted reattaches to the
containers whose allocation is still wanted and removes the others; a kill is SIGTERM, then SIGKILL
after the grace; no container is left behind."""

from __future__ import annotations

import base64
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.agent_bootstrap.test_agent_integration import AgentProcess, agent_token, wait_for
from tests.conftest import LiveMaster
from tests.docker.conftest import Engine
from tests.docker.images import host_mounts

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TRAIN = (ROOT / "tests" / "integration" / "model" / "train.py").read_text()
HOLD = """\
import os, signal, time
signal.signal(signal.SIGTERM, lambda *a: print("got SIGTERM, ignoring it", flush=True))
print("holding in", os.getcwd(), flush=True)
while True:
    time.sleep(0.05)
"""
AGENT = "docker-agent"


@pytest.fixture
def master(db_url: str, tmp_path: Path) -> Iterator[LiveMaster]:
    cfg = tmp_path / "master.yaml"
    # The cluster's checkpoint root is the tests' `tmp_path / "checkpoints"`: another host path in an
    # experiment needs allow_task_host_access, and the agent makes a missing one only under the root.
    cfg.write_text(yaml.safe_dump({"task_kill_grace_s": 2, "checkpoint_storage": {
        "type": "shared_fs", "host_path": str(tmp_path / "checkpoints")}}))
    m = LiveMaster(db_url, tmp_path / "master-state", config_path=cfg)
    m.start()
    yield m
    m.stop()


def files(contents: dict[str, str]) -> list[dict[str, Any]]:
    return [{"path": p, "type": 48, "content": base64.b64encode(t.encode()).decode(), "mode": 0o644,
             "mtime": "0", "uid": 0, "gid": 0} for p, t in contents.items()]


class Api:
    def __init__(self, master: LiveMaster) -> None:
        self.c = httpx.Client(base_url=master.url, headers={"Authorization": f"Bearer {master.token()}"}, timeout=30)

    def get(self, path: str, **params: Any) -> Any:
        r = self.c.get(path, params=params)
        r.raise_for_status()
        return r.json()

    def submit(self, config: dict[str, Any], contents: dict[str, str]) -> dict[str, Any]:
        r = self.c.post("/api/v1/experiments", json={"config": yaml.safe_dump(config), "modelDefinition": files(contents),
                                                      "activate": True})
        assert r.status_code == 200, r.text
        return r.json()["experiment"]

    def trial(self, trial_id: int) -> dict[str, Any]:
        return self.get(f"/api/v1/trials/{trial_id}")["trial"]

    def logs(self, trial_id: int) -> str:
        import json

        r = self.c.get(f"/api/v1/trials/{trial_id}/logs", params={"follow": "false"})
        r.raise_for_status()
        return "".join(json.loads(line)["result"].get("log") or "" for line in r.text.splitlines() if line.strip())


def start_agent(master: LiveMaster, engine: Engine, work: Path, agents: list[AgentProcess]) -> AgentProcess:
    a = AgentProcess(master.url, agent_token(master) if not agents else agents[0].token, work,
                     "--runtime", "docker", "--docker-host", engine.socket_url,
                     "--container-mounts", ",".join(host_mounts()), agent_id=AGENT)
    agents.append(a)
    return a


@pytest.fixture
def agents() -> Iterator[list[AgentProcess]]:
    started: list[AgentProcess] = []
    yield started
    for a in started:
        a.stop()


def test_a_trial_in_a_container_reports_and_a_restarted_agent_leaves_no_orphan(
        master: LiveMaster, docker_engine: Engine, tmp_path: Path, agents: list[AgentProcess]) -> None:
    api = Api(master)
    work = tmp_path / "work"
    a = start_agent(master, docker_engine, work, agents)
    ckpt = tmp_path / "checkpoints"  # made by the agent, writable by every task user (1777)
    config = {
        "name": "in-a-container", "entrypoint": ["python3", "train.py"],
        "hyperparameters": {"lr": 0.1, "validate_every": 2},
        "searcher": {"name": "single", "metric": "validation_loss", "max_length": {"batches": 4}},
        "resources": {"slots_per_trial": 1, "shm_size": "128m"},
        "environment": {"image": docker_engine.image, "environment_variables": ["FROM_CONFIG=yes"]},
        "checkpoint_storage": {"type": "shared_fs", "host_path": str(ckpt)},
        "max_restarts": 0,
    }
    exp = api.submit(config, {"train.py": TRAIN})
    trial_id = exp["trialIds"][0]
    wait_for(lambda: api.trial(trial_id)["state"] in ("STATE_COMPLETED", "STATE_ERROR"), what="trial ended")
    assert api.trial(trial_id)["state"] == "STATE_COMPLETED", a.stderr[-3000:]
    assert "event=task_container_started" in a.stderr
    validation = api.get(f"/api/v1/trials/{trial_id}/metrics", group="validation")["metrics"]
    assert [m["stepsCompleted"] for m in validation] == [2, 4]
    (latest, *_) = sorted(api.get(f"/api/v1/trials/{trial_id}/checkpoints")["checkpoints"],
                          key=lambda c: -c["metadata"]["steps_completed"])
    assert latest["metadata"]["steps_completed"] == 4
    assert (ckpt / latest["uuid"] / "state.json").exists()  # written inside, on the bound storage
    assert f"trial {trial_id} run 1" in api.logs(trial_id)
    wait_for(lambda: docker_engine.containers(AGENT) == [], what="the container removed")

    # A trial that ignores SIGTERM; then the agent is SIGKILLed: its container keeps running.
    hold = api.submit({**config, "name": "hold", "entrypoint": ["python3", "hold.py"]}, {"hold.py": HOLD})
    hold_trial = hold["trialIds"][0]
    wait_for(lambda: "holding in" in api.logs(hold_trial), what="hold trial running")
    (running,) = docker_engine.containers(AGENT, all=False)
    a.proc.send_signal(signal.SIGKILL)
    a.wait()
    # What an agent may leave besides: a container of an allocation the master does not know, and
    # one that has ended.
    stray_dir = work / "tasks" / "stray-0000"
    stray_dir.mkdir(parents=True)
    for name, code in (("stray", "import time; time.sleep(600)"), ("ended", "pass")):
        docker_engine.client.containers.run(
            docker_engine.image, ["python3", "-c", code], detach=True, network_mode="host", init=True,
            labels={"shipyard.agent": AGENT, "shipyard.allocation": f"{name}.alloc", "shipyard.taskdir": str(stray_dir)},
            volumes={p: {"bind": p, "mode": "ro"} for p in host_mounts()})
    wait_for(lambda: any(c["State"] == "exited" for c in docker_engine.containers(AGENT)), what="ended container")
    assert len(docker_engine.containers(AGENT)) == 3

    b = start_agent(master, docker_engine, work, agents)
    wait_for(lambda: "event=registered" in b.stderr, what="re-registration")
    assert "event=task_reattached" in b.stderr and "event=leftover_container_removed" in b.stderr
    # The master still wants the hold trial's allocation there; not the stray one.
    wait_for(lambda: [c["Id"] for c in docker_engine.containers(AGENT)] == [running["Id"]],
             what="only the wanted container left")
    assert api.trial(hold_trial)["state"] == "STATE_RUNNING"

    r = api.c.post(f"/api/v1/experiments/{hold['id']}/kill")
    assert r.status_code == 200, r.text
    wait_for(lambda: docker_engine.containers(AGENT) == [], what="the killed trial's container removed")
    wait_for(lambda: "got SIGTERM, ignoring it" in api.logs(hold_trial), what="the SIGTERM line shipped")
    assert "exit_code=137" in b.stderr  # SIGKILLed once the 2 s grace was over
    wait_for(lambda: api.trial(hold_trial)["state"] not in ("STATE_RUNNING", "STATE_ACTIVE"), what="trial ended")
    wait_for(lambda: not stray_dir.exists(), what="the stray task's directory removed")
