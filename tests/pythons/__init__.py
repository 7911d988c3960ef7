"""The agent and the harness on every Python they support (issue 26): 3.9 to 3.13.

The master runs on 3.11+ and the main suite on 3.11. The agent runs on the hosts' own Python (Ubuntu
22.04 has 3.10, Debian 11 3.9) and the harness inside users' training images, so each of
tests/pythons/test_python_3_*.py takes one other interpreter (pyenv's, or `python3.X` on PATH;
missing: a skip, a failure with CI=true) and

- makes a venv for it in a cache outside the repository
  (`~/.cache/shipyard/pythons/<version>-<hash>`, reused while the constraints, the test pins and
  the interpreter are the same) with exactly the agent's constraints file
  (agent_bootstrap/constraints.txt) and the test tools below, none of the master's dependencies;
  every library installed there must be at a version they pin (the constraints hold the closure);
- unpacks the agent package the master serves (agent_bootstrap/package.py) into an empty
  directory and runs `python -m agent_bootstrap.agent --help` and imports the harness from it;
- runs the agent's, the harness's and the shared package's tests with that interpreter
  (PYTHONPATH = the repository). Tests that start a master get one running on the main venv's
  interpreter (SHIPYARD_MASTER_PYTHON, tests/conftest.py's LiveMaster), so the agents they start
  are of the interpreter under test.

What the inner runs leave out, and why (all of it runs in the main suite):
- tests/agent_bootstrap/test_ssh.py: the master's SSH bootstrap of static hosts (paramiko, the
  static provider): master code, on 3.11+.
- `[postgres]` cases (`-k "not postgres"`): making a PostgreSQL database needs psycopg2 in the test
  process; the SQLite cases run the same agent code against the same master.
- The S3 and GCS cases of tests/harness/test_storage.py, test_tensorboard_events.py and
  test_tensorboard_serve.py: their servers
  (moto, gcp-storage-emulator) are not installed there. The clients (boto3, google-cloud-storage)
  are, at the constraints' pins (a cloud agent's boot installs its own cloud's;
  tests/e2e/test_strict_master_boot.py checkpoints through them on 3.9).
- The tests of tests/shipyard_common/test_private_files.py that use the det CLI or the local
  provider, and tests/agent_bootstrap/test_cloud_init.py's package endpoint test (the in-process
  master app): master code. The package check above runs the served archive on each interpreter.
- tests/agent_bootstrap/test_agent_integration.py (agent processes against a real master, about
  80 s of each run) runs on 3.9, the oldest agent host's Python (Debian 11; the main suite runs it
  on 3.11, and the strict boot runs a cloud agent on 3.9); 3.10 (Ubuntu 22.04, the clouds' default
  images), 3.12 and 3.13 (the newer training images', for the harness) run all the rest, keeping
  the four runs within a few minutes of `make test`.
- tests/harness/test_launch_distributed.py skips itself without torch (as in the main suite when
  the `torch` extra is not installed).

tests/pythons/test_boot.py runs the boot script on a bare Python 3.9 (its venv fallback installs
the constraints) and on 3.8 (refused in one line).
"""

from __future__ import annotations

import glob
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.locks import file_lock
from tests.pg import missing_part

ROOT = Path(__file__).resolve().parents[2]
CONSTRAINTS = ROOT / "agent_bootstrap" / "constraints.txt"
# What the inner runs need besides the agent's libraries, at versions every interpreter from 3.9 to
# 3.13 installs (pytest 9 and newer hypothesis releases need 3.10).
TEST_PINS = """\
pytest==8.4.2
pytest-timeout==2.4.0
hypothesis==6.141.1
attrs==26.1.0
sortedcontainers==2.4.0
iniconfig==2.1.0
pluggy==1.6.0
packaging==26.3
pygments==2.21.0
tomli==2.5.0
"""
# boto3 and google-cloud-storage: the storage clients a cloud agent's boot installs (one per cloud), so
# that their pinned closure is proven to install on every interpreter, and the boot tests find the
# host's Python complete (no venv fallback).
REQUIREMENTS = ("httpx", "pyyaml", "pydantic", "tenacity", "requests", "boto3", "google-cloud-storage", "pytest",
                "pytest-timeout", "hypothesis")
