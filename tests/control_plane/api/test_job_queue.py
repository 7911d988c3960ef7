"""The job queue and agent enable/disable over HTTP (api/jobs.py, api/agents.py), both databases:
Determined's shapes (v1RBACJob/v1Job/v1RPQueueStat, as 0.38.1's bindings require them), the
order, pagination and pool filter, updates and their refusals (status, field and reason), who may
change what. The rules themselves are tested in tests/control_plane/services/test_jobs.py."""

from __future__ import annotations

from typing import Any

from control_plane.db.engine import transaction
from control_plane.db.models import Agent, Allocation, Experiment
from tests.conftest import login
from tests.control_plane.api.test_experiments import CONFIG, create_ok, make_user

# Required constructor fields of Determined 0.38.1's v1Job and v1JobSummary.
V1_JOB_REQUIRED = {"allocatedSlots", "entityId", "isPreemptible", "jobId", "name", "requestedSlots", "resourcePool",
                   "submissionTime", "type", "username", "workspaceId"}


def submit(client: Any, headers: dict[str, str], config: str = CONFIG) -> dict[str, Any]:
    return create_ok(client, headers, config)["experiment"]


def jobs_v2(client: Any, headers: dict[str, str], **params: Any) -> dict[str, Any]:
    r = client.get("/api/v1/job-queues-v2", headers=headers, params=params)
    assert r.status_code == 200, r.text
    return r.json()


def queue_ids(client: Any, headers: dict[str, str], **params: Any) -> list[str]:
    return [j["full"]["jobId"] for j in jobs_v2(client, headers, **params)["jobs"]]


def post_updates(client: Any, headers: dict[str, str], *updates: dict[str, Any]) -> Any:
    return client.post("/api/v1/job-queues", headers=headers, json={"updates": list(updates)})


def test_queue_shapes_order_and_pagination(client, admin_headers, master) -> None:  # type: ignore[no-untyped-def]
    a, b = submit(client, admin_headers), submit(client, admin_headers)
    body = jobs_v2(client, admin_headers)
    assert [j["full"]["jobId"] for j in body["jobs"]] == [a["jobId"], b["jobId"]]
    job = body["jobs"][0]["full"]
    assert V1_JOB_REQUIRED <= set(job)
    assert job["summary"] == {"state": "STATE_QUEUED", "jobsAhead": 0}
    assert (job["type"], job["entityId"], job["username"], job["priority"], job["weight"]) == (
        "TYPE_EXPERIMENT", str(a["id"]), "admin", 42, 1.0)
    assert (job["requestedSlots"], job["allocatedSlots"], job["resourcePool"]) == (1, 0, "default")
    assert "waitingReason" in job
    assert body["pagination"]["total"] == 2 and body["pagination"]["endIndex"] == 2
    page = jobs_v2(client, admin_headers, offset=1, limit=1)
    assert [j["full"]["jobId"] for j in page["jobs"]] == [b["jobId"]]
    assert page["pagination"] == {"offset": 1, "limit": 1, "startIndex": 1, "endIndex": 2, "total": 2}
    assert queue_ids(client, admin_headers, orderBy="ORDER_BY_DESC") == [b["jobId"], a["jobId"]]
    assert queue_ids(client, admin_headers, resourcePool="default", states="STATE_SCHEDULED") == []
    v1 = client.get("/api/v1/job-queues", headers=admin_headers).json()
    assert [j["jobId"] for j in v1["jobs"]] == [a["jobId"], b["jobId"]]
    stats = client.get("/api/v1/job-queues/stats", headers=admin_headers).json()
    assert stats == {"results": [{"resourcePool": "default", "stats": {"queuedCount": 2, "scheduledCount": 0},
                                  "aggregates": []}]}
    for path, params in (("/api/v1/job-queues-v2", {"resourcePool": "nope"}),
                         ("/api/v1/job-queues-v2", {"states": "STATE_BOGUS"}),
                         ("/api/v1/job-queues", {"limit": -1}),
                         ("/api/v1/job-queues/stats", {"resourcePools": "nope"})):
        r = client.get(path, headers=admin_headers, params=params)
        assert r.status_code == 400, (path, r.text)
        assert r.json()["details"], r.text


