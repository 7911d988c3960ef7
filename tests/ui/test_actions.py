"""The actions the experiment page offers for each state (control_plane/ui/actions.py): each one is
an action the service would carry out and that changes something."""

from __future__ import annotations

import pytest

from control_plane.core import states as st
from control_plane.ui.actions import ACTIONS, allowed, outcome

E = st.ExperimentState


@pytest.mark.parametrize(("state", "archived", "expected"), [
    (E.ACTIVE, False, {"pause", "cancel", "kill"}),
    (E.PAUSED, False, {"activate", "cancel", "kill"}),
    (E.STOPPING_CANCELED, False, {"kill"}),  # a cancel may be escalated, not repeated
    (E.STOPPING_KILLED, False, set()),
    (E.COMPLETED, False, {"archive"}),
    (E.CANCELED, True, {"unarchive"}),
    (E.ERROR, False, {"archive"}),
])
def test_offered_actions_are_the_ones_that_change_something(state: E, archived: bool, expected: set[str]) -> None:
    assert set(allowed(state, archived, may_change=True)) == expected
    assert allowed(state, archived, may_change=False) == ()
    for action in set(allowed(state, archived, True)) & {"activate", "pause", "cancel", "kill"}:
        target = st.ACTION_TARGETS[st.ExperimentAction(action)]
        assert target != state and st.can_transition(state, target)


def test_messages_say_what_happened() -> None:
    assert outcome("kill", False, 7, "completed") == "Nothing to kill: experiment 7 is completed."
    assert outcome("pause", True, 7, "paused") == "Paused experiment 7 (now paused)."
    assert all(outcome(a, True, 1, "x") for a in ACTIONS) and outcome("explode", True, 1, "x") == ""