TEST_PATHS = ("tests/agent_bootstrap", "tests/harness", "tests/shipyard_common")
KEYWORDS = "not postgres"
IGNORED = ("tests/agent_bootstrap/test_ssh.py",)
AGENT_INTEGRATION = "tests/agent_bootstrap/test_agent_integration.py"
DESELECTED = (
    *(f"tests/harness/test_storage.py::{test}[{store}]" for store in ("s3", "gcs") for test in (
        "test_round_trip_is_byte_identical_and_delete_removes_it", "test_probe_leaves_nothing_behind",
        "test_checkpoint_context_store_and_restore")),
    "tests/harness/test_storage.py::test_missing_s3_bucket_fails_at_init",
    "tests/harness/test_tensorboard_events.py::test_sync_to_buckets[s3]",
    "tests/harness/test_tensorboard_events.py::test_sync_to_buckets[gcs]",
    "tests/harness/test_tensorboard_serve.py::test_a_trials_uploaded_event_files_reach_the_tensorboard[s3]",
    "tests/harness/test_tensorboard_serve.py::test_a_trials_uploaded_event_files_reach_the_tensorboard[gcs]",
    "tests/harness/test_storage.py::test_missing_gcs_bucket_fails_at_init",
    "tests/harness/test_storage_files.py::test_list_and_delete_some_files[s3]",
    "tests/harness/test_storage_files.py::test_list_and_delete_some_files[gcs]",
    "tests/shipyard_common/test_private_files.py::test_the_cli_token_cache_is_private",
    "tests/shipyard_common/test_private_files.py::test_deploy_local_state_is_private",
    "tests/shipyard_common/test_private_files.py::test_the_local_providers_directory_is_private",
    "tests/agent_bootstrap/test_cloud_init.py::test_agent_package_endpoint_serves_a_runnable_agent",
)
SUITE_TIMEOUT_S = 600
OUTPUT_TAIL = 8000


def required() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def _reports(python: str, version: str) -> bool:
    try:
        out = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and out.stdout.strip() == version


def _patch(path: str) -> int:
    m = re.search(r"/\d+\.\d+\.(\d+)/bin/", path)
    return int(m.group(1)) if m else -1


def find_python(version: str) -> Path | None:
    """The newest release of Python `version` ("3.9") that pyenv carries, else `python3.9` on PATH."""
    roots = {os.environ.get("PYENV_ROOT") or "", str(Path.home() / ".pyenv"), "/root/.pyenv"}
    found = [p for root in sorted(r for r in roots if r)
             for p in glob.glob(f"{root}/versions/{version}.*/bin/python{version}")
             if re.fullmatch(r"\d+\.\d+\.\d+", Path(p).parents[1].name)]
    candidates = sorted(found, key=_patch, reverse=True)
    on_path = shutil.which(f"python{version}")
    if on_path:
        candidates.append(on_path)
    return next((Path(c) for c in candidates if _reports(c, version)), None)


def python_or_skip(version: str) -> Path:
    python = find_python(version)
    if python is None:
        missing_part(f"no Python {version} (pyenv install {version}, or python{version} on PATH)")
    assert python is not None
    return python


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "shipyard" / "pythons"


def venv_key(python: Path) -> str:
    full = subprocess.run([str(python), "-c", "import sys; print(sys.version)"], capture_output=True, text=True,
                          timeout=30, check=True).stdout
    h = hashlib.sha256()
    for part in (CONSTRAINTS.read_text(), TEST_PINS, " ".join(REQUIREMENTS), str(python.resolve()), full):
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:12]


def venv_for(version: str, python: Path) -> Path:
    """The cached venv of `python` with the constraints and the test tools (made on first use, under
    a lock; other venvs of this version, from older constraints, are removed then)."""
    root = cache_root()
    venv = root / f"{version}-{venv_key(python)}"
    ready = venv / ".shipyard-ready"
    with file_lock(root / f"{version}.lock"):
        if ready.exists():
            return venv
        shutil.rmtree(venv, ignore_errors=True)
        for stale in root.glob(f"{version}-*"):
            shutil.rmtree(stale, ignore_errors=True)
        subprocess.run([str(python), "-m", "venv", str(venv)], check=True, capture_output=True, timeout=300)
        pins = venv / "test-pins.txt"
        pins.write_text(TEST_PINS)
        install = subprocess.run(
            [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
             "-c", str(CONSTRAINTS), "-c", str(pins), *REQUIREMENTS],
            capture_output=True, text=True, timeout=600)
        if install.returncode != 0:
            shutil.rmtree(venv, ignore_errors=True)
            raise AssertionError(f"Python {version}: the constraints do not install "
                                 f"({python}):\n{(install.stdout + install.stderr)[-OUTPUT_TAIL:]}")
        ready.write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    return venv


def exact_pins(text: str) -> dict[str, set[str]]:
    """`name==version` lines of a constraints text as {normalized name: its versions} (more than one
    where pins carry Python markers, `urllib3==…; python_version < "3.10"`)."""
    pins: dict[str, set[str]] = {}
    for line in text.splitlines():
        name, sep, version = line.split("#", 1)[0].split(";", 1)[0].strip().partition("==")
        if sep:
            pins.setdefault(re.sub(r"[-_.]+", "-", name).lower(), set()).add(version.strip())
    return pins


