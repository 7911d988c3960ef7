"""Experiments API: create (config + model definition), list/get, changes, archive, delete.

Every test runs on SQLite and PostgreSQL (the `client` fixture is parametrised over both)."""

from __future__ import annotations

import base64
import json
from datetime import timedelta
from typing import Any

from sqlalchemy import func, select

from control_plane import auth
from control_plane.core import states as st
from control_plane.db.engine import transaction
from control_plane.db.models import Experiment, ModelDefinition, Trial
from tests.conftest import login

CONFIG = """
name: mnist-test
description: a small test
labels: [a, b]
entrypoint: python3 train.py
hyperparameters:
  lr: 0.1
searcher:
  name: single
  metric: val_loss
  smaller_is_better: true
  max_length: {batches: 100}
resources:
  slots_per_trial: 1
"""

# Required constructor fields of Determined 0.38.1's bindings (from_json must not break).
V1_EXPERIMENT_REQUIRED = {
    "archived", "config", "id", "jobId", "name", "numTrials", "originalConfig", "projectId",
    "projectOwnerId", "searcherType", "startTime", "state", "username",
}
V1_TRIAL_REQUIRED = {"experimentId", "hparams", "id", "restarts", "startTime", "state", "totalBatchesProcessed"}


def v1file(path: str, content: bytes = b"print('hi')\n", type_: int = 48) -> dict[str, Any]:
    return {"path": path, "type": type_, "content": base64.b64encode(content).decode(), "mode": 0o644,
            "mtime": "0", "uid": 0, "gid": 0}


def create(client, headers: dict[str, str], config: str = CONFIG, files: list[dict[str, Any]] | None = None,
           **extra: Any):  # type: ignore[no-untyped-def]
    body = {"config": config, "modelDefinition": files if files is not None else [v1file("train.py")], **extra}
    return client.post("/api/v1/experiments", headers=headers, json=body)


def create_ok(client, headers: dict[str, str], config: str = CONFIG, **extra: Any) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    r = create(client, headers, config, **extra)
    assert r.status_code == 200, r.text
    return r.json()


