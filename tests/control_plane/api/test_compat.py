"""What Determined's own client (0.38.1) needs beyond the shapes: JSON without a Content-Type, the
task sessions' token header, `det trial kill`, a trial's workloads. SQLite and PostgreSQL.
(tests/compat drives the real client against a real cluster.)"""

from __future__ import annotations

import json

from sqlalchemy import select

from control_plane.core import states as st
from control_plane.db.engine import transaction
from control_plane.db.models import Allocation, Trial
from control_plane.services import allocations, lifecycle
from tests.conftest import ADMIN_PASSWORD
from tests.control_plane.api.test_checkpoints import ckpt_body, report_ckpt
from tests.control_plane.api.test_experiments import allocation_headers, create_ok, make_user, only_trial
from tests.control_plane.api.test_trials import post, report


def test_json_body_without_content_type(client, master) -> None:  # type: ignore[no-untyped-def]
    """`requests.request(data=json_string)` sends no Content-Type; the body is still JSON."""
    body = json.dumps({"username": "admin", "password": ADMIN_PASSWORD}).encode()
    r = client.post("/api/v1/auth/login", content=body)
    assert r.status_code == 200, r.text
    assert "token" in r.json()
    # Not JSON: a 4xx naming the body, never a 500.
    r = client.post("/api/v1/auth/login", content=b"username=admin")
    assert 400 <= r.status_code < 500, r.text
    # The body limit still holds without a Content-Type.
    big = json.dumps({"username": "admin", "password": "x" * (master.config.max_body_bytes + 10)}).encode()
    assert client.post("/api/v1/auth/login", content=big).status_code == 413


def test_task_token_header(client, admin_headers, master) -> None:  # type: ignore[no-untyped-def]
    """determined.core's TaskSession sends `Grpc-Metadata-x-allocation-token: Bearer <token>`."""
    trial = only_trial(master, create_ok(client, admin_headers)["experiment"]["id"])
    token = allocation_headers(master, trial)["Authorization"]
    post(client, {"Grpc-Metadata-x-allocation-token": token}, trial.id, report(trial.id, 1, {"loss": 1.0}))
    r = client.post(f"/api/v1/trials/{trial.id}/metrics", headers={"Grpc-Metadata-x-allocation-token": "Bearer nope"},
                    json=report(trial.id, 2, {"loss": 1.0}))
    assert r.status_code == 401, r.text


def _trial_and_alloc(master, trial_id: int) -> tuple[Trial, Allocation]:  # type: ignore[no-untyped-def]
    with master.sessions() as s:
        trial = s.get(Trial, trial_id)
        alloc = s.scalars(select(Allocation).where(Allocation.trial_id == trial_id)).one()
        s.expunge_all()
    return trial, alloc


def test_kill_trial_pending_and_running(client, admin_headers, master) -> None:  # type: ignore[no-untyped-def]
    bob = make_user(client, admin_headers, "bob")
    # Queued (its allocation not placed yet): withdrawn at once, CANCELED.
    queued = only_trial(master, create_ok(client, admin_headers)["experiment"]["id"])
    assert client.post(f"/api/v1/trials/{queued.id}/kill", headers=bob).status_code == 403  # not bob's
    assert client.post(f"/api/v1/trials/{queued.id}/kill", headers=admin_headers).status_code == 200
    trial, alloc = _trial_and_alloc(master, queued.id)
    assert trial.state == st.TrialState.CANCELED and alloc.state == st.AllocationState.TERMINATED
    assert client.post(f"/api/v1/trials/{queued.id}/kill", headers=admin_headers).status_code == 200  # idempotent

    # Running: the agent is told to kill it; it stays STOPPING_KILLED until the process exits.
    running = only_trial(master, create_ok(client, admin_headers)["experiment"]["id"])
    with transaction(master.sessions) as s:
        a = s.scalars(select(Allocation).where(Allocation.trial_id == running.id)).one()
        a.state = st.AllocationState.RUNNING
        s.get(Trial, running.id).state = st.TrialState.RUNNING
    assert client.post(f"/api/v1/trials/{running.id}/kill", headers=admin_headers).status_code == 200
    trial, alloc = _trial_and_alloc(master, running.id)
    assert trial.state == st.TrialState.STOPPING_KILLED and alloc.kill_requested
    shown = client.get(f"/api/v1/trials/{running.id}", headers=admin_headers).json()["trial"]
    assert shown["state"] == "STATE_STOPPING_KILLED"
    with transaction(master.sessions) as s:
        a = s.get(Allocation, alloc.id)
        allocations.end_allocation(s, master, a, cause=st.ExitCause.EXITED, reason="killed", exit_code=137)
        lifecycle.reconcile_all(s, master)
    trial, _ = _trial_and_alloc(master, running.id)
    assert trial.state == st.TrialState.CANCELED and trial.restarts == 0  # a kill is not a failure


def test_trial_workloads(client, admin_headers, master) -> None:  # type: ignore[no-untyped-def]
    trial = only_trial(master, create_ok(client, admin_headers)["experiment"]["id"])
    auth = allocation_headers(master, trial)
    for step in (1, 2):
        post(client, auth, trial.id, report(trial.id, step, {"loss": 1.0 / step}, batchMetrics=[{"loss": 0.5}]))
    post(client, auth, trial.id, report(trial.id, 2, {"val_loss": 0.3}, group="validation"))
    ckpt = report_ckpt(client, auth, ckpt_body(trial, 2))
    url = f"/api/v1/trials/{trial.id}/workloads"
    got = client.get(url, headers=admin_headers).json()
    kinds = [(next(iter(w)), (w.get("training") or w.get("validation") or w.get("checkpoint"))["totalBatches"])
             for w in got["workloads"]]
    assert kinds == [("training", 1), ("training", 2), ("validation", 2), ("checkpoint", 2)]
    assert got["workloads"][2]["validation"]["metrics"]["avgMetrics"] == {"val_loss": 0.3}
    assert "batchMetrics" not in got["workloads"][0]["training"]["metrics"]
    assert got["workloads"][3]["checkpoint"]["uuid"] == ckpt
    assert got["workloads"][3]["checkpoint"]["state"] == "STATE_COMPLETED"
    assert got["pagination"]["total"] == 4 and got["pagination"]["endIndex"] == 4
    page = client.get(url, headers=admin_headers, params={"offset": 1, "limit": 2, "includeBatchMetrics": "true"}).json()
    assert page["workloads"][0]["training"]["metrics"]["batchMetrics"] == [{"loss": 0.5}]
    assert page["pagination"]["endIndex"] == 3
    only = client.get(url, headers=admin_headers, params={"filter": "FILTER_OPTION_CHECKPOINT_OR_VALIDATION"}).json()
    assert [next(iter(w)) for w in only["workloads"]] == ["validation", "checkpoint"]
    r = client.get(url, headers=admin_headers, params={"filter": "NOPE"})
    assert r.status_code == 400 and r.json()["details"][0]["field"] == "filter"
