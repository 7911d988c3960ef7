"""Checkpoint metadata API: report (Determined client shape), get, list/sort, delete, patch,
metadata. SQLite and PostgreSQL."""

from __future__ import annotations

import uuid
from typing import Any

from control_plane.db.engine import transaction
from control_plane.db.models import Checkpoint, Model, ModelVersion, Trial
from tests.control_plane.api.test_experiments import (
    allocation_headers,
    create_ok,
    make_user,
    only_trial,
)
from tests.control_plane.api.test_trials import report

# Required constructor fields of Determined 0.38.1's v1Checkpoint.
V1_CHECKPOINT_REQUIRED = {"metadata", "resources", "state", "training", "uuid"}


def ckpt_body(trial: Trial, steps: int, *, uid: str | None = None, **extra: Any) -> dict[str, Any]:
    """What determined.core's CheckpointContext posts: an empty `training`, sizes as strings."""
    return {
        "uuid": uid or str(uuid.uuid4()),
        "taskId": trial.task_id,
        "allocationId": f"{trial.task_id}.1",
        "reportTime": "2024-05-01T10:00:00.000001+00:00",
        "resources": {"model.pt": "1000", "opt/state.pt": "24", "opt/": "0"},
        "metadata": {"steps_completed": steps, "framework": "torch"},
        "state": "STATE_COMPLETED",
        "training": {},
        "storageId": 1,
        **extra,
    }


def report_ckpt(client, headers, body: dict[str, Any]) -> str:  # type: ignore[no-untyped-def]
    r = client.post("/api/v1/checkpoints", headers=headers, json=body)
    assert r.status_code == 200, r.text
    return body["uuid"]


def test_report_and_get_checkpoint(client, admin_headers, master) -> None:
    alice = make_user(client, admin_headers, "alice")
    bob = make_user(client, admin_headers, "bob")
    eid = create_ok(client, alice)["experiment"]["id"]
    trial = only_trial(master, eid)
    other = only_trial(master, create_ok(client, alice)["experiment"]["id"])
    token = allocation_headers(master, trial)
    r = client.post(f"/api/v1/trials/{trial.id}/metrics", headers=token,
                    json=report(trial.id, 100, {"val_loss": 0.25}, group="validation"))
    assert r.status_code == 200

    body = ckpt_body(trial, 100)
    uid = report_ckpt(client, token, body)
    report_ckpt(client, token, body)  # a retry is a no-op
    got = client.get(f"/api/v1/checkpoints/{uid}", headers=bob)
    assert got.status_code == 200, got.text
    c = got.json()["checkpoint"]
    assert V1_CHECKPOINT_REQUIRED <= set(c)
    assert c["state"] == "STATE_COMPLETED" and c["stepsCompleted"] == 100 and c["sizeBytes"] == "1024"
    assert c["resources"] == {"model.pt": "1000", "opt/state.pt": "24", "opt/": "0"}
    assert c["metadata"] == {"steps_completed": 100, "framework": "torch"}
    assert c["training"]["trialId"] == trial.id and c["training"]["experimentId"] == eid
    assert c["training"]["validationMetrics"]["avgMetrics"] == {"val_loss": 0.25}
    assert c["training"]["searcherMetric"] == 0.25 and c["taskId"] == trial.task_id
    t = client.get(f"/api/v1/trials/{trial.id}", headers=alice).json()["trial"]
    assert t["latestCheckpointUuid"] == uid and t["checkpointCount"] == 1 and t["totalCheckpointSize"] == "1024"
    assert t["bestCheckpoint"]["uuid"] == uid  # the checkpoint at the best validation's step
    exp = client.get(f"/api/v1/experiments/{eid}", headers=alice).json()["experiment"]
    assert exp["checkpointCount"] == 1 and exp["checkpointSize"] == "1024"

    # an older checkpoint does not become the latest; the owner may report one too
    older = report_ckpt(client, alice, ckpt_body(trial, 50, training={"trialId": trial.id}))
    assert client.get(f"/api/v1/trials/{trial.id}", headers=alice).json()["trial"]["latestCheckpointUuid"] == uid
    assert client.get(f"/api/v1/checkpoints/{older}", headers=token).json()["checkpoint"]["stepsCompleted"] == 50

    def refused(headers: dict[str, str], bad: dict[str, Any], status: int, field: str | None = None) -> None:
        r = client.post("/api/v1/checkpoints", headers=headers, json=bad)
        assert r.status_code == status, (bad, r.text)
        if field:
            assert field in [d["field"] for d in r.json()["details"]], r.json()

    refused({}, ckpt_body(trial, 1), 401)
    refused(allocation_headers(master, other), ckpt_body(trial, 1), 403)  # another trial's token
    refused(bob, ckpt_body(trial, 1), 403)  # another user's experiment
    refused(token, ckpt_body(trial, 1, uid="../../etc"), 400, "uuid")
    refused(token, {**ckpt_body(trial, 1), "metadata": {}}, 400, "metadata.steps_completed")
    refused(token, {**ckpt_body(trial, 1), "resources": {"../x": "1"}}, 400)
    refused(token, {**ckpt_body(trial, 1), "resources": {"/etc/passwd": "1"}}, 400)
    refused(token, {**ckpt_body(trial, 1), "resources": {"a": "lots"}}, 400)
    refused(token, ckpt_body(trial, 1, state="STATE_DELETED"), 400, "state")
    refused(token, ckpt_body(trial, 1, taskId="nope"), 400, "taskId")
    refused(token, ckpt_body(trial, 1, training={"trialId": other.id}), 400)  # names two trials
    refused(token, ckpt_body(trial, 1, bogus=1), 400, "bogus")
    refused(allocation_headers(master, other), ckpt_body(other, 1, uid=uid), 409)  # uuid of another trial
    assert client.get(f"/api/v1/checkpoints/{uuid.uuid4()}", headers=alice).status_code == 404
    assert client.get("/api/v1/checkpoints/not-a-uuid", headers=alice).status_code == 404
    assert client.get(f"/api/v1/checkpoints/{uid}", headers=allocation_headers(master, other)).status_code == 403

    r = client.post(f"/api/v1/checkpoints/{uid}/metadata", headers=token,
                    json={"checkpoint": {"metadata": {"steps_completed": 100, "note": "best"}}})
    assert r.status_code == 200 and r.json()["metadata"]["note"] == "best"
    assert client.post(f"/api/v1/checkpoints/{uid}/metadata", headers=bob,
                       json={"checkpoint": {"metadata": {}}}).status_code == 403