def unpinned(venv: Path) -> list[str]:
    """What the venv holds at a version the constraints and the test pins do not name: the
    constraints must pin the agent's whole closure on every interpreter."""
    listed = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "list", "--format=freeze",
                             "--disable-pip-version-check"], capture_output=True, text=True, timeout=120, check=True)
    pins = {**exact_pins(CONSTRAINTS.read_text()), **exact_pins(TEST_PINS)}
    installed = {name: version for name, (version,) in exact_pins(listed.stdout).items()}
    return sorted(f"{name}=={version}" for name, version in installed.items()
                  if name not in ("pip", "setuptools", "wheel") and version not in pins.get(name, set()))


def inner_env(**extra: str) -> dict[str, str]:
    """This environment without what belongs to the outer pytest (xdist's worker, addopts)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_") and k != "PYTHONPATH"}
    env.update(extra)
    return env


def check_agent_package(version: str) -> None:
    """The archive the master serves, unpacked where nothing else is: the agent starts (`--help`)
    and the shared package and the harness it carries import, with the venv's libraries only,
    every one of them at the version the constraints pin."""
    from agent_bootstrap.package import build_agent_package

    venv = venv_for(version, python_or_skip(version))
    assert unpinned(venv) == [], f"Python {version}: installed but not pinned in {CONSTRAINTS.name}"
    py = str(venv / "bin" / "python")
    with tempfile.TemporaryDirectory(prefix=f"shipyard-pkg-{version}-") as tmp:
        dest = Path(tmp) / "agent"
        with tarfile.open(fileobj=io.BytesIO(build_agent_package().data), mode="r:gz") as tar:
            tar.extractall(dest, filter="data")
        env = inner_env(PYTHONPATH=str(dest), PYTHONDONTWRITEBYTECODE="1")
        helped = subprocess.run([py, "-m", "agent_bootstrap.agent", "--help"], cwd=tmp, env=env,
                                capture_output=True, text=True, timeout=120)
        assert helped.returncode == 0 and "usage: det-agent" in helped.stdout, helped.stdout + helped.stderr
        modules = ("agent_bootstrap.agent.__main__", "agent_bootstrap.agent.runtime.docker",
                   "agent_bootstrap.agent.det_shim.sitecustomize", "shipyard_common.agent_protocol",
                   "harness.core", "harness.storage", "harness.launch.torch_distributed")
        code = ("import importlib, sys\n"
                "for name in sys.argv[1:]:\n"
                "    print(importlib.import_module(name).__file__)\n")
        imported = subprocess.run([py, "-c", code, *modules], cwd=tmp, env=env, capture_output=True, text=True,
                                  timeout=120)
        assert imported.returncode == 0, imported.stderr[-OUTPUT_TAIL:]
        files = imported.stdout.split()
        assert len(files) == len(modules) and all(f.startswith(str(dest)) for f in files), imported.stdout


def run_suite(version: str, *, with_master: bool = True) -> None:
    """The agent's, the harness's and the shared package's tests under Python `version`;
    `with_master=False` leaves out the agent's integration tests (see the module's docstring)."""
    venv = venv_for(version, python_or_skip(version))
    ignored = IGNORED + (() if with_master else (AGENT_INTEGRATION,))
    with tempfile.TemporaryDirectory(prefix=f"shipyard-py{version}-") as tmp:
        cmd = [str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider",
               "--basetemp", str(Path(tmp) / "basetemp"), "-k", KEYWORDS,
               *(f"--ignore={p}" for p in ignored), *(f"--deselect={n}" for n in DESELECTED), *TEST_PATHS]
        env = inner_env(PYTHONPATH=str(ROOT), SHIPYARD_MASTER_PYTHON=sys.executable)
        try:
            proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, timeout=SUITE_TIMEOUT_S)
        except subprocess.TimeoutExpired as e:
            out = e.stdout if isinstance(e.stdout, str) else (e.stdout or b"").decode(errors="replace")
            raise AssertionError(f"Python {version}: the tests ran past {SUITE_TIMEOUT_S} s:\n"
                                 f"{out[-OUTPUT_TAIL:]}") from None
    assert proc.returncode == 0, (f"Python {version} ({venv}): pytest exited {proc.returncode}:\n"
                                  f"{proc.stdout[-OUTPUT_TAIL:]}")


def version_tests(version: str, *, with_master: bool = True) -> tuple[Callable[[], None], Callable[[], None]]:
    """The two tests of one interpreter, for its module (one module per interpreter, so that xdist's
    --dist loadfile spreads them over the workers): the agent package runs, the tests pass."""

    @pytest.mark.timeout(900)  # a cold cache installs the constraints first
    def test_the_agent_package_runs() -> None:
        check_agent_package(version)

    @pytest.mark.timeout(900)
    def test_the_agent_and_harness_tests_pass() -> None:
        run_suite(version, with_master=with_master)

    return test_the_agent_package_runs, test_the_agent_and_harness_tests_pass
