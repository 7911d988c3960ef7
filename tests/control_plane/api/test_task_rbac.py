"""Commands, notebooks, TensorBoards and shells under roles and pool bindings (issue 30), over HTTP on
both databases, in one app per database: a task belongs to its launch's workspace; launching needs a
role that creates there, killing the owner or an Editor there; reads are open; its pool must be one
the workspace may use, and `det workspace list-pools` lists exactly those."""

from __future__ import annotations

from typing import Any

from tests.control_plane.api.test_experiments import make_user
from tests.control_plane.api.test_rbac import EDITOR, VIEWER, _assign, _ids, _ok
from tests.control_plane.api.test_rbac import master_config as master_config  # two pools: default, team


def _launch(client, headers: dict[str, str], ws: int | None, kind: str = "commands", **config: Any) -> Any:  # type: ignore[no-untyped-def]
    body: dict[str, Any] = {"config": {"entrypoint": ["sleep", "60"], **config}}
    if ws is not None:
        body["workspaceId"] = ws
    return client.post(f"/api/v1/{kind}", headers=headers, json=body)


def _pools(client, headers: dict[str, str], ws: int) -> list[str]:  # type: ignore[no-untyped-def]
    return _ok(client.get(f"/api/v1/workspaces/{ws}/available-resource-pools", headers=headers))["resourcePools"]


