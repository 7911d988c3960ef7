"""Spot interruption notices end to end: a real master, two real agents each watching its own fake
instance metadata (tests/fakes/metadata.py: AWS IMDSv2's spot/instance-action, GCE's
instance/preempted), and a trial using the Core API (`harness`). The notice reaches the agent the
trial runs on; the master asks the trial to stop, the trial checkpoints within the warning and
exits, and it completes on the other agent from that checkpoint: no step lost or repeated, no
restart counted. A trial that ignores the request is stopped by its agent at the deadline less the
margin, and that is not counted against it either."""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.agent_bootstrap.test_agent_integration import AgentProcess, admin, agent_token, wait_for
from tests.conftest import LiveMaster
from tests.fakes.metadata import SpotMetadataServer

pytestmark = pytest.mark.integration

TRAIN = '''
import json, os, pathlib, sys, time
from harness import core

with core.init() as ctx:
    hp = ctx.info.hparams
    steps = 0
    print(f"run {ctx.info.trial_run_id} on agent {os.environ['DET_AGENT_ID']} pid {os.getpid()}", flush=True)
    if ctx.info.latest_checkpoint:
        with ctx.checkpoint.restore_path(ctx.info.latest_checkpoint) as path:
            steps = json.loads((pathlib.Path(path) / "state.json").read_text())["steps"]
        print(f"resumed at step {steps}", flush=True)
    for op in ctx.searcher.operations():
        while steps < op.length:
            steps += 1
            time.sleep(hp["step_sleep"])
            ctx.train.report_training_metrics(steps, {"loss": 1.0 / steps})
            if hp.get("ckpt_every") and steps % hp["ckpt_every"] == 0:
                with ctx.checkpoint.store_path({"steps_completed": steps}) as (path, _):
                    (pathlib.Path(path) / "state.json").write_text(json.dumps({"steps": steps}))
            if ctx.preempt.should_preempt() and not hp["ignore_preemption"]:
                with ctx.checkpoint.store_path({"steps_completed": steps}) as (path, _):
                    (pathlib.Path(path) / "state.json").write_text(json.dumps({"steps": steps}))
                print(f"preempted at step {steps}", flush=True)
                sys.exit(0)
        with ctx.checkpoint.store_path({"steps_completed": steps}) as (path, _):
            (pathlib.Path(path) / "state.json").write_text(json.dumps({"steps": steps}))
        op.report_completed(1.0 / steps)
'''


def model_files() -> list[dict[str, Any]]:
    return [{"path": "train.py", "type": 48, "content": base64.b64encode(TRAIN.encode()).decode(), "mode": 0o644,
             "mtime": 0, "uid": 0, "gid": 0}]


@pytest.fixture
def master(db_url: str, tmp_path: Path) -> Iterator[LiveMaster]:
    cfg = tmp_path / "master.yaml"
    cfg.write_text(yaml.safe_dump({"task_kill_grace_s": 3}))
    m = LiveMaster(db_url, tmp_path / "master-state", config_path=cfg)
    m.start()
    yield m
    m.stop()


class Spot:
    """Two agents, `a` and `b`, each with its own metadata server (`watch=False`: agents that do not
    watch it, as benchmarks/spot_notice.py's peer)."""

    def __init__(self, master: LiveMaster, tmp_path: Path, cloud: str, warning_s: float, watch: bool = True) -> None:
        self.master = master
        self.headers = admin(master)
        token = agent_token(master)
        self.fakes = {n: SpotMetadataServer(cloud, warning_s=warning_s).start() for n in ("a", "b")}
        self.agents = {n: AgentProcess(master.url, token, tmp_path / f"work-{n}", "--interruption-watch",
                                       cloud if watch else "off",
                                       "--metadata-url", self.fakes[n].url, "--interruption-poll-s", "0.2",
                                       "--interruption-kill-margin-s", "3", agent_id=f"spot-{n}")
                       for n in ("a", "b")}

    def close(self) -> None:
        for a in self.agents.values():
            a.stop()
        for f in self.fakes.values():
            f.stop()

    def get(self, path: str, **params: Any) -> Any:
        r = httpx.get(self.master.url + path, params=params, headers=self.headers, timeout=30)
        r.raise_for_status()
        return r.json()

    def submit(self, length: int, step_sleep: float, ignore_preemption: bool = False, ckpt_every: int = 0) -> int:
        config = {"name": "spot", "entrypoint": "python3 train.py", "max_restarts": 0,
                  "hyperparameters": {"step_sleep": step_sleep, "ignore_preemption": ignore_preemption,
                                      "ckpt_every": ckpt_every},
                  "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": length}},
                  "checkpoint_storage": {"type": "shared_fs", "host_path": str(self.master.state_dir / "checkpoints")}}
        r = httpx.post(self.master.url + "/api/v1/experiments", headers=self.headers, timeout=30,
                       json={"config": yaml.safe_dump(config), "modelDefinition": model_files()})
        assert r.status_code == 200, r.text
        return r.json()["experiment"]["id"]

    def logs(self, trial_id: int) -> str:
        r = httpx.get(f"{self.master.url}/api/v1/trials/{trial_id}/logs", params={"follow": "false"},
                      headers=self.headers, timeout=30)
        r.raise_for_status()
        import json

        return "".join((json.loads(line).get("result", {}).get("message") or "")
                       for line in r.text.splitlines() if line.strip())

    def trial(self, exp_id: int) -> dict[str, Any]:
        return self.get(f"/api/v1/experiments/{exp_id}/trials")["trials"][0]

    def steps(self, trial_id: int) -> list[int]:
        return [m["stepsCompleted"] for m in self.get(f"/api/v1/trials/{trial_id}/metrics", group="training",
                                                       limit=100000)["metrics"]]

    def interrupt_where_running(self, exp_id: int, min_steps: int) -> tuple[str, str, int]:
        """Wait for the trial to train `min_steps` steps, announce the notice on its agent's metadata:
        (that agent, the other, the trial id)."""
        trial_id = wait_for(lambda: (self.get(f"/api/v1/experiments/{exp_id}/trials")["trials"] or [{}])[0]
                            .get("id"), 60, "trial created")
        wait_for(lambda: len(self.steps(trial_id)) >= min_steps, 60, "trial training")
        first = re.search(r"run 1 on agent spot-(\w)", self.logs(trial_id))
        assert first is not None
        mine = first.group(1)
        self.fakes[mine].announce()
        return mine, "b" if mine == "a" else "a", trial_id

    def wait_done(self, exp_id: int) -> dict[str, Any]:
        exp = wait_for(lambda: (lambda e: e if e["state"] in ("STATE_COMPLETED", "STATE_ERROR", "STATE_CANCELED")
                                else None)(self.get(f"/api/v1/experiments/{exp_id}")["experiment"]),
                       90, "experiment to end")
        return exp


