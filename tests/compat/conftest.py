"""Determined's own client (`determined==0.38.1` from PyPI: its `det` CLI and its SDK) against a
real Shipyard cluster.

- `compat_python`: a virtual environment with the package, built once into a cache directory
  (`$SHIPYARD_COMPAT_CACHE`, else `~/.cache/shipyard/compat`) keyed by version and Python, and
  reused by every later run. A failed build skips these tests, or fails them under CI=true.
- `compat_cluster`: one master and two 1-slot agents (`det deploy local`'s `up`) on free ports for
  the whole package, with the admin password of tests/conftest.py (two: a `slots_per_trial: 2`
  trial spans both, as a gang across agents).
- `compat_torch_path`: a directory of symlinks to this environment's torch and the packages it
  needs that the compat venv lacks, for a trial's PYTHONPATH: no second copy of torch is
  downloaded or installed (the cached venv stays as pip built it; nothing in it points here).
- `det` runs `python -m determined.cli ...` in that environment with DET_MASTER set and a
  private HOME (Determined keeps its token store under ~/.config/determined).
- `sdk` runs a small Python script in that environment (`determined.experimental.client`).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from shipyard_common import private_files
from tests.conftest import ADMIN_PASSWORD
from tests.harness.conftest import gcs_bucket, gcs_emulator_host, moto_endpoint, s3_bucket  # noqa: F401 (fixtures)
from tests.pg import free_port, missing_part

DETERMINED_VERSION = "0.38.1"
MODEL_DIR = Path(__file__).resolve().parent.parent / "integration" / "model"


def _cache_root() -> Path:
    env = os.environ.get("SHIPYARD_COMPAT_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "shipyard" / "compat"


def _build_venv(target: Path) -> None:
    """Build in place (a venv cannot be moved: its scripts name their interpreter by path) and
    mark it complete last, so that an interrupted build is thrown away by the next run."""
    if target.exists():
        shutil.rmtree(target)
    subprocess.run([sys.executable, "-m", "venv", str(target)], check=True, capture_output=True)
    subprocess.run([str(target / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    f"determined=={DETERMINED_VERSION}"], check=True, capture_output=True, timeout=900)


@pytest.fixture(scope="session")
def compat_python() -> Path:
    """The interpreter of a venv holding determined==0.38.1."""
    tag = f"determined-{DETERMINED_VERSION}-py{sys.version_info.major}.{sys.version_info.minor}"
    root = _cache_root()
    root.mkdir(parents=True, exist_ok=True)
    target = root / tag
    done = target / ".complete"
    with open(root / f"{tag}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # concurrent runs build it once
        if not done.exists():
            try:
                _build_venv(target)
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as e:
                detail = getattr(e, "stderr", b"") or b""
                missing_part(f"could not build a venv with determined=={DETERMINED_VERSION}: {e} "
                             f"{detail.decode(errors='replace')[-600:] if isinstance(detail, bytes) else detail}")
            done.write_text(DETERMINED_VERSION)
    return target / "bin" / "python"


def _requirement_closure(root: str) -> list[Any]:
    """The installed distributions `root` needs (markers evaluated here), itself first."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    seen: dict[str, Any] = {}
    todo = [root]
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        seen[name] = dist
        for spec in dist.requires or []:
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return list(seen.values())


