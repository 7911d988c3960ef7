"""Issue 27, item 1: a non-admin's trial cannot read the cluster's secrets.

A real `det deploy local` cluster (two agents, run as root as in production, on SQLite in the
master's state dir and on PostgreSQL): an admin's trial holds one agent, a non-admin's probe runs on
the other and tries to read the admin password, the master's token key, the database file, the
pool's agent token, both agents' credentials, the master's log and the other trial's directory.
Every read fails with EACCES, the probe runs as its user's uid (not root), and the trial still
reports metrics and checkpoints to shared_fs.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.integration.conftest import Cluster, model_files, trial_config

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs a root agent")]

UID_BASE = 200000  # the agent's default task_uid_base

PROBE = """\
import errno, json, os
print("uid=%d gid=%d groups=%s" % (os.getuid(), os.getgid(), os.getgroups()), flush=True)
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
print("privileges CapEff=%s NoNewPrivs=%s" % (status["CapEff"].strip(), status["NoNewPrivs"].strip()), flush=True)
for name, path in sorted(json.load(open("targets.json")).items()):
    try:
        if name.endswith("_dir"):
            os.listdir(path)
        else:
            open(path, "rb").read(1)
        print("PROBE %s READ" % name, flush=True)
    except OSError as e:
        print("PROBE %s %s" % (name, errno.errorcode.get(e.errno, e.errno)), flush=True)
os.listdir(os.environ["SHIPYARD_DET_INFO_DIR"])  # its own token: readable
print("PROBE own_dir READ", flush=True)
"""


def _file(path: str, text: str) -> dict[str, Any]:
    return {"path": path, "type": 48, "content": base64.b64encode(text.encode()).decode(), "mode": 0o644,
            "mtime": 0, "uid": 0, "gid": 0}


@contextlib.contextmanager
def isolated_cluster(request: pytest.FixtureRequest, runtime: str = "process",
                     image: str | None = None) -> Iterator[Cluster]:
    """A two-agent deploy-local cluster on request.param's database (SQLite in the master's state
    dir, as `det deploy local` lays it out, or PostgreSQL), with its default shared_fs checkpoints."""
    # Not under pytest's tmp_path (0700): task users must traverse the path to their directories.
    base = Path(tempfile.mkdtemp(prefix="shipyard-isolation-", dir="/tmp"))
    os.chmod(base, 0o711)
    db = None
    if request.param == "postgres":
        db = request.getfixturevalue("postgres_server").create_database()
    # deploy local's default checkpoint storage, <state dir>/checkpoints, which the agent creates.
    c = Cluster(base / "cluster", db or "", agents=2, master_yaml=None)
    c.db_url = db  # type: ignore[assignment]
    c.runtime, c.image = runtime, image
    old = os.environ.get("SHIPYARD_CLI_DIR")
    os.environ["SHIPYARD_CLI_DIR"] = str(base / "cli")
    try:
        c.up()
        yield c
    finally:
        c.down()
        if old is None:
            os.environ.pop("SHIPYARD_CLI_DIR", None)
        else:
            os.environ["SHIPYARD_CLI_DIR"] = old
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(params=["sqlite", "postgres"])
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    with isolated_cluster(request) as c:
        yield c


def host_python_env() -> dict[str, str]:
    """This venv's interpreter lives under /root (0700 here): task users run the system's python3 of
    the same version with the venv's packages, as a host with the agent installed system-wide does."""
    if not os.path.exists("/usr/bin/python3"):
        pytest.skip("no /usr/bin/python3 for task users")
    return {"PATH": "/usr/bin:/bin", "PYTHONPATH": sysconfig.get_paths()["purelib"]}


