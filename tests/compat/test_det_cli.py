"""The real `det` of determined==0.38.1 against Shipyard: what it prints, and what the master
recorded. One cluster and one finished experiment serve most tests (tests/compat/conftest.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.compat.conftest import MODEL_DIR, TERMINAL, CompatCluster, Det, wait_for, write_config
from tests.conftest import ADMIN_PASSWORD


def login_status(cluster: CompatCluster, username: str, password: str) -> int:
    return httpx.post(cluster.url + "/api/v1/auth/login", json={"username": username, "password": password}).status_code


@pytest.fixture(scope="package")
def finished(det: Det, compat_cluster: CompatCluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """`det e create -f`: created, followed to the end; the experiment's id, trial and checkpoints."""
    folder = tmp_path_factory.mktemp("cfg")
    out = det.ok("experiment", "create", "-f", write_config(folder, "compat-main"), MODEL_DIR)
    m = re.search(r"Created experiment (\d+)", out)
    assert m, out
    exp_id = int(m.group(1))
    assert "Following first trial with ID" in out and "trial " in out  # the trial's own log line, followed
    exp = wait_for(lambda: (lambda e: e if e["state"] in TERMINAL else None)(compat_cluster.experiment(exp_id)),
                   "the experiment to end")
    assert exp["state"] == "STATE_COMPLETED", exp
    trial = compat_cluster.trials(exp_id)[0]
    ckpts = compat_cluster.get(f"/api/v1/experiments/{exp_id}/checkpoints")["checkpoints"]
    return {"id": exp_id, "trial": trial, "checkpoints": ckpts, "folder": folder}


def test_master_info(det: Det) -> None:
    r = det("master", "info")
    assert r.code == 0 and "clusterName: shipyard" in r.out and "userManagementEnabled: true" in r.out
    # /info's version is the Determined API version served: the client compares it with its own and
    # has nothing to warn about (Shipyard's own version is in shipyardVersion, which it does not print).
    assert "version: 0.38.1" in r.out, r.out
    assert "less than" not in r.err and "Consider upgrading" not in r.err, r.err


def test_cluster_message_set_get_clear(det: Det) -> None:
    det.ok("master", "cluster-message", "set", "-m", "maintenance tonight", "--duration", "1h")
    got = json.loads(det.ok("master", "cluster-message", "get", "--json"))["clusterMessage"]
    assert got["message"] == "maintenance tonight" and {"startTime", "endTime", "createdTime"} <= set(got), got
    assert "message: maintenance tonight" in det.ok("master", "cluster-message", "get")
    refused = det("master", "cluster-message", "set", "-m", "later", "--duration", "2w")  # Go has no weeks
    assert refused.code == 1 and "duration" in refused.err, refused
    det.ok("master", "cluster-message", "clear")
    assert json.loads(det.ok("master", "cluster-message", "get", "--json")).get("clusterMessage") is None


def test_user_login_whoami_logout(det: Det) -> None:
    r = det("user", "login", "admin", stdin=ADMIN_PASSWORD + "\n", user=None)
    assert r.code == 0, r.err
    assert "You are logged in as user 'admin'" in det.ok("user", "whoami", user=None)
    det.ok("user", "logout", user=None)
    r = det("user", "whoami", user=None)  # the cached token is gone: the default user fails to log in
    assert "admin" not in r.out


def test_user_create_change_password_deactivate(det: Det, compat_cluster: CompatCluster) -> None:
    det.ok("user", "create", "compat-bob", "--password", "Bob-passw0rd")
    assert "compat-bob" in det.ok("user", "list")
    r = det("user", "change-password", "compat-bob", stdin="Bob-new-passw0rd\nBob-new-passw0rd\n")
    assert r.code == 0, r.err
    # Recorded: the new password logs in, the old one does not.
    assert login_status(compat_cluster, "compat-bob", "Bob-new-passw0rd") == 200
    assert login_status(compat_cluster, "compat-bob", "Bob-passw0rd") in (401, 403)
    assert "compat-bob" in det.ok("user", "whoami", user="compat-bob", password="Bob-new-passw0rd")
    linked = det("user", "link-with-agent-user", "compat-bob", "--agent-uid", "1000", "--agent-gid", "1000",
                 "--agent-user", "bob", "--agent-group", "bob")
    assert linked.code != 0 and "linking a user to an agent user is not supported" in linked.err, linked
    det.ok("user", "deactivate", "compat-bob")
    bob = [u for u in compat_cluster.get("/api/v1/users")["users"] if u["username"] == "compat-bob"][0]
    assert bob["active"] is False
    assert login_status(compat_cluster, "compat-bob", "Bob-new-passw0rd") in (401, 403)
    assert det("user", "whoami", user="compat-bob", password="Bob-new-passw0rd").code != 0
    det.ok("user", "activate", "compat-bob")
    assert login_status(compat_cluster, "compat-bob", "Bob-new-passw0rd") == 200


def test_experiment_list_and_describe(det: Det, finished: dict[str, Any]) -> None:
    exp_id, trial = finished["id"], finished["trial"]
    listed = det.ok("experiment", "list")
    assert re.search(rf"^\s*{exp_id} \| admin\s+\| compat-main .*COMPLETED", listed, re.M), listed
    out = det.ok("experiment", "describe", exp_id)
    assert "compat-main" in out and "Workloads:" in out
    assert re.search(rf"^\s*{trial['id']} \|\s+10 \|.*COMPLETED", out, re.M), out  # the last step's checkpoint


