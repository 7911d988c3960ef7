"""det job list|update and det agent enable|disable [--drain] against a real master (both databases):
the table and --json, a reorder that shows in the next listing, and one readable line for each
refusal."""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx
import pytest

from tests.cli.conftest import Det, one_error_line
from tests.conftest import LiveMaster

pytestmark = pytest.mark.integration

CONFIG = """\
name: {name}
entrypoint: python3 train.py
searcher: {{name: single, metric: loss, max_length: {{batches: 10}}}}
hyperparameters: {{lr: 0.1}}
"""


def _submit(m: LiveMaster, admin: dict[str, str], name: str) -> dict[str, Any]:
    # Queued, or scheduled on an agent another test registered: either way in the queue, in order.
    train = {"path": "train.py", "type": 48, "content": base64.b64encode(b"print(1)\n").decode(), "mode": 0o644,
             "mtime": "0", "uid": 0, "gid": 0}
    r = httpx.post(m.url + "/api/v1/experiments", headers=admin,
                   json={"config": CONFIG.format(name=name), "modelDefinition": [train]})
    assert r.status_code == 200, r.text
    return r.json()["experiment"]


def _listed(admin_det: Det) -> list[str]:
    r = admin_det("job", "list", "--resource-pool", "default", "--json")
    assert r.code == 0, r.err
    return [j["jobId"] for j in json.loads(r.out)]


def test_job_list_and_update(admin_det: Det, cli_master: LiveMaster) -> None:
    admin = {"Authorization": f"Bearer {cli_master.token()}"}
    a, b = _submit(cli_master, admin, "job-cli-a"), _submit(cli_master, admin, "job-cli-b")
    ids = _listed(admin_det)
    assert ids.index(a["jobId"]) < ids.index(b["jobId"])
    text = admin_det("job", "list").out
    assert a["jobId"] in text and "job-cli-a" in text and "Waiting Because" in text

    r = admin_det("job", "update", b["jobId"], "--ahead-of", a["jobId"])
    assert r.code == 0 and f"Updated job {b['jobId']}" in r.out, r.err
    ids = _listed(admin_det)
    assert ids.index(b["jobId"]) < ids.index(a["jobId"])
    r = admin_det("job", "update", a["jobId"], "--priority", "1", "--weight", "2")
    assert r.code == 0, r.err
    job = next(j for j in json.loads(admin_det("job", "list", "--json").out) if j["jobId"] == a["jobId"])
    assert (job["priority"], job["weight"], job["summary"]["jobsAhead"]) == (1, 2.0, 0)

    assert "priority: must be between 1 and 99" in one_error_line(admin_det("job", "update", a["jobId"], "-p", "0"))
    assert "weight" in one_error_line(admin_det("job", "update", a["jobId"], "--weight", "0"))
    assert "404" in one_error_line(admin_det("job", "update", "no-such-job", "-p", "5"))
    assert "no resource pool named 'nope'" in one_error_line(
        admin_det("job", "update", a["jobId"], "--resource-pool", "nope"))
    assert "nothing to change" in one_error_line(admin_det("job", "update", a["jobId"]))
    for exp in (a, b):
        httpx.post(cli_master.url + f"/api/v1/experiments/{exp['id']}/kill", headers=admin).raise_for_status()


def test_agent_enable_disable_drain(admin_det: Det, cli_master: LiveMaster) -> None:
    admin = {"Authorization": f"Bearer {cli_master.token()}"}
    r = httpx.post(cli_master.url + "/api/v1/agents/tokens", json={"resourcePool": "default"}, headers=admin)
    agent = {"Authorization": f"Bearer {r.json()['token']}"}
    r = httpx.post(cli_master.url + "/api/v1/agents/register", headers=agent, json={
        "agentId": "drain-cli-1", "resourcePool": "default", "version": "0.1.0",
        "slots": [{"id": "0", "type": "cpu"}], "runningAllocations": []})
    assert r.status_code == 200, r.text

    r = admin_det("agent", "disable", "--drain", "drain-cli-1")
    assert r.code == 0 and "Draining agent drain-cli-1" in r.out, r.err
    listed = next(a for a in json.loads(admin_det("agent", "list", "--json").out) if a["id"] == "drain-cli-1")
    assert (listed["enabled"], listed["draining"]) == (False, True)
    r = admin_det("agent", "disable", "drain-cli-1")
    assert r.code == 0 and r.out.startswith("Disabled agent drain-cli-1"), r.err
    r = admin_det("agent", "enable", "drain-cli-1")
    assert r.code == 0 and "Enabled agent drain-cli-1" in r.out, r.err
    assert "404" in one_error_line(admin_det("agent", "enable", "no-such-agent"))
