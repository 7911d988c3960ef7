"""cloud-init user-data (agent_bootstrap/cloud_init.py), its boot script, and the agent package the
master serves (agent_bootstrap/package.py)."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent_bootstrap.agent.config import load_config
from agent_bootstrap.cloud_init import (
    BOOT_SCRIPT_PATH,
    CONFIG_PATH,
    CONSTRAINTS_PATH,
    STARTUP_SCRIPT_PATH,
    STORAGE_MODULES,
    TOKEN_PATH,
    BootstrapParams,
    agent_constraints,
    pip_pins,
    render_user_data,
    validate_agent_options,
)
from agent_bootstrap.package import build_agent_package
from tests.e2e.boot import FakeMetadataServer, parse_unit, parse_user_data, write_files
from tests.pg import missing_part

TOKEN = "bootstrap-SECRET-token-0123456789abcdef"


def params(provider: str = "aws", **kw: Any) -> BootstrapParams:
    base: dict[str, Any] = dict(master_url="http://10.0.0.2:8080", pool="gpu", bootstrap_token=TOKEN,
                                provider=provider, launch_id="5f0c2a9e1d4b4e7f8a6b3c2d1e0f9a8b")
    base.update(kw)
    return BootstrapParams(**base)


def files_of(text: str) -> dict[str, dict[str, Any]]:
    doc = yaml.safe_load(text)
    return {f["path"]: f for f in doc["write_files"]}


# ---- the document ------------------------------------------------------------------------------


@pytest.mark.parametrize("provider", ["aws", "gcp"])
def test_user_data_passes_cloud_init_schema(provider: str, tmp_path: Path) -> None:
    if shutil.which("cloud-init") is None:
        missing_part("the cloud-init binary is not installed (apt-get install cloud-init)")
    path = tmp_path / "user-data"
    path.write_text(render_user_data(params(provider, startup_script="echo prepare\n")))
    proc = subprocess.run(["cloud-init", "schema", "--config-file", str(path)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Valid cloud-config" in proc.stdout


def test_user_data_installs_python_and_runs_the_boot_script() -> None:
    text = render_user_data(params())
    assert text.startswith("#cloud-config\n")
    doc = yaml.safe_load(text)
    assert {"python3", "python3-yaml", "python3-httpx"} <= set(doc["packages"])
    assert doc["runcmd"] == [[BOOT_SCRIPT_PATH]]
    boot = files_of(text)[BOOT_SCRIPT_PATH]
    assert boot["permissions"] == "0755"
    assert boot["content"].startswith("#!/bin/bash\n")
    assert "/api/v1/agent/package" in boot["content"]
    # AWS user-data is capped at 16 KB.
    assert len(text.encode()) < 16 * 1024


def test_token_is_only_in_the_token_file_with_mode_0600() -> None:
    text = render_user_data(params(startup_script="echo hi", agent_options={"slot_type": "cpu"}))
    files = files_of(text)
    token_file = files[TOKEN_PATH]
    assert token_file["permissions"] == "0600"
    assert token_file["content"].strip() == TOKEN
    assert text.count(TOKEN) == 1  # nowhere else: not the config, the scripts, runcmd or comments
    for path, f in files.items():
        if path != TOKEN_PATH:
            assert TOKEN not in f["content"]
    assert "token:" not in files[CONFIG_PATH]["content"].replace("token_file:", "")


def test_agent_config_is_valid_for_the_agent(tmp_path: Path) -> None:
    text = render_user_data(params(agent_options={"slot_type": "cpu", "agent_reconnect_attempts": 7}))
    cfg_path = tmp_path / "agent.yaml"
    cfg_path.write_text(files_of(text)[CONFIG_PATH]["content"])
    cfg = load_config(["--config", str(cfg_path), "--instance-id", "i-0abc"], env={})
    assert cfg.master_url == "http://10.0.0.2:8080"
    assert cfg.resource_pool == "gpu"
    assert str(cfg.token_file) == TOKEN_PATH and cfg.token is None
    assert cfg.slot_type == "cpu" and cfg.agent_reconnect_attempts == 7  # pool options win
    assert cfg.on_connection_lost is not None and "poweroff" in cfg.on_connection_lost


def test_startup_script_is_written_only_when_set() -> None:
    assert STARTUP_SCRIPT_PATH not in files_of(render_user_data(params()))
    files = files_of(render_user_data(params(startup_script="apt-get install -y nvidia-driver")))
    script = files[STARTUP_SCRIPT_PATH]
    assert script["permissions"] == "0700"
    assert script["content"].startswith("#!/bin/bash\n") and "nvidia-driver" in script["content"]
    own = files_of(render_user_data(params(startup_script="#!/usr/bin/env python3\nprint(1)\n")))
    assert own[STARTUP_SCRIPT_PATH]["content"] == "#!/usr/bin/env python3\nprint(1)\n"


@pytest.mark.parametrize("provider", ["aws", "gcp"])
def test_boot_script_parses_under_bash_n(provider: str, tmp_path: Path) -> None:
    script = tmp_path / "boot"
    script.write_text(files_of(render_user_data(params(provider, startup_script="true")))[BOOT_SCRIPT_PATH]["content"])
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_the_venv_fallback_installs_the_constraints_the_package_carries() -> None:
    pins = agent_constraints()
    # The whole closure of the agent's and the harness's libraries, each at one exact version.
    assert {"httpx", "httpcore", "h11", "anyio", "idna", "certifi", "pyyaml", "pydantic", "pydantic-core",
            "annotated-types", "typing-extensions", "typing-inspection", "tenacity", "requests", "urllib3",
            "charset-normalizer", "docker"} <= set(pins)
    assert pip_pins() == [f"{name}=={pins[name.lower()]}" for name in ("httpx", "PyYAML", "pydantic", "tenacity")]
    assert pip_pins("docker")[-1] == f"docker=={pins['docker']}"
    # The bucket's storage client of the instance's own cloud, with its closure pinned; never the other's.
    assert pip_pins(provider="aws")[-1] == f"boto3=={pins['boto3']}"
    assert pip_pins("docker", "gcp")[-2:] == [f"docker=={pins['docker']}",
                                             f"google-cloud-storage=={pins['google-cloud-storage']}"]
    assert {"botocore", "s3transfer", "jmespath", "python-dateutil", "six", "google-api-core", "google-auth",
            "google-cloud-core", "google-resumable-media", "google-crc32c", "googleapis-common-protos",
            "protobuf"} <= set(pins)
    for provider, client, other in (("aws", "boto3", "google-cloud-storage"), ("gcp", "google-cloud-storage", "boto3")):
        script = files_of(render_user_data(params(provider)))[BOOT_SCRIPT_PATH]["content"]
        assert f"CONSTRAINTS_PATH={CONSTRAINTS_PATH}\n" in script and '-c "$INSTALL_DIR/$CONSTRAINTS_PATH"' in script
        assert "PIP_PINS=(" + " ".join(pip_pins(provider=provider)) + ")" in script
        assert f"{client}==" in script and f"{other}==" not in script
        assert f"import {STORAGE_MODULES[provider]}'" in script


def test_constraints_pin_urllib3_per_python_for_botocore() -> None:
    # botocore on Python < 3.10 needs urllib3 < 1.27; requests takes either, newer Pythons keep 2.x.
    assert agent_constraints((3, 9))["urllib3"].startswith("1.26.")
    assert agent_constraints((3, 10))["urllib3"].startswith("2.")
    assert agent_constraints((3, 13))["urllib3"] == agent_constraints((3, 10))["urllib3"]
    assert agent_constraints((3, 9))["boto3"] == agent_constraints((3, 13))["boto3"]


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        (dict(provider="azure"), "provider"),
        (dict(master_url="10.0.0.2:8080"), "master_url"),
        (dict(pool="bad pool; rm -rf /"), "pool"),
        (dict(bootstrap_token="short"), "bootstrap_token"),
        (dict(bootstrap_token=TOKEN + "\nruncmd: [evil]"), "bootstrap_token"),
        (dict(launch_id="x y"), "launch_id"),
        (dict(agent_options={"token": "x"}), "agent.token"),
        (dict(agent_options={"no_such_option": 1}), "agent.no_such_option"),
    ],
)
def test_bad_params_are_refused_naming_the_field(kw: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        params(**kw)


def test_validate_agent_options_accepts_agent_keys() -> None:
    assert validate_agent_options({"slot_type": "cuda", "poll_timeout": 5}) == {"slot_type": "cuda", "poll_timeout": 5}
    with pytest.raises(ValueError, match="master_url"):
        validate_agent_options({"master_url": "http://elsewhere"})


# ---- the agent package ---------------------------------------------------------------------------


def test_agent_package_is_deterministic_and_has_no_bytecode() -> None:
    a, b = build_agent_package(), build_agent_package()
    assert a.data == b.data and a.sha256 == b.sha256
    with tarfile.open(fileobj=io.BytesIO(a.data), mode="r:gz") as tar:
        names = tar.getnames()
        assert all(m.mtime == tar.getmembers()[0].mtime for m in tar.getmembers())
    assert "agent_bootstrap/__init__.py" in names
    assert "agent_bootstrap/agent/__main__.py" in names
    assert "shipyard_common/__init__.py" in names and "shipyard_common/model_def.py" in names
    assert "harness/core/__init__.py" in names  # the Core API, for the agent's trials
    assert "agent_bootstrap/constraints.txt" in names  # the exact pins the boot's venv installs
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)
    # Nothing of the master: the agent imports only agent_bootstrap and shipyard_common.
    assert not any(n.startswith("control_plane") for n in names)


def test_agent_package_endpoint_serves_a_runnable_agent(client: Any, admin_headers: dict[str, str],
                                                        tmp_path: Path) -> None:
    assert client.get("/api/v1/agent/package").status_code == 401
    # A user token is not an agent credential.
    assert client.get("/api/v1/agent/package", headers=admin_headers).status_code == 403
    r = client.post("/api/v1/agents/tokens", json={"resourcePool": "default"}, headers=admin_headers)
    assert r.status_code == 200, r.text
    agent_headers = {"Authorization": f"Bearer {r.json()['token']}"}
    r = client.get("/api/v1/agent/package", headers=agent_headers)
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/gzip"
    again = client.get("/api/v1/agent/package", headers={**agent_headers, "If-None-Match": r.headers["etag"]})
    assert again.status_code == 304
    dest = tmp_path / "agent"
    dest.mkdir()
    with tarfile.open(fileobj=io.BytesIO(r.content), mode="r:gz") as tar:
        tar.extractall(dest, filter="data")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(dest)
    proc = subprocess.run([sys.executable, "-m", "agent_bootstrap.agent", "--help"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "--instance-id" in proc.stdout
    # ...and it really is the unpacked copy that ran, not the test's source tree.
    where = subprocess.run(
        [sys.executable, "-c", "import agent_bootstrap.agent.daemon as d, shipyard_common.model_def as m;"
                               "print(d.__file__); print(m.__file__)"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert where.returncode == 0, where.stderr
    assert all(line.startswith(str(dest)) for line in where.stdout.split())
    # A trial of this agent imports the harness it shipped (determined_env.prepare puts it on the
    # trial's PYTHONPATH), from a directory where nothing else provides it.
    task_env = subprocess.run(
        [sys.executable, "-c", "import json, pathlib, sys; from agent_bootstrap.agent import determined_env as d;"
                               "env = dict(json.loads(sys.argv[2]), PYTHONPATH='/user/lib');"
                               "print(d.prepare(env, pathlib.Path(sys.argv[1]))['PYTHONPATH'])",
         str(tmp_path / "task"), json.dumps(TRIAL_ENV)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert task_env.returncode == 0, task_env.stderr
    path = task_env.stdout.strip().split(os.pathsep)
    assert path[1:] == [str(dest), "/user/lib"] and path[0].endswith("det_shim")
    trial = subprocess.run([sys.executable, "-I", "-c", "import sys; sys.path[:0] = sys.argv[1].split(':');"
                            "import harness.core as c; print(c.__file__)", task_env.stdout.strip()],
                           cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert trial.returncode == 0, trial.stderr
    assert trial.stdout.strip().startswith(str(dest / "harness"))


TRIAL_ENV = {"DET_MASTER": "http://10.0.0.2:8080", "DET_CLUSTER_ID": "c-1", "DET_AGENT_ID": "a-1", "DET_TASK_ID": "t-1",
             "DET_ALLOCATION_ID": "t-1.1", "DET_SESSION_TOKEN": "token", "DET_TRIAL_ID": "1",
             "DET_EXPERIMENT_ID": "1", "DET_TRIAL_SEED": "7", "DET_TRIAL_RUN_ID": "1"}


# ---- the boot script, run in a sandbox ---------------------------------------------------------------


class FakeMaster:
    """Serves only the agent package, and only to the bootstrap token."""

    def __init__(self, token: str, order: list[str]) -> None:
        pkg = build_agent_package().data
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                ok = self.path == "/api/v1/agent/package" and self.headers.get("Authorization") == f"Bearer {token}"
                outer.order.append(f"package:{'ok' if ok else 'refused'}")
                body = pkg if ok else b"{}"
                self.send_response(200 if ok else 401)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.order = order
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def metadata() -> Iterator[FakeMetadataServer]:
    server = FakeMetadataServer().start()
    yield server
    server.stop()


def run_boot(text: str, sandbox: Path, metadata: FakeMetadataServer, provider: str,
             instance_id: str) -> subprocess.CompletedProcess[str]:
    written = write_files(parse_user_data(text), sandbox)
    env = {
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "/usr/bin:/bin")]),
        "HOME": str(sandbox),
        "SHIPYARD_ROOT": str(sandbox),
        "SHIPYARD_PYTHON": sys.executable,
        "SHIPYARD_METADATA_URL": metadata.register(instance_id, provider, instance_id),
    }
    return subprocess.run([str(written[BOOT_SCRIPT_PATH])], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.integration
@pytest.mark.parametrize(("provider", "instance_id"), [("aws", "i-0123456789abcdef0"), ("gcp", "shipyard-c1-abc")])
def test_boot_script_installs_the_agent_in_a_sandbox(provider: str, instance_id: str, tmp_path: Path,
                                                     metadata: FakeMetadataServer) -> None:
    order: list[str] = []
    metadata.on_hit = lambda hit: order.append(f"metadata:{hit.status}")
    master = FakeMaster(TOKEN, order)
    try:
        marker = tmp_path / "order-marker"
        text = render_user_data(params(provider, master_url=master.url,
                                       startup_script=f"echo startup >> {marker}\n"))
        sandbox = tmp_path / "root"
        proc = run_boot(text, sandbox, metadata, provider, instance_id)
    finally:
        master.stop()
    assert proc.returncode == 0, proc.stderr
    assert marker.read_text() == "startup\n"
    # The startup script ran first: the metadata service was asked only afterwards (checked by the
    # log's order), then the package was fetched with the bootstrap token.
    events = [line.split("event=")[1].split()[0] for line in proc.stderr.splitlines() if "event=" in line]
    assert events.index("startup_script_done") < events.index("instance_identified") < events.index("agent_installed")
    assert order[-1] == "package:ok" and all(o.startswith("metadata:2") for o in order[:-1])
    if provider == "aws":  # IMDSv2: a session token PUT before the GET
        assert [(h.method, h.path.split("/", 2)[2]) for h in metadata.hits_for(instance_id)] == [
            ("PUT", "latest/api/token"), ("GET", "latest/meta-data/instance-id")]
    assert stat.S_IMODE((sandbox / "etc/shipyard/agent-token").stat().st_mode) == 0o600
    assert (sandbox / "opt/shipyard/agent_bootstrap/agent/__main__.py").is_file()
    unit = parse_unit(sandbox / "etc/systemd/system/shipyard-agent.service")
    assert unit.settings["Restart"] == "on-failure"
    assert unit.environment["PYTHONPATH"] == str(sandbox / "opt/shipyard")
    argv = unit.exec_start
    assert argv[0] == sys.executable and argv[1:3] == ["-m", "agent_bootstrap.agent"]
    assert argv[argv.index("--instance-id") + 1] == instance_id
    assert argv[argv.index("--agent-id") + 1] == instance_id
    assert argv[argv.index("--token-file") + 1] == str(sandbox / "etc/shipyard/agent-token")
    assert TOKEN not in unit.path.read_text() and TOKEN not in proc.stderr + proc.stdout


@pytest.mark.integration
def test_failing_startup_script_stops_the_boot(tmp_path: Path, metadata: FakeMetadataServer) -> None:
    text = render_user_data(params(startup_script="echo broken driver >&2\nexit 3\n"))
    sandbox = tmp_path / "root"
    proc = run_boot(text, sandbox, metadata, "aws", "i-0123456789abcdef0")
    assert proc.returncode != 0
    assert "event=boot_failed" in proc.stderr and "startup script failed" in proc.stderr
    assert metadata.hits == []  # nothing after the startup script ran
    assert not (sandbox / "etc/systemd/system/shipyard-agent.service").exists()


@pytest.mark.integration
def test_boot_fails_clearly_without_an_instance_id(tmp_path: Path, metadata: FakeMetadataServer) -> None:
    # A metadata service that does not know this instance: the boot stops with a clear reason
    # instead of guessing an id.
    text = render_user_data(params())
    written = write_files(parse_user_data(text), tmp_path / "root")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SHIPYARD_ROOT": str(tmp_path / "root"),
           "SHIPYARD_PYTHON": sys.executable, "SHIPYARD_METADATA_URL": metadata.url_for("unknown")}
    script = written[BOOT_SCRIPT_PATH]
    # Two attempts are enough to show the failure path; the real script retries for minutes.
    script.write_text(re.sub(r"(?m)^RETRY_ATTEMPTS=\d+$", "RETRY_ATTEMPTS=2", script.read_text()))
    proc = subprocess.run([str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "cannot read the instance id" in proc.stderr