def start_spot(master: LiveMaster, tmp_path: Path, cloud: str, warning_s: float, watch: bool = True) -> Spot:
    s = Spot(master, tmp_path, cloud, warning_s, watch)
    wait_for(lambda: all(httpx.get(f"{master.url}/api/v1/agents/spot-{n}", headers=s.headers).status_code == 200
                         for n in ("a", "b")), 60, "both agents registered")
    return s


@pytest.fixture(params=["aws", "gcp"])
def spot(request: pytest.FixtureRequest, master: LiveMaster, tmp_path: Path) -> Iterator[Spot]:
    # AWS: the fake's notice says the instance goes 20 s on; GCE's notice names no time: the agent
    # takes GCE's 30 s.
    s = start_spot(master, tmp_path, request.param, warning_s=20 if request.param == "aws" else 30)
    yield s
    s.close()


def test_notice_checkpoints_within_the_warning_and_resumes_elsewhere(spot: Spot) -> None:
    length = 60
    exp_id = spot.submit(length, step_sleep=0.05)
    mine, other, trial_id = spot.interrupt_where_running(exp_id, min_steps=5)
    exp = spot.wait_done(exp_id)
    logs = spot.logs(trial_id)
    assert exp["state"] == "STATE_COMPLETED", logs
    stopped = re.search(r"preempted at step (\d+)", logs)
    resumed = re.search(r"resumed at step (\d+)", logs)
    assert stopped and resumed, logs
    assert stopped.group(1) == resumed.group(1)  # from the checkpoint taken at the notice
    assert f"run 2 on agent spot-{other}" in logs  # resumed on the other agent
    assert "spot interruption notice: checkpointing" in logs
    assert "sending SIGTERM" not in logs  # it stopped on its own, well before the deadline
    # No step lost or repeated; not counted as a failure (max_restarts is 0).
    assert spot.steps(trial_id) == list(range(1, length + 1))
    trial = spot.get(f"/api/v1/trials/{trial_id}")["trial"]
    assert trial["restarts"] == 0
    # The checkpoint of the interrupted run was reported before the instance's deadline.
    ckpts = spot.get(f"/api/v1/trials/{trial_id}/checkpoints")["checkpoints"]
    at_notice = [c for c in ckpts if c["metadata"].get("steps_completed") == int(stopped.group(1))]
    assert at_notice, ckpts
    reported = datetime.fromisoformat(at_notice[0]["reportTime"].replace("Z", "+00:00"))
    deadline = spot.fakes[mine].deadline
    assert deadline is not None and reported < deadline
    # The interrupted agent takes no new work: disabled, shown draining.
    agent = spot.get(f"/api/v1/agents/spot-{mine}")["agent"]
    assert agent["enabled"] is False and agent["draining"] is True
    assert spot.get(f"/api/v1/agents/spot-{other}")["agent"]["enabled"] is True
    # ... and an admin cannot turn it back on: its instance is going away.
    r = httpx.post(f"{spot.master.url}/api/v1/agents/spot-{mine}/enable", headers=spot.headers, timeout=30)
    assert r.status_code == 409 and "spot interruption notice" in r.text, r.text


@pytest.fixture
def aws_spot(master: LiveMaster, tmp_path: Path) -> Iterator[Spot]:
    # The instance goes 5 s after the notice: with the 3 s margin, SIGTERM 2 s after it.
    s = start_spot(master, tmp_path, "aws", warning_s=5)
    yield s
    s.close()


def test_a_trial_ignoring_the_notice_is_stopped_at_the_deadline_not_failed(aws_spot: Spot) -> None:
    spot = aws_spot
    length = 50
    exp_id = spot.submit(length, step_sleep=0.1, ignore_preemption=True)
    _mine, other, trial_id = spot.interrupt_where_running(exp_id, min_steps=5)
    exp = spot.wait_done(exp_id)
    logs = spot.logs(trial_id)
    assert exp["state"] == "STATE_COMPLETED", logs
    assert "sending SIGTERM" in logs and f"run 2 on agent spot-{other}" in logs
    assert spot.get(f"/api/v1/trials/{trial_id}")["trial"]["restarts"] == 0  # not the trial's fault
    # It saved no checkpoint before the stop: the second run starts over, from step 1.
    assert "resumed at step" not in logs
    assert spot.steps(trial_id)[-1] == length
