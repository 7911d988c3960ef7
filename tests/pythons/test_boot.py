"""The agent's boot script on the oldest Python it supports, and on one it does not (issue 26).

A host whose distribution lacks the agent's libraries (or ships pydantic 1) gets a venv with the
versions of the constraints file the agent package carries; a Python older than 3.9 is refused
with one clear line, by the boot and by the agent itself."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

import pytest

from agent_bootstrap.cloud_init import BOOT_SCRIPT_PATH, agent_constraints, render_user_data
from agent_bootstrap.package import build_agent_package
from tests.agent_bootstrap.test_cloud_init import TOKEN, FakeMaster, params
from tests.e2e.boot import FakeMetadataServer, parse_unit, parse_user_data, write_files
from tests.pythons import OUTPUT_TAIL, find_python, inner_env, python_or_skip

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
INSTANCE_ID = "i-0123456789abcdef0"


def boot(python: Path, tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], Path]:
    """The rendered user-data's boot script in a sandbox, with `python` as the host's python3."""
    metadata = FakeMetadataServer().start()
    master = FakeMaster(TOKEN, [])
    sandbox = tmp_path / "root"
    try:
        written = write_files(parse_user_data(render_user_data(params(master_url=master.url))), sandbox)
        env = inner_env(HOME=str(sandbox), SHIPYARD_ROOT=str(sandbox), SHIPYARD_PYTHON=str(python),
                        SHIPYARD_METADATA_URL=metadata.register(INSTANCE_ID, "aws", INSTANCE_ID))
        proc = subprocess.run([str(written[BOOT_SCRIPT_PATH])], env=env, capture_output=True, text=True,
                              timeout=500)
    finally:
        master.stop()
        metadata.stop()
    return proc, sandbox


def test_a_bare_python_3_9_gets_a_venv_with_the_constraints(tmp_path: Path) -> None:
    # A venv of the interpreter without anything installed: as a distribution's python3 without
    # python3-httpx & co (the boot's venv sees the interpreter's own site-packages, bare here too).
    bare = tmp_path / "bare"
    subprocess.run([str(python_or_skip("3.9")), "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    proc, sandbox = boot(bare / "bin" / "python", tmp_path)
    assert proc.returncode == 0, proc.stderr[-OUTPUT_TAIL:]
    assert "event=python_deps_missing" in proc.stderr and "event=agent_installed" in proc.stderr
    venv_python = sandbox / "opt/shipyard-venv/bin/python"
    assert parse_unit(sandbox / "etc/systemd/system/shipyard-agent.service").exec_start[0] == str(venv_python)
    listed = subprocess.run([str(venv_python), "-m", "pip", "list", "--format=freeze", "--disable-pip-version-check"],
                            capture_output=True, text=True, timeout=120, check=True).stdout
    installed = {name.lower().replace("_", "-"): version
                 for name, _, version in (line.partition("==") for line in listed.split())}
    pins = agent_constraints()
    for name in ("httpx", "pyyaml", "pydantic", "pydantic-core", "tenacity", "anyio", "typing-extensions"):
        assert installed.get(name) == pins[name], (name, installed)


def test_a_python_older_than_3_9_is_refused_in_one_line(tmp_path: Path) -> None:
    old = find_python("3.8")
    if old is None:
        pytest.skip("no Python 3.8 to refuse (pyenv install 3.8)")
    proc, sandbox = boot(old, tmp_path)
    assert proc.returncode != 0
    assert "event=boot_failed" in proc.stderr and "the agent needs 3.9 or newer" in proc.stderr, proc.stderr
    assert not (sandbox / "etc/systemd/system/shipyard-agent.service").exists()
    # Started by hand from the package anyway: one line and exit 2 (bad configuration), no traceback.
    dest = tmp_path / "agent"
    with tarfile.open(fileobj=io.BytesIO(build_agent_package().data), mode="r:gz") as tar:
        tar.extractall(dest, filter="data")
    ran = subprocess.run([str(old), "-m", "agent_bootstrap.agent", "--help"], cwd=dest, capture_output=True,
                         text=True, timeout=60, env=dict(inner_env(), PYTHONPATH=str(dest)))
    assert ran.returncode == 2 and "Traceback" not in ran.stderr, ran.stderr
    assert ran.stderr.strip() == f"the Shipyard agent needs Python 3.9 or newer; {old} is 3.8"
