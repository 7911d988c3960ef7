"""The master's trial lifecycle driven through its real HTTP API, with the agent side played by
the test over the agent protocol (docs/PROTOCOL.md) and the pool loop ticked by hand."""

from __future__ import annotations

import json
from typing import Any

import yaml

from control_plane import auth
from control_plane.db.engine import transaction
from control_plane.loops import placement
from tests.conftest import login

CONFIG = {
    "name": "lc",
    "entrypoint": "python3 train.py",
    "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 20}},
    "hyperparameters": {"lr": 0.1},
}
FILES = [{"path": "train.py", "type": 48, "content": "cHJpbnQoMSkK", "mode": 420, "mtime": 0, "uid": 0, "gid": 0}]


def submit(client, headers, config: dict[str, Any] | None = None) -> int:  # type: ignore[no-untyped-def]
    r = client.post("/api/v1/experiments", headers=headers,
                    json={"config": yaml.safe_dump(config or CONFIG), "modelDefinition": FILES})
    assert r.status_code == 200, r.text
    return r.json()["experiment"]["id"]


def agent_token(master, pool: str = "default") -> str:  # type: ignore[no-untyped-def]
    with transaction(master.sessions) as s:
        return auth.issue_token(s, auth.TokenKind.AGENT, now=master.clock(), ttl=None, pool=pool)


def register(client, token: str, agent_id: str = "a1", slots: int = 1,  # type: ignore[no-untyped-def]
             running: list[str] | None = None) -> tuple[str, str]:
    """Enrol (or re-register) the agent: (its own credential, its session). The pool token only
    enrols; the agent polls and reports with the credential its enrolment returned."""
    r = client.post("/api/v1/agents/register", headers={"Authorization": f"Bearer {token}"}, json={
        "agentId": agent_id, "resourcePool": "default",
        "slots": [{"id": str(i), "type": "cpu"} for i in range(slots)], "runningAllocations": running or []})
    assert r.status_code == 200, r.text
    return r.json().get("agentCredential") or token, r.json()["sessionId"]


def commands(client, token: str, session: str, agent_id: str = "a1") -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    r = client.get(f"/api/v1/agents/{agent_id}/commands", headers={"Authorization": f"Bearer {token}"},
                   params={"sessionId": session, "timeoutSeconds": 0})
    assert r.status_code == 200, r.text
    return r.json()["commands"]


def event(client, token: str, session: str, alloc: str, kind: str, exit_code: int | None = None,  # type: ignore[no-untyped-def]
          agent_id: str = "a1") -> None:
    r = client.post(f"/api/v1/agents/{agent_id}/events", headers={"Authorization": f"Bearer {token}"},
                    json={"sessionId": session, "events": [{"allocationId": alloc, "type": kind, "exitCode": exit_code}]})
    assert r.status_code == 200, r.text


def experiment(client, headers, exp_id: int) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    return client.get(f"/api/v1/experiments/{exp_id}", headers=headers).json()["experiment"]


def test_single_trial_runs_to_completion(client, master, admin_headers) -> None:
    exp_id = submit(client, admin_headers)
    tok, session = register(client, agent_token(master))
    placement.tick(master)
    (cmd,) = commands(client, tok, session)
    assert cmd["type"] == "start"
    spec = cmd["spec"]
    env = spec["env"]
    assert env["DET_EXPERIMENT_ID"] == str(exp_id) and json.loads(env["DET_HPARAMS"]) == {"lr": 0.1}
    assert json.loads(env["DET_SLOT_IDS"]) == ["0"] and env["DET_SESSION_TOKEN"] == spec["token"]
    alloc = cmd["allocationId"]
    trial_id = spec["trialId"]
    event(client, tok, session, alloc, "running")
    # the trial's own token: its searcher op, metrics, model definition
    trial_auth = {"Authorization": f"Bearer {spec['token']}"}
    op = client.get(f"/api/v1/trials/{trial_id}/searcher/operation", headers=trial_auth).json()
    assert op == {"op": {"validateAfter": {"length": 20}}, "completed": False}
    assert "b64Tgz" in client.get(f"/api/v1/experiments/{exp_id}/model_def", headers=trial_auth).json()
    r = client.post(f"/api/v1/trials/{trial_id}/metrics", headers=trial_auth, json={
        "group": "validation", "metrics": {"trialId": trial_id, "trialRunId": 1, "stepsCompleted": 20,
                                           "metrics": {"avgMetrics": {"loss": 0.5}}}})
    assert r.status_code == 200, r.text
    assert client.get(f"/api/v1/trials/{trial_id}/searcher/operation", headers=trial_auth).json()["completed"] is True
    event(client, tok, session, alloc, "exited", exit_code=0)
    placement.tick(master)
    assert experiment(client, admin_headers, exp_id)["state"] == "STATE_COMPLETED"
    # the allocation's token died with it
    assert client.get(f"/api/v1/trials/{trial_id}/searcher/operation", headers=trial_auth).status_code == 401


