"""A trial across agents (a gang) through the agent service, on SQLite and PostgreSQL: each agent
is owed its own part's start (with the rendezvous of all parts), the allocation moves with its
least advanced part, a failure of any part stops the others and restarts the whole trial, an agent
gone takes its part with it; and the rendezvous endpoint answers Determined's shape."""

from __future__ import annotations

import json
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import select

from control_plane.db.engine import transaction
from control_plane.db.models import Allocation, Trial
from control_plane.loops import placement
from shipyard_common.agent_protocol import KillCommand, StartCommand
from tests.control_plane.services.test_agents import (
    CONFIG,
    agent_principal,
    commands,
    credential,
    register,
    report,
    states,
    submit,
)

GANG = {**CONFIG, "resources": {"slots_per_trial": 2}, "max_restarts": 1}


def _two_agents(master: Any) -> dict[str, tuple[Any, str]]:
    """Two one-slot agents (a1, a2) and the gang's starts: agent -> (credential, session)."""
    submit(master, GANG)
    out = {}
    for agent_id in ("a1", "a2"):
        resp = register(master, agent_principal(master), agent_id=agent_id)
        out[agent_id] = (credential(master, resp), resp.session_id)
    placement.tick(master)
    return out


def _alloc(master: Any) -> Allocation:
    with master.sessions() as s:
        (alloc,) = s.scalars(select(Allocation).where(Allocation.state != "terminated"))
        s.expunge(alloc)
        return alloc


def _cmds(master: Any, agents: dict[str, tuple[Any, str]], agent_id: str) -> list[Any]:
    cred, session = agents[agent_id]
    return commands(master, cred, session, agent_id=agent_id)


def _report(master: Any, agents: dict[str, tuple[Any, str]], agent_id: str, alloc: str, kind: str,
            code: int | None = None, message: str | None = None) -> None:
    cred, session = agents[agent_id]
    report(master, cred, session, alloc, kind, code, message, agent_id=agent_id)


def test_each_agent_starts_its_part_with_the_rendezvous_and_the_gang_runs_when_all_do(master) -> None:  # type: ignore[no-untyped-def]
    agents = _two_agents(master)
    alloc = _alloc(master)
    assert alloc.state == "assigned" and [p["agent"] for p in alloc.placement or []] == ["a1", "a2"]
    envs = {}
    for agent_id in ("a1", "a2"):
        (cmd,) = _cmds(master, agents, agent_id)
        assert isinstance(cmd, StartCommand) and cmd.allocation_id == alloc.id and len(cmd.spec.slot_ids) == 1
        envs[agent_id] = cmd.spec.env
    for rank, agent_id in enumerate(("a1", "a2")):
        env = envs[agent_id]
        assert env["DET_RESOURCES_ID"] == agent_id
        rdzv = json.loads(env["DET_RENDEZVOUS_INFO"])
        assert rdzv["rank"] == rank and rdzv["slots"] == [1, 1] and len(rdzv["addresses"]) == 2
    assert envs["a1"]["C10D_PORT"] == envs["a2"]["C10D_PORT"]

    _report(master, agents, "a1", alloc.id, "running")
    assert states(master, alloc.id)[0] == "assigned"  # a2 has not started yet: still owed its start
    assert _cmds(master, agents, "a1") == [] and len(_cmds(master, agents, "a2")) == 1
    _report(master, agents, "a2", alloc.id, "running")
    assert states(master, alloc.id) == ("running", "STATE_RUNNING")
    assert _cmds(master, agents, "a2") == []


def test_a_failed_part_stops_the_others_and_the_whole_trial_restarts(master) -> None:  # type: ignore[no-untyped-def]
    agents = _two_agents(master)
    alloc = _alloc(master)
    for agent_id in ("a1", "a2"):
        _report(master, agents, agent_id, alloc.id, "running")
    _report(master, agents, "a2", alloc.id, "exited", 1, "exited with code 1")

    assert states(master, alloc.id)[0] == "running"  # until the chief has stopped too
    (kill,) = _cmds(master, agents, "a1")
    assert isinstance(kill, KillCommand) and kill.allocation_id == alloc.id
    assert _cmds(master, agents, "a2") == []  # its part is over
    _report(master, agents, "a1", alloc.id, "exited", -15, "killed at the master's request")

    with master.sessions() as s:
        ended = s.get(Allocation, alloc.id)
        assert ended is not None and ended.state == "terminated"
        assert (ended.end_cause, ended.exit_code) == ("exited", 1)
        assert ended.exit_reason == "rank 1 (agent a2): exited with code 1"
        trial = s.get(Trial, ended.trial_id)
        assert trial is not None and trial.restarts == 1
    placement.tick(master)
    again = _alloc(master)  # a new run of the whole gang
    assert again.id != alloc.id and again.state == "assigned" and len(again.placement or []) == 2


