"""The agent package: the archive of the agent's own code that the master serves to the hosts it
boots (`GET /api/v1/agent/package`).

A cloud instance's user-data (agent_bootstrap/cloud_init.py) and the SSH bootstrap of static hosts
(agent_bootstrap/ssh.py) fetch the agent from the master that launched them, so agent and master
always run the same code and no package index is needed for Shipyard itself. The archive holds the
`agent_bootstrap` package's `__init__`, the `agent` daemon package, the `shipyard_common`
package (what master, agent and harness all speak) and the `harness` (the Core API the agent's
trials import); unpacked into a directory,
`PYTHONPATH=dir python3 -m agent_bootstrap.agent` runs it, on Python 3.9 to 3.13. Its only
third-party imports are httpx, pyyaml, pydantic and tenacity (the harness adds requests, the
docker runtime the docker SDK), at the versions of `agent_bootstrap/constraints.txt`, which the
archive carries for the boot's venv.

The archive is built once per process from the installed source files, byte-for-byte
deterministic (sorted entries, fixed mtimes and owners, gzip without a timestamp), so its digest
identifies the code version.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import io
import tarfile
from dataclasses import dataclass
from pathlib import Path

MEDIA_TYPE = "application/gzip"
# A fixed, non-zero mtime: some tar tools warn about entries dated 1970.
FIXED_MTIME = 946_684_800  # 2000-01-01T00:00:00Z
_SKIP_DIRS = {"__pycache__"}
_SKIP_SUFFIXES = (".pyc", ".pyo")


@dataclass(frozen=True)
class AgentPackage:
    data: bytes
    sha256: str
    files: tuple[str, ...]  # archive member names of the regular files, in order


def _source_files() -> list[tuple[str, Path]]:
    """(archive name, source path) of every file that goes into the package, sorted by name."""
    import agent_bootstrap
    import harness
    import shipyard_common

    bootstrap_dir = Path(agent_bootstrap.__file__).resolve().parent
    found: list[tuple[str, Path]] = [
        ("agent_bootstrap/__init__.py", bootstrap_dir / "__init__.py"),
        # Exact pins of the agent's and the harness's libraries: the boot's venv installs with them.
        ("agent_bootstrap/constraints.txt", bootstrap_dir / "constraints.txt"),
    ]
    agent_dir = bootstrap_dir / "agent"
    for path in agent_dir.rglob("*"):
        rel = path.relative_to(bootstrap_dir)
        if path.is_dir() or any(part in _SKIP_DIRS for part in rel.parts) or path.suffix in _SKIP_SUFFIXES:
            continue
        found.append((f"agent_bootstrap/{rel.as_posix()}", path))
    # The harness goes with the agent: the agent puts it on its trials' PYTHONPATH, so trial code
    # imports the Core API of the same version as the master, whatever the host carries.
    for package in (shipyard_common, harness):
        pkg_dir = Path(package.__file__).resolve().parent
        for path in pkg_dir.rglob("*"):
            rel = path.relative_to(pkg_dir)
            if path.is_dir() or any(part in _SKIP_DIRS for part in rel.parts) or path.suffix in _SKIP_SUFFIXES:
                continue
            found.append((f"{package.__name__}/{rel.as_posix()}", path))
    return sorted(found)


def _dirs_of(names: list[str]) -> list[str]:
    dirs: set[str] = set()
    for name in names:
        parts = name.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            dirs.add("/".join(parts[:i]))
    return sorted(dirs)


def _info(name: str, *, is_dir: bool, size: int = 0) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE if is_dir else tarfile.REGTYPE
    info.mode = 0o755 if is_dir else 0o644
    info.size = size
    info.mtime = FIXED_MTIME
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def build_agent_package() -> AgentPackage:
    """Build the archive from the source files (no caching; see `agent_package`)."""
    files = _source_files()
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in _dirs_of([name for name, _ in files]):
            tar.addfile(_info(d, is_dir=True))
        for name, path in files:
            data = path.read_bytes()
            tar.addfile(_info(name, is_dir=False, size=len(data)), io.BytesIO(data))
    out = io.BytesIO()
    # mtime=0 and no file name in the gzip header: the same sources give the same bytes.
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0, compresslevel=9) as gz:
        gz.write(raw.getvalue())
    data = out.getvalue()
    return AgentPackage(data, hashlib.sha256(data).hexdigest(), tuple(name for name, _ in files))


@functools.cache
def agent_package() -> AgentPackage:
    """The archive of this process's agent code, built on first use."""
    return build_agent_package()
