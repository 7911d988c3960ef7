"""`DELETE /api/v1/models/{name}` (Determined's DeleteModel, `det model delete`): the model and its
versions go in one transaction, their checkpoints stay; the model's owner or an admin. SQLite and
PostgreSQL; the real 0.38.1 client is in tests/compat/test_client_gaps.py."""

from __future__ import annotations

from sqlalchemy import func, select

from control_plane.db.models import Checkpoint, Model, ModelVersion
from tests.control_plane.api.test_checkpoints import ckpt_body, report_ckpt
from tests.control_plane.api.test_experiments import allocation_headers, create_ok, make_user, only_trial


def test_delete_model_with_versions_keeps_checkpoints(client, admin_headers, master) -> None:  # type: ignore[no-untyped-def]
    alice = make_user(client, admin_headers, "alice")
    bob = make_user(client, admin_headers, "bob")
    trial = only_trial(master, create_ok(client, alice)["experiment"]["id"])
    token = allocation_headers(master, trial)
    uuids = [report_ckpt(client, token, ckpt_body(trial, n)) for n in (10, 20)]
    for name in ("m1", "m2"):
        assert client.post("/api/v1/models", headers=alice, json={"name": name}).status_code == 200
        for u in uuids:
            r = client.post(f"/api/v1/models/{name}/versions", headers=alice, json={"checkpointUuid": u})
            assert r.status_code == 200, r.text

    r = client.delete("/api/v1/models/m1", headers=bob)
    assert r.status_code == 403 and "m1" in r.json()["message"], r.text
    assert client.delete("/api/v1/models/nope", headers=alice).status_code == 404
    assert client.delete("/api/v1/models/m1").status_code == 401

    assert client.delete("/api/v1/models/m1", headers=alice).status_code == 200
    assert client.get("/api/v1/models/m1", headers=alice).status_code == 404
    assert client.delete("/api/v1/models/m1", headers=alice).status_code == 404
    with master.sessions() as s:
        assert s.scalars(select(Model.name)).all() == ["m2"]
        assert s.scalar(select(func.count()).select_from(ModelVersion)) == 2  # m2's only
        assert {s.get(Checkpoint, u).state for u in uuids} == {"STATE_COMPLETED"}
    # still held by m2's versions; an admin deletes another user's model, then the checkpoints are free
    r = client.request("DELETE", "/api/v1/checkpoints", headers=alice, json={"checkpointUuids": uuids[:1]})
    assert r.status_code == 400
    assert client.delete("/api/v1/models/m2", headers=admin_headers).status_code == 200
    r = client.request("DELETE", "/api/v1/checkpoints", headers=alice, json={"checkpointUuids": uuids[:1]})
    assert r.status_code == 200, r.text