def test_list_and_sort_checkpoints(client, admin_headers, master) -> None:
    eid = create_ok(client, admin_headers)["experiment"]["id"]
    trial = only_trial(master, eid)
    token = allocation_headers(master, trial)
    losses = {10: 0.5, 20: 0.2, 30: 0.9}
    uids = {}
    for steps, loss in losses.items():
        r = client.post(f"/api/v1/trials/{trial.id}/metrics", headers=token,
                        json=report(trial.id, steps, {"val_loss": loss, "acc": 1 - loss}, group="validation"))
        assert r.status_code == 200
        uids[steps] = report_ckpt(client, token, ckpt_body(trial, steps))
    uids[40] = report_ckpt(client, token, ckpt_body(trial, 40))  # no validation at this step

    def listed(path: str, **params: Any) -> list[str]:
        r = client.get(path, headers=admin_headers, params=params)
        assert r.status_code == 200, r.text
        return [c["uuid"] for c in r.json()["checkpoints"]]

    for path in (f"/api/v1/experiments/{eid}/checkpoints", f"/api/v1/trials/{trial.id}/checkpoints"):
        assert listed(path, sortByAttr="SORT_BY_BATCH_NUMBER") == [uids[10], uids[20], uids[30], uids[40]]
        assert listed(path, sortByAttr="SORT_BY_BATCH_NUMBER", orderBy="ORDER_BY_DESC", limit=2) == [uids[40], uids[30]]
        # best first (smaller val_loss) by default; checkpoints without the metric go last
        assert listed(path, sortByAttr="SORT_BY_SEARCHER_METRIC") == [uids[20], uids[10], uids[30], uids[40]]
        assert listed(path, sortByAttr="SORT_BY_SEARCHER_METRIC", orderBy="ORDER_BY_DESC") == [
            uids[30], uids[10], uids[20], uids[40]]
        assert listed(path, sortByMetric="acc", orderBy="ORDER_BY_DESC") == [uids[20], uids[10], uids[30], uids[40]]
    page = client.get(f"/api/v1/trials/{trial.id}/checkpoints", headers=admin_headers,
                      params={"sortByAttr": "SORT_BY_BATCH_NUMBER", "offset": 1, "limit": 2}).json()
    assert [c["stepsCompleted"] for c in page["checkpoints"]] == [20, 30] and page["pagination"]["total"] == 4
    for params, field in [({"sortByAttr": "SORT_BY_SIZE"}, "sortByAttr"), ({"states": "STATE_GONE"}, "states"),
                          ({"sortByAttr": "SORT_BY_UUID", "sortByMetric": "acc"}, "sortByMetric")]:
        r = client.get(f"/api/v1/experiments/{eid}/checkpoints", headers=admin_headers, params=params)
        assert r.status_code == 400 and r.json()["details"][0]["field"] == field
    assert client.get("/api/v1/experiments/999999/checkpoints", headers=admin_headers).status_code == 404

    # delete two; they read as deleted and the trial's latest checkpoint moves back
    r = client.request("DELETE", "/api/v1/checkpoints", headers=admin_headers,
                       json={"checkpointUuids": [uids[40], uids[30]]})
    assert r.status_code == 200, r.text
    with master.sessions() as s:
        assert s.get(Checkpoint, uids[40]).state == "STATE_DELETING"  # for the GC worker
        assert s.get(Trial, trial.id).latest_checkpoint_uuid == uids[20]
    assert listed(f"/api/v1/experiments/{eid}/checkpoints", states="STATE_DELETED",
                  sortByAttr="SORT_BY_BATCH_NUMBER") == [uids[30], uids[40]]
    assert listed(f"/api/v1/experiments/{eid}/checkpoints", states=["STATE_COMPLETED"],
                  sortByAttr="SORT_BY_BATCH_NUMBER") == [uids[10], uids[20]]
    assert client.get(f"/api/v1/checkpoints/{uids[40]}", headers=admin_headers).json()["checkpoint"]["state"] == "STATE_DELETED"
    exp = client.get(f"/api/v1/experiments/{eid}", headers=admin_headers).json()["experiment"]
    assert exp["checkpointCount"] == 2
    # deleting again is harmless
    assert client.request("DELETE", "/api/v1/checkpoints", headers=admin_headers,
                          json={"checkpointUuids": [uids[40]]}).status_code == 200


