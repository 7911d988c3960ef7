"""A real Docker engine for the docker runtime's tests: `dockerd` (Debian's docker.io, installed by
tests/system_deps.sh) started once per test session on its own socket, with the vfs storage
driver, host networking only (no bridge, no iptables) and its state in a throwaway directory. With
CI=true an engine that is missing or does not start fails these tests; elsewhere they skip."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.docker.cgroups import mount_all_v1_controllers
from tests.docker.images import ensure_image, host_mounts
from tests.pg import missing_part


@dataclass
class Engine:
    socket_url: str
    client: Any  # docker.DockerClient
    image: str  # the test image (tests/docker/images.py)
    log_path: Path

    def containers(self, agent_id: str, all: bool = True) -> list[dict[str, Any]]:
        return self.client.api.containers(all=all, filters={"label": f"shipyard.agent={agent_id}"})


def _dockerd() -> str | None:
    return shutil.which("dockerd") or next((p for p in ("/usr/sbin/dockerd", "/usr/bin/dockerd") if os.access(p, os.X_OK)),
                                          None)


@pytest.fixture(scope="session")
def docker_engine() -> Iterator[Engine]:
    binary = _dockerd()
    if binary is None:
        missing_part("dockerd is not installed (apt-get install docker.io)")
    if os.geteuid() != 0:
        missing_part("dockerd needs root")
    try:
        import docker
    except ImportError:
        missing_part("the docker Python package is not installed")
    mount_all_v1_controllers()  # else a strict boot's machine breaks Docker's OOM reports here (tests/docker/cgroups.py)
    # A short socket path (unix sockets are limited to ~107 bytes); state on disk, not in /tmp's tmpfs.
    sock_dir = Path(tempfile.mkdtemp(prefix="sy-dockerd-", dir="/tmp"))
    state = Path(tempfile.mkdtemp(prefix="shipyard-dockerd-", dir="/var/tmp" if os.path.isdir("/var/tmp") else None))
    url = f"unix://{sock_dir}/docker.sock"
    log_path = state / "dockerd.log"
    cmd = [binary, "--host", url, "--storage-driver", "vfs", "--data-root", str(state / "data"),
           "--exec-root", str(state / "exec"), "--pidfile", str(state / "docker.pid"),
           "--iptables=false", "--ip6tables=false", "--bridge=none", "--ip-masq=false"]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    client = None
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                missing_part(f"dockerd exited with {proc.returncode}: {log_path.read_text(errors='replace')[-1500:]}")
            try:
                client = docker.DockerClient(base_url=url, timeout=120)
                client.ping()
                break
            except Exception as e:
                if client is not None:
                    client.close()
                    client = None
                if time.monotonic() > deadline:
                    missing_part(f"dockerd did not answer on {url}: {e}; "
                                 f"log: {log_path.read_text(errors='replace')[-1500:]}")
                time.sleep(0.2)
        image = ensure_image(client)
        yield Engine(socket_url=url, client=client, image=image, log_path=log_path)
    finally:
        if client is not None:
            # Killed, not removed: removing a container copies nothing but deletes its whole root on
            # the vfs driver (tens of seconds each); the engine's state goes below, all at once.
            for c in client.api.containers(filters={"status": "running"}):
                try:
                    client.api.kill(c["Id"])
                except Exception:
                    pass
            client.close()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        _unmount_under(state)  # dockerd leaves its network namespace's nsfs mount behind
        shutil.rmtree(sock_dir, ignore_errors=True)
        _remove_in_background(state)


def _remove_in_background(path: Path) -> None:
    """Delete the engine's state (the vfs copies of every image and container: gigabytes, close to
    a minute here) in a process of its own, so the test session does not wait for it; each session
    has its own fresh directory, so nothing reads it any more."""
    subprocess.Popen(["rm", "-rf", "--one-file-system", str(path)], stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def _unmount_under(root: Path) -> None:
    prefix = str(root) + "/"
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return
    points = [line.split()[4] for line in lines if len(line.split()) > 4 and line.split()[4].startswith(prefix)]
    for point in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)


@pytest.fixture
def mounts() -> list[str]:
    return host_mounts()
