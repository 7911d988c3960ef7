"""The scheduling policy registry: pools name a policy, the registry hands back its function."""

from __future__ import annotations

import pytest

from control_plane.core import scheduling
from control_plane.core.scheduling import (
    DEFAULT_POLICY,
    AgentSlots,
    PendingAllocation,
    UnknownPolicy,
    policy_names,
    priority,
    scheduling_policy,
)


def test_priority_is_registered_and_is_the_default() -> None:
    assert policy_names() == ("priority", "fair_share")
    assert DEFAULT_POLICY == "priority"
    assert scheduling_policy("priority") is priority.POLICY
    assert scheduling_policy(None) is priority.POLICY
    assert scheduling.POLICIES["priority"].schedule is priority.schedule


def test_the_registered_function_is_what_runs() -> None:
    policy = scheduling_policy("priority")
    d = policy.schedule([PendingAllocation("p", 1)], [], [AgentSlots("a", ("0",))], preemption=False)
    assert [(a.allocation_id, a.agent_id, a.slot_ids) for a in d.assignments] == [("p", "a", ("0",))]


@pytest.mark.parametrize("name", ["fairshare", "round_robin", "PRIORITY"])
def test_unknown_policy_names_the_allowed_ones(name: str) -> None:
    with pytest.raises(UnknownPolicy) as e:
        scheduling_policy(name)
    assert str(e.value) == f"unknown scheduler type {name!r}; expected one of: priority, fair_share"
    assert isinstance(e.value, ValueError)  # so pydantic reports it as the field's error
