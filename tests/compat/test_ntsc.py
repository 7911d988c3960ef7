"""The real `det` of determined==0.38.1 against Shipyard's commands, notebooks and task list
(api/ntsc.py): `det cmd run` (context uploaded, output followed), `det cmd list`, `det task list`,
`det cmd kill`, `det notebook start|list|kill` (JupyterLab ready behind the master's proxy),
`det shell start -d|list|kill`."""

from __future__ import annotations

import re
from pathlib import Path

from tests.compat.conftest import CompatCluster, Det, wait_for
from tests.pg import missing_part

UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


def test_det_cmd_run_list_kill_and_task_list(det: Det, compat_cluster: CompatCluster, tmp_path: Path) -> None:
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "hello.txt").write_text("hello from the context\n")
    out = det.ok("cmd", "run", "-c", ctx, "--config", "resources.slots=0", "sh", "-c", "cat hello.txt")
    m = re.search(rf"Launched command \(id: ({UUID})", out)
    assert m, out
    assert "hello from the context" in out
    done = m.group(1)
    cmd = compat_cluster.get(f"/api/v1/commands/{done}")["command"]
    assert (cmd["state"], cmd["exitCode"]) == ("STATE_TERMINATED", 0)
    running = det.ok("cmd", "run", "-d", "--config", "resources.slots=0", "sleep", "120").strip()
    assert re.fullmatch(UUID, running), running
    listed = det.ok("cmd", "list")
    assert done in listed and running in listed and "TERMINATED" in listed
    wait_for(lambda: running in det.ok("task", "list"), "the running command in det task list")
    assert f"Set priority of command {running} to 7" in det.ok("cmd", "set", "priority", running, "7")
    assert compat_cluster.get(f"/api/v1/commands/{running}")["config"]["resources"]["priority"] == 7
    assert "Killed command" in det.ok("cmd", "kill", running)
    wait_for(lambda: compat_cluster.get(f"/api/v1/commands/{running}")["command"]["state"] == "STATE_TERMINATED",
             "the killed command to end")


def test_det_notebook_start_list_kill(det: Det, compat_cluster: CompatCluster) -> None:
    try:
        import jupyterlab  # noqa: F401 (the agents' environment runs it)
    except ImportError:
        missing_part("jupyterlab is not installed (pip install -e '.[dev]')")
    out = det.ok("notebook", "start", "--no-browser", "--config", "resources.slots=0", timeout=180)
    m = re.search(rf"Launched notebook \(id: ({UUID})", out)
    assert m, out
    nb_id = m.group(1)
    assert "Jupyter Notebook is running at" in out and f"/proxy/{nb_id}/" in out
    status = compat_cluster.client.get(f"/proxy/{nb_id}/api/status")
    assert status.status_code == 200 and "last_activity" in status.json(), status.text
    assert nb_id in det.ok("notebook", "list")
    assert "Killed notebook" in det.ok("notebook", "kill", nb_id)
    wait_for(lambda: compat_cluster.get(f"/api/v1/notebooks/{nb_id}")["notebook"]["state"] == "STATE_TERMINATED",
             "the killed notebook to end")


def test_det_shell_start_open_list_kill(det: Det, compat_cluster: CompatCluster) -> None:
    """The real client's shell verbs. Its `det shell open` tunnel (determined.cli.tunnel) connects
    without credentials: the master's default shell_tunnel_auth (ssh_key, as Determined) lets it
    reach the shell's sshd, which admits only the owner's key, fetched by the client with its session."""
    shell_id = det.ok("shell", "start", "-d", "--config", "resources.slots=0").strip()
    assert re.fullmatch(UUID, shell_id), shell_id
    wait_for(lambda: compat_cluster.get(f"/api/v1/shells/{shell_id}")["shell"]["isReady"], "the shell's sshd")
    shell = compat_cluster.get(f"/api/v1/shells/{shell_id}")["shell"]
    assert shell["privateKey"].startswith("-----BEGIN OPENSSH PRIVATE KEY-----") and shell["agentUserGroup"]["user"]
    out = det.ok("shell", "open", shell_id, "echo", "hello-from-0.38.1", timeout=120)
    assert "hello-from-0.38.1" in out, out
    listed = det.ok("shell", "list")
    assert shell_id in listed and "RUNNING" in listed, listed
    assert "Killed shell" in det.ok("shell", "kill", shell_id)
    wait_for(lambda: compat_cluster.get(f"/api/v1/shells/{shell_id}")["shell"]["state"] == "STATE_TERMINATED",
             "the killed shell to end")


def test_det_tensorboard_start_list_kill(det: Det, compat_cluster: CompatCluster, tmp_path: Path) -> None:
    """0.38.1's `det tensorboard start EXP` over a finished experiment: ready behind the master's
    proxy with the trial's scalars, listed, killed."""
    from tests.compat.conftest import MODEL_DIR, write_config

    out = det.ok("experiment", "create", "-f", write_config(tmp_path, "compat-tb", length=6), MODEL_DIR, timeout=180)
    exp_id = int(re.search(r"Created experiment (\d+)", out).group(1))  # type: ignore[union-attr]
    (trial,) = compat_cluster.trials(exp_id)
    out = det.ok("tensorboard", "start", exp_id, "--no-browser", "--config", "resources.slots=0", timeout=180)
    m = re.search(rf"Launched tensorboard \(id: ({UUID})", out)
    assert m and "Tensorboard is running at" in out, out
    tb_id = m.group(1)
    tags = compat_cluster.client.get(f"/proxy/{tb_id}/data/plugin/scalars/tags")
    assert tags.status_code == 200 and "Determined/loss" in tags.json()[f"exp{exp_id}-trial{trial['id']}"], tags.text
    assert tb_id in det.ok("tensorboard", "list")
    assert "Killed tensorboard" in det.ok("tensorboard", "kill", tb_id)
    wait_for(lambda: compat_cluster.get(f"/api/v1/tensorboards/{tb_id}")["tensorboard"]["state"] == "STATE_TERMINATED",
             "the killed TensorBoard to end")