@pytest.fixture(scope="session")
def compat_torch_path(compat_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Symlinks to torch (and what it needs that the compat venv has not) from the environment
    running the tests (the `torch` extra), to put on a trial's PYTHONPATH."""
    from packaging.utils import canonicalize_name

    try:
        import torch  # noqa: F401
    except ImportError:
        missing_part("torch is not installed in the test environment (pip install -e '.[torch]')")
    site = next((compat_python.parent.parent / "lib").glob("python3*/site-packages"))
    present = {canonicalize_name(p.name.split("-")[0]) for p in site.glob("*.dist-info")}
    link = tmp_path_factory.mktemp("compat-torch")
    for dist in _requirement_closure("torch"):
        if canonicalize_name(dist.metadata["Name"]) in present:
            continue
        for top in {f.parts[0] for f in dist.files or () if f.parts and f.parts[0] != ".."}:
            src = Path(str(dist.locate_file(top)))
            if src.exists() and not (link / top).exists():
                (link / top).symlink_to(src)
    return link


@dataclass
class Run:
    code: int
    out: str
    err: str


@dataclass
class CompatCluster:
    url: str
    state: Path
    data: dict[str, Any]
    client: httpx.Client  # the admin's, to check what the master recorded

    def get(self, path: str, **params: Any) -> Any:
        r = self.client.get(path, params=params)
        r.raise_for_status()
        return r.json()

    def experiment(self, exp_id: int) -> dict[str, Any]:
        return self.get(f"/api/v1/experiments/{exp_id}")["experiment"]

    def trials(self, exp_id: int) -> list[dict[str, Any]]:
        return self.get(f"/api/v1/experiments/{exp_id}/trials")["trials"]


@pytest.fixture(scope="package")
def compat_cluster(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[CompatCluster]:
    """The master reads GCS checkpoints (`det checkpoint download --mode master`) from the emulator."""
    from cli import deploy_local

    gcs_host = request.getfixturevalue("gcs_emulator_host")

    state = tmp_path_factory.mktemp("compat-cluster")
    private_files.private_dir(state)
    private_files.write_private(state / "admin-password", ADMIN_PASSWORD.encode())
    cfg = state / "master.yaml"
    # "compat-bound", without agents, for pool bindings (tests/compat/test_rbac.py); the agents join "default".
    # allow_task_host_access: the experiments name shared_fs storage under their own tmp_path, as
    # Determined's configs name their own host_path (off the cluster's root that is an operator's
    # choice in Shipyard; its refusal is tested in tests/control_plane/api/test_storage_host_access.py).
    cfg.write_text(yaml.safe_dump({"agent_heartbeat_timeout_s": 8, "task_kill_grace_s": 3,
                                   "allow_task_host_access": True,
                                   "resource_pools": [{"name": "default"}, {"name": "compat-bound"}]}))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STORAGE_EMULATOR_HOST", gcs_host)
        data = deploy_local.up(state, agents=2, port=free_port(), db=f"sqlite:///{state / 'shipyard.db'}", slots=1,
                               pool_config=cfg)
    url = data["master_url"]
    token = httpx.post(url + "/api/v1/auth/login", json={"username": "admin", "password": ADMIN_PASSWORD}).json()["token"]
    client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30)
    try:
        yield CompatCluster(url, state, data, client)
    finally:
        client.close()
        deploy_local.down(state, quiet=True)


@pytest.fixture(scope="package")
def compat_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("det-home")


def _env(cluster: CompatCluster, home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DET_", "SHIPYARD_", "PYTHONPATH"))}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), DET_MASTER=cluster.url, NO_COLOR="1",
               PYTHONWARNINGS="ignore", **extra)
    return env


class Det:
    """The real `det`: det("e", "list") → Run; `user`/`password` log in through DET_USER/DET_PASS."""

    def __init__(self, python: Path, cluster: CompatCluster, home: Path) -> None:
        self.python = python
        self.cluster = cluster
        self.home = home

    def __call__(self, *argv: Any, stdin: str | None = None, user: str | None = "admin",
                 password: str = ADMIN_PASSWORD, timeout: float = 120, cwd: Path | None = None) -> Run:
        extra = {"DET_USER": user, "DET_PASS": password} if user else {}
        p = subprocess.run([str(self.python), "-m", "determined.cli", *[str(a) for a in argv]], input=stdin,
                           capture_output=True, text=True, env=_env(self.cluster, self.home, **extra),
                           timeout=timeout, cwd=cwd)
        return Run(p.returncode, p.stdout, p.stderr)

    def ok(self, *argv: Any, **kw: Any) -> str:
        r = self(*argv, **kw)
        assert r.code == 0, f"det {' '.join(map(str, argv))} → {r.code}\n{r.out}\n{r.err}"
        assert "Traceback" not in r.err, r.err
        assert "Consider upgrading" not in r.err, r.err  # no version warning (the master reports 0.38.1)
        return r.out


@pytest.fixture(scope="package")
def det(compat_python: Path, compat_cluster: CompatCluster, compat_home: Path) -> Det:
    return Det(compat_python, compat_cluster, compat_home)


@pytest.fixture(scope="package")
def sdk(compat_python: Path, compat_cluster: CompatCluster, compat_home: Path) -> Any:
    """sdk(script) runs `script` after `client.login(...)` (as admin) and returns what it printed
    last, parsed as JSON."""

    def run(script: str, timeout: float = 120) -> Any:
        prelude = textwrap.dedent(f"""
            import json, sys
            from determined.experimental import client
            client.login(master={compat_cluster.url!r}, user="admin", password={ADMIN_PASSWORD!r})
        """)
        p = subprocess.run([str(compat_python), "-c", prelude + textwrap.dedent(script)], capture_output=True,
                           text=True, env=_env(compat_cluster, compat_home), timeout=timeout)
        assert p.returncode == 0, f"SDK script failed ({p.returncode}):\n{p.stdout}\n{p.stderr}"
        lines = [x for x in p.stdout.splitlines() if x.strip()]
        return json.loads(lines[-1]) if lines else None

    return run


def experiment_config(name: str, *, length: int = 10, step_sleep: float = 0.0, **extra: Any) -> dict[str, Any]:
    """The integration tests' trial (Shipyard's harness) under Determined's config keys."""
    return {
        "name": name,
        "entrypoint": "python3 train.py",
        "hyperparameters": {"lr": 0.1, "step_sleep": step_sleep, "crash_at": -1, "validate_every": 5},
        "searcher": {"name": "single", "metric": "validation_loss", "max_length": {"batches": length}},
        "max_restarts": 0,
        **extra,
    }


def write_config(folder: Path, name: str, **kw: Any) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(experiment_config(name, **kw)))
    return path


TERMINAL = ("STATE_COMPLETED", "STATE_CANCELED", "STATE_ERROR")


def wait_for(predicate: Any, what: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}; last={last!r}")
