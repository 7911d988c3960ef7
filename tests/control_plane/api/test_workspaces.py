"""Workspaces, projects and config templates over HTTP on both databases (issue 30): Determined
0.38.1's routes and shapes, experiments in projects (create with projectId, move, list by project,
the project and workspace on every experiment), the workspace's default pool and checkpoint
storage, templates merged under the config, and the owner/admin rule on every change."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ADMIN_PASSWORD
from tests.control_plane.api.test_experiments import CONFIG, create, create_ok, make_user

# The required constructor fields of 0.38.1's bindings.v1Workspace and v1Project.
V1_WORKSPACE_REQUIRED = {"archived", "errorMessage", "id", "immutable", "name", "numExperiments", "numProjects",
                         "pinned", "state", "userId", "username"}
V1_PROJECT_REQUIRED = {"archived", "errorMessage", "id", "immutable", "key", "name", "notes",
                       "numActiveExperiments", "numExperiments", "numRuns", "state", "userId", "username",
                       "workspaceId"}


@pytest.fixture
def master_config(db_url: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    """Two pools, so that a workspace's default compute pool can differ from the master's."""
    from control_plane.config import load_config

    return load_config(env={}, db_url=db_url, state_dir=str(tmp_path / "state"), admin_password=ADMIN_PASSWORD,
                       resource_pools=[{"name": "default"}, {"name": "team"}])


def _ok(r: Any) -> Any:
    assert r.status_code == 200, r.text
    return r.json()


def _refused(r: Any, status: int, field: str | None = None) -> str:
    assert r.status_code == status, r.text
    if field is not None:
        assert field in [d["field"] for d in r.json()["details"]], r.text
    return str(r.json()["message"])


def test_uncategorized_is_the_default_home(client, admin_headers) -> None:  # type: ignore[no-untyped-def]
    spaces = _ok(client.get("/api/v1/workspaces", headers=admin_headers))["workspaces"]
    assert [(w["id"], w["name"], w["immutable"]) for w in spaces] == [(1, "Uncategorized", True)]
    assert V1_WORKSPACE_REQUIRED <= set(spaces[0])
    (project,) = _ok(client.get("/api/v1/workspaces/1/projects", headers=admin_headers))["projects"]
    assert (project["id"], project["name"], project["workspaceId"]) == (1, "Uncategorized", 1)
    assert V1_PROJECT_REQUIRED <= set(project)
    exp = create_ok(client, admin_headers)["experiment"]
    assert (exp["projectId"], exp["projectName"], exp["workspaceId"], exp["workspaceName"]) == \
        (1, "Uncategorized", 1, "Uncategorized")
    assert _ok(client.get("/api/v1/projects/1", headers=admin_headers))["project"]["numExperiments"] == 1
    # The cluster's own cannot be archived, renamed or deleted, even by an admin.
    _refused(client.post("/api/v1/workspaces/1/archive", headers=admin_headers), 409)
    _refused(client.delete("/api/v1/projects/1", headers=admin_headers), 409)
    _refused(client.patch("/api/v1/workspaces/1", headers=admin_headers, json={"name": "x"}), 409)


def test_projects_hold_experiments_and_move_them(client, admin_headers) -> None:  # type: ignore[no-untyped-def]
    alice = make_user(client, admin_headers, "alice")
    ws = _ok(client.post("/api/v1/workspaces", headers=alice, json={"name": "vision"}))["workspace"]
    assert (ws["name"], ws["username"], ws["numProjects"]) == ("vision", "alice", 0)
    _refused(client.post("/api/v1/workspaces", headers=alice, json={"name": "vision"}), 409)
    body = {"name": "detection", "workspaceId": ws["id"], "description": "boxes"}
    proj = _ok(client.post(f"/api/v1/workspaces/{ws['id']}/projects", headers=alice, json=body))["project"]
    assert (proj["key"], proj["workspaceName"], proj["description"]) == ("DETEC", "vision", "boxes")
    other = _ok(client.post(f"/api/v1/workspaces/{ws['id']}/projects", headers=alice,
                            json={"name": "detection-2", "workspaceId": ws["id"]}))["project"]
    assert other["key"] == "DETE1"

    exp = create_ok(client, alice, projectId=proj["id"])["experiment"]
    assert (exp["projectId"], exp["projectName"], exp["workspaceId"], exp["workspaceName"]) == \
        (proj["id"], "detection", ws["id"], "vision")
    in_uncat = create_ok(client, alice)["experiment"]["id"]
    listed = _ok(client.get("/api/v1/experiments", headers=alice, params={"projectId": proj["id"]}))
    assert [e["id"] for e in listed["experiments"]] == [exp["id"]]
    assert {e["id"] for e in _ok(client.get("/api/v1/experiments", headers=alice,
                                            params={"projectId": 0}))["experiments"]} == {exp["id"], in_uncat}
    _refused(create(client, alice, projectId=999), 400, "projectId")

    # Move: into the other project, then the emptied project can go, the used one cannot.
    _ok(client.post(f"/api/v1/experiments/{exp['id']}/move", headers=alice,
                    json={"destinationProjectId": other["id"], "experimentId": exp["id"]}))
    assert _ok(client.get(f"/api/v1/experiments/{exp['id']}", headers=alice))["experiment"]["projectId"] == other["id"]
    counts = {p["name"]: p["numExperiments"] for p in _ok(client.get(
        f"/api/v1/workspaces/{ws['id']}/projects", headers=alice))["projects"]}
    assert counts == {"detection": 0, "detection-2": 1}
    _refused(client.post(f"/api/v1/experiments/{exp['id']}/move", headers=alice,
                         json={"destinationProjectId": 999}), 400, "destinationProjectId")
    _refused(client.delete(f"/api/v1/projects/{other['id']}", headers=alice), 409)
    assert _ok(client.delete(f"/api/v1/projects/{proj['id']}", headers=alice)) == {"completed": True}
    _refused(client.delete(f"/api/v1/workspaces/{ws['id']}", headers=alice), 409)

    # Archived: no new experiments or moves into it; unarchived, it takes them again.
    _ok(client.post(f"/api/v1/projects/{other['id']}/archive", headers=alice))
    _refused(create(client, alice, projectId=other["id"]), 400, "projectId")
    _refused(client.post(f"/api/v1/experiments/{in_uncat}/move", headers=alice,
                         json={"destinationProjectId": other["id"]}), 400, "destinationProjectId")
    _ok(client.post(f"/api/v1/projects/{other['id']}/unarchive", headers=alice))
    _ok(client.post(f"/api/v1/experiments/{in_uncat}/move", headers=alice, json={"destinationProjectId": other["id"]}))


def test_only_the_owner_or_an_admin_changes(client, admin_headers) -> None:  # type: ignore[no-untyped-def]
    alice = make_user(client, admin_headers, "alice")
    bob = make_user(client, admin_headers, "bob")
    ws = _ok(client.post("/api/v1/workspaces", headers=alice, json={"name": "a-space"}))["workspace"]
    proj = _ok(client.post(f"/api/v1/workspaces/{ws['id']}/projects", headers=alice, json={"name": "p"}))["project"]
    exp = create_ok(client, alice, projectId=proj["id"])["experiment"]
    # Bob reads all of it; creating in it needs a role there (he has none: RBAC, services/authz.py) ...
    assert _ok(client.get(f"/api/v1/workspaces/{ws['id']}", headers=bob))["workspace"]["numExperiments"] == 1
    assert "needs Editor" in _refused(client.post(f"/api/v1/workspaces/{ws['id']}/projects", headers=bob,
                                                  json={"name": "bobs"}), 403)
    bobs = _ok(client.post("/api/v1/workspaces/1/projects", headers=bob, json={"name": "bobs"}))["project"]
    # ... but changes none of Alice's: not her workspace, her project, or her experiment's home.
    for r in (client.patch(f"/api/v1/workspaces/{ws['id']}", headers=bob, json={"name": "mine"}),
              client.post(f"/api/v1/workspaces/{ws['id']}/archive", headers=bob),
              client.delete(f"/api/v1/workspaces/{ws['id']}", headers=bob),
              client.patch(f"/api/v1/projects/{proj['id']}", headers=bob, json={"description": "x"}),
              client.post(f"/api/v1/projects/{proj['id']}/archive", headers=bob),
              client.put(f"/api/v1/projects/{proj['id']}/notes", headers=bob, json={"notes": []}),
              client.post(f"/api/v1/experiments/{exp['id']}/move", headers=bob,
                          json={"destinationProjectId": bobs["id"]})):
        assert "belongs to another user" in _refused(r, 403)
    notes = [{"name": "readme", "contents": "how we label"}]
    assert _ok(client.put(f"/api/v1/projects/{proj['id']}/notes", headers=alice, json={"notes": notes})) \
        == {"notes": notes}
    assert _ok(client.get(f"/api/v1/projects/{proj['id']}", headers=bob))["project"]["notes"] == notes
    # The admin may.
    _ok(client.patch(f"/api/v1/projects/{proj['id']}", headers=admin_headers, json={"description": "by admin"}))
    _ok(client.post(f"/api/v1/experiments/{exp['id']}/move", headers=admin_headers,
                    json={"destinationProjectId": bobs["id"]}))
    assert _ok(client.get(f"/api/v1/projects/{proj['id']}", headers=bob))["project"]["description"] == "by admin"


def test_workspace_defaults_apply_when_the_config_is_silent(client, master, admin_headers) -> None:  # type: ignore[no-untyped-def]
    # Host paths other than the cluster's storage root (test_storage_host_access) need the setting.
    master.config = master.config.model_copy(update={"allow_task_host_access": True})
    storage = {"type": "shared_fs", "host_path": "/mnt/team-ckpts", "save_trial_best": 3}
    ws = _ok(client.post("/api/v1/workspaces", headers=admin_headers, json={
        "name": "team", "defaultComputePool": "team", "checkpointStorageConfig": storage}))["workspace"]
    assert (ws["defaultComputePool"], ws["checkpointStorageConfig"]) == ("team", storage)
    proj = _ok(client.post(f"/api/v1/workspaces/{ws['id']}/projects", headers=admin_headers,
                           json={"name": "p"}))["project"]
    got = create_ok(client, admin_headers, projectId=proj["id"])
    assert got["experiment"]["resourcePool"] == "team"
    assert got["config"]["checkpoint_storage"]["host_path"] == "/mnt/team-ckpts"
    assert got["config"]["checkpoint_storage"]["save_trial_best"] == 3
    # The config's own choices win.
    explicit = yaml.safe_load(CONFIG)
    explicit["resources"]["resource_pool"] = "default"
    explicit["checkpoint_storage"] = {"type": "shared_fs", "host_path": "/mnt/mine"}
    got = create_ok(client, admin_headers, yaml.safe_dump(explicit), projectId=proj["id"])
    assert got["experiment"]["resourcePool"] == "default"
    assert (got["config"]["checkpoint_storage"]["host_path"], got["config"]["checkpoint_storage"]["save_trial_best"]) \
        == ("/mnt/mine", 3)
    # Uncategorized keeps the master's.
    assert create_ok(client, admin_headers)["experiment"]["resourcePool"] == "default"
    # Bad defaults are refused, naming the field; `det workspace edit` sends the *ResourcePool names.
    _refused(client.post("/api/v1/workspaces", headers=admin_headers,
                         json={"name": "x", "defaultComputePool": "nope"}), 400, "defaultComputePool")
    _refused(client.post("/api/v1/workspaces", headers=admin_headers,
                         json={"name": "x", "checkpointStorageConfig": {"type": "s3"}}), 400)
    edited = _ok(client.patch(f"/api/v1/workspaces/{ws['id']}", headers=admin_headers,
                              json={"defaultComputeResourcePool": "", "checkpointStorageConfig": {}}))["workspace"]
    assert (edited["defaultComputePool"], edited["checkpointStorageConfig"]) == ("", None)


def test_templates_merge_under_the_config(client, admin_headers) -> None:  # type: ignore[no-untyped-def]
    alice = make_user(client, admin_headers, "alice")
    bob = make_user(client, admin_headers, "bob")
    tpl = {"description": "from the template", "labels": ["team"], "max_restarts": 7,
           "resources": {"slots_per_trial": 1, "priority": 10},
           "environment": {"environment_variables": ["TEAM=1"]}}
    # What `det template create NAME FILE` sends (workspaceId 0: the default workspace).
    got = _ok(client.post("/api/v1/templates/base", headers=alice,
                          json={"name": "base", "config": tpl, "workspaceId": 0}))["template"]
    assert got == {"name": "base", "config": tpl, "workspaceId": 1}
    _refused(client.post("/api/v1/templates/base", headers=alice, json={"name": "base", "config": {}}), 409)
    assert [t["name"] for t in _ok(client.get("/api/v1/templates", headers=bob))["templates"]] == ["base"]

    exp = create_ok(client, bob, template="base")
    cfg = exp["config"]
    assert (cfg["description"], cfg["max_restarts"], cfg["resources"]["priority"]) == ("a small test", 7, 10)
    assert cfg["labels"] == ["a", "b", "team"]  # labels are a set in Determined: unioned
    assert cfg["environment"]["environment_variables"]["cpu"] == ["TEAM=1"]
    _refused(create(client, bob, template="nope"), 400, "template")

    # `det template set` (PATCH with the config as the body): the owner or an admin only.
    _refused(client.patch("/api/v1/templates/base", headers=bob, json={"max_restarts": 1}), 403)
    assert _ok(client.patch("/api/v1/templates/base", headers=alice,
                            json={"max_restarts": 1}))["template"]["config"] == {"max_restarts": 1}
    _refused(client.patch("/api/v1/templates/base", headers=alice, json=[1]), 400, "config")
    _ok(client.put("/api/v1/templates/other", headers=bob, json={"name": "other", "config": {"max_restarts": 2}}))
    _refused(client.delete("/api/v1/templates/base", headers=bob), 403)
    _ok(client.delete("/api/v1/templates/base", headers=alice))
    _refused(client.get("/api/v1/templates/base", headers=alice), 404)
