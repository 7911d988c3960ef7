"""The agent protocol models: what the agent sends, the master accepts, and the other way round."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from pydantic import ValidationError

from agent_bootstrap.agent.devices import Slot
from shipyard_common.agent_protocol import (
    TASK_EVENT_TYPES,
    CommandsResponse,
    EventsRequest,
    KillCommand,
    RegisterRequest,
    RegisterResponse,
    StartCommand,
    TaskEvent,
    TaskSpec,
    parse_command,
)


@pytest.mark.parametrize("kind", TASK_EVENT_TYPES)
def test_every_event_the_agent_can_send_is_accepted(kind: str) -> None:
    sent = TaskEvent(allocation_id="a1", type=kind, time=datetime(2024, 5, 1, 12, tzinfo=timezone.utc), pid=7)  # type: ignore[arg-type]
    body = EventsRequest(session_id="s", events=[sent]).to_wire()
    assert body["events"][0]["time"] == "2024-05-01T12:00:00.000000Z"
    got = EventsRequest.model_validate(body)
    assert got.events[0].type == kind and got.events[0].pid == 7
    assert got.events[0].time == sent.time
    assert "pulling" in TASK_EVENT_TYPES


def test_events_refuse_unknown_types_and_fields() -> None:
    with pytest.raises(ValidationError):
        EventsRequest.model_validate({"sessionId": "s", "events": [{"allocationId": "a", "type": "paused"}]})
    with pytest.raises(ValidationError, match="extra"):
        EventsRequest.model_validate({"sessionId": "s", "events": [], "sesionId": "typo"})


def test_registration_from_the_agents_slots() -> None:
    slot = Slot(id="0", type="cuda", brand="A10G", uuid="GPU-1", index=0, memory_mb=23028)
    req = RegisterRequest(agent_id="host-1", resource_pool="gpu", slots=[slot.info()], running_allocations=["x"])
    wire = req.to_wire()
    assert wire["slots"] == [{"id": "0", "type": "cuda", "uuid": "GPU-1", "brand": "A10G", "memoryMb": 23028}]
    assert RegisterRequest.model_validate(wire) == req
    with pytest.raises(ValidationError, match="agent_id|agentId"):
        RegisterRequest.model_validate({**wire, "agentId": "-bad id"})


def test_answers_from_a_newer_master_are_read_leniently() -> None:
    resp = RegisterResponse.model_validate({"sessionId": "s", "heartbeatIntervalSeconds": 3, "kill": ["a"],
                                            "someNewField": True})
    assert (resp.session_id, resp.heartbeat_interval_s, resp.kill, resp.cluster_id) == ("s", 3.0, ["a"], None)


def test_commands_round_trip_and_a_bad_one_is_reported() -> None:
    spec = TaskSpec(allocation_id="a", entrypoint="python3 train.py", env={"N": 1, "B": True, "Z": None},  # type: ignore[dict-item]
                    slot_ids=[0, 1])  # type: ignore[list-item]
    assert spec.env == {"N": "1", "B": "true", "Z": ""} and spec.slot_ids == ["0", "1"]
    assert spec.argv == ["sh", "-c", "python3 train.py"]
    body = CommandsResponse(commands=[StartCommand(allocation_id="a", spec=spec),
                                      KillCommand(allocation_id="b", grace_seconds=5)]).to_wire()
    start, kill = (parse_command(c) for c in body["commands"])
    assert isinstance(start, StartCommand) and start.spec == spec
    assert isinstance(kill, KillCommand) and kill.grace_seconds == 5
    with pytest.raises(ValueError, match="spec.entrypoint"):
        parse_command({"type": "start", "allocationId": "a", "spec": {"allocationId": "a"}})
    with pytest.raises(ValueError, match="unknown command type 'reboot'"):
        parse_command({"type": "reboot"})
