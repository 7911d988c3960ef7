"""The harness's libraries for a container image that lacks them (the docker runtime's
`container_harness_libs`).

A trial in an unmodified public image (a PyTorch image, say) imports the harness, which the agent
binds into the container, and the harness imports `requests` and `tenacity`, and the cluster's
checkpoint storage its bucket's client (`boto3` on AWS, `google-cloud-storage` on GCP): such images
carry none of them. For each Python version an image has (asked once per image: `python3 -c ...`
in the image), the agent installs them into a directory of its own with its own pip
(`pip install --target DIR --python-version X.Y --only-binary=:all:`, wheels for that Python and
this host's platform) at the exact pins of agent_bootstrap/constraints.txt for that Python, and
the container gets that directory read-only at CONTAINER_PATH. The task's `sitecustomize` shim
(agent/det_shim) appends it to `sys.path`, after the image's own site-packages: what the image has
wins, the pinned copies only fill what it lacks.

The storage clients installed are those the agent's own interpreter can import (a cloud agent's
boot installs its cloud's only). A build is made in a temporary directory and renamed when
complete, under a lock per Python version, so concurrent tasks wait for one build."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Optional

from agent_bootstrap.agent.pins import STORAGE_CLIENTS, agent_constraints

CONTAINER_PATH = "/opt/shipyard-harness-libs"
ENV = "SHIPYARD_FALLBACK_SITE"
# What the harness imports besides the standard library (harness/core/_session.py, its retries).
HARNESS_REQUIREMENTS = ("requests", "tenacity")
PROBE = "import sys; print('%d.%d' % sys.version_info[:2])"
PIP_TIMEOUT_S = 900


class HarnessLibsUnavailable(Exception):
    """The libraries could not be installed; the message says why (pip's last lines)."""


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def wanted() -> list[str]:
    """The distributions a container's Python gets: the harness's and this agent's storage clients."""
    return list(HARNESS_REQUIREMENTS) + [dist for module, dist in STORAGE_CLIENTS.values() if _importable(module)]


def parse_version(text: str) -> Optional[tuple[int, int]]:
    """`3.10` (the probe's output, maybe with noise around it) → (3, 10); None when it is not one."""
    for line in reversed(text.strip().splitlines()):
        major, dot, minor = line.strip().partition(".")
        if dot and major.isdigit() and minor.isdigit():
            return int(major), int(minor)
    return None


def pip_command(python: tuple[int, int], target: Path, constraints: Path, requirements: list[str]) -> list[str]:
    return [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile",
            "--no-warn-script-location", "--target", str(target), "--python-version", f"{python[0]}.{python[1]}",
            "--only-binary=:all:", "-c", str(constraints), *requirements]


class HarnessLibs:
    """The per-Python directories under `root` (the agent's work directory)."""

    def __init__(self, root: Path, requirements: Optional[list[str]] = None) -> None:
        self.root = root
        self.requirements = sorted(requirements if requirements is not None else wanted())
        self._locks: dict[tuple[int, int], threading.Lock] = {}
        self._guard = threading.Lock()

    def _pins(self, python: tuple[int, int]) -> dict[str, str]:
        return agent_constraints(python)

    def path_for(self, python: tuple[int, int]) -> Path:
        """The directory for `python` (named by the pins and requirements: an upgraded agent builds anew)."""
        pins = self._pins(python)
        key = hashlib.sha256(repr((sorted(pins.items()), self.requirements)).encode()).hexdigest()[:12]
        return self.root / f"py{python[0]}.{python[1]}-{key}"

    def ensure(self, python: tuple[int, int]) -> tuple[Path, bool]:
        """(the directory for `python`, whether it was built now), built if missing. Raises
        HarnessLibsUnavailable with pip's reason."""
        dest = self.path_for(python)
        if (dest / ".complete").exists():
            return dest, False
        with self._guard:
            lock = self._locks.setdefault(python, threading.Lock())
        with lock:
            if (dest / ".complete").exists():
                return dest, False
            self.root.mkdir(parents=True, exist_ok=True)
            os.chmod(self.root, 0o755)
            tmp = dest.with_name(dest.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(mode=0o755)
            constraints = tmp / ".constraints.txt"
            constraints.write_text("".join(f"{n}=={v}\n" for n, v in sorted(self._pins(python).items())))
            # The pins are exact: a host-wide pip constraint must not pull them elsewhere.
            env = {**os.environ, "PIP_CONSTRAINT": "", "PIP_REQUIRE_VIRTUALENV": "0"}
            try:
                proc = subprocess.run(pip_command(python, tmp, constraints, self.requirements), capture_output=True,
                                      text=True, timeout=PIP_TIMEOUT_S, env=env, check=False)
            except (OSError, subprocess.TimeoutExpired) as e:
                shutil.rmtree(tmp, ignore_errors=True)
                raise HarnessLibsUnavailable(f"pip could not run: {e}") from None
            if proc.returncode != 0:
                shutil.rmtree(tmp, ignore_errors=True)
                tail = " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-4:])
                raise HarnessLibsUnavailable(f"pip install --target for Python {python[0]}.{python[1]} failed: {tail}")
            for d, _dirs, files in os.walk(tmp):  # readable by every task user (trials run as their own uids)
                os.chmod(d, 0o755)
                for name in files:  # read for all; what its owner may run, all may run (scripts in bin/)
                    f = os.path.join(d, name)
                    mode = os.lstat(f).st_mode
                    if not os.path.islink(f):
                        os.chmod(f, mode | 0o444 | (0o111 if mode & 0o100 else 0))
            (tmp / ".complete").write_text("\n".join(self.requirements) + "\n")
            shutil.rmtree(dest, ignore_errors=True)
            os.replace(tmp, dest)
            return dest, True