def test_tasks_under_roles_and_pool_bindings(client, admin_headers) -> None:  # type: ignore[no-untyped-def]
    admin = admin_headers
    users = {name: make_user(client, admin, name) for name in ("viewer", "editor", "nobody")}
    ids = _ids(client, admin)
    ws = _ok(client.post("/api/v1/workspaces", headers=admin, json={"name": "W"}))["workspace"]["id"]
    _ok(_assign(client, admin, VIEWER, user=ids["viewer"], workspace=ws))
    _ok(_assign(client, admin, EDITOR, user=ids["editor"], workspace=ws))

    # Launching in W: an Editor may; a Viewer or a user without a role there may not (403 naming it).
    viewer = _launch(client, users["viewer"], ws)
    assert viewer.status_code == 403 and "has Viewer on workspace" in viewer.json()["message"], viewer.text
    assert "needs Editor" in viewer.json()["message"]
    nobody = _launch(client, users["nobody"], ws, "notebooks")
    assert nobody.status_code == 403 and f"has no role on workspace {ws}" in nobody.json()["message"], nobody.text
    mine = _ok(_launch(client, users["editor"], ws, "notebooks"))["notebook"]
    assert (mine["workspaceId"], mine["resourcePool"]) == (ws, "default")
    # Everyone is Editor of Uncategorized (the default workspace); an unknown workspace is a 400.
    uncat = _ok(_launch(client, users["nobody"], None))["command"]
    assert uncat["workspaceId"] == 1
    missing = _launch(client, users["editor"], 9999)
    assert missing.status_code == 400 and missing.json()["details"][0]["field"] == "workspaceId"

    # Killing another's task in W: a Viewer may not (403 naming the role); an Editor there may.
    admins = _ok(_launch(client, admin, ws))["command"]
    refused = client.post(f"/api/v1/commands/{admins['id']}/kill", headers=users["viewer"])
    assert refused.status_code == 403 and "has Viewer on workspace" in refused.json()["message"], refused.text
    assert "belongs to another user" in refused.json()["message"]
    # Reads are open: the Viewer reads it and its logs; the list filters by workspace.
    assert _ok(client.get(f"/api/v1/commands/{admins['id']}", headers=users["viewer"]))["command"]["workspaceId"] == ws
    assert client.get(f"/api/v1/tasks/{admins['id']}/logs", headers=users["viewer"]).status_code == 200
    in_ws = _ok(client.get("/api/v1/commands", headers=users["viewer"], params={"workspaceId": ws}))["commands"]
    assert [c["id"] for c in in_ws] == [admins["id"]]
    killed = _ok(client.post(f"/api/v1/commands/{admins['id']}/kill", headers=users["editor"]))["command"]
    assert killed["state"] == "STATE_TERMINATED"
    # An Editor of W is nobody in Uncategorized: another user's task there is not theirs to kill.
    assert client.post(f"/api/v1/commands/{uncat['id']}/kill", headers=users["editor"]).status_code == 403
    # The proxy stays the owner's (and admins'): a Viewer of its workspace finds nothing there.
    assert client.get(f"/proxy/{mine['id']}/", headers=users["viewer"]).status_code == 404

    # Bound to W, "team" takes W's tasks only (400 naming the pool, as experiments); list-pools agrees.
    assert _pools(client, admin, ws) == _pools(client, admin, 1) == ["default", "team"]
    _ok(client.post("/api/v1/resource-pools/team/workspace-bindings", headers=admin, json={"workspaceIds": [ws]}))
    outside = _launch(client, users["nobody"], None, resources={"resource_pool": "team"})
    assert outside.status_code == 400 and "'team' is bound to other workspaces" in outside.json()["message"]
    assert outside.json()["details"][0]["field"] == "config.resources.resource_pool"
    inside = _ok(_launch(client, users["editor"], ws, resources={"resource_pool": "team"}))["command"]
    assert inside["resourcePool"] == "team"
    queue = _ok(client.get("/api/v1/job-queues", headers=users["viewer"], params={"resourcePool": "team"}))["jobs"]
    assert [(j["jobId"], j["workspaceId"]) for j in queue] == [(inside["id"], ws)]  # the job queue says whose
    assert (_pools(client, users["viewer"], ws), _pools(client, users["viewer"], 1)) == (["default", "team"], ["default"])
    # No pool named: the workspace's default compute pool (aux pool for 0 slots), else the cluster's.
    _ok(client.patch(f"/api/v1/workspaces/{ws}", headers=admin, json={"defaultComputePool": "team"}))
    assert _ok(_launch(client, users["editor"], ws))["command"]["resourcePool"] == "team"
    assert _ok(_launch(client, users["editor"], ws, resources={"slots": 0}))["command"]["resourcePool"] == "default"

    # Determined's set_priority (det cmd|notebook|shell|tensorboard set priority): who may kill it may
    # change it; the job queue orders it by the new one; out of range or ended is a 400 on priority.
    queued = _ok(_launch(client, admin, ws, resources={"resource_pool": "team", "slots": 1}))["command"]
    refused = client.post(f"/api/v1/commands/{queued['id']}/set_priority", headers=users["viewer"], json={"priority": 5})
    assert refused.status_code == 403 and "has Viewer on workspace" in refused.json()["message"], refused.text
    changed = _ok(client.post(f"/api/v1/commands/{queued['id']}/set_priority", headers=users["editor"],
                              json={"priority": 5, "commandId": queued["id"]}))["command"]
    assert changed["id"] == queued["id"]
    queue = _ok(client.get("/api/v1/job-queues", headers=admin, params={"resourcePool": "team"}))["jobs"]
    assert [(j["jobId"], j["priority"]) for j in queue][0] == (queued["id"], 5), queue  # now first (lower runs first)
    assert _ok(client.get(f"/api/v1/commands/{queued['id']}", headers=admin))["config"]["resources"]["priority"] == 5
    for priority in (0, 100):
        bad = client.post(f"/api/v1/commands/{queued['id']}/set_priority", headers=admin, json={"priority": priority})
        assert bad.status_code == 400 and bad.json()["details"][0]["field"] == "priority", bad.text
    ended = client.post(f"/api/v1/commands/{killed['id']}/set_priority", headers=admin, json={"priority": 3})
    assert ended.status_code == 400 and "has ended" in ended.json()["message"], ended.text
    assert client.post(f"/api/v1/notebooks/{queued['id']}/set_priority", headers=admin,
                       json={"priority": 3}).status_code == 404  # a command is not a notebook