def test_an_agent_restarted_without_its_part_ends_the_gang_as_agent_lost(master) -> None:  # type: ignore[no-untyped-def]
    agents = _two_agents(master)
    alloc = _alloc(master)
    for agent_id in ("a1", "a2"):
        _report(master, agents, agent_id, alloc.id, "running")
    cred, _ = agents["a2"]
    register(master, cred, agent_id="a2", running=[])  # a2 came back without it

    (kill,) = _cmds(master, agents, "a1")
    assert isinstance(kill, KillCommand)
    _report(master, agents, "a1", alloc.id, "exited", -15, "killed")
    with master.sessions() as s:
        ended = s.get(Allocation, alloc.id)
        assert ended is not None and (ended.state, ended.end_cause) == ("terminated", "agent_lost")
        trial = s.get(Trial, ended.trial_id)
        assert trial is not None and trial.restarts == 0  # not the trial's failure


def test_the_rendezvous_endpoint_answers_for_the_allocation_token_only(master) -> None:  # type: ignore[no-untyped-def]
    from control_plane.api.app import create_app

    agents = _two_agents(master)
    alloc = _alloc(master)
    (cmd,) = _cmds(master, agents, "a2")
    token = cmd.spec.env["DET_SESSION_TOKEN"]
    with TestClient(create_app(master)) as client:
        url = f"/api/v1/allocations/{alloc.id}/resources/a2/rendezvous"
        r = client.get(url, headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200, r.text
        info = r.json()["rendezvousInfo"]
        assert info["rank"] == 1 and info["slots"] == [1, 1] and len(info["addresses"]) == 2
        assert info == json.loads(cmd.spec.env["DET_RENDEZVOUS_INFO"])
        missing = client.get(f"/api/v1/allocations/{alloc.id}/resources/a9/rendezvous",
                             headers={"Authorization": f"Bearer {token}"})
        assert missing.status_code == 404 and "a9" in missing.text
        other = client.get("/api/v1/allocations/other/resources/a2/rendezvous",
                           headers={"Authorization": f"Bearer {token}"})
        assert other.status_code == 403
        assert client.get(url).status_code == 401
    with transaction(master.sessions) as s:  # the token dies with the allocation
        row = s.get(Allocation, alloc.id)
        assert row is not None


def test_after_the_chief_finishes_the_workers_may_finish_on_their_own(master) -> None:  # type: ignore[no-untyped-def]
    agents = _two_agents(master)
    alloc = _alloc(master)
    for agent_id in ("a1", "a2"):
        _report(master, agents, agent_id, alloc.id, "running")
    _report(master, agents, "a1", alloc.id, "exited", 0, "exited with code 0")
    assert _cmds(master, agents, "a2") == []  # within the grace: not killed
    _report(master, agents, "a2", alloc.id, "exited", 0, "exited with code 0")
    with master.sessions() as s:
        ended = s.get(Allocation, alloc.id)
        assert ended is not None and (ended.state, ended.exit_code) == ("terminated", 0)


def test_an_agent_shows_the_slots_its_part_of_a_gang_holds() -> None:
    """`GET /api/v1/agents`' slot view follows the agent's own part of a gang, not the chief's slot
    ids (they differ when a gang's parts hold different slots)."""
    from types import SimpleNamespace

    from control_plane.api.agents import agent_json
    from control_plane.db.models import Agent

    gang = SimpleNamespace(id="g", agent_id="a1", slot_ids=["0"], placement=[
        {"agent": "a1", "slots": ["0"]}, {"agent": "a2", "slots": ["1"]}])
    a2 = Agent(id="a2", pool="default", enabled=True, state="connected", slots=[{"id": "0"}, {"id": "1"}])
    shown = agent_json(a2, [gang])  # type: ignore[arg-type]
    assert shown["slots"]["1"]["container"]["id"] == "g" and shown["slots"]["0"]["container"] is None