def probe_secrets(cluster: Cluster, env: dict[str, str], **extra: Any) -> tuple[int, dict[str, str]]:
    """An admin's trial holds one agent; a new non-admin user's trial runs the probe on the other,
    then trains. Returns the probe's uid and {secret: errno name or READ}, after checking that it
    read its own info files, reported metrics and checkpointed as itself."""
    state = cluster.state
    holder_cfg = trial_config("holder", environment={"environment_variables": env}, **extra)
    holder_cfg["entrypoint"] = "python3 hold.py"
    holder_id = cluster.submit(holder_cfg, [_file("hold.py", "import time\ntime.sleep(600)\n")])
    tasks = [state / "agents" / f"local-{i}" / "tasks" for i in range(2)]
    other = cluster.wait(lambda: next((d for t in tasks if t.is_dir() for d in t.iterdir()
                                       if (d / ".determined-info").is_dir()), None), 60, "the admin's task directory")
    targets = {
        "admin_password": state / "admin-password",
        "agent_token": state / "agent-token",
        "master_log": state / "master.log",
        "token_secret": state / "master" / "token-secret",
        "master_state_dir": state / "master",
        "credential_0": state / "agents" / "local-0" / "state" / "agent-credential",
        "credential_1": state / "agents" / "local-1" / "state" / "agent-credential",
        "agent_log": state / "agents" / "local-0.log",
        "other_trial_dir": other,
        "other_trial_info_dir": other / ".determined-info",
        "tasks_dir": tasks[0],
        "state_dir": state,
    }
    if not cluster.db_url:
        targets["database"] = state / "master" / "shipyard.db"
    for path in targets.values():
        assert path.exists(), path  # each secret is there: the probe's failures are refusals
    probe_targets = {k: str(v) for k, v in targets.items()}  # the probe lists those ending in _dir

    user_id = cluster.post("/api/v1/users", {"user": {"username": "mallory"},
                                             "password": "mallory-password-1"})["user"]["id"]
    token = httpx.post(cluster.url + "/api/v1/auth/login",
                       json={"username": "mallory", "password": "mallory-password-1"}).json()["token"]
    cfg = trial_config("probe", length=20, environment={"environment_variables": env}, **extra)
    cfg["entrypoint"] = "python3 probe.py && python3 train.py"
    files = model_files() + [_file("probe.py", PROBE), _file("targets.json", json.dumps(probe_targets))]
    r = httpx.post(cluster.url + "/api/v1/experiments", headers={"Authorization": f"Bearer {token}"},
                   json={"config": yaml.safe_dump(cfg), "modelDefinition": files}, timeout=30)
    assert r.status_code == 200, r.text
    exp_id = r.json()["experiment"]["id"]
    cluster.wait_experiment(exp_id, timeout=240)
    trial = cluster.trials(exp_id)[0]
    logs = cluster.logs(trial["id"])
    uid = UID_BASE + user_id
    # No supplementary group but its own (a container lists its primary group there too).
    assert f"uid={uid} gid={uid} groups=[]" in logs or f"uid={uid} gid={uid} groups=[{uid}]" in logs, logs
    assert "privileges CapEff=0000000000000000 NoNewPrivs=1" in logs, logs
    probed = [line.split("PROBE ", 1)[1].split() for line in logs.splitlines() if "PROBE " in line]
    results = {name: outcome for name, outcome in probed}
    assert results.pop("own_dir", None) == "READ", logs
    assert set(results) == set(probe_targets), logs
    # It still trained and checkpointed, as its own user, into the shared directory.
    assert cluster.metrics(trial["id"], "training")
    ckpt_dir = state / "checkpoints"
    # Beside them, the cluster's TensorBoard tree: its shared levels are root's, made by the agent
    # (agent/tensorboard_dirs.py), so that no user can take another experiment's place in it.
    trees = [p for p in ckpt_dir.iterdir() if (p / "tensorboard").is_dir()]
    assert all(p.stat().st_uid == 0 and (p / "tensorboard" / "experiment").stat().st_uid == 0 for p in trees)
    ckpts = [p for p in ckpt_dir.iterdir() if p not in trees]
    assert ckpts and all(p.stat().st_uid == uid for p in ckpts)
    assert ckpt_dir.stat().st_mode & 0o7777 == 0o1777
    cluster.post(f"/api/v1/experiments/{holder_id}/kill")
    return uid, results


def test_a_non_admins_trial_reads_none_of_the_clusters_secrets(cluster: Cluster) -> None:
    # det deploy local's layout: traverse-only directories on the way to the task directories,
    # everything else its owner's alone.
    state = cluster.state
    modes = {p: p.stat().st_mode & 0o7777 for p in (
        state, state / "agents", state / "admin-password", state / "agent-token", state / "master",
        state / "master.log", state / "master-config.yaml", state / "agents" / "local-0.log")}
    assert modes == {state: 0o711, state / "agents": 0o711, state / "admin-password": 0o600,
                     state / "agent-token": 0o600, state / "master": 0o700, state / "master.log": 0o600,
                     state / "master-config.yaml": 0o600, state / "agents" / "local-0.log": 0o600}
    _, results = probe_secrets(cluster, host_python_env())
    assert results == {name: "EACCES" for name in results}