def make_user(client, admin_headers: dict[str, str], name: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    r = client.post("/api/v1/users", headers=admin_headers,
                    json={"user": {"username": name}, "password": f"{name}-password-1"})
    assert r.status_code == 200, r.text
    return login(client, name, f"{name}-password-1")


def only_trial(master, experiment_id: int) -> Trial:  # type: ignore[no-untyped-def]
    with master.sessions() as s:
        trials = list(s.scalars(select(Trial).where(Trial.experiment_id == experiment_id)))
    assert len(trials) == 1, trials
    return trials[0]


def allocation_headers(master, trial: Trial, *, user_id: int | None = None) -> dict[str, str]:  # type: ignore[no-untyped-def]
    with transaction(master.sessions) as s:
        token = auth.issue_token(s, auth.TokenKind.ALLOCATION, now=master.clock(), ttl=timedelta(hours=1),
                                 trial_id=trial.id, allocation_id=f"{trial.task_id}.1", user_id=user_id)
    return {"Authorization": f"Bearer {token}"}


def finish_experiment(master, experiment_id: int, state: str = st.ExperimentState.COMPLETED) -> None:  # type: ignore[no-untyped-def]
    """What the lifecycle does when an experiment ends (the loops do not run in these tests)."""
    from control_plane.db.models import Allocation

    with transaction(master.sessions) as s:
        exp = s.get(Experiment, experiment_id)
        exp.state = state
        exp.end_time = master.clock()
        for t in s.scalars(select(Trial).where(Trial.experiment_id == experiment_id)):
            t.state = st.TrialState.COMPLETED
            t.end_time = master.clock()
        for a in s.scalars(select(Allocation).where(Allocation.experiment_id == experiment_id)):
            a.state = st.AllocationState.TERMINATED


def row_counts(master) -> tuple[int, int, int]:  # type: ignore[no-untyped-def]
    with master.sessions() as s:
        return (
            s.scalar(select(func.count()).select_from(Experiment)),
            s.scalar(select(func.count()).select_from(Trial)),
            s.scalar(select(func.count()).select_from(ModelDefinition)),
        )


# -- create ----------------------------------------------------------------------------------------
def test_create_experiment_happy_path(client, admin_headers, master) -> None:
    body = create_ok(client, admin_headers)
    exp = body["experiment"]
    assert V1_EXPERIMENT_REQUIRED <= set(exp)
    assert exp["name"] == "mnist-test" and exp["description"] == "a small test" and exp["labels"] == ["a", "b"]
    assert exp["state"] == "STATE_ACTIVE" and exp["archived"] is False and exp["searcherType"] == "single"
    assert exp["username"] == "admin" and exp["resourcePool"] == "default" and exp["projectId"] == 1
    assert exp["numTrials"] == 1 and len(exp["trialIds"]) == 1  # the single searcher's trial
    assert exp["originalConfig"] == CONFIG and exp["searcherMetric"] == "val_loss"
    # The stored config is fully defaulted, with the master's checkpoint storage and a seed.
    cfg = body["config"]
    assert cfg["checkpoint_storage"]["type"] == "shared_fs"
    assert isinstance(cfg["reproducibility"]["experiment_seed"], int)
    assert body["warnings"] == []

    with master.sessions() as s:
        row = s.get(Experiment, exp["id"])
        md = s.get(ModelDefinition, row.model_definition_id)
        assert md.file_count == 1 and md.size_bytes == len(md.archive) > 0
        assert row.config == cfg and row.job_id == exp["jobId"]

    got = client.get(f"/api/v1/experiments/{exp['id']}", headers=admin_headers)
    assert got.status_code == 200
    assert got.json()["config"] == cfg
    assert got.json()["jobSummary"]["state"] == "STATE_QUEUED"
    assert got.json()["jobSummary"]["requestedSlots"] == 1 and got.json()["jobSummary"]["allocatedSlots"] == 0

    trials = client.get(f"/api/v1/experiments/{exp['id']}/trials", headers=admin_headers).json()
    assert trials["pagination"]["total"] == 1
    trial = trials["trials"][0]
    assert V1_TRIAL_REQUIRED <= set(trial)
    assert trial["hparams"] == {"lr": 0.1} and trial["state"] == "STATE_QUEUED"
    assert trial["requestId"] and trial["searcherTargetLength"] == 100 and trial["exitReason"] is None
    assert client.get(f"/api/v1/trials/{trial['id']}", headers=admin_headers).json()["trial"]["id"] == trial["id"]


def test_create_paused_seed_kept_and_secrets_hidden(client, admin_headers, master) -> None:
    config = CONFIG + (
        "reproducibility:\n  experiment_seed: 777\n"
        "checkpoint_storage:\n  type: s3\n  bucket: ckpts\n  access_key: AKID\n  secret_key: s3cr3t/VALUE\n"
    )
    body = create_ok(client, admin_headers, config, activate=False)
    exp = body["experiment"]
    assert exp["state"] == "STATE_PAUSED"
    assert exp["config"]["reproducibility"]["experiment_seed"] == 777
    # the storage secret is kept for the trials but never shown back
    for shown in (body["config"], exp["config"],
                  client.get(f"/api/v1/experiments/{exp['id']}", headers=admin_headers).json()["config"]):
        assert shown["checkpoint_storage"]["secret_key"] == "********"
    assert "s3cr3t" not in json.dumps(client.get("/api/v1/experiments", headers=admin_headers).json())
    with master.sessions() as s:
        assert s.get(Experiment, exp["id"]).config["checkpoint_storage"]["secret_key"] == "s3cr3t/VALUE"


def test_validate_only_writes_nothing(client, admin_headers, master) -> None:
    before = row_counts(master)
    r = create(client, admin_headers, validateOnly=True)
    assert r.status_code == 200, r.text
    assert r.json()["experiment"]["id"] == 0 and r.json()["config"]["searcher"]["name"] == "single"
    assert row_counts(master) == before


def _assert_refused(r, field: str, status: int = 400) -> None:  # type: ignore[no-untyped-def]
    assert r.status_code == status, r.text
    fields = [d["field"] for d in r.json()["details"]]
    assert field in fields, (field, r.json())


def test_bad_configs_are_400_with_field_and_write_nothing(client, admin_headers, master) -> None:
    before = row_counts(master)
    cases = [
        ("name: [unclosed\n", "config"),  # malformed YAML
        (CONFIG.replace("name: single", "name: bayesian"), "config.searcher.name"),  # unknown searcher
        (CONFIG.replace("slots_per_trial: 1", "slots_per_trial: 0"), "config.resources.slots_per_trial"),
        (CONFIG.replace("slots_per_trial: 1", "slots_per_trial: -2"), "config.resources.slots_per_trial"),
        (CONFIG + "bogus_field: 1\n", "config.bogus_field"),  # unknown field
        (CONFIG.replace("slots_per_trial: 1", "slots_per_trial: two"), "config.resources.slots_per_trial"),
        (CONFIG.replace("slots_per_trial: 1", "resource_pool: nope"), "config.resources.resource_pool"),
        ("", "config"),
    ]
    for text, field in cases:
        _assert_refused(create(client, admin_headers, text), field)
    # every problem is reported, not just the first
    both = CONFIG.replace("slots_per_trial: 1", "slots_per_trial: 0") + "bogus_field: 1\n"
    fields = {d["field"] for d in create(client, admin_headers, both).json()["details"]}
    assert {"config.resources.slots_per_trial", "config.bogus_field"} <= fields
    assert row_counts(master) == before


def test_bad_requests_write_nothing(client, admin_headers, master) -> None:
    before = row_counts(master)
    # wrong types and unknown request fields
    _assert_refused(client.post("/api/v1/experiments", headers=admin_headers,
                                json={"config": 5, "modelDefinition": []}), "config")
    _assert_refused(client.post("/api/v1/experiments", headers=admin_headers,
                                json={"config": CONFIG, "modelDefinition": [], "bogus": 1}), "bogus")
    _assert_refused(create(client, admin_headers, unmanaged=True), "unmanaged")
    # non-UTF-8 bytes in the body, and a config string carrying undecodable bytes (lone surrogates)
    raw = b'{"config": "name: \xff\xfe\\n", "modelDefinition": []}'
    r = client.post("/api/v1/experiments", headers={**admin_headers, "content-type": "application/json"},
                    content=raw)
    assert r.status_code == 400, r.text
    surrogate = json.dumps({"config": "name: \udcff\n" + CONFIG, "modelDefinition": []})
    r = client.post("/api/v1/experiments", headers={**admin_headers, "content-type": "application/json"},
                    content=surrogate.encode())
    _assert_refused(r, "config")
    assert row_counts(master) == before


def test_bad_model_definitions_are_refused(client, admin_headers, master) -> None:
    before = row_counts(master)
    cases = [
        ([v1file("train.py"), v1file("../x")], "modelDefinition[1].path"),
        ([v1file("/etc/passwd")], "modelDefinition[0].path"),
        ([v1file("train.py"), v1file("link", b"", type_=ord("2"))], "modelDefinition[1].type"),
        ([{"path": "train.py", "type": 48, "content": "%%% not base64"}], "modelDefinition[0].content"),
    ]
    for files, field in cases:
        _assert_refused(create(client, admin_headers, files=files), field)
    master.config.model_def_max_bytes = 1024
    _assert_refused(create(client, admin_headers, files=[v1file("big.bin", b"x" * 4096)]), "modelDefinition")
    assert row_counts(master) == before


def test_create_requires_a_user(client, admin_headers, master) -> None:
    assert create(client, {}).status_code == 401
    assert create(client, {"Authorization": "Bearer not-a-token"}).status_code == 401
    exp = create_ok(client, admin_headers)["experiment"]
    trial = only_trial(master, exp["id"])
    # an allocation token (a trial process) cannot create experiments
    assert create(client, allocation_headers(master, trial)).status_code == 403


# -- list / get ------------------------------------------------------------------------------------
def test_list_filters_sorting_and_pagination(client, admin_headers, master) -> None:
    alice = make_user(client, admin_headers, "alice")
    e1 = create_ok(client, admin_headers, CONFIG.replace("mnist-test", "alpha"))["experiment"]
    e2 = create_ok(client, alice, CONFIG.replace("mnist-test", "beta").replace("[a, b]", "[b, c]"))["experiment"]
    e3 = create_ok(client, admin_headers, CONFIG.replace("mnist-test", "Gamma_100%"), activate=False)["experiment"]

    def ids(**params: Any) -> list[int]:
        r = client.get("/api/v1/experiments", headers=alice, params=params)
        assert r.status_code == 200, r.text
        return [e["id"] for e in r.json()["experiments"]]

    assert ids() == [e1["id"], e2["id"], e3["id"]]
    assert ids(orderBy="ORDER_BY_DESC") == [e3["id"], e2["id"], e1["id"]]
    assert ids(sortBy="SORT_BY_NAME") == [e3["id"], e1["id"], e2["id"]]  # "Gamma" < "alpha" (bytewise)
    assert ids(states="STATE_PAUSED") == [e3["id"]]
    assert ids(states=["STATE_PAUSED", "STATE_ACTIVE"]) == [e1["id"], e2["id"], e3["id"]]
    assert ids(labels=["b"]) == [e1["id"], e2["id"], e3["id"]]
    assert ids(labels=["a", "b"]) == [e1["id"], e3["id"]]
    assert ids(labels="c") == [e2["id"]]
    assert ids(name="ALPH") == [e1["id"]]
    assert ids(name="100%") == [e3["id"]]  # LIKE wildcards are literal
    assert ids(users="alice") == [e2["id"]]
    assert ids(userIds=1) == [e1["id"], e3["id"]]
    assert ids(archived="false") == [e1["id"], e2["id"], e3["id"]]
    assert ids(**{"experimentIdFilter.gt": e1["id"]}) == [e2["id"], e3["id"]]
    assert ids(sortBy="SORT_BY_USER", orderBy="ORDER_BY_DESC")[0] == e2["id"]

    page = client.get("/api/v1/experiments", headers=alice, params={"offset": 1, "limit": 1}).json()
    assert [e["id"] for e in page["experiments"]] == [e2["id"]]
    assert page["pagination"] == {"offset": 1, "limit": 1, "startIndex": 1, "endIndex": 2, "total": 3}
    only_total = client.get("/api/v1/experiments", headers=alice, params={"limit": -2}).json()
    assert only_total["experiments"] == [] and only_total["pagination"]["total"] == 3

    for params, field in [({"states": "STATE_BOGUS"}, "states"), ({"sortBy": "SORT_BY_COLOR"}, "sortBy"),
                          ({"orderBy": "sideways"}, "orderBy"), ({"name": "a\x00b"}, "name")]:
        _assert_refused(client.get("/api/v1/experiments", headers=alice, params=params), field)
    assert client.get("/api/v1/experiments").status_code == 401
    assert client.get("/api/v1/experiments/999999", headers=alice).status_code == 404


def test_allocation_token_reads_only_its_own_experiment(client, admin_headers, master) -> None:
    e1 = create_ok(client, admin_headers)["experiment"]
    e2 = create_ok(client, admin_headers)["experiment"]
    token = allocation_headers(master, only_trial(master, e1["id"]))
    assert client.get(f"/api/v1/experiments/{e1['id']}", headers=token).status_code == 200
    assert client.get(f"/api/v1/experiments/{e2['id']}", headers=token).status_code == 403
    t2 = only_trial(master, e2["id"])
    assert client.get(f"/api/v1/trials/{t2.id}", headers=token).status_code == 403
    assert client.get("/api/v1/experiments", headers=token).status_code == 403


# -- changes ---------------------------------------------------------------------------------------
def test_patch_labels_and_ownership(client, admin_headers, master) -> None:
    alice = make_user(client, admin_headers, "alice")
    bob = make_user(client, admin_headers, "bob")
    exp = create_ok(client, alice)["experiment"]
    eid = exp["id"]

    r = client.patch(f"/api/v1/experiments/{eid}", headers=alice,
                     json={"id": eid, "name": "renamed", "notes": "n", "labels": ["x", "x", "y"]})
    assert r.status_code == 200, r.text
    assert r.json()["experiment"]["name"] == "renamed" and r.json()["experiment"]["labels"] == ["x", "y"]
    assert client.put(f"/api/v1/experiments/{eid}/labels/z", headers=alice).json() == {"labels": ["x", "y", "z"]}
    assert client.delete(f"/api/v1/experiments/{eid}/labels/x", headers=alice).json() == {"labels": ["y", "z"]}

    # another user cannot change it; an admin can
    for method, path, body in [
        ("patch", f"/api/v1/experiments/{eid}", {"name": "mine"}),
        ("put", f"/api/v1/experiments/{eid}/labels/q", None),
        ("post", f"/api/v1/experiments/{eid}/pause", None),
        ("post", f"/api/v1/experiments/{eid}/kill", None),
        ("delete", f"/api/v1/experiments/{eid}", None),
    ]:
        r = client.request(method.upper(), path, headers=bob, json=body)
        assert r.status_code == 403, (method, path, r.text)
    assert client.patch(f"/api/v1/experiments/{eid}", headers=admin_headers, json={"description": "d"}).status_code == 200

    _assert_refused(client.patch(f"/api/v1/experiments/{eid}", headers=alice, json={"name": ""}), "name")
    _assert_refused(client.patch(f"/api/v1/experiments/{eid}", headers=alice, json={"labels": [""]}), "labels[0]")
    _assert_refused(client.patch(f"/api/v1/experiments/{eid}", headers=alice, json={"bogus": 1}), "bogus")
    _assert_refused(client.patch(f"/api/v1/experiments/{eid}", headers=alice, json={"id": eid + 1}), "id")
    got = client.get(f"/api/v1/experiments/{eid}", headers=bob).json()["experiment"]
    assert got["name"] == "renamed" and got["description"] == "d" and got["notes"] == "n"


def test_state_changes_and_archive(client, admin_headers, master) -> None:
    eid = create_ok(client, admin_headers)["experiment"]["id"]

    def state() -> str:
        return client.get(f"/api/v1/experiments/{eid}", headers=admin_headers).json()["experiment"]["state"]

    assert client.post(f"/api/v1/experiments/{eid}/pause", headers=admin_headers).json() == {}
    assert state() == "STATE_PAUSED"
    assert client.post(f"/api/v1/experiments/{eid}/activate", headers=admin_headers).status_code == 200
    assert state() == "STATE_ACTIVE"
    # only a finished experiment can be archived
    assert client.post(f"/api/v1/experiments/{eid}/archive", headers=admin_headers).status_code == 409
    assert client.post(f"/api/v1/experiments/{eid}/cancel", headers=admin_headers).status_code == 200
    assert state() == "STATE_STOPPING_CANCELED"
    finish_experiment(master, eid, st.ExperimentState.CANCELED)
    assert client.post(f"/api/v1/experiments/{eid}/activate", headers=admin_headers).status_code == 409
    assert client.post(f"/api/v1/experiments/{eid}/kill", headers=admin_headers).status_code == 200  # no-op
    assert client.post(f"/api/v1/experiments/{eid}/archive", headers=admin_headers).status_code == 200
    listed = client.get("/api/v1/experiments", headers=admin_headers, params={"archived": "true"}).json()
    assert [e["id"] for e in listed["experiments"]] == [eid]
    assert client.post(f"/api/v1/experiments/{eid}/unarchive", headers=admin_headers).status_code == 200
    assert client.get(f"/api/v1/experiments/{eid}", headers=admin_headers).json()["jobSummary"] is None
    assert client.post("/api/v1/experiments/424242/pause", headers=admin_headers).status_code == 404


def test_delete_experiment(client, admin_headers, master) -> None:
    from control_plane.db.models import Checkpoint, Metric, TaskLog

    keep = create_ok(client, admin_headers)["experiment"]["id"]
    eid = create_ok(client, admin_headers)["experiment"]["id"]
    trial = only_trial(master, eid)
    token = allocation_headers(master, trial)
    report = {"group": "validation", "metrics": {"trialId": trial.id, "trialRunId": 1, "stepsCompleted": 100,
                                                 "metrics": {"avgMetrics": {"val_loss": 0.5}}}}
    assert client.post(f"/api/v1/trials/{trial.id}/metrics", headers=token, json=report).status_code == 200
    ckpt = "7d4b1f1e-1111-4222-8333-944445555666"
    assert client.post("/api/v1/checkpoints", headers=token, json={
        "uuid": ckpt, "taskId": trial.task_id, "resources": {"model.pt": "10"},
        "metadata": {"steps_completed": 100}, "state": "STATE_COMPLETED", "training": {}}).status_code == 200
    assert client.post("/api/v1/task/logs", headers=token,
                       json={"logs": [{"taskId": trial.task_id, "log": "hello\n"}]}).status_code == 200

    assert client.delete(f"/api/v1/experiments/{eid}", headers=admin_headers).status_code == 409  # still active
    finish_experiment(master, eid)
    assert client.delete(f"/api/v1/experiments/{eid}", headers=admin_headers).status_code == 200
    assert client.get(f"/api/v1/experiments/{eid}", headers=admin_headers).status_code == 404
    assert client.get(f"/api/v1/trials/{trial.id}", headers=admin_headers).status_code == 404
    with master.sessions() as s:
        assert s.scalar(select(func.count()).select_from(Metric).where(Metric.trial_id == trial.id)) == 0
        assert s.scalar(select(func.count()).select_from(TaskLog).where(TaskLog.task_id == trial.task_id)) == 0
        row = s.get(Checkpoint, ckpt)
        assert row.state == "STATE_DELETING" and row.trial_id is None and row.storage["type"] == "shared_fs"
    # the other experiment is untouched; the deleted trial's token is revoked
    assert client.get(f"/api/v1/experiments/{keep}", headers=admin_headers).status_code == 200
    assert client.get(f"/api/v1/checkpoints/{ckpt}", headers=token).status_code == 401
    assert row_counts(master) == (1, 1, 1)
