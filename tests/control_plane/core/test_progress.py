"""core/progress.py: a trial's progress and an experiment's, from what the trials did."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as hs

from control_plane.core.progress import TrialWork, experiment_progress, trial_progress


def work(steps: int = 0, target: int | None = 100, reported: float | None = None, completed: bool = False) -> TrialWork:
    return TrialWork(completed=completed, steps_completed=steps, target_length=target, reported=reported)


def test_a_trial_is_its_reported_progress_else_its_steps_over_its_target() -> None:
    assert trial_progress(work(25)) == 0.25
    assert trial_progress(work(25, reported=0.6)) == 0.6  # what the code reported wins
    assert trial_progress(work(250)) == 1.0
    assert trial_progress(work(25, target=None)) == 0.0  # no operation yet: nothing to measure against
    assert trial_progress(work(0, completed=True)) == 1.0
    assert trial_progress(work(5, reported=float("nan"))) == 0.0


def test_an_experiment_sums_its_trials_over_the_trials_planned() -> None:
    assert experiment_progress([work(50)], planned_trials=1) == 0.5  # a single searcher moves with its steps
    assert experiment_progress([work(completed=True), work(50)], planned_trials=4) == 0.375
    assert experiment_progress([work(50), work(50)], planned_trials=None) == 0.5  # more trials than planned
    assert experiment_progress([work(10)], planned_trials=1, searcher_estimate=0.4) == 0.4  # ASHA's rungs ahead
    assert experiment_progress([], planned_trials=3) == 0.0


@given(hs.lists(hs.tuples(hs.integers(0, 10**6), hs.integers(1, 10**6) | hs.none(),
                          hs.floats(allow_nan=True) | hs.none(), hs.booleans()), max_size=20),
       hs.integers(0, 50) | hs.none(), hs.floats(allow_nan=True))
def test_progress_is_always_between_0_and_1(trials, planned, estimate) -> None:  # type: ignore[no-untyped-def]
    shares = [work(*t) for t in trials]
    assert all(0.0 <= trial_progress(t) <= 1.0 for t in shares)
    assert 0.0 <= experiment_progress(shares, planned, estimate) <= 1.0
