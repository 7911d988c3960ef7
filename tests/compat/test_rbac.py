"""Groups and roles with the real determined==0.38.1 CLI (issue 30): `det user-group
create|add-user|remove-user|list|describe|delete`, `det rbac list-roles|describe-role|assign-role|
unassign-role|list-users-roles|list-groups-roles|my-permissions`; a Viewer of a workspace lists and
describes its experiments but cannot kill one (403 naming the role), an Editor (through a group)
creates and kills there; pool bindings refused to an Editor and for the
default pool; `det workspace list-pools` and `det cmd run [-w]` with a bound pool. Experiments are
created paused and commands take no slot on a pool without agents: nothing here needs a task to run."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from tests.compat.conftest import MODEL_DIR, CompatCluster, Det, experiment_config

PASSWORD = "Rbac-passw0rd"


def _create(det: Det, cfg: Path, project_id: int, **kw: str) -> int:
    out = det.ok("experiment", "create", "--paused", "--project_id", project_id, cfg, MODEL_DIR, **kw)
    return int(re.search(r"Created experiment (\d+)", out).group(1))  # type: ignore[union-attr]


def test_viewer_reads_editor_changes(det: Det, compat_cluster: CompatCluster, tmp_path: Path) -> None:
    for name in ("rbac-viewer", "rbac-editor"):
        det.ok("user", "create", name, "--password", PASSWORD)
    out = det.ok("user-group", "create", "rbac-editors", "--add-user", "rbac-viewer")
    assert "user group with name rbac-editors" in out and "rbac-viewer was added" in out, out
    det.ok("user-group", "add-user", "rbac-editors", "rbac-editor")
    det.ok("user-group", "remove-user", "rbac-editors", "rbac-viewer")
    described = det.ok("user-group", "describe", "rbac-editors")
    assert "rbac-editor" in described and "rbac-viewer" not in described, described
    assert re.search(r"rbac-editors\s+\|\s+1", det.ok("user-group", "list")), det.ok("user-group", "list")

    roles = det.ok("rbac", "list-roles")
    assert all(f"role '{r}'" in roles for r in ("Viewer", "Editor", "WorkspaceAdmin", "ClusterAdmin")), roles
    det.ok("workspace", "create", "compat-rbac")
    det.ok("project", "create", "compat-rbac", "shared")
    ws = compat_cluster.get("/api/v1/workspaces", name="compat-rbac")["workspaces"][0]
    project = compat_cluster.get(f"/api/v1/workspaces/{ws['id']}/projects", name="shared")["projects"][0]["id"]
    out = det.ok("rbac", "assign-role", "Viewer", "--workspace-name", "compat-rbac", "--username-to-assign",
                 "rbac-viewer")
    assert "assigned role 'Viewer' with ID 4 to user 'rbac-viewer'" in out, out
    det.ok("rbac", "assign-role", "Editor", "-w", "compat-rbac", "-g", "rbac-editors")
    assert "compat-rbac" in det.ok("rbac", "describe-role", "Viewer")
    assert re.search(r"Viewer\s+\|\s+4\s+\|\s+True", det.ok("rbac", "list-users-roles", "rbac-viewer"))
    assert "role 'Editor' with ID 5 assigned" in det.ok("rbac", "list-groups-roles", "rbac-editors")
    mine = det.ok("rbac", "my-permissions", user="rbac-viewer", password=PASSWORD)
    assert "permissions assigned over workspace 'compat-rbac'" in mine, mine

    cfg = tmp_path / "exp.yaml"
    cfg.write_text(yaml.safe_dump(experiment_config("compat-rbac")))
    exp_id = _create(det, cfg, project)
    viewer = {"user": "rbac-viewer", "password": PASSWORD}
    assert re.search(rf"^\s*{exp_id} \|", det.ok("experiment", "list", "--all", **viewer), re.M)
    assert "compat-rbac" in det.ok("experiment", "describe", exp_id, **viewer)
    r = det("experiment", "kill", exp_id, **viewer)
    assert r.code != 0 and "has Viewer on workspace" in (r.out + r.err), (r.out, r.err)
    r = det("experiment", "create", "--paused", "--project_id", project, cfg, MODEL_DIR, **viewer)
    assert r.code != 0 and "needs Editor" in (r.out + r.err), (r.out, r.err)

    editor = {"user": "rbac-editor", "password": PASSWORD}
    theirs = _create(det, cfg, project, **editor)
    det.ok("experiment", "kill", exp_id, **editor)  # the admin's: the Editor role covers the workspace
    det.ok("experiment", "kill", theirs, **editor)
    # Pool bindings are a ClusterAdmin's, and the cluster's default pool (this cluster's only one)
    # is never bound.
    r = det("resource-pool", "bindings", "add", "default", "compat-rbac", **editor)
    assert r.code != 0 and "needs ClusterAdmin" in (r.out + r.err), (r.out, r.err)
    r = det("resource-pool", "bindings", "add", "default", "compat-rbac")
    assert r.code != 0 and "cluster's default pool" in (r.out + r.err), (r.out, r.err)
    assert "default" in det.ok("resource-pool", "bindings", "list-workspaces", "default")
    det.ok("rbac", "unassign-role", "Editor", "-w", "compat-rbac", "-g", "rbac-editors")
    r = det("experiment", "create", "--paused", "--project_id", project, cfg, MODEL_DIR, **editor)
    assert r.code != 0 and "has no role on workspace" in (r.out + r.err), (r.out, r.err)
    det.ok("user-group", "delete", "rbac-editors", "--yes")
    assert "rbac-editors" not in det.ok("user-group", "list")


def test_bound_pool_list_pools_and_cmd_run(det: Det, compat_cluster: CompatCluster) -> None:
    det.ok("workspace", "create", "compat-bound-ws")
    det.ok("resource-pool", "bindings", "add", "compat-bound", "compat-bound-ws")
    try:
        pools = det.ok("workspace", "list-pools", "compat-bound-ws")
        assert re.search(r"compat-bound-ws\s+\| default, compat-bound\s*$", pools, re.M), pools
        pools = det.ok("workspace", "list-pools", "Uncategorized")
        assert re.search(r"Uncategorized\s+\| default\s*$", pools, re.M), pools
        on_bound = ("--config", "resources.resource_pool=compat-bound", "--config", "resources.slots=0")
        r = det("cmd", "run", "-d", *on_bound, "true")
        assert r.code != 0 and "'compat-bound' is bound to other workspaces" in (r.out + r.err), (r.out, r.err)
        task_id = det.ok("cmd", "run", "-d", "-w", "compat-bound-ws", *on_bound, "true").strip()
        cmd = compat_cluster.get(f"/api/v1/commands/{task_id}")["command"]
        ws = compat_cluster.get("/api/v1/workspaces", name="compat-bound-ws")["workspaces"][0]["id"]
        assert (cmd["resourcePool"], cmd["workspaceId"]) == ("compat-bound", ws)
        assert task_id in det.ok("cmd", "list", "-w", "compat-bound-ws")
        det.ok("cmd", "kill", task_id)
    finally:
        det.ok("resource-pool", "bindings", "remove", "compat-bound", "compat-bound-ws")
