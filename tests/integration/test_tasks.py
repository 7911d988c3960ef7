"""Commands (and, below, notebooks) end to end with Shipyard's `det` against a real master and
agent (process runtime): the context uploaded with -c reaches the task's directory, the output is
followed, det exits with the command's status and the master records it."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from tests.pg import missing_part

pytestmark = [pytest.mark.integration, pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)]


def det(capsys: pytest.CaptureFixture[str], url: str, *argv: str) -> tuple[int, str, str]:
    from cli.main import main

    capsys.readouterr()
    code = main(["-m", url, *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def login(capsys: pytest.CaptureFixture[str], cluster: Any) -> None:
    password = (cluster.state / "admin-password").read_text().strip()
    code, _out, err = det(capsys, cluster.url, "user", "login", "admin", "--password", password)
    assert code == 0, err


def test_det_cmd_run_follows_output_and_exits_with_the_status(cluster_factory: Any, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    os.environ["COLUMNS"] = "240"
    cluster = cluster_factory(agents=1)
    login(capsys, cluster)
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "hello.txt").write_text("hello from the context\n")
    code, out, err = det(capsys, cluster.url, "cmd", "run", "-c", str(ctx), "--config", "resources.slots=0", "--",
                         "sh", "-c", "cat hello.txt; echo task=$DET_TASK_ID; exit 3")
    assert code == 3, (out, err)
    assert "hello from the context" in out
    task_id = out.split("Launched command ")[1].split()[0]
    assert f"task={task_id}" in out
    code, out, err = det(capsys, cluster.url, "cmd", "list")
    assert code == 0 and task_id in out and "TERMINATED" in out and "exited with code 3" in out, (out, err)
    cmd = cluster.get(f"/api/v1/commands/{task_id}")["command"]
    assert (cmd["exitCode"], cmd["state"]) == (3, "STATE_TERMINATED")
    code, out, _ = det(capsys, cluster.url, "cmd", "logs", task_id)
    assert code == 0 and "hello from the context" in out
    # Another user's `det cmd list` shows their own (none); --all shows everyone's (reads are open).
    cluster.client.post("/api/v1/users", json={"user": {"username": "eve"}, "password": "eve-password-1"}).raise_for_status()
    code, _out, err = det(capsys, cluster.url, "user", "login", "eve", "--password", "eve-password-1")
    assert code == 0, err
    code, out, _ = det(capsys, cluster.url, "cmd", "list")
    assert code == 0 and task_id not in out, out
    code, out, _ = det(capsys, cluster.url, "cmd", "list", "--all")
    assert code == 0 and task_id in out and "admin" in out, out


def _execute(ws: Any, code: str) -> str:
    """Run `code` on the kernel over its channels WebSocket; the execute_result's text."""
    import json
    import uuid

    msg_id = uuid.uuid4().hex
    ws.send(json.dumps({
        "header": {"msg_id": msg_id, "username": "test", "session": uuid.uuid4().hex, "msg_type": "execute_request",
                   "version": "5.3"},
        "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
        "content": {"code": code, "silent": False, "store_history": False, "user_expressions": {},
                    "allow_stdin": False, "stop_on_error": True}}))
    while True:
        msg = json.loads(ws.recv(timeout=60))
        if msg.get("parent_header", {}).get("msg_id") == msg_id and msg["msg_type"] == "execute_result":
            return str(msg["content"]["data"]["text/plain"])


