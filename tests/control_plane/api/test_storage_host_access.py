"""A user's shared_fs checkpoint storage stays on the cluster's storage root unless the master sets
allow_task_host_access: the agent bind-mounts `host_path` read-write into the trial's container
(and makes it when missing), so `host_path: /etc` would be a host path like any bind mount.
Every way a stored config is made is checked on its merged form: a plain create, a fork
(`parentId`), a config template, a workspace's storage. SQLite and PostgreSQL (`client`)."""

from __future__ import annotations

from typing import Any

import yaml
from sqlalchemy import func, select

from control_plane.db.engine import transaction
from control_plane.db.models import Experiment
from tests.control_plane.api.test_experiments import CONFIG, create, create_ok

FIELD = "config.checkpoint_storage.host_path"


def _config(storage: dict[str, Any] | None) -> str:
    cfg = yaml.safe_load(CONFIG)
    if storage is not None:
        cfg["checkpoint_storage"] = storage
    return yaml.safe_dump(cfg)


def _refused(r: Any) -> None:
    assert r.status_code == 400, r.text
    assert [d["field"] for d in r.json()["details"]] == [FIELD], r.text
    assert "allow_task_host_access" in r.json()["message"], r.text


def _experiments(master: Any) -> int:
    with transaction(master.sessions) as s:
        return s.scalar(select(func.count()).select_from(Experiment)) or 0


def test_shared_fs_storage_must_use_the_clusters_root(client, master, admin_headers) -> None:  # type: ignore[no-untyped-def]
    root = master.config.default_checkpoint_storage["host_path"]
    for foreign in ("/etc/systemd/system/x.service.d", "/", f"{root}/../elsewhere", f"{root}/sub"):
        _refused(create(client, admin_headers, _config({"type": "shared_fs", "host_path": foreign})))
    assert _experiments(master) == 0  # nothing stored
    # The root itself (spelled with a trailing slash too), a storage_path below it, or no host_path at all.
    for storage in ({"type": "shared_fs", "host_path": root + "/", "storage_path": "team/a"},
                    {"type": "shared_fs", "storage_path": "team/b", "save_trial_best": 2}, None):
        got = create_ok(client, admin_headers, _config(storage))["config"]["checkpoint_storage"]
        assert got["host_path"].rstrip("/") == root, got
    # A fork (`det e fork`: parentId) and a config template are checked on the merged config too.
    parent = create_ok(client, admin_headers)["experiment"]["id"]
    _refused(create(client, admin_headers, _config({"type": "shared_fs", "host_path": "/etc"}), parentId=parent))
    r = client.post("/api/v1/templates/evil", headers=admin_headers, json={
        "name": "evil", "config": {"checkpoint_storage": {"type": "shared_fs", "host_path": "/etc"}}})
    assert r.status_code == 200, r.text
    _refused(create(client, admin_headers, template="evil"))
    # A workspace's storage is refused when it is set, on create and on edit, naming the field ...
    foreign_ws = {"type": "shared_fs", "host_path": "/var/lib"}
    for r in (client.post("/api/v1/workspaces", headers=admin_headers,
                          json={"name": "team", "checkpointStorageConfig": foreign_ws}),
              client.patch("/api/v1/workspaces/1", headers=admin_headers, json={"checkpointStorageConfig": foreign_ws})):
        assert r.status_code == 400, r.text
        assert [d["field"] for d in r.json()["details"]] == ["checkpointStorageConfig.host_path"], r.text
        assert "allow_task_host_access" in r.json()["message"], r.text
    assert [w["name"] for w in client.get("/api/v1/workspaces", headers=admin_headers).json()["workspaces"]] \
        == ["Uncategorized"]  # nothing stored
    # ... and one stored while the master allowed it is refused by each experiment that inherits it.
    master.config = master.config.model_copy(update={"allow_task_host_access": True})
    ws = client.post("/api/v1/workspaces", headers=admin_headers, json={
        "name": "team", "checkpointStorageConfig": foreign_ws})
    assert ws.status_code == 200, ws.text
    master.config = master.config.model_copy(update={"allow_task_host_access": False})
    proj = client.post(f"/api/v1/workspaces/{ws.json()['workspace']['id']}/projects", headers=admin_headers,
                       json={"name": "p"})
    _refused(create(client, admin_headers, projectId=proj.json()["project"]["id"]))
    assert _experiments(master) == 4
    # A storage_path climbing out of the root is refused too, as each experiment would refuse it.
    r = client.post("/api/v1/workspaces", headers=admin_headers, json={"name": "team3", "checkpointStorageConfig": {
        "type": "shared_fs", "host_path": root, "storage_path": "../elsewhere"}})
    assert r.status_code == 400 and [d["field"] for d in r.json()["details"]] == [
        "checkpointStorageConfig.storage_path"], r.text
    # The cluster's root (or a storage_path below it) is a workspace's to choose.
    ok = client.post("/api/v1/workspaces", headers=admin_headers, json={
        "name": "team2", "checkpointStorageConfig": {"type": "shared_fs", "host_path": root, "storage_path": "t2"}})
    assert ok.status_code == 200, ok.text


def test_the_setting_allows_another_host_path_and_s3_clusters_refuse_shared_fs(  # type: ignore[no-untyped-def]
        client, master, admin_headers) -> None:
    foreign = _config({"type": "shared_fs", "host_path": "/srv/elsewhere"})
    master.config = master.config.model_copy(update={"allow_task_host_access": True})
    assert create_ok(client, admin_headers, foreign)["config"]["checkpoint_storage"]["host_path"] == "/srv/elsewhere"
    s3 = {"type": "s3", "bucket": "ckpts"}
    master.config = master.config.model_copy(update={"allow_task_host_access": False, "checkpoint_storage": s3})
    r = create(client, admin_headers, foreign)
    _refused(r)
    assert "cluster's checkpoint storage is s3" in r.text
    assert create_ok(client, admin_headers)["config"]["checkpoint_storage"]["type"] == "s3"
