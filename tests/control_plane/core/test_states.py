"""The experiment, trial and allocation state machines: enums with their transition tables."""

from __future__ import annotations

from enum import StrEnum

import pytest

from control_plane.core import states as st
from control_plane.core.states import (
    ALLOCATION_TRANSITIONS,
    EXPERIMENT_TRANSITIONS,
    TRIAL_TRANSITIONS,
    AllocationState,
    ExperimentAction,
    ExperimentState,
    IllegalTransition,
    TrialState,
    can_transition,
    experiment_action,
    transition,
)


def test_values_are_the_wire_and_stored_strings() -> None:
    assert ExperimentState.STOPPING_CANCELED == "STATE_STOPPING_CANCELED"
    assert TrialState.QUEUED == "STATE_QUEUED"
    assert AllocationState.PENDING == "pending"
    assert f"{ExperimentState.ACTIVE}" == "STATE_ACTIVE" and str(AllocationState.RUNNING) == "running"
    assert st.AgentState.CONNECTED == "connected" and st.ExitCause.AGENT_LOST == "agent_lost"
    assert st.CheckpointState.PARTIALLY_DELETED == "STATE_PARTIALLY_DELETED"
    # Every state is an enum member: no module-level alias of one (issue 25).
    aliases = [name for name, value in vars(st).items()
               if name.isupper() and isinstance(value, StrEnum) and not name.startswith("_")]
    assert aliases == []


@pytest.mark.parametrize("table, enum, ends", [
    (EXPERIMENT_TRANSITIONS, ExperimentState, st.EXP_TERMINAL),
    (TRIAL_TRANSITIONS, TrialState, st.TRIAL_TERMINAL),
    (ALLOCATION_TRANSITIONS, AllocationState, {st.AllocationState.TERMINATED}),
])
def test_every_state_has_a_row_and_terminal_states_lead_nowhere(table, enum, ends) -> None:  # type: ignore[no-untyped-def]
    assert set(table) == set(enum)
    for state in ends:
        assert table[state] == frozenset()
        assert all(not can_transition(state, other) for other in enum if other != state)
    for state, targets in table.items():
        assert state not in targets  # staying put is not a row entry, can_transition allows it
        assert can_transition(state, state)


def test_experiment_transitions() -> None:
    assert can_transition(ExperimentState.ACTIVE, ExperimentState.PAUSED)
    assert can_transition(ExperimentState.PAUSED, ExperimentState.ACTIVE)
    assert can_transition(ExperimentState.ACTIVE, ExperimentState.COMPLETED)  # the searcher finished
    assert can_transition(ExperimentState.STOPPING_CANCELED, ExperimentState.STOPPING_KILLED)
    assert not can_transition(ExperimentState.STOPPING_KILLED, ExperimentState.STOPPING_CANCELED)
    assert not can_transition(ExperimentState.STOPPING_CANCELED, ExperimentState.ACTIVE)
    assert not can_transition(ExperimentState.PAUSED, ExperimentState.COMPLETED)
    assert not can_transition(ExperimentState.COMPLETED, ExperimentState.ACTIVE)


def test_allocations_only_move_forward() -> None:
    order = [AllocationState.PENDING, AllocationState.ASSIGNED, AllocationState.PULLING,
             AllocationState.STARTING, AllocationState.RUNNING, AllocationState.TERMINATED]
    for i, a in enumerate(order):
        for j, b in enumerate(order):
            if j < i:
                assert not can_transition(a, b), (a, b)
    assert can_transition(AllocationState.ASSIGNED, AllocationState.RUNNING)  # nothing to pull
    assert not can_transition(AllocationState.PENDING, AllocationState.RUNNING)  # never unplaced
    assert all(can_transition(a, AllocationState.TERMINATED) for a in st.ALLOC_LIVE)


def test_trials_follow_their_allocation_and_end_from_any_live_state() -> None:
    assert can_transition(TrialState.RUNNING, TrialState.QUEUED)  # restarted or preempted
    assert can_transition(TrialState.PAUSED, TrialState.QUEUED)
    for live in (TrialState.QUEUED, TrialState.PULLING, TrialState.STARTING, TrialState.RUNNING, TrialState.PAUSED):
        assert all(can_transition(live, end) for end in st.TRIAL_TERMINAL)
    assert not can_transition(TrialState.STOPPING_KILLED, TrialState.RUNNING)
    assert not can_transition(TrialState.ERROR, TrialState.QUEUED)


def test_transition_accepts_the_stored_string_and_refuses_with_both_states_named() -> None:
    assert transition("STATE_PAUSED", ExperimentState.ACTIVE) is ExperimentState.ACTIVE
    with pytest.raises(IllegalTransition, match="experiment cannot move from STATE_COMPLETED to STATE_ACTIVE"):
        transition("STATE_COMPLETED", ExperimentState.ACTIVE)
    with pytest.raises(IllegalTransition, match="allocation cannot move from terminated to running"):
        transition(AllocationState.TERMINATED, AllocationState.RUNNING)


def test_actions_name_their_target_state() -> None:
    assert experiment_action("cancel") is ExperimentAction.CANCEL
    assert experiment_action("STATE_CANCELED") is ExperimentAction.CANCEL
    assert experiment_action("STATE_PAUSED") is ExperimentAction.PAUSE
    assert experiment_action("explode") is None
    assert st.ACTION_TARGETS[ExperimentAction.KILL] is ExperimentState.STOPPING_KILLED
    # every action is allowed from ACTIVE, and kill from every stopping state
    assert all(can_transition(ExperimentState.ACTIVE, t) for t in st.ACTION_TARGETS.values())
    assert all(can_transition(s, ExperimentState.STOPPING_KILLED) for s in st.EXP_STOPPING)


def test_a_state_the_machine_does_not_know_leads_nowhere() -> None:
    assert not can_transition("STATE_DELETING", ExperimentState.ACTIVE)
    with pytest.raises(IllegalTransition, match="experiment cannot move from STATE_DELETING to STATE_CANCELED"):
        transition("STATE_DELETING", ExperimentState.CANCELED)
