"""Prepares a trial's directory for Determined's own `determined.core` (shipyard_common/determined_info.py
says what and why): the info files in a private directory of the task, and the shim and the
shipped harness on PYTHONPATH."""

from __future__ import annotations

import json
import os
from pathlib import Path

from shipyard_common import private_files
from shipyard_common.determined_info import INFO_DIR_ENV, info_files

SHIM_DIR = Path(__file__).resolve().parent / "det_shim"
# Where the agent's package was unpacked (agent_bootstrap/package.py): it holds the harness, which
# trials import, of the agent's (and the master's) version.
PACKAGE_ROOT = Path(__file__).resolve().parents[2]


def prepare(env: dict[str, str], task_dir: Path, container_addr: str = "127.0.0.1") -> dict[str, str]:
    """The task's environment with the info files written under `task_dir` (0700 / 0600: they
    hold the task's token); a TensorBoard task gets the shipped harness on PYTHONPATH (its launcher,
    harness/tensorboard/serve.py); another task without a trial id is left as it is."""
    if "DET_TRIAL_ID" not in env:
        return _with_harness(env) if env.get("DET_TASK_TYPE") == "TENSORBOARD" else env
    info_dir = task_dir / ".determined-info"
    private_files.private_dir(info_dir)
    for name, content in info_files(env, container_addr).items():
        private_files.write_private(info_dir / name, json.dumps(content).encode())
    out = dict(env)
    out[INFO_DIR_ENV] = str(info_dir)
    return _with_harness(out, [str(SHIM_DIR)])


def _with_harness(env: dict[str, str], first: list[str] | None = None) -> dict[str, str]:
    out = dict(env)
    existing = out.get("PYTHONPATH")
    shipped = (first or []) + ([str(PACKAGE_ROOT)] if (PACKAGE_ROOT / "harness" / "__init__.py").exists() else [])
    out["PYTHONPATH"] = os.pathsep.join(shipped + ([existing] if existing else []))
    return out
