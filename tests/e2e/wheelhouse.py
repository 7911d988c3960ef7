"""A local stand-in for the package index the master's pip reads: exactly the wheels a release's
constraints pin, built once per set of pins into ~/.cache/shipyard/wheelhouse-<hash> (outside the
repository) with this machine's pip (`pip wheel --no-deps`: a wheel from the index where there is
one, built from the sdist where there is not), for the interpreter of the clean image (CPython 3.11
on Debian bookworm; this venv's interpreter is a 3.11 too).

The strict master boot (tests/e2e/test_strict_master_boot.py) mounts the directory read-only in the
master's machine and points pip at it through the machine's environment (PIP_NO_INDEX,
PIP_FIND_LINKS), never through the user-data: the boot's own `pip install` lines run unchanged."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.locks import file_lock

CACHE_ROOT = Path(os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache"))) / "shipyard"


class WheelhouseUnavailable(Exception):
    pass


def pins_of(constraints: Path) -> list[str]:
    return sorted(line.strip() for line in constraints.read_text().splitlines()
                  if line.strip() and not line.lstrip().startswith("#"))


def ensure_wheelhouse(constraints: Path) -> Path:
    """The directory of wheels for exactly the pins of `constraints`, built if not cached."""
    pins = pins_of(constraints)
    key = hashlib.sha256(("\n".join(pins) + f"\n{sys.version_info[:2]}").encode()).hexdigest()[:16]
    dest = CACHE_ROOT / f"wheelhouse-{key}"
    if (dest / ".complete").exists():
        return dest
    CACHE_ROOT.mkdir(parents=True, exist_ok=True)
    with file_lock(CACHE_ROOT / "wheelhouse.lock"):
        if (dest / ".complete").exists():
            return dest
        tmp = dest.with_name(dest.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        req = tmp / "requirements.txt"
        req.write_text("\n".join(pins) + "\n")
        # This machine's own pip constraints (if any) must not pull the pins elsewhere: exactly these.
        env = {**os.environ, "PIP_CONSTRAINT": "", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
        proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-r", str(req),
                               "-w", str(tmp)], capture_output=True, text=True, timeout=1200, env=env,
                              check=False)
        if proc.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            raise WheelhouseUnavailable(f"pip wheel of the release's pins failed: {(proc.stdout + proc.stderr)[-2000:]}")
        req.unlink()
        (tmp / ".complete").write_text("\n".join(pins) + "\n")
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(tmp, dest)
    return dest
