"""Notebooks, TensorBoards and shells in containers (issue 29): a `det-agent --runtime docker`
against a real `det-master` and a real Docker engine runs a notebook, a TensorBoard and a shell in
the task's image, the way a cloud pool (Docker by default) runs them: JupyterLab answers through the
master's proxy and its kernel runs a cell over the WebSocket; the TensorBoard serves the scalars a
trial that ran in a container wrote to its shared_fs checkpoint storage; the shell's sshd (the
image's openssh-server, unprivileged as the task's user, which the image's /etc/passwd does not
know: the agent adds it) runs a command through `det shell open`'s tunnel."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.agent_bootstrap.test_agent_integration import AgentProcess, wait_for
from tests.conftest import ADMIN_PASSWORD, LiveMaster
from tests.docker.conftest import Engine
from tests.docker.images import SSH_BINARIES
from tests.docker.test_docker_agent import TRAIN, Api, agents, master, start_agent  # noqa: F401 (fixtures)
from tests.integration.test_tasks import _execute, det
from tests.pg import missing_part

pytestmark = [pytest.mark.integration, pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)]


def _task(api: Api, kind: str, body: dict[str, Any]) -> str:
    r = api.c.post(f"/api/v1/{kind}s", json=body)
    assert r.status_code == 200, r.text
    task_id = str(r.json()[kind]["id"])
    wait_for(lambda: _get(api, kind, task_id)["isReady"] or _get(api, kind, task_id)["state"] == "STATE_TERMINATED",
             timeout=120, what=f"{kind} {task_id} ready")
    return task_id


def _get(api: Api, kind: str, task_id: str) -> dict[str, Any]:
    return dict(api.get(f"/api/v1/{kind}s/{task_id}")[kind])


def _kill(api: Api, kind: str, task_id: str) -> None:
    assert api.c.post(f"/api/v1/{kind}s/{task_id}/kill").status_code == 200
    wait_for(lambda: _get(api, kind, task_id)["state"] == "STATE_TERMINATED",
             what=f"{kind} {task_id} stopped")


def test_notebook_tensorboard_and_shell_run_in_the_tasks_image(
        master: LiveMaster, docker_engine: Engine, tmp_path: Path, agents: list[AgentProcess],  # noqa: F811
        capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from websockets.sync.client import connect

    try:
        import jupyterlab  # noqa: F401 (the test image runs the venv's, bound in read-only)
        import tensorboard  # noqa: F401
    except ImportError as e:
        missing_part(f"{e.name} is not installed (pip install -e '.[dev]')")
    if len(SSH_BINARIES) < 2 or subprocess.run(["which", "ssh"], capture_output=True).returncode:
        missing_part("openssh-server/openssh-client are not installed (tests/system_deps.sh)")
    api = Api(master)
    a = start_agent(master, docker_engine, tmp_path / "work", agents)
    image = {"image": docker_engine.image}
    ckpt = tmp_path / "checkpoints"
    exp = api.submit({"name": "tb-in-a-container", "entrypoint": ["python3", "train.py"],
                      "hyperparameters": {"lr": 0.1, "validate_every": 2},
                      "searcher": {"name": "single", "metric": "validation_loss", "max_length": {"batches": 4}},
                      "resources": {"slots_per_trial": 1}, "environment": image, "max_restarts": 0,
                      "checkpoint_storage": {"type": "shared_fs", "host_path": str(ckpt)}}, {"train.py": TRAIN})
    trial_id = exp["trialIds"][0]
    wait_for(lambda: api.trial(trial_id)["state"] in ("STATE_COMPLETED", "STATE_ERROR"), what="trial ended")
    assert api.trial(trial_id)["state"] == "STATE_COMPLETED", a.stderr[-3000:]

    nb = _task(api, "notebook", {"config": {"resources": {"slots": 0}, "environment": image}})
    assert _get(api, "notebook", nb)["isReady"], (_get(api, "notebook", nb), a.stderr[-3000:])
    status = api.c.get(f"/proxy/{nb}/api/status")
    assert status.status_code == 200 and "kernels" in status.json(), status.text
    kernel = api.c.post(f"/proxy/{nb}/api/kernels", json={"name": "python3"})
    assert kernel.status_code == 201, kernel.text
    ws_url = master.url.replace("http://", "ws://") + f"/proxy/{nb}/api/kernels/{kernel.json()['id']}/channels"
    with connect(ws_url, additional_headers={"Authorization": api.c.headers["Authorization"]}) as ws:
        # In the container: its own root file system (the image's /etc/hostname-less root), its pid 1 docker-init.
        assert _execute(ws, "open('/proc/1/comm').read().strip()") == "'docker-init'"
    containers = docker_engine.containers(a.agent_id, all=False)
    assert [c["Image"] for c in containers] == [docker_engine.image], containers
    _kill(api, "notebook", nb)

    tb = _task(api, "tensorboard", {"experimentIds": [exp["id"]], "config": {"resources": {"slots": 0},
                                                                             "environment": image}})
    assert _get(api, "tensorboard", tb)["isReady"], (_get(api, "tensorboard", tb), a.stderr[-3000:])
    run = f"exp{exp['id']}-trial{trial_id}"
    tags = api.c.get(f"/proxy/{tb}/data/plugin/scalars/tags")
    assert tags.status_code == 200, tags.text
    assert "Determined/loss" in tags.json().get(run, {}), (tags.json(), a.stderr[-3000:])
    series = api.c.get(f"/proxy/{tb}/data/plugin/scalars/scalars", params={"run": run, "tag": "Determined/loss"}).json()
    assert [step for _wall, step, _value in series] == [1, 2, 3, 4], series
    assert [c["Image"] for c in docker_engine.containers(a.agent_id, all=False)] == [docker_engine.image]
    _kill(api, "tensorboard", tb)
    wait_for(lambda: docker_engine.containers(a.agent_id) == [], what="the task containers removed")
    wait_for(lambda: httpx.get(f"{master.url}/proxy/{tb}/data/runs", headers=dict(api.c.headers)).status_code == 404,
             timeout=15, what="the killed TensorBoard no longer proxied")

    # A shell: the image's sshd as the task's uid, which the agent names in the container's /etc/passwd.
    sh = _task(api, "shell", {"config": {"resources": {"slots": 0}, "environment": image}})
    assert _get(api, "shell", sh)["isReady"], (_get(api, "shell", sh), a.stderr[-3000:])
    monkeypatch.setenv("SHIPYARD_CLI_DIR", str(tmp_path / "cli"))
    monkeypatch.setenv("COLUMNS", "240")
    code, _out, err = det(capfd, master.url, "user", "login", "admin", "--password", ADMIN_PASSWORD)  # type: ignore[arg-type]
    assert code == 0, err
    # sh's builtins only (the image has no coreutils): USER and HOME come from the passwd entry.
    code, out, err = det(capfd, master.url, "shell", "open", sh, "--",  # type: ignore[arg-type]
                         "read", "init", "</proc/1/comm;", "echo", "$USER", "$HOME", "$DET_TASK_ID", "$init")
    assert code == 0, (out, err)
    user, home, task, init = out.split()
    assert (task, init) == (sh, "docker-init"), out
    assert user == _get(api, "shell", sh)["agentUserGroup"]["user"] and user != "root", out
    assert home.startswith(str(tmp_path / "work")), out  # the task's directory
    assert [c["Image"] for c in docker_engine.containers(a.agent_id, all=False)] == [docker_engine.image]
    _kill(api, "shell", sh)
    wait_for(lambda: docker_engine.containers(a.agent_id) == [], what="the shell's container removed")