def test_delete_and_patch_refusals(client, admin_headers, master) -> None:
    alice = make_user(client, admin_headers, "alice")
    bob = make_user(client, admin_headers, "bob")
    eid = create_ok(client, alice)["experiment"]["id"]
    trial = only_trial(master, eid)
    token = allocation_headers(master, trial)
    a = report_ckpt(client, token, ckpt_body(trial, 10))
    b = report_ckpt(client, token, ckpt_body(trial, 20))
    registered = report_ckpt(client, token, ckpt_body(trial, 30))
    with transaction(master.sessions) as s:
        model = Model(name="m", owner_id=1)
        s.add(model)
        s.flush()
        s.add(ModelVersion(model_id=model.id, version=1, checkpoint_uuid=registered, owner_id=1))

    def delete(headers: dict[str, str], uuids: list[str]) -> Any:
        return client.request("DELETE", "/api/v1/checkpoints", headers=headers, json={"checkpointUuids": uuids})

    assert delete({}, [a]).status_code == 401
    assert delete(bob, [a]).status_code == 403
    assert delete(token, [a]).status_code == 403  # a trial process cannot delete
    assert delete(alice, [a, str(uuid.uuid4())]).status_code == 404
    assert delete(alice, ["../x"]).status_code == 400
    assert delete(alice, []).status_code == 400
    r = delete(alice, [a, registered])
    assert r.status_code == 400 and registered in r.json()["message"]
    with master.sessions() as s:  # nothing was marked by the refused requests
        assert {s.get(Checkpoint, u).state for u in (a, b, registered)} == {"STATE_COMPLETED"}

    # PATCH: a smaller file list is a partial deletion, an empty one a full deletion
    r = client.patch("/api/v1/checkpoints", headers=alice, json={"checkpoints": [
        {"uuid": a, "resources": {"resources": {"model.pt": "1000"}}}, {"uuid": b, "resources": {}}]})
    assert r.status_code == 200, r.text
    got_a = client.get(f"/api/v1/checkpoints/{a}", headers=alice).json()["checkpoint"]
    assert got_a["state"] == "STATE_PARTIALLY_DELETED" and got_a["resources"] == {"model.pt": "1000"}
    assert client.get(f"/api/v1/checkpoints/{b}", headers=alice).json()["checkpoint"]["state"] == "STATE_DELETED"
    assert client.patch("/api/v1/checkpoints", headers=bob,
                        json={"checkpoints": [{"uuid": a, "resources": {}}]}).status_code == 403