def test_notebook_through_the_master_proxy_http_and_kernel_websocket(cluster_factory: Any,
                                                                      capsys: pytest.CaptureFixture[str],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import httpx
    from websockets.sync.client import connect

    try:
        import jupyterlab  # noqa: F401 (the agent's environment runs it)
    except ImportError:
        missing_part("jupyterlab is not installed (pip install -e '.[dev]')")
    os.environ["COLUMNS"] = "240"
    cluster = cluster_factory(agents=1)
    login(capsys, cluster)
    code, out, err = det(capsys, cluster.url, "notebook", "start", "--config", "resources.slots=0")
    assert code == 0, (out, err)
    nb_id = out.split("Launched notebook ")[1].split()[0]
    assert f"JupyterLab is running at: {cluster.url}/proxy/{nb_id}/" in out
    admin = cluster.client
    assert admin is not None
    status = admin.get(f"/proxy/{nb_id}/api/status")
    assert status.status_code == 200, status.text
    assert "last_activity" in status.json() and "kernels" in status.json()
    # det notebook open: the URL printed, and given to the browser (none here: it says so).
    opened: list[str] = []
    monkeypatch.setattr("webbrowser.open", lambda url: opened.append(url) and False)
    code, out, err = det(capsys, cluster.url, "notebook", "open", nb_id)
    assert code == 0 and out.splitlines()[0] == f"{cluster.url}/proxy/{nb_id}/" and opened == [out.splitlines()[0]]
    assert "no browser found" in out, (out, err)
    # Only the owner (or an admin): another user is told there is no such task.
    admin.post("/api/v1/users", json={"user": {"username": "eve"}, "password": "eve-password-1"}).raise_for_status()
    eve = httpx.post(cluster.url + "/api/v1/auth/login", json={"username": "eve", "password": "eve-password-1"}).json()
    assert httpx.get(f"{cluster.url}/proxy/{nb_id}/api/status",
                     headers={"Authorization": f"Bearer {eve['token']}"}).status_code == 404
    assert httpx.get(f"{cluster.url}/proxy/{nb_id}/api/status").status_code == 401
    kernel = admin.post(f"/proxy/{nb_id}/api/kernels", json={"name": "python3"})
    assert kernel.status_code == 201, kernel.text
    ws_url = cluster.url.replace("http://", "ws://") + f"/proxy/{nb_id}/api/kernels/{kernel.json()['id']}/channels"
    with connect(ws_url, additional_headers={"Authorization": admin.headers["Authorization"]}) as ws:
        assert _execute(ws, "1+1") == "2"
    code, out, err = det(capsys, cluster.url, "notebook", "kill", nb_id)
    assert code == 0, err
    deadline = time.monotonic() + 30
    while cluster.get(f"/api/v1/notebooks/{nb_id}")["notebook"]["state"] != "STATE_TERMINATED":
        assert time.monotonic() < deadline, "the notebook did not stop"
        time.sleep(0.3)
    assert admin.get(f"/proxy/{nb_id}/api/status").status_code == 404


def test_idle_notebook_is_stopped_but_not_while_a_cell_runs(cluster_factory: Any,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    import json
    import uuid

    from websockets.sync.client import connect

    try:
        import jupyterlab  # noqa: F401
    except ImportError:
        missing_part("jupyterlab is not installed (pip install -e '.[dev]')")
    cluster = cluster_factory(agents=1)
    login(capsys, cluster)
    code, out, err = det(capsys, cluster.url, "notebook", "start", "--config", "resources.slots=0",
                         "--config", "idle_timeout=4")
    assert code == 0, (out, err)
    nb_id = out.split("Launched notebook ")[1].split()[0]
    admin = cluster.client
    assert admin is not None
    kernel = admin.post(f"/proxy/{nb_id}/api/kernels", json={"name": "python3"}).json()
    ws_url = cluster.url.replace("http://", "ws://") + f"/proxy/{nb_id}/api/kernels/{kernel['id']}/channels"
    with connect(ws_url, additional_headers={"Authorization": admin.headers["Authorization"]}) as ws:
        # A cell that runs longer than the timeout, with no traffic meanwhile: the notebook stays.
        ws.send(json.dumps({
            "header": {"msg_id": uuid.uuid4().hex, "username": "t", "session": uuid.uuid4().hex,
                       "msg_type": "execute_request", "version": "5.3"},
            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
            "content": {"code": "import time; time.sleep(9)", "silent": False, "store_history": False,
                        "user_expressions": {}, "allow_stdin": False, "stop_on_error": True}}))
        time.sleep(8)
        assert cluster.get(f"/api/v1/notebooks/{nb_id}")["notebook"]["state"] == "STATE_RUNNING"
    # Tab closed, kernel quiet: stopped after the timeout, its logs saying why.
    deadline = time.monotonic() + 40
    while cluster.get(f"/api/v1/notebooks/{nb_id}")["notebook"]["state"] != "STATE_TERMINATED":
        assert time.monotonic() < deadline, "the idle notebook was not stopped"
        time.sleep(0.5)
    code, out, _ = det(capsys, cluster.url, "notebook", "logs", nb_id)
    assert code == 0 and "stopped: idle for" in out and "idle timeout 4s" in out, out


def test_tensorboard_of_a_finished_experiment_through_the_proxy_then_culled_idle(
        cluster_factory: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """`det tensorboard start EXP` on a finished experiment: the real TensorBoard serves the trial's
    metrics (the harness's event files in the shared_fs storage) at /proxy/<id>/ to its owner, 404 to
    another user; left alone it is stopped after tensorboard_timeout, its logs saying why."""
    import httpx

    from tests.integration.conftest import trial_config

    os.environ["COLUMNS"] = "240"
    cluster = cluster_factory(agents=1, master_yaml={"tensorboard_timeout": 15})
    login(capsys, cluster)
    exp_id = cluster.submit(trial_config("tb", length=12))
    cluster.wait_experiment(exp_id, timeout=120)
    (trial,) = cluster.trials(exp_id)
    code, out, err = det(capsys, cluster.url, "tensorboard", "start", str(exp_id), "--config", "resources.slots=0")
    assert code == 0, (out, err)
    tb_id = out.split("Launched tensorboard ")[1].split()[0]
    assert f"TensorBoard is running at: {cluster.url}/proxy/{tb_id}/" in out
    admin = cluster.client
    assert admin is not None
    base = f"/proxy/{tb_id}"
    run = f"exp{exp_id}-trial{trial['id']}"
    tags = admin.get(f"{base}/data/plugin/scalars/tags").json()
    assert set(tags[run]) == {"Determined/loss", "Determined/validation_loss"}, tags
    series = admin.get(f"{base}/data/plugin/scalars/scalars", params={"run": run, "tag": "Determined/loss"}).json()
    stored = {row["stepsCompleted"]: row["metrics"].get("avg_metrics", row["metrics"])["loss"]
              for row in cluster.metrics(trial["id"], "training")}
    assert len(stored) == 12
    assert {step: round(value, 5) for _wall, step, value in series} == {s: round(v, 5) for s, v in stored.items()}
    code, out, _ = det(capsys, cluster.url, "tensorboard", "list")
    assert code == 0 and tb_id in out and "RUNNING" in out, out
    code, out, _ = det(capsys, cluster.url, "tensorboard", "open", tb_id, "--no-browser")
    assert (code, out.strip()) == (0, f"{cluster.url}/proxy/{tb_id}/")
    admin.post("/api/v1/users", json={"user": {"username": "eve"}, "password": "eve-password-1"}).raise_for_status()
    eve = httpx.post(cluster.url + "/api/v1/auth/login", json={"username": "eve", "password": "eve-password-1"}).json()
    assert httpx.get(f"{cluster.url}{base}/data/runs", headers={"Authorization": f"Bearer {eve['token']}"}).status_code == 404
    # No more traffic: stopped after the master's tensorboard_timeout.
    deadline = time.monotonic() + 60
    while cluster.get(f"/api/v1/tensorboards/{tb_id}")["tensorboard"]["state"] != "STATE_TERMINATED":
        assert time.monotonic() < deadline, "the idle TensorBoard was not stopped"
        time.sleep(1)
    code, out, _ = det(capsys, cluster.url, "tensorboard", "logs", tb_id)
    assert code == 0 and "stopped: idle for" in out and "idle timeout 15s" in out, out
    assert admin.get(f"{base}/data/runs").status_code == 404
