"""det agent list, det slot list, det resource-pool list|describe against a real master with one
registered (HTTP-only) agent."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.cli.conftest import Det, one_error_line
from tests.conftest import LiveMaster

pytestmark = pytest.mark.integration


def _register_agent(m: LiveMaster, agent_id: str) -> None:
    admin = {"Authorization": f"Bearer {m.token()}"}
    r = httpx.post(m.url + "/api/v1/agents/tokens", json={"resourcePool": "default"}, headers=admin)
    assert r.status_code == 200, r.text
    agent = {"Authorization": f"Bearer {r.json()['token']}"}
    slots = [{"id": str(i), "type": "cpu", "brand": "cpu"} for i in range(2)]
    r = httpx.post(m.url + "/api/v1/agents/register", headers=agent,
                   json={"agentId": agent_id, "resourcePool": "default", "version": "0.1.0",
                         "addresses": ["10.0.0.5"], "slots": slots, "runningAllocations": []})
    assert r.status_code == 200, r.text


def test_agents_slots_and_pools(admin_det: Det, cli_master: LiveMaster) -> None:
    _register_agent(cli_master, "host-cli-1")

    agents = json.loads(admin_det("agent", "list", "--json").out)
    a = next(a for a in agents if a["id"] == "host-cli-1")
    assert a["resourcePools"] == ["default"] and len(a["slots"]) == 2
    text = admin_det("agent", "list").out
    assert "host-cli-1" in text and "10.0.0.5" in text

    slots = [s for s in json.loads(admin_det("slot", "list", "--json").out) if s["agentId"] == "host-cli-1"]
    assert sorted(s["id"] for s in slots) == ["0", "1"]
    assert all(s["device"]["type"] == "TYPE_CPU" and s["enabled"] for s in slots)
    assert admin_det("slot", "list").out.count("host-cli-1") == 2

    pools = json.loads(admin_det("resource-pool", "list", "--json").out)
    default = next(p for p in pools if p["name"] == "default")
    assert default["numAgents"] >= 1 and default["slotsAvailable"] >= 2
    assert "default" in admin_det("resource-pool", "list").out
    assert json.loads(admin_det("resource-pool", "describe", "default", "--json").out)["name"] == "default"
    text = admin_det("resource-pool", "describe", "default").out
    assert "Slots" in text and "Instances" in text
    assert "404" in one_error_line(admin_det("resource-pool", "describe", "no-such-pool"))


def test_decision_lines_render_any_shape() -> None:
    from cli.commands.resource_pool import decision_lines

    assert decision_lines(None) == []
    assert decision_lines("launch 1, terminate 0\n  demand: 2 slots") == ["launch 1, terminate 0", "  demand: 2 slots"]
    lines = decision_lines({"launch": 2, "terminate": [{"id": "i-1", "reason": "idle 300s"}],
                            "reasons": ["demand: 4 slots"]})
    assert lines == ["launch 2, terminate 1", "  terminate i-1: idle 300s", "  demand: 4 slots"]