def test_allocation_token_is_scoped_to_its_trial(client, master, admin_headers) -> None:
    exp_a = submit(client, admin_headers)
    exp_b = submit(client, admin_headers)
    tok, session = register(client, agent_token(master), slots=2)
    placement.tick(master)
    specs = {c["spec"]["experimentId"]: c["spec"] for c in commands(client, tok, session)}
    a, b = specs[exp_a], specs[exp_b]
    trial_auth = {"Authorization": f"Bearer {a['token']}"}
    assert client.get(f"/api/v1/trials/{b['trialId']}/searcher/operation", headers=trial_auth).status_code == 403
    assert client.get(f"/api/v1/experiments/{exp_b}/model_def", headers=trial_auth).status_code == 403
    assert client.post(f"/api/v1/experiments/{exp_a}/kill", headers=trial_auth).status_code == 403
    assert client.get("/api/v1/users", headers=trial_auth).status_code == 403
    # an agent token is not a user either
    assert client.get("/api/v1/me", headers={"Authorization": f"Bearer {tok}"}).status_code == 403


def test_agent_credentials_are_bound_to_their_pool(client, master, admin_headers) -> None:
    r = client.post("/api/v1/agents/register", headers={"Authorization": "Bearer not-a-token"},
                    json={"agentId": "x", "resourcePool": "default", "slots": []})
    assert r.status_code == 401
    with transaction(master.sessions) as s:
        other = auth.issue_token(s, auth.TokenKind.AGENT, now=master.clock(), ttl=None, pool="elsewhere")
    r = client.post("/api/v1/agents/register", headers={"Authorization": f"Bearer {other}"},
                    json={"agentId": "x", "resourcePool": "default", "slots": []})
    assert r.status_code == 403 and "elsewhere" in r.json()["message"]
    user = login(client)
    r = client.post("/api/v1/agents/register", headers=user, json={"agentId": "x", "resourcePool": "default"})
    assert r.status_code == 403


def test_killing_a_queued_experiment_cancels_it(client, master, admin_headers) -> None:
    exp_id = submit(client, admin_headers)
    placement.tick(master)
    assert client.post(f"/api/v1/experiments/{exp_id}/kill", headers=admin_headers).status_code == 200
    placement.tick(master)
    assert experiment(client, admin_headers, exp_id)["state"] == "STATE_CANCELED"


def test_agent_restart_keeps_wanted_tasks_and_kills_the_rest(client, master, admin_headers) -> None:
    submit(client, admin_headers)
    tok = agent_token(master)
    enrolled = client.post("/api/v1/agents/register", headers={"Authorization": f"Bearer {tok}"}, json={
        "agentId": "a1", "resourcePool": "default", "slots": [{"id": "0", "type": "cpu"}]}).json()
    session, cred = enrolled["sessionId"], enrolled["agentCredential"]
    placement.tick(master)
    (cmd,) = commands(client, cred, session)
    event(client, cred, session, cmd["allocationId"], "running")
    # the agent comes back with its own credential (the pool token only enrols)
    r = client.post("/api/v1/agents/register", headers={"Authorization": f"Bearer {cred}"}, json={
        "agentId": "a1", "resourcePool": "default", "slots": [{"id": "0", "type": "cpu"}],
        "runningAllocations": [cmd["allocationId"], "stale-alloc"]})
    assert r.json()["kill"] == ["stale-alloc"]
    new_session = r.json()["sessionId"]
    # the old session is stale now
    stale = client.get("/api/v1/agents/a1/commands", headers={"Authorization": f"Bearer {cred}"},
                       params={"sessionId": session, "timeoutSeconds": 0})
    assert stale.status_code == 409
    assert commands(client, cred, new_session) == []  # still running: no new start


