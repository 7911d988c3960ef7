"""Groups, roles and the one authorization service over HTTP on both databases (issue 30): the
authorization matrix (write routes x Viewer, Editor, WorkspaceAdmin, ClusterAdmin, no role, the
owner) in one app per database, and Determined 0.38.1's shapes of /api/v1/groups, /api/v1/roles and
the pool bindings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ADMIN_PASSWORD, TEST_PASSWORD_HASHING, _from_migrated_schema
from tests.control_plane.api.test_experiments import CONFIG, create, create_ok, make_user

CLUSTER_ADMIN, WORKSPACE_ADMIN, VIEWER, EDITOR = 1, 2, 4, 5


@pytest.fixture
def master_config(db_url: str, tmp_path: Path, request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """Two pools: "team" to bind to a workspace, "default" (the cluster's) for everyone."""
    from control_plane.config import load_config

    _from_migrated_schema(db_url, request)
    return load_config(env={}, db_url=db_url, state_dir=str(tmp_path / "state"), admin_password=ADMIN_PASSWORD,
                       resource_pools=[{"name": "default"}, {"name": "team"}], **TEST_PASSWORD_HASHING)


def _ok(r: Any) -> Any:
    assert r.status_code == 200, r.text
    return r.json()


def _ids(client, admin: dict[str, str]) -> dict[str, int]:  # type: ignore[no-untyped-def]
    return {u["username"]: u["id"] for u in _ok(client.get("/api/v1/users", headers=admin))["users"]}


def _assign(client, headers: dict[str, str], role: int, *, user: int | None = None, group: int | None = None,  # type: ignore[no-untyped-def]
            workspace: int | None = None, remove: bool = False) -> Any:
    ra = {"role": {"roleId": role}, "scopeWorkspaceId": workspace}
    body = ({"userRoleAssignments": [{"userId": user, "roleAssignment": ra}]} if user is not None
            else {"groupRoleAssignments": [{"groupId": group, "roleAssignment": ra}]})
    return client.post(f"/api/v1/roles/{'remove' if remove else 'add'}-assignments", headers=headers, json=body)


# Who may do what to another user's experiment, project and workspace W (the matrix). The owner of
# the experiment and project is an Editor of W who made them.
ACTIONS = ("create_experiment", "kill", "pause", "patch_experiment", "create_project", "patch_project",
           "patch_workspace", "assign_in_workspace", "assign_cluster_wide", "create_group")
EDITS = {"create_experiment", "kill", "pause", "patch_experiment", "create_project", "patch_project"}
ALLOWED = {
    "none": set(),
    "viewer": set(),
    "editor": EDITS,  # through a group
    "wsadmin": EDITS | {"patch_workspace", "assign_in_workspace"},
    "clusteradmin": set(ACTIONS),
    "owner": EDITS,
}


def test_authorization_matrix(client, admin_headers) -> None:  # type: ignore[no-untyped-def]
    admin = admin_headers
    users = {name: make_user(client, admin, name) for name in ALLOWED}
    ids = _ids(client, admin)
    ws = _ok(client.post("/api/v1/workspaces", headers=admin, json={"name": "W"}))["workspace"]["id"]
    team = _ok(client.post("/api/v1/groups", headers=admin, json={"name": "team", "addUsers": [ids["editor"]]}))
    assert [u["username"] for u in team["group"]["users"]] == ["editor"]
    for role, kw in ((VIEWER, {"user": ids["viewer"]}), (EDITOR, {"group": team["group"]["groupId"]}),
                     (WORKSPACE_ADMIN, {"user": ids["wsadmin"]}), (EDITOR, {"user": ids["owner"]})):
        _ok(_assign(client, admin, role, workspace=ws, **kw))
    _ok(_assign(client, admin, CLUSTER_ADMIN, user=ids["clusteradmin"]))
    proj = _ok(client.post(f"/api/v1/workspaces/{ws}/projects", headers=users["owner"], json={"name": "p"}))["project"]

    def attempt(who: str, action: str) -> Any:
        h = users[who]
        if action in ("kill", "pause", "patch_experiment"):  # a fresh one each: a kill ends it
            exp = create_ok(client, users["owner"], projectId=proj["id"])["experiment"]["id"]
        return {
            "create_experiment": lambda: create(client, h, projectId=proj["id"]),
            "kill": lambda: client.post(f"/api/v1/experiments/{exp}/kill", headers=h),
            "pause": lambda: client.post(f"/api/v1/experiments/{exp}/pause", headers=h),
            "patch_experiment": lambda: client.patch(f"/api/v1/experiments/{exp}", headers=h, json={"notes": "x"}),
            "create_project": lambda: client.post(f"/api/v1/workspaces/{ws}/projects", headers=h,
                                                  json={"name": f"by-{who}"}),
            "patch_project": lambda: client.patch(f"/api/v1/projects/{proj['id']}", headers=h, json={"description": who}),
            "patch_workspace": lambda: client.patch(f"/api/v1/workspaces/{ws}", headers=h, json={"name": f"W-{who}"}),
            "assign_in_workspace": lambda: _assign(client, h, VIEWER, user=ids["none"], workspace=ws),
            "assign_cluster_wide": lambda: _assign(client, h, VIEWER, user=ids["none"]),
            "create_group": lambda: client.post("/api/v1/groups", headers=h, json={"name": f"g-{who}"}),
        }[action]()

    got = {(who, action): attempt(who, action) for who in ALLOWED for action in ACTIONS
           if who != "owner" or action not in ("kill", "pause", "patch_experiment")}
    wrong = {k: (r.status_code, r.text[:160]) for k, r in got.items()
             if (r.status_code == 200) != (k[1] in ALLOWED[k[0]]) or r.status_code not in (200, 403)}
    assert wrong == {}, wrong
    # A refusal names the role held and the one needed.
    assert "has Viewer on workspace" in got["viewer", "kill"].json()["message"]
    assert "needs Editor" in got["viewer", "kill"].json()["message"]
    assert "has no role on workspace" in got["none", "create_experiment"].json()["message"]
    assert "needs ClusterAdmin" in got["wsadmin", "create_group"].json()["message"]
    # Reads stay open: the viewer and a user without a role read W's experiments.
    for who in ("viewer", "none"):
        listed = _ok(client.get("/api/v1/experiments", headers=users[who], params={"projectId": proj["id"]}))
        assert listed["experiments"]
    # Ownership stands on its own: with Editor taken away, the owner still kills their experiment
    # but creates nothing more in W.
    mine = create_ok(client, users["owner"], projectId=proj["id"])["experiment"]["id"]
    _ok(_assign(client, admin, EDITOR, user=ids["owner"], workspace=ws, remove=True))
    _ok(client.post(f"/api/v1/experiments/{mine}/kill", headers=users["owner"]))
    assert create(client, users["owner"], projectId=proj["id"]).status_code == 403
    # Leaving the group takes the group's role away.
    _ok(client.put(f"/api/v1/groups/{team['group']['groupId']}", headers=admin,
                   json={"groupId": team["group"]["groupId"], "removeUsers": [ids["editor"]]}))
    assert create(client, users["editor"], projectId=proj["id"]).status_code == 403
    # Everyone still creates in Uncategorized and changes only their own there.
    theirs = create_ok(client, users["none"])["experiment"]["id"]
    assert client.post(f"/api/v1/experiments/{theirs}/pause", headers=users["viewer"]).status_code == 403


def test_groups_and_roles_wire(client, admin_headers) -> None:  # type: ignore[no-untyped-def]
    admin = admin_headers
    make_user(client, admin, "ann")
    ids = _ids(client, admin)
    g = _ok(client.post("/api/v1/groups", headers=admin, json={"name": "ml", "addUsers": [ids["ann"]]}))["group"]
    assert client.post("/api/v1/groups", headers=admin, json={"name": "ml"}).status_code == 409
    bad = client.post("/api/v1/groups", headers=admin, json={"name": "x", "addUsers": [9999]})
    assert bad.status_code == 400 and bad.json()["details"][0]["field"] == "addUsers"
    found = _ok(client.post("/api/v1/groups/search", headers=admin, json={"name": "ml", "limit": 1}))
    assert [(x["group"]["name"], x["numMembers"]) for x in found["groups"]] == [("ml", 1)]
    by_user = _ok(client.post("/api/v1/groups/search", headers=admin, json={"userId": ids["ann"], "limit": 10}))
    assert [x["group"]["groupId"] for x in by_user["groups"]] == [g["groupId"]]
    roles = _ok(client.post("/api/v1/roles/search", headers=admin, json={"limit": 500}))["roles"]
    assert {r["name"]: r["roleId"] for r in roles} == {"ClusterAdmin": 1, "WorkspaceAdmin": 2, "Viewer": 4,
                                                       "Editor": 5}
    in_ws = _ok(client.post("/api/v1/roles/search/by-assignability", headers=admin,
                            json={"limit": 10, "workspaceId": 1}))["roles"]
    assert "ClusterAdmin" not in {r["name"] for r in in_ws}
    bad = _assign(client, admin, 3, user=ids["ann"], workspace=1)
    assert bad.status_code == 400 and "roleId" in bad.json()["details"][0]["field"]
    assert _assign(client, admin, CLUSTER_ADMIN, user=ids["ann"], workspace=1).status_code == 400
    _ok(_assign(client, admin, VIEWER, group=g["groupId"], workspace=1))
    _ok(_assign(client, admin, VIEWER, group=g["groupId"], workspace=1))  # held already: kept once
    described = _ok(client.post("/api/v1/roles/search/by-ids", headers=admin, json={"roleIds": [VIEWER]}))["roles"]
    assert [(a["groupId"], a["roleAssignment"]["scopeWorkspaceId"]) for a in described[0]["groupRoleAssignments"]] \
        == [(g["groupId"], 1)]
    of_ann = _ok(client.get(f"/api/v1/roles/search/by-user/{ids['ann']}", headers=admin))["roles"]
    assert [r["role"]["name"] for r in of_ann] == ["Viewer"]
    of_group = _ok(client.get(f"/api/v1/roles/search/by-group/{g['groupId']}", headers=admin))
    assert of_group["assignments"] == [{"roleId": VIEWER, "scopeCluster": False, "scopeWorkspaceIds": [1]}]
    summary = _ok(client.get("/api/v1/permissions/summary", headers=admin))
    assert {a["roleId"] for a in summary["assignments"] if a["scopeCluster"]} == {CLUSTER_ADMIN}
    assert _ok(client.get("/api/v1/master", headers=admin))["rbacEnabled"] is True
    _ok(client.delete(f"/api/v1/groups/{g['groupId']}", headers=admin))
    assert _ok(client.get(f"/api/v1/roles/search/by-user/{ids['ann']}", headers=admin))["roles"] == []
    _a_cluster_admin_binds_a_pool(client, admin)


def _a_cluster_admin_binds_a_pool(client, admin: dict[str, str]) -> None:  # type: ignore[no-untyped-def]
    """/api/v1/resource-pools/{name}/workspace-bindings (part of the wire test: one app)."""
    boss, editor = make_user(client, admin, "boss"), make_user(client, admin, "ed")
    ids = _ids(client, admin)
    _ok(_assign(client, admin, CLUSTER_ADMIN, user=ids["boss"]))
    ws = _ok(client.post("/api/v1/workspaces", headers=admin, json={"name": "T"}))["workspace"]["id"]
    _ok(_assign(client, admin, EDITOR, user=ids["ed"], workspace=ws))
    path = "/api/v1/resource-pools/team/workspace-bindings"
    body = {"resourcePoolName": "team", "workspaceNames": ["T"]}
    # ClusterAdmin held cluster-wide opens the admin-only routes too; an Editor of a workspace does not.
    assert client.get("/api/v1/master/config", headers=boss).status_code == 200
    assert client.get("/api/v1/master/config", headers=editor).status_code == 403
    assert "needs ClusterAdmin" in client.post(path, headers=editor, json=body).json()["message"]
    _ok(client.post(path, headers=boss, json=body))
    assert _ok(client.get(path, headers=editor))["workspaceIds"] == [ws]
    refused = client.post("/api/v1/resource-pools/default/workspace-bindings", headers=boss,
                          json={"workspaceNames": ["T"]})
    assert refused.status_code == 400 and "default pool" in refused.json()["message"]
    assert client.post(path, headers=boss, json={"workspaceNames": ["nope"]}).status_code == 400
    team_cfg = yaml.safe_load(CONFIG)
    team_cfg["resources"] = {**(team_cfg.get("resources") or {}), "resource_pool": "team"}
    uncat = create(client, editor, config=yaml.safe_dump(team_cfg))
    assert uncat.status_code == 400 and "'team' is bound to other workspaces" in uncat.json()["message"]
    proj = _ok(client.post(f"/api/v1/workspaces/{ws}/projects", headers=editor, json={"name": "p"}))["project"]["id"]
    assert create_ok(client, editor, config=yaml.safe_dump(team_cfg), projectId=proj)["experiment"]["resourcePool"] \
        == "team"
    _ok(client.request("DELETE", path, headers=boss, json=body))
    assert _ok(client.get(path, headers=editor))["workspaceIds"] == []
    assert create(client, editor, config=yaml.safe_dump(team_cfg)).status_code == 200
