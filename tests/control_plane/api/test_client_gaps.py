"""What Determined 0.38.1's client sends that Shipyard refused (issue 30), over HTTP on both
databases: the model registry takes JSON nulls as proto3's JSON mapping does (null = the field's
default), and `PATCH /api/v1/experiments/{id}` `resources` (`det e set priority|weight|max-slots`)
changes the experiment's job through the job queue's rules."""

from __future__ import annotations

from typing import Any

import pytest

from control_plane.db.models import Allocation
from tests.conftest import login
from tests.control_plane.api.test_checkpoints import ckpt_body, report_ckpt
from tests.control_plane.api.test_experiments import allocation_headers, create_ok, make_user, only_trial

# What `Determined.create_model(name, description)` and `det model create` send (0.38.1's bindings).
CLIENT_POST_MODEL = {"name": "m1", "description": "", "labels": None, "metadata": None, "notes": None,
                     "workspaceId": None, "workspaceName": None}


def test_model_create_and_register_take_the_clients_nulls(client, admin_headers, master) -> None:  # type: ignore[no-untyped-def]
    r = client.post("/api/v1/models", headers=admin_headers, json=CLIENT_POST_MODEL)
    assert r.status_code == 200, r.text
    model = r.json()["model"]
    assert (model["metadata"], model["labels"], model["notes"], model["description"]) == ({}, [], "", "")
    trial = only_trial(master, create_ok(client, admin_headers)["experiment"]["id"])
    ckpt = report_ckpt(client, allocation_headers(master, trial), ckpt_body(trial, 10))
    body = {"checkpointUuid": ckpt, "modelName": "m1", "comment": None, "labels": None, "metadata": None,
            "name": None, "notes": None}
    r = client.post("/api/v1/models/m1/versions", headers=admin_headers, json=body)
    assert r.status_code == 200, r.text
    v = r.json()["modelVersion"]
    assert (v["version"], v["metadata"], v["labels"], v["checkpoint"]["uuid"]) == (1, {}, [], ckpt)
    # A null inside a JSON value is kept (only a field's own null means "absent").
    r = client.post("/api/v1/models", headers=admin_headers, json={"name": "m2", "metadata": {"k": None}})
    assert r.status_code == 200 and r.json()["model"]["metadata"] == {"k": None}, r.text


@pytest.mark.parametrize(("body", "field"), [
    ({"name": None}, "name"),  # required: null is absent, and absent is refused
    ({"name": "x", "metadata": {"a": "\x00"}}, "metadata.a"),
    ({"name": "x", "description": "d" * 10_001}, "description"),
    ({"name": "x", "metadata": [1]}, "metadata"),
])
def test_model_hardening_still_applies(client, admin_headers, body: dict[str, Any], field: str) -> None:  # type: ignore[no-untyped-def]
    r = client.post("/api/v1/models", headers=admin_headers, json=body)
    assert r.status_code == 400, r.text
    assert field in [d["field"] for d in r.json()["details"]], r.text


def _patch(client: Any, headers: dict[str, str], exp_id: int, **resources: Any) -> Any:
    return client.patch(f"/api/v1/experiments/{exp_id}", headers=headers,
                        json={"id": exp_id, "resources": resources})


def test_experiment_resources_patch_changes_the_job(client, admin_headers, master) -> None:  # type: ignore[no-untyped-def]
    exp_id = create_ok(client, admin_headers)["experiment"]["id"]
    for change in ({"priority": 7}, {"weight": 2.5}, {"maxSlots": 3}):
        r = _patch(client, admin_headers, exp_id, **change)
        assert r.status_code == 200, (change, r.text)
    exp = client.get(f"/api/v1/experiments/{exp_id}", headers=admin_headers).json()["experiment"]
    resources = exp["config"]["resources"]
    assert (resources["priority"], resources["weight"], resources["max_slots"]) == (7, 2.5, 3)
    # All null (`det e set max-slots <id> none`) changes nothing, as in Determined.
    assert _patch(client, admin_headers, exp_id, maxSlots=None).status_code == 200
    again = client.get(f"/api/v1/experiments/{exp_id}", headers=admin_headers).json()["experiment"]
    assert again["config"]["resources"] == resources
    job = client.get("/api/v1/job-queues-v2", headers=admin_headers).json()["jobs"][0]["full"]
    assert (job["jobId"], job["priority"], job["weight"]) == (exp["jobId"], 7, 2.5)
    with master.sessions() as s:  # the live allocation carries the change, as `det job update` does
        alloc = s.query(Allocation).filter_by(experiment_id=exp_id).one()
        assert (alloc.priority, alloc.weight) == (7, 2.5)


@pytest.mark.parametrize(("change", "field"), [
    ({"priority": 0}, "resources.priority"),
    ({"priority": 100}, "resources.priority"),
    ({"weight": 0}, "resources.weight"),
    ({"maxSlots": 0}, "resources.maxSlots"),
])
def test_experiment_resources_patch_bounds(client, admin_headers, master, change: dict[str, Any], field: str) -> None:  # type: ignore[no-untyped-def]
    exp_id = create_ok(client, admin_headers)["experiment"]["id"]
    r = _patch(client, admin_headers, exp_id, **change)
    assert r.status_code == 400, r.text
    assert [d["field"] for d in r.json()["details"]] == [field] and r.json()["details"][0]["reason"], r.text


def test_experiment_resources_patch_owner_admin_and_ended(client, admin_headers, master) -> None:  # type: ignore[no-untyped-def]
    from tests.control_plane.api.test_experiments import finish_experiment

    make_user(client, admin_headers, "owner")
    make_user(client, admin_headers, "other")
    owner, other = login(client, "owner", "owner-password-1"), login(client, "other", "other-password-1")
    exp_id = create_ok(client, owner)["experiment"]["id"]
    assert _patch(client, other, exp_id, priority=3).status_code == 403
    assert _patch(client, owner, exp_id, priority=4).status_code == 200
    assert _patch(client, admin_headers, exp_id, priority=5).status_code == 200
    finish_experiment(master, exp_id)
    assert _patch(client, owner, exp_id, priority=6).status_code == 409


def test_trial_summary_metrics_in_determineds_format(client, admin_headers, master) -> None:  # type: ignore[no-untyped-def]
    from tests.control_plane.api.test_trials import post, report

    trial = only_trial(master, create_ok(client, admin_headers)["experiment"]["id"])
    url = f"/api/v1/trials/{trial.id}"
    assert client.get(url, headers=admin_headers).json()["trial"]["summaryMetrics"] is None  # nothing reported
    headers = allocation_headers(master, trial)
    for step, loss in ((2, 0.5), (1, 0.9), (3, "NaN")):  # out of order: `last` is the highest step's
        post(client, headers, trial.id, report(trial.id, step, {"loss": loss, "phase": f"p{step}"}))
    post(client, headers, trial.id, report(trial.id, 3, {"val_loss": 0.25}, group="validation"))
    summary = client.get(url, headers=admin_headers).json()["trial"]["summaryMetrics"]
    assert summary["avg_metrics"]["loss"] == {"count": 3, "sum": "NaN", "min": 0.5, "max": 0.9, "last": "NaN",
                                              "type": "number"}
    assert summary["avg_metrics"]["phase"] == {"count": 3, "last": "p3", "type": "string"}
    assert summary["validation_metrics"]["val_loss"] == {"count": 1, "sum": 0.25, "min": 0.25, "max": 0.25,
                                                         "last": 0.25, "type": "number"}