def test_updates_reorder_and_change_the_job(client, admin_headers, master) -> None:  # type: ignore[no-untyped-def]
    a, b, c = (submit(client, admin_headers) for _ in range(3))
    r = post_updates(client, admin_headers, {"jobId": c["jobId"], "aheadOf": a["jobId"]},
                     {"jobId": a["jobId"], "behindOf": b["jobId"], "priority": None, "weight": None})
    assert r.status_code == 200 and r.json() == {}, r.text
    assert queue_ids(client, admin_headers) == [c["jobId"], b["jobId"], a["jobId"]]
    r = post_updates(client, admin_headers, {"jobId": a["jobId"], "priority": 3, "weight": 2})
    assert r.status_code == 200, r.text
    first = jobs_v2(client, admin_headers)["jobs"][0]["full"]
    assert (first["jobId"], first["priority"], first["weight"]) == (a["jobId"], 3, 2.0)
    with master.sessions() as s:
        alloc = s.query(Allocation).filter_by(experiment_id=a["id"]).one()
        assert (alloc.priority, alloc.weight) == (3, 2.0)
    exp = client.get(f"/api/v1/experiments/{a['id']}", headers=admin_headers).json()["experiment"]
    assert exp["config"]["resources"]["priority"] == 3


BAD_UPDATES: list[tuple[dict[str, Any], int, str]] = [
    ({"priority": 0}, 400, "updates[1].priority"),
    ({"priority": 100}, 400, "updates[1].priority"),
    ({"weight": 0}, 400, "updates[1].weight"),
    ({"weight": -1.5}, 400, "updates[1].weight"),
    ({"resourcePool": "nope"}, 400, "updates[1].resourcePool"),
    ({"aheadOf": "nope"}, 404, "updates[1].aheadOf"),
    ({"behindOf": "SELF"}, 400, "updates[1].behindOf"),
    ({"aheadOf": "A", "behindOf": "A"}, 400, "updates[1].behindOf"),
    ({"jobId": "nope"}, 404, "updates[1].jobId"),
    ({}, 400, "updates[1]"),
    ({"bogus": 1}, 400, "updates[1].bogus"),
]


def test_bad_updates_are_refused_whole(client, admin_headers, master) -> None:  # type: ignore[no-untyped-def]
    """Each bad second update: its status, the field and a reason; the valid first one is not applied."""
    a, b = submit(client, admin_headers), submit(client, admin_headers)
    ids = {"SELF": b["jobId"], "A": a["jobId"]}
    for update, status, field in BAD_UPDATES:
        second = {"jobId": b["jobId"], **{k: ids.get(v, v) if isinstance(v, str) else v for k, v in update.items()}}
        r = post_updates(client, admin_headers, {"jobId": a["jobId"], "priority": 5}, second)
        assert r.status_code == status, (update, r.text)
        details = r.json()["details"]
        assert [d["field"] for d in details] == [field] and details[0]["reason"], (update, r.text)
        assert [j["full"]["priority"] for j in jobs_v2(client, admin_headers)["jobs"]] == [42, 42]
    assert post_updates(client, admin_headers).status_code == 400  # no updates at all


def test_only_the_owner_or_an_admin_changes_a_job(client, admin_headers, master) -> None:  # type: ignore[no-untyped-def]
    make_user(client, admin_headers, "owner")
    make_user(client, admin_headers, "other")
    owner = login(client, "owner", "owner-password-1")
    other = login(client, "other", "other-password-1")
    job = submit(client, owner)
    assert post_updates(client, other, {"jobId": job["jobId"], "priority": 1}).status_code == 403
    assert post_updates(client, owner, {"jobId": job["jobId"], "priority": 10}).status_code == 200
    assert post_updates(client, admin_headers, {"jobId": job["jobId"], "priority": 11}).status_code == 200
    # Everyone sees the whole queue.
    assert queue_ids(client, other) == [job["jobId"]]
    assert client.post("/api/v1/agents/a1/disable", headers=owner, json={"drain": True}).status_code == 403
    assert client.post("/api/v1/agents/a1/enable", headers=owner).status_code == 403


def test_agent_disable_drain_enable(client, admin_headers, master) -> None:  # type: ignore[no-untyped-def]
    from jsonschema import Draft202012Validator

    spec = client.get("/openapi.json").json()
    with transaction(master.sessions) as s:
        s.add(Agent(id="a1", pool="default", slots=[{"id": "0", "type": "cpu"}], session_id="x",
                    registered_at=master.clock(), last_seen=master.clock()))
    assert client.post("/api/v1/agents/nope/enable", headers=admin_headers).status_code == 404
    # Determined's CLI sends no body for a plain disable, and only {"drain": true} to drain.
    r = client.post("/api/v1/agents/a1/disable", headers=admin_headers)
    assert r.status_code == 200, r.text
    assert (r.json()["agent"]["enabled"], r.json()["agent"]["draining"]) == (False, False)
    r = client.post("/api/v1/agents/a1/disable", headers=admin_headers, json={"drain": True})
    assert r.status_code == 200, r.text
    schema = spec["paths"]["/api/v1/agents/{agentId}/disable"]["post"]["responses"]["200"]["content"]
    validator = Draft202012Validator({**schema["application/json"]["schema"], "components": spec["components"]})
    assert not list(validator.iter_errors(r.json()))
    agent = client.get("/api/v1/agents/a1", headers=admin_headers).json()["agent"]
    assert (agent["enabled"], agent["draining"]) == (False, True) and agent["drainStartedTime"]
    assert all(sl["draining"] for sl in agent["slots"].values())
    r = client.post("/api/v1/agents/a1/disable", headers=admin_headers, json={"agentId": "other", "drain": True})
    assert r.status_code == 400 and r.json()["details"][0]["field"] == "agentId"
    r = client.post("/api/v1/agents/a1/enable", headers=admin_headers)
    assert r.status_code == 200 and (r.json()["agent"]["enabled"], r.json()["agent"]["draining"]) == (True, False)


def test_ended_job_cannot_be_changed(client, admin_headers, master) -> None:  # type: ignore[no-untyped-def]
    from tests.control_plane.api.test_experiments import finish_experiment

    job = submit(client, admin_headers)
    finish_experiment(master, job["id"])
    assert queue_ids(client, admin_headers) == []
    r = post_updates(client, admin_headers, {"jobId": job["jobId"], "priority": 5})
    assert r.status_code == 409, r.text
    with master.sessions() as s:
        exp = s.get(Experiment, job["id"])
        assert exp is not None and exp.priority is None


def test_commands_and_notebooks_are_jobs_of_their_pool(client, admin_headers, master) -> None:  # type: ignore[no-untyped-def]
    # Determined lists every task in the queue: a command and a notebook are jobs of their own,
    # ordered with the experiments by priority then submission, counted in the stats, not changed
    # through the queue (their own verbs kill them), gone once they end.
    exp = submit(client, admin_headers)
    cmd = client.post("/api/v1/commands", headers=admin_headers,
                      json={"config": {"entrypoint": ["true"], "resources": {"slots": 0, "priority": 10}}}).json()["command"]
    nb = client.post("/api/v1/notebooks", headers=admin_headers, json={"config": {"resources": {"slots": 0}}}).json()["notebook"]
    jobs = {j["full"]["jobId"]: j["full"] for j in jobs_v2(client, admin_headers)["jobs"]}
    assert list(jobs) == [cmd["id"], exp["jobId"], nb["id"]]  # priority 10 first, then by submission
    assert V1_JOB_REQUIRED <= set(jobs[cmd["id"]])
    assert jobs[cmd["id"]]["type"] == "TYPE_COMMAND" and jobs[nb["id"]]["type"] == "TYPE_NOTEBOOK"
    assert jobs[cmd["id"]]["isPreemptible"] is False and jobs[cmd["id"]]["priority"] == 10
    assert jobs[nb["id"]]["summary"] == {"state": "STATE_QUEUED", "jobsAhead": 2}
    assert jobs[nb["id"]]["requestedSlots"] == 0 and jobs[nb["id"]]["progress"] is None
    stats = client.get("/api/v1/job-queues/stats", headers=admin_headers).json()["results"]
    assert {s["resourcePool"]: s["stats"]["queuedCount"] for s in stats}["default"] == 3
    r = post_updates(client, admin_headers, {"jobId": nb["id"], "priority": 5})
    assert r.status_code == 400 and "is a notebook" in r.text, r.text
    assert client.post(f"/api/v1/commands/{cmd['id']}/kill", headers=admin_headers).status_code == 200
    assert cmd["id"] not in queue_ids(client, admin_headers)


def test_a_job_reports_its_projects_workspace(client, admin_headers, master) -> None:  # type: ignore[no-untyped-def]
    ws = client.post("/api/v1/workspaces", headers=admin_headers, json={"name": "team-q"}).json()["workspace"]["id"]
    proj = client.post(f"/api/v1/workspaces/{ws}/projects", headers=admin_headers, json={"name": "p"}).json()["project"]
    in_team = create_ok(client, admin_headers, projectId=proj["id"])["experiment"]
    plain = submit(client, admin_headers)
    jobs = {j["full"]["jobId"]: j["full"]["workspaceId"] for j in jobs_v2(client, admin_headers)["jobs"]}
    assert jobs == {in_team["jobId"]: ws, plain["jobId"]: 1}
