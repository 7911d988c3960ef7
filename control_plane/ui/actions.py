"""Which of an experiment's actions the page offers, and what a done (or skipped) action says: a
pure decision from the experiment's state, its archived flag and whether the user may change it
(its owner or an admin). The services still decide; this only keeps the page from offering what
they would refuse or ignore."""

from __future__ import annotations

from control_plane.core import states as st

# The order the buttons appear in, with their labels.
LABELS = {"activate": "Activate", "pause": "Pause", "cancel": "Cancel", "kill": "Kill",
          "archive": "Archive", "unarchive": "Unarchive"}
ACTIONS = tuple(LABELS)


def allowed(state: str, archived: bool, may_change: bool) -> tuple[str, ...]:
    """The actions that would change something: activate only a paused experiment, pause only an
    active one, cancel / kill only one not over (kill also one already being canceled), archive
    only a finished one not archived yet, unarchive only an archived one; none for a user who may
    not change the experiment."""
    if not may_change:
        return ()
    out = []
    for name in ("activate", "pause", "cancel", "kill"):
        action = st.ExperimentAction(name)
        target = st.ACTION_TARGETS[action]
        if state in st.EXP_TERMINAL or state == target or not st.can_transition(state, target):
            continue
        if action is st.ExperimentAction.CANCEL and state in st.EXP_STOPPING:
            continue  # already stopping: canceling again changes nothing
        out.append(name)
    if state in st.EXP_TERMINAL and not archived:
        out.append("archive")
    if archived:
        out.append("unarchive")
    return tuple(out)


PAST = {"activate": "Activated", "pause": "Paused", "cancel": "Canceling", "kill": "Killing",
        "archive": "Archived", "unarchive": "Unarchived"}


def outcome(action: str, changed: bool, exp_id: int, state: str) -> str:
    """What happened, in words: what the action did, or why it did nothing (`state`, as the page
    shows states, is the experiment's state after the action)."""
    if action not in PAST:
        return ""
    if not changed:
        return f"Nothing to {action}: experiment {exp_id} is {state}."
    if action in ("cancel", "kill"):
        return f"{PAST[action]} experiment {exp_id}: its trials are being stopped (now {state})."
    return f"{PAST[action]} experiment {exp_id} (now {state})."
