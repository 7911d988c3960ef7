"""A real local cluster (master + agents as processes) for end-to-end tests."""

from __future__ import annotations

import base64
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from shipyard_common.processes import pid_alive  # noqa: F401 (the tests import it from here)
from tests.pg import free_port

MODEL_DIR = Path(__file__).parent / "model"


def model_files(folder: Path = MODEL_DIR) -> list[dict[str, Any]]:
    return [{"path": str(p.relative_to(folder)), "type": 48, "content": base64.b64encode(p.read_bytes()).decode(),
             "mode": 0o644, "mtime": 0, "uid": 0, "gid": 0}
            for p in sorted(folder.rglob("*")) if p.is_file() and "__pycache__" not in p.parts]


class Cluster:
    def __init__(self, state: Path, db_url: str, agents: int, master_yaml: dict[str, Any] | None) -> None:
        self.state = state
        self.db_url = db_url
        self.agents = agents
        self.master_yaml = master_yaml or {}
        self.data: dict[str, Any] = {}
        self.client: httpx.Client | None = None
        self.runtime = "process"  # the agents' task runtime (deploy_local.up's runtime and image)
        self.image: str | None = None

    def up(self) -> None:
        from cli import deploy_local

        cfg = self.state / "master.yaml"
        self.state.mkdir(parents=True, exist_ok=True)
        cfg.write_text(yaml.safe_dump({"agent_heartbeat_timeout_s": 8, "task_kill_grace_s": 3, **self.master_yaml}))
        self.data = deploy_local.up(self.state, agents=self.agents, port=free_port(), db=self.db_url, slots=1,
                                    pool_config=cfg, runtime=self.runtime, image=self.image)
        self.url = self.data["master_url"]
        token = httpx.post(self.url + "/api/v1/auth/login", json={
            "username": "admin", "password": (self.state / "admin-password").read_text().strip()}).json()["token"]
        self.client = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=30)

    def kill_master(self) -> None:
        """SIGKILL the master: no chance to clean up anything."""
        import os

        os.kill(self.data["master_pid"], signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and pid_alive(self.data["master_pid"]):
            time.sleep(0.05)

    def restart_master(self) -> None:
        import subprocess
        import sys

        from cli import deploy_local

        port = self.url.rsplit(":", 1)[1]
        password = (self.state / "admin-password").read_text().strip()
        cmd = [sys.executable, "-m", "control_plane", "--config", str(self.state / "master.yaml"), "--port", port,
               "--state-dir", str(self.state / "master"), "--db", self.db_url]
        with open(self.state / "master.log", "ab") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, env=dict(os.environ, SHIPYARD_ADMIN_PASSWORD=password))
        self.data["master_pid"] = proc.pid
        deploy_local.LocalCluster(self.state).write(self.data)
        self.wait(lambda: _answers(self.url), 30, "master back")

    def down(self) -> None:
        from cli import deploy_local

        if self.client:
            self.client.close()
        deploy_local.down(self.state, quiet=True)

    # -- helpers -----------------------------------------------------------------------------------
    def get(self, path: str, **params: Any) -> Any:
        assert self.client
        r = self.client.get(path, params=params)
        r.raise_for_status()
        return r.json()

    def post(self, path: str, body: Any = None) -> Any:
        assert self.client
        r = self.client.post(path, json=body if body is not None else {})
        assert r.status_code < 300, r.text
        return r.json()

    def submit(self, config: dict[str, Any], files: list[dict[str, Any]] | None = None) -> int:
        body = {"config": yaml.safe_dump(config), "modelDefinition": files if files is not None else model_files()}
        return self.post("/api/v1/experiments", body)["experiment"]["id"]

    def experiment(self, exp_id: int) -> dict[str, Any]:
        return self.get(f"/api/v1/experiments/{exp_id}")["experiment"]

    def trials(self, exp_id: int) -> list[dict[str, Any]]:
        return self.get(f"/api/v1/experiments/{exp_id}/trials", limit=1000)["trials"]

    def wait(self, predicate: Any, timeout: float = 120, what: str = "condition") -> Any:
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            last = predicate()
            if last:
                return last
            time.sleep(0.25)
        raise AssertionError(f"timed out waiting for {what}; last={last!r}; master log tail:\n"
                             + Path(self.data["master_log"]).read_text(errors="replace")[-3000:])

    def wait_experiment(self, exp_id: int, states: tuple[str, ...] = ("STATE_COMPLETED",), timeout: float = 180) -> dict[str, Any]:
        terminal = ("STATE_COMPLETED", "STATE_CANCELED", "STATE_ERROR")
        e = self.wait(lambda: (lambda x: x if x["state"] in terminal else None)(self.experiment(exp_id)), timeout,
                      f"experiment {exp_id} to end")
        assert e["state"] in states, (e["state"], self.trials(exp_id))
        return e

    def metrics(self, trial_id: int, group: str) -> list[dict[str, Any]]:
        return self.get(f"/api/v1/trials/{trial_id}/metrics", group=group, limit=100000)["metrics"]

    def logs(self, trial_id: int) -> str:
        assert self.client
        r = self.client.get(f"/api/v1/trials/{trial_id}/logs", params={"follow": "false"})
        r.raise_for_status()
        import json

        out = []
        for line in r.text.splitlines():
            if line.strip():
                res = json.loads(line).get("result", {})
                out.append(res.get("message") or res.get("log") or "")
        return "".join(out)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url + "/info", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def trial_config(name: str = "it", *, length: int = 30, searcher: dict[str, Any] | None = None,
                 hparams: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "entrypoint": "python3 train.py",
        "hyperparameters": {"lr": 0.1, "step_sleep": 0.0, "crash_at": -1, "validate_every": 10, **(hparams or {})},
        "searcher": searcher or {"name": "single", "metric": "validation_loss", "max_length": {"batches": length}},
        "max_restarts": 2,
        **extra,
    }


@pytest.fixture
def cluster_factory(tmp_path: Path, db_url: str) -> Iterator[Any]:
    made: list[Cluster] = []

    def make(agents: int = 1, master_yaml: dict[str, Any] | None = None) -> Cluster:
        c = Cluster(tmp_path / f"cluster{len(made)}", db_url, agents, master_yaml)
        made.append(c)
        c.up()
        return c

    old = os.environ.get("SHIPYARD_CLI_DIR")
    os.environ["SHIPYARD_CLI_DIR"] = str(tmp_path / "cli")
    try:
        yield make
    finally:
        for c in made:
            c.down()
        if old is None:
            os.environ.pop("SHIPYARD_CLI_DIR", None)
        else:
            os.environ["SHIPYARD_CLI_DIR"] = old


def kill9(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# Checkpoint storages reached over real HTTP: a moto server (S3) and gcp-storage-emulator (GCS).
from tests.harness.conftest import gcs_bucket, gcs_emulator_host, moto_endpoint, s3_bucket  # noqa: E402,F401
