"""Shells end to end (issue 29) with Shipyard's `det` against a real master and agent (process
runtime): the task's sshd, started unprivileged with the master's per-task key, is reached only
through the master's WebSocket tunnel: `det shell open ID -- echo hello` prints hello; another user
is refused (404) at the API and at the tunnel; kill stops sshd."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from typing import Any

import httpx
import pytest

from cli.tunnel import TOKEN_ENV
from tests.integration.test_tasks import det, login
from tests.pg import missing_part

pytestmark = [pytest.mark.integration, pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)]


def test_det_shell_open_runs_a_command_through_the_master_tunnel(cluster_factory: Any,
                                                                 capfd: pytest.CaptureFixture[str]) -> None:
    if not os.path.exists("/usr/sbin/sshd") or subprocess.run(["which", "ssh"], capture_output=True).returncode:
        missing_part("openssh-server/openssh-client are not installed (tests/system_deps.sh)")
    os.environ["COLUMNS"] = "240"
    cluster = cluster_factory(agents=1)
    login(capfd, cluster)  # type: ignore[arg-type]
    code, out, err = det(capfd, cluster.url, "shell", "start", "-d", "--config", "resources.slots=0")  # type: ignore[arg-type]
    assert code == 0, (out, err)
    shell_id = out.strip()
    code, out, err = det(capfd, cluster.url, "shell", "open", shell_id, "--", "echo", "hello", "$DET_TASK_ID")  # type: ignore[arg-type]
    assert (code, out) == (0, f"hello {shell_id}\n"), (out, err)
    shell = cluster.get(f"/api/v1/shells/{shell_id}")["shell"]
    assert shell["privateKey"].startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    assert shell["publicKey"].startswith("ssh-ed25519 ") and shell["agentUserGroup"]["user"]
    code, out, _ = det(capfd, cluster.url, "shell", "list")  # type: ignore[arg-type]
    assert code == 0 and shell_id in out and "RUNNING" in out
    assert cluster.client.get(f"/proxy/{shell_id}/").status_code == 400  # HTTP is not SSH
    # Another user reads the shell as any task (issue 30: reads are open) but never its key, and
    # the tunnel (with a real session of theirs) is refused as for a task that does not exist.
    admin = cluster.client
    admin.post("/api/v1/users", json={"user": {"username": "eve"}, "password": "eve-password-1"}).raise_for_status()
    eve = httpx.post(cluster.url + "/api/v1/auth/login", json={"username": "eve", "password": "eve-password-1"}).json()
    seen = httpx.get(f"{cluster.url}/api/v1/shells/{shell_id}", headers={"Authorization": f"Bearer {eve['token']}"})
    assert seen.status_code == 200 and not seen.json()["shell"].get("privateKey"), seen.text
    assert shell["privateKey"] not in seen.text
    tunnel = subprocess.run([sys.executable, "-m", "cli.tunnel", cluster.url, shell_id], input=b"SSH-2.0-x\r\n",
                            capture_output=True, timeout=30, env={**os.environ, TOKEN_ENV: eve["token"]})
    assert tunnel.returncode == 1 and b"refused the tunnel" in tunnel.stderr and b"404" in tunnel.stderr, tunnel
    assert tunnel.stdout == b""
    # Kill: the task ends and its sshd no longer listens.
    code, out, _ = det(capfd, cluster.url, "shell", "logs", shell_id)  # type: ignore[arg-type]
    port = int(re.search(r"sshd listening on port (\d+)", out).group(1))  # type: ignore[union-attr]
    code, out, err = det(capfd, cluster.url, "shell", "kill", shell_id)  # type: ignore[arg-type]
    assert code == 0, err
    deadline = time.monotonic() + 30
    while cluster.get(f"/api/v1/shells/{shell_id}")["shell"]["state"] != "STATE_TERMINATED":
        assert time.monotonic() < deadline, "the killed shell did not end"
        time.sleep(0.3)
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass
