"""Commands and notebooks over HTTP (api/ntsc.py → services/tasks.py), both databases: Determined
0.38.1's shapes, the queue (placed by the placement loop like a trial's allocation, not preempted),
the agent's task spec, who may see and kill what, refusals naming the field."""

from __future__ import annotations

import json
from typing import Any

import yaml
from sqlalchemy import select

from control_plane.core.scheduling import RunningAllocation  # noqa: F401 (documents the seam)
from control_plane.db.engine import transaction
from control_plane.db.models import Agent, Allocation
from control_plane.loops import placement
from control_plane.services import agents as agent_service
from control_plane.services import tasks
from tests.control_plane.api.test_experiments import make_user

# Required constructor fields of 0.38.1's v1Command (v1Notebook adds serviceAddress).
V1_COMMAND_REQUIRED = {"description", "id", "jobId", "resourcePool", "startTime", "state", "username", "workspaceId"}


def launch(client: Any, headers: dict[str, str], kind: str = "commands", **config: Any) -> dict[str, Any]:
    r = client.post(f"/api/v1/{kind}", headers=headers, json={"config": config})
    assert r.status_code == 200, r.text
    return r.json()


def _agent(master: Any, agent_id: str = "a1", slots: int = 1) -> None:
    with transaction(master.sessions) as s:
        s.add(Agent(id=agent_id, pool="default", session_id="s", slots=[{"id": str(i), "type": "cpu"} for i in range(slots)],
                    last_seen=master.clock()))


def test_command_launch_list_get_kill_read_by_all_killed_by_owner(client, admin_headers, master) -> None:  # type: ignore[no-untyped-def]
    body = launch(client, admin_headers, entrypoint=["echo", "hi"], resources={"slots": 0})
    cmd = body["command"]
    assert V1_COMMAND_REQUIRED <= set(cmd)
    assert (cmd["state"], cmd["username"], cmd["resourcePool"]) == ("STATE_QUEUED", "admin", "default")
    assert body["config"]["entrypoint"] == ["echo", "hi"] and body["config"]["resources"]["slots"] == 0
    assert [c["id"] for c in client.get("/api/v1/commands", headers=admin_headers).json()["commands"]] == [cmd["id"]]
    other = make_user(client, admin_headers, "bob")
    # Reads are open (as experiments'); det cmd list without --all asks for the caller's own.
    assert [c["id"] for c in client.get("/api/v1/commands", headers=other).json()["commands"]] == [cmd["id"]]
    assert client.get("/api/v1/commands", headers=other, params={"users": ["bob"]}).json()["commands"] == []
    for r in (client.get(f"/api/v1/commands/{cmd['id']}", headers=other),
              client.get(f"/api/v1/tasks/{cmd['id']}/logs", headers=other)):
        assert r.status_code == 200, r.text
    r = client.post(f"/api/v1/commands/{cmd['id']}/kill", headers=other)
    assert r.status_code == 403 and "belongs to another user" in r.text and "needs Editor" in r.text, r.text
    # The same allocation list det task list reads.
    summary = client.get("/api/v1/tasks", headers=admin_headers).json()["allocationIdToSummary"]
    assert [s["taskId"] for s in summary.values()] == [cmd["id"]]
    task = client.get(f"/api/v1/tasks/{cmd['id']}", headers=admin_headers).json()["task"]
    assert task["taskType"] == "TASK_TYPE_COMMAND" and task["allocations"][0]["isReady"] is False
    killed = client.post(f"/api/v1/commands/{cmd['id']}/kill", headers=admin_headers).json()["command"]
    assert killed["state"] == "STATE_TERMINATED" and killed["exitStatus"] == "killed before it started"
    assert client.get(f"/api/v1/notebooks/{cmd['id']}", headers=admin_headers).status_code == 404


def test_refusals_name_the_field(client, admin_headers) -> None:  # type: ignore[no-untyped-def]
    for config, field in (({"entrypoint": ["x"], "resources": {"slots": "two"}}, "config.resources.slots"),
                          ({"description": "no entrypoint"}, "config.entrypoint"),
                          ({"entrypoint": "x", "resources": {"resource_pool": "nope"}}, "config.resources.resource_pool"),
                          ({"entrypoint": "x", "idle_timeout": "soon"}, "config.idle_timeout"),
                          ({"entrypoint": "x", "resources": {"devices": ["dev/x"]}}, "config.resources.devices"),
                          # What reaches the agent's host needs allow_task_host_access, as for trials.
                          ({"entrypoint": "x", "bind_mounts": [{"host_path": "/etc", "container_path": "/e"}]},
                           "config.bind_mounts"),
                          ({"entrypoint": "x", "resources": {"devices": ["/dev/mem"]}}, "config.resources.devices"),
                          ({"entrypoint": "x", "environment": {"add_capabilities": ["SYS_ADMIN"]}},
                           "config.environment.add_capabilities")):
        r = client.post("/api/v1/commands", headers=admin_headers, json={"config": config})
        assert r.status_code == 400, r.text
        assert field in r.text, r.text
    assert client.get("/api/v1/commands", headers=admin_headers).json()["commands"] == []


def test_placed_like_a_trial_with_its_spec_and_not_preempted(client, admin_headers, master) -> None:  # type: ignore[no-untyped-def]
    _agent(master)
    cmd = launch(client, admin_headers, entrypoint="echo $DET_TASK_ID", description="mine",
                 resources={"priority": 50})["command"]
    nb = launch(client, admin_headers, "notebooks", resources={"slots": 0})["notebook"]
    assert nb["serviceAddress"] == f"/proxy/{nb['id']}/"
    placement.tick(master)
    with transaction(master.sessions) as s:
        allocs = {a.task_id: a for a in s.scalars(select(Allocation))}
        assert allocs[cmd["id"]].state == "assigned" and allocs[nb["id"]].state == "assigned"
        assert (allocs[cmd["id"]].priority, allocs[nb["id"]].slots_needed) == (50, 0)
        agent = s.get(Agent, "a1")
        spec = agent_service.task_spec(s, master, allocs[cmd["id"]], agent)
        nb_spec = agent_service.task_spec(s, master, allocs[nb["id"]], agent)
    assert spec.argv == ["sh", "-c", "echo $DET_TASK_ID"] and spec.slot_ids == ["0"]
    assert (spec.env["DET_TASK_ID"], spec.env["DET_TASK_TYPE"]) == (cmd["id"], "COMMAND")
    assert spec.token and spec.model_definition_path is None
    assert nb_spec.argv[:2] == ["python3", "-c"] and nb_spec.env["SHIPYARD_PROXY_BASE"] == f"/proxy/{nb['id']}/"
    assert nb_spec.env["JUPYTER_TOKEN"] and nb_spec.env["DET_TASK_TYPE"] == "NOTEBOOK"
    # A trial of higher priority (a lower number) waits: the command is not preempted for it.
    r = client.post("/api/v1/experiments", headers=admin_headers, json={"config": (
        "name: e\nentrypoint: python3 train.py\nsearcher: {name: single, metric: loss, max_length: {batches: 1}}\n"
        "resources: {priority: 1}\n"), "modelDefinition": []})
    assert r.status_code == 200, r.text
    placement.tick(master)
    with transaction(master.sessions) as s:
        cmd_alloc = s.scalar(select(Allocation).where(Allocation.task_id == cmd["id"]))
        assert not cmd_alloc.preempt_requested and not cmd_alloc.kill_requested
        trial_alloc = s.scalar(select(Allocation).where(Allocation.trial_id.is_not(None)))
        assert trial_alloc.state == "pending"


def test_tensorboard_launch_its_trials_spec_and_refusals(client, admin_headers, master) -> None:  # type: ignore[no-untyped-def]
    """Determined's LaunchTensorboard: an experiment's trials (readable by the caller), v1Tensorboard's
    shape, the agent's spec (the harness's launcher and each trial's storage and path); refusals."""
    from tests.control_plane.api.test_experiments import create_ok, only_trial

    exp_id = create_ok(client, admin_headers)["experiment"]["id"]
    trial = only_trial(master, exp_id)
    for body, status, field in (({}, 400, "experimentIds"), ({"experimentIds": [9999]}, 404, "experiment 9999"),
                                ({"trialIds": [9999]}, 404, "trial 9999"),
                                ({"experimentIds": [exp_id], "config": {"idle_timeout": "later"}}, 400,
                                 "config.idle_timeout")):
        r = client.post("/api/v1/tensorboards", headers=admin_headers, json=body)
        assert r.status_code == status and field in r.text, r.text
    r = client.post("/api/v1/tensorboards", headers=admin_headers,
                    json={"experimentIds": [exp_id], "trialIds": [trial.id], "config": {"resources": {"slots": 0}}})
    assert r.status_code == 200, r.text
    tb = r.json()["tensorboard"]
    assert V1_COMMAND_REQUIRED <= set(tb) and tb["serviceAddress"] == f"/proxy/{tb['id']}/"
    assert (tb["experimentIds"], tb["trialIds"], tb["state"]) == ([exp_id], [trial.id], "STATE_QUEUED")
    assert tb["description"].startswith("TensorBoard (")
    listed = client.get("/api/v1/tensorboards", headers=admin_headers).json()["tensorboards"]
    assert [t["id"] for t in listed] == [tb["id"]]
    other = make_user(client, admin_headers, "bob")
    assert client.get(f"/api/v1/tensorboards/{tb['id']}", headers=other).json()["tensorboard"]["id"] == tb["id"]
    _agent(master)
    placement.tick(master)
    with transaction(master.sessions) as s:
        alloc = s.scalar(select(Allocation).where(Allocation.task_id == tb["id"]))
        spec = agent_service.task_spec(s, master, alloc, s.get(Agent, "a1"))
    assert spec.argv == ["python3", "-m", "harness.tensorboard.serve"] and spec.env["DET_TASK_TYPE"] == "TENSORBOARD"
    assert spec.env["SHIPYARD_TASK_TOKEN"] == tasks.jupyter_token(master, tb["id"])  # the gate's; the proxy sends it
    (source,) = json.loads(spec.env["SHIPYARD_TENSORBOARD_SOURCES"])
    assert source["name"] == f"exp{exp_id}-trial{trial.id}" and source["storage"]["type"] == "shared_fs"
    assert source["path"] == f"{master.cluster_id}/tensorboard/experiment/{exp_id}/trial/{trial.id}"
    task = client.get(f"/api/v1/tasks/{tb['id']}", headers=admin_headers).json()["task"]
    assert task["taskType"] == "TASK_TYPE_TENSORBOARD" and task["allocations"][0]["isReady"] is False
    killed = client.post(f"/api/v1/tensorboards/{tb['id']}/kill", headers=admin_headers).json()["tensorboard"]
    assert killed["state"] == "STATE_TERMINATING"


def test_a_tensorboard_gets_another_users_storage_without_its_keys(client, admin_headers, master) -> None:  # type: ignore[no-untyped-def]
    """It runs as its launcher, who could read its environment: the storage of an experiment they do
    not own reaches it without access_key / secret_key; the owner's own TensorBoard gets them."""
    from tests.control_plane.api.test_experiments import CONFIG, create_ok, only_trial

    bob = make_user(client, admin_headers, "bob")
    cfg = yaml.safe_load(CONFIG)
    cfg["checkpoint_storage"] = {"type": "s3", "bucket": "b", "access_key": "AKIABOB", "secret_key": "bob-secret"}
    trial = only_trial(master, create_ok(client, bob, yaml.safe_dump(cfg))["experiment"]["id"])
    _agent(master)
    seen = {}
    for who, headers in (("admin", admin_headers), ("bob", bob)):
        r = client.post("/api/v1/tensorboards", headers=headers,
                        json={"trialIds": [trial.id], "config": {"resources": {"slots": 0}}})
        assert r.status_code == 200, r.text
        placement.tick(master)
        with transaction(master.sessions) as s:
            alloc = s.scalar(select(Allocation).where(Allocation.task_id == r.json()["tensorboard"]["id"]))
            spec = agent_service.task_spec(s, master, alloc, s.get(Agent, "a1"))
        (seen[who],) = json.loads(spec.env["SHIPYARD_TENSORBOARD_SOURCES"])
    assert (seen["admin"]["storage"]["bucket"], seen["admin"]["storage"].keys() & {"access_key", "secret_key"}) == (
        "b", set())
    assert "bob-secret" not in json.dumps(seen["admin"]) and "AKIABOB" not in json.dumps(seen["admin"])
    assert (seen["bob"]["storage"]["access_key"], seen["bob"]["storage"]["secret_key"]) == ("AKIABOB", "bob-secret")


def test_tensorboard_of_a_large_experiment_takes_its_best_trials(client, admin_headers, master,  # type: ignore[no-untyped-def]
                                                                  monkeypatch) -> None:
    """Determined's rule: an experiment with more trials than a TensorBoard shows gives its best by
    validation metric (smaller is better by default); naming more trials than that is refused."""
    from control_plane.db.models import Trial
    from control_plane.services import tensorboards
    from tests.control_plane.api.test_experiments import create_ok, only_trial

    monkeypatch.setattr(tensorboards, "MAX_TRIALS", 2)
    exp_id = create_ok(client, admin_headers)["experiment"]["id"]
    unvalidated = only_trial(master, exp_id).id
    with transaction(master.sessions) as s:
        added = [Trial(experiment_id=exp_id, request_id=f"r{i}", hparams={}, seed=i, state="COMPLETED",
                       task_id=f"extra-{i}", best_validation=v) for i, v in ((1, 0.9), (2, 0.1))]
        s.add_all(added)
        s.flush()
        worse, best = (t.id for t in added)
    r = client.post("/api/v1/tensorboards", headers=admin_headers, json={"experimentIds": [exp_id]})
    assert r.status_code == 200, r.text
    assert r.json()["tensorboard"]["trialIds"] == sorted([worse, best])
    r = client.post("/api/v1/tensorboards", headers=admin_headers, json={"trialIds": [unvalidated, worse, best]})
    assert r.status_code == 400 and "at most 2" in r.text and "trialIds" in r.text, r.text
