"""How far a trial and an experiment are: the one home of the rule the API, the CLI and the UI show
(the lifecycle writes the experiment's to its row on every tick; the trial's is computed where it
is serialized). Pure: no clock, no database.

A trial's progress is what its code reported (Determined's `report_progress`, 0..1) when it
reported some, else its steps done over the steps its searcher operation asked for; a completed
trial is done (1.0). An experiment's is the sum of its trials' progress over the trials planned
(the searcher's `max_trials`, or as many as exist when more), or the searcher's own estimate when
that is further (ASHA's counts rungs not yet reached). A completed experiment is at 1.0; one that
ended otherwise (error, canceled) keeps the progress it had: the caller stops asking."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class TrialWork:
    completed: bool  # the trial ended COMPLETED
    steps_completed: int
    target_length: int | None  # the length its searcher operation asked for (None: none yet)
    reported: float | None  # what its code reported (None or 0: nothing)


def _unit(value: float) -> float:
    return min(max(value, 0.0), 1.0) if math.isfinite(value) else 0.0


def trial_progress(t: TrialWork) -> float:
    if t.completed:
        return 1.0
    if t.reported:
        return _unit(float(t.reported))
    if t.target_length:
        return _unit(t.steps_completed / t.target_length)
    return 0.0


def experiment_progress(trials: Iterable[TrialWork], planned_trials: int | None, searcher_estimate: float = 0.0) -> float:
    shares = [trial_progress(t) for t in trials]
    planned = max(planned_trials or 1, len(shares), 1)
    return max(_unit(sum(shares) / planned), _unit(searcher_estimate))
