"""`det deploy local up|status|down` as a user runs it: separate processes, nothing left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent_bootstrap.agent.identity import unreachable_interpreter
from tests.integration.conftest import pid_alive
from tests.pg import free_port

pytestmark = pytest.mark.integration


def det(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli.main", *args], capture_output=True, text=True, env=env,
                          timeout=120)


def test_up_status_down_leaves_no_process(tmp_path: Path) -> None:
    # The user's shell holds secrets of its own: they do not reach the agents (shipyard_common/host_env.py).
    env = dict(os.environ, SHIPYARD_CLI_DIR=str(tmp_path / "cli"), AWS_SECRET_ACCESS_KEY="shell-secret-key")
    state = tmp_path / "local"
    port = free_port()
    up = det("deploy", "local", "up", "--agents", "2", "--port", str(port), "--state-dir", str(state), env=env)
    assert up.returncode == 0, up.stderr
    assert f"http://127.0.0.1:{port}" in up.stdout and "Admin password" in up.stdout
    assert oct((state / "admin-password").stat().st_mode & 0o777) == "0o600"
    # As root with this Python under a private directory (pyenv under /root here), the user is told
    # before the first trial that trial users cannot run it; otherwise nothing is said.
    blocked = unreachable_interpreter(sys.executable, sys.prefix) if os.geteuid() == 0 else None
    if blocked is not None:
        assert f"Warning: this Python ({os.path.realpath(sys.executable)}) is under {blocked}" in up.stderr
    else:
        assert "Warning" not in up.stderr, up.stderr
    status = json.loads(det("deploy", "local", "status", "--json", "--state-dir", str(state), env=env).stdout)
    pids = [status["master_pid"]] + [a["pid"] for a in status["agents"]]
    assert status["master_alive"] and all(a["alive"] for a in status["agents"])
    for a in status["agents"]:
        environ = Path(f"/proc/{a['pid']}/environ").read_bytes()
        assert b"shell-secret-key" not in environ and b"PATH=" in environ
    # the CLI is logged in as admin against that master and sees both agents
    agents = det("-m", f"http://127.0.0.1:{port}", "agent", "list", "--json", env=env)
    assert agents.returncode == 0, agents.stderr
    assert {a["id"] for a in json.loads(agents.stdout)} == {"local-0", "local-1"}
    again = det("deploy", "local", "up", "--port", str(port), "--state-dir", str(state), env=env)
    assert again.returncode != 0 and "already running" in again.stderr and "Traceback" not in again.stderr
    down = det("deploy", "local", "down", "--state-dir", str(state), env=env)
    assert down.returncode == 0, down.stderr
    assert not any(pid_alive(p) for p in pids)
    assert det("deploy", "local", "status", "--state-dir", str(state), env=env).returncode == 1


def test_down_terminates_the_instances_of_an_elastic_pool(tmp_path: Path) -> None:
    # The master's secrets (its database URL, its cloud keys) reach neither the agents the local
    # provider starts nor their tasks (shipyard_common/host_env.py).
    db_url = f"sqlite:///{tmp_path / 'secret-db-name.sqlite'}"
    env = dict(os.environ, SHIPYARD_CLI_DIR=str(tmp_path / "cli"), SHIPYARD_DB_URL=db_url,
               AWS_SECRET_ACCESS_KEY="master-secret-key", STORAGE_EMULATOR_HOST="http://127.0.0.1:9")
    state = tmp_path / "local"
    cfg = tmp_path / "master.yaml"
    cfg.write_text("resource_pools:\n  - name: default\n    provider:\n      type: local\n"
                   "      min_instances: 2\n      max_instances: 2\n")
    port = free_port()
    up = det("deploy", "local", "up", "--agents", "0", "--port", str(port), "--state-dir", str(state),
             "--master-config", str(cfg), env=env)
    assert up.returncode == 0, up.stderr
    url = f"http://127.0.0.1:{port}"

    def instance_pids() -> list[int]:
        recs = list((state / "master" / "local-instances" / "default").glob("local-*.json"))
        return [json.loads(r.read_text())["pid"] for r in recs]

    import time

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(instance_pids()) < 2:
        time.sleep(0.5)
    pids = instance_pids()
    assert len(pids) == 2 and all(pid_alive(p) for p in pids)
    pools = json.loads(det("-m", url, "resource-pool", "list", "--json", env=env).stdout)
    assert pools[0]["provider"] == "local"
    for pid in pids:
        agent_env = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
        assert "secret-db-name" not in agent_env and "master-secret-key" not in agent_env
        assert "STORAGE_EMULATOR_HOST=http://127.0.0.1:9\0" in agent_env  # where storage is: inherited
    run = det("-m", url, "cmd", "run", "--config", "resources.slots=0", "--", "env", env=env)
    assert run.returncode == 0 and "DET_TASK_ID=" in run.stdout, (run.stdout, run.stderr)
    assert "secret-db-name" not in run.stdout and "master-secret-key" not in run.stdout
    assert "STORAGE_EMULATOR_HOST=http://127.0.0.1:9\n" in run.stdout
    down = det("deploy", "local", "down", "--state-dir", str(state), env=env)
    assert down.returncode == 0, down.stderr
    assert not any(pid_alive(p) for p in pids)
    assert instance_pids() == []