def test_only_the_agents_own_credential_polls_and_reports_for_it(client, master, admin_headers) -> None:
    submit(client, admin_headers)
    pool_token = agent_token(master)
    cred, session = register(client, pool_token)
    other, _ = register(client, pool_token, agent_id="a2")
    placement.tick(master)
    (cmd,) = commands(client, cred, session)
    for token, reason in ((pool_token, "it only enrols"), (other, "belongs to agent 'a2', not 'a1'")):
        auth_h = {"Authorization": f"Bearer {token}"}
        r = client.get("/api/v1/agents/a1/commands", headers=auth_h, params={"sessionId": session, "timeoutSeconds": 0})
        assert r.status_code == 403 and reason in r.json()["message"], r.text
        r = client.post("/api/v1/agents/a1/events", headers=auth_h, json={
            "sessionId": session, "events": [{"allocationId": cmd["allocationId"], "type": "exited", "exitCode": 0}]})
        assert r.status_code == 403 and reason in r.json()["message"], r.text
    # nothing moved: the start is still owed to a1
    assert [c["allocationId"] for c in commands(client, cred, session)] == [cmd["allocationId"]]


def test_priority_preemption(client, master, admin_headers) -> None:
    low = submit(client, admin_headers, {**CONFIG, "resources": {"priority": 60}})
    tok, session = register(client, agent_token(master))
    placement.tick(master)
    (cmd,) = commands(client, tok, session)
    event(client, tok, session, cmd["allocationId"], "running")
    submit(client, admin_headers, {**CONFIG, "resources": {"priority": 10}})
    placement.tick(master)
    low_auth = {"Authorization": f"Bearer {cmd['spec']['token']}"}
    r = client.get(f"/api/v1/allocations/{cmd['allocationId']}/signals/preemption", headers=low_auth)
    assert r.json() == {"preempt": True}
    # the preempted trial checkpoints and exits; the high-priority one takes the slot
    event(client, tok, session, cmd["allocationId"], "exited", exit_code=0)
    placement.tick(master)
    (nxt,) = commands(client, tok, session)
    assert nxt["spec"]["experimentId"] != low
    trials = client.get(f"/api/v1/experiments/{low}/trials", headers=admin_headers).json()["trials"]
    assert trials[0]["state"] == "STATE_QUEUED" and trials[0]["restarts"] == 0


def test_environment_variables_reach_the_task(client, master, admin_headers) -> None:
    submit(client, admin_headers, {**CONFIG, "environment": {"environment_variables": ["A=1", "B=x=y"]}})
    tok, session = register(client, agent_token(master))
    placement.tick(master)
    (cmd,) = commands(client, tok, session)
    env = cmd["spec"]["env"]
    assert env["A"] == "1" and env["B"] == "x=y" and "cpu" not in env and "cuda" not in env


def test_asha_trials_are_labelled_with_the_searchers_own_rungs(client, master, admin_headers) -> None:
    # max_length 10 with the default divisor (4) and max_rungs (5): the searcher plans two rungs,
    # 2 and 10 batches. The trials must say rung 0 then 1 (they used to say 3 and 4).
    config = {**CONFIG, "searcher": {"name": "adaptive_asha", "metric": "loss", "max_length": {"batches": 10},
                                     "max_trials": 4, "mode": "aggressive"}}
    exp_id = submit(client, admin_headers, config)
    tok, session = register(client, agent_token(master), slots=4)
    placement.tick(master)
    specs = [c["spec"] for c in commands(client, tok, session)]
    assert len(specs) == 4

    def trials() -> dict[int, dict[str, Any]]:
        r = client.get(f"/api/v1/experiments/{exp_id}/trials", headers=admin_headers)
        return {t["id"]: t for t in r.json()["trials"]}

    def operation(spec: dict[str, Any]) -> dict[str, Any]:
        auth_ = {"Authorization": f"Bearer {spec['token']}"}
        return client.get(f"/api/v1/trials/{spec['trialId']}/searcher/operation", headers=auth_).json()

    assert {t["rung"] for t in trials().values()} == {0}
    assert all(operation(spec)["op"] == {"validateAfter": {"length": 2}} for spec in specs)
    for loss, spec in zip((0.1, 0.2, 0.3, 0.4), specs, strict=True):
        r = client.post(f"/api/v1/trials/{spec['trialId']}/metrics",
                        headers={"Authorization": f"Bearer {spec['token']}"},
                        json={"group": "validation", "metrics": {
                            "trialId": spec["trialId"], "trialRunId": 1, "stepsCompleted": 2,
                            "metrics": {"avgMetrics": {"loss": loss}}}})
        assert r.status_code == 200, r.text
    best = specs[0]
    assert operation(best)["op"] == {"validateAfter": {"length": 10}}
    rungs = {tid: t["rung"] for tid, t in trials().items()}
    assert rungs == {s["trialId"]: (1 if s is best else 0) for s in specs}