def test_experiment_list_trials_and_checkpoints(det: Det, finished: dict[str, Any]) -> None:
    exp_id, trial = finished["id"], finished["trial"]
    out = det.ok("experiment", "list-trials", exp_id)
    assert re.search(rf"^\s*{trial['id']} \| COMPLETED", out, re.M), out
    out = det.ok("experiment", "list-checkpoints", exp_id)
    best = [c for c in finished["checkpoints"] if c["state"] == "STATE_COMPLETED"]
    assert best and best[0]["uuid"] in out and "state.json" in out


def test_trial_describe_and_logs(det: Det, finished: dict[str, Any]) -> None:
    trial = finished["trial"]
    out = det.ok("trial", "describe", trial["id"])
    assert '"validation_loss"' in out and "Checkpoint UUID" in out
    completed = [c["uuid"] for c in finished["checkpoints"] if c["state"] == "STATE_COMPLETED"]
    assert completed[0] in out
    out = det.ok("trial", "describe", trial["id"], "--metrics")
    assert "Workload Metrics" in out and '"loss"' in out
    out = det.ok("trial", "logs", trial["id"])
    assert f"trial {trial['id']} run 1" in out
    out = det.ok("trial", "logs", "-f", trial["id"])  # the trial has ended: the follow ends too
    assert f"trial {trial['id']} run 1" in out


def test_checkpoint_describe_and_download(det: Det, finished: dict[str, Any], tmp_path: Path) -> None:
    ckpt = [c for c in finished["checkpoints"] if c["state"] == "STATE_COMPLETED"][0]
    out = det.ok("checkpoint", "describe", ckpt["uuid"])
    assert ckpt["uuid"] in out and "validation_loss" in out
    det.ok("checkpoint", "download", ckpt["uuid"], "-o", tmp_path / "ckpt")
    assert '"steps"' in (tmp_path / "ckpt" / "state.json").read_text()


def test_labels_archive_wait(det: Det, compat_cluster: CompatCluster, finished: dict[str, Any]) -> None:
    exp_id = finished["id"]
    det.ok("experiment", "label", "add", exp_id, "compat-label")
    assert compat_cluster.experiment(exp_id)["labels"] == ["compat-label"]
    det.ok("experiment", "label", "remove", exp_id, "compat-label")
    assert compat_cluster.experiment(exp_id)["labels"] == []
    det.ok("experiment", "wait", exp_id, "--polling-interval", "1")  # completed: exit 0 at once
    det.ok("experiment", "archive", exp_id)
    assert compat_cluster.experiment(exp_id)["archived"] is True
    assert f"{exp_id} | admin" not in det.ok("experiment", "list")  # archived ones are hidden
    det.ok("experiment", "unarchive", exp_id)
    assert compat_cluster.experiment(exp_id)["archived"] is False


def test_cluster_lists(det: Det, finished: dict[str, Any]) -> None:
    assert re.search(r"^\s*local-0\s+\|.*\|\s+default\s+\|", det.ok("agent", "list"), re.M)
    assert re.search(r"^\s*local-0\s+\|\s+default\s+\|\s+0 \|", det.ok("slot", "list"), re.M)
    det.ok("task", "list")
    assert "Job Name" in det.ok("job", "list")  # parses the resource pools (v1ResourcePool) and the queue


def test_create_test_mode(det: Det, compat_cluster: CompatCluster, finished: dict[str, Any]) -> None:
    out = det.ok("experiment", "create", "--test", write_config(finished["folder"], "compat-test"), MODEL_DIR)
    m = re.search(r"Created test experiment (\d+)", out)
    assert m, out
    assert compat_cluster.experiment(int(m.group(1)))["state"] in TERMINAL


def test_pause_activate_kill_trial(det: Det, compat_cluster: CompatCluster, finished: dict[str, Any]) -> None:
    cfg = write_config(finished["folder"], "compat-long", length=10_000, step_sleep=0.05)
    out = det.ok("experiment", "create", "--paused", cfg, MODEL_DIR)
    exp_id = int(re.search(r"Created experiment (\d+)", out).group(1))  # type: ignore[union-attr]
    assert compat_cluster.experiment(exp_id)["state"] == "STATE_PAUSED"
    det.ok("experiment", "activate", exp_id)
    trial = wait_for(lambda: [t for t in compat_cluster.trials(exp_id) if t["state"] == "STATE_RUNNING"],
                     "a running trial")[0]
    det.ok("experiment", "pause", exp_id)
    wait_for(lambda: compat_cluster.experiment(exp_id)["state"] == "STATE_PAUSED", "paused")
    det.ok("experiment", "activate", exp_id)
    wait_for(lambda: compat_cluster.experiment(exp_id)["state"] == "STATE_ACTIVE", "active again")
    assert f"Killed trial {trial['id']}" in det.ok("trial", "kill", trial["id"])
    wait_for(lambda: compat_cluster.trials(exp_id)[0]["state"] in TERMINAL, "the trial to end")
    assert compat_cluster.trials(exp_id)[0]["state"] == "STATE_CANCELED"


def test_cancel_and_kill(det: Det, compat_cluster: CompatCluster, finished: dict[str, Any]) -> None:
    ids = []
    for verb in ("cancel", "kill"):
        cfg = write_config(finished["folder"], f"compat-{verb}", length=10_000, step_sleep=0.05)
        out = det.ok("experiment", "create", "--paused", cfg, MODEL_DIR)
        exp_id = int(re.search(r"Created experiment (\d+)", out).group(1))  # type: ignore[union-attr]
        det.ok("experiment", verb, exp_id)
        ids.append(exp_id)
    for exp_id in ids:
        wait_for(lambda exp_id=exp_id: compat_cluster.experiment(exp_id)["state"] in TERMINAL, "the end")
        assert compat_cluster.experiment(exp_id)["state"] == "STATE_CANCELED"
    assert det("experiment", "wait", ids[0], "--polling-interval", "1").code == 1  # canceled: not COMPLETED
