"""tests/gpu/check.sh on a machine without an NVIDIA GPU (this one): it says so in one line and exits 2,
without starting anything. The GPU checks themselves need a GPU machine (README, GPUs)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

CHECK = Path(__file__).with_name("check.sh")

# nvidia-smi where the driver is not loaded: installed, but it lists nothing and fails.
BROKEN_SMI = """#!/bin/sh
echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver." >&2
exit 9
"""


@pytest.mark.parametrize("smi", [None, BROKEN_SMI], ids=["no-nvidia-smi", "nvidia-smi-without-driver"])
def test_check_says_there_is_no_gpu_in_one_line_and_exits_2(tmp_path: Path, smi: str | None) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if smi is not None:
        (bin_dir / "nvidia-smi").write_text(smi)
        (bin_dir / "nvidia-smi").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}
    proc = subprocess.run(["bash", str(CHECK)], env=env, capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("NO GPU: "), proc.stdout
    assert proc.stderr == ""
