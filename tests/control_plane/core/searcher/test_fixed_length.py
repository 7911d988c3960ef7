from __future__ import annotations

import math

import pytest

from control_plane.core.expconf import SingleSearcher
from control_plane.core.searcher import (
    Close,
    Create,
    ExitedReason,
    Shutdown,
    SnapshotMismatchError,
    UnknownTrialError,
    ValidateAfter,
    new_search_method,
    restore_search_method,
)
from control_plane.core.searcher.simulate import SearchSimulation
from tests.control_plane.core.searcher.helpers import HPARAMS, searcher_cfg


def constant_metric(trial: object, length: int) -> float:
    return 0.5


# ---- single -----------------------------------------------------------------------------------


def test_single_trains_one_trial_to_max_length_then_shuts_down() -> None:
    s = new_search_method(searcher_cfg("single", max_length={"epochs": 3}), HPARAMS, 1)
    ops = s.initial_operations()
    assert [type(op) for op in ops] == [Create, ValidateAfter]
    create, validate = ops
    assert isinstance(create, Create) and validate == ValidateAfter(create.request_id, 3)
    rid = create.request_id
    assert s.trial_created(rid) == []
    assert s.progress() == 0.0
    assert s.validation_completed(rid, 0.3, 1) == []  # an intermediate validation
    assert s.progress() == pytest.approx(1 / 3)
    assert s.validation_completed(rid, 0.2, 3) == [Close(rid)]
    assert s.trial_closed(rid) == [Shutdown(failure=False)]
    assert s.progress() == 1.0
    assert s.trial_closed(rid) == []  # replays are harmless


def test_single_trial_error_fails_the_search() -> None:
    s = new_search_method(searcher_cfg("single"), HPARAMS, 1)
    rid = s.initial_operations()[0].request_id
    ops = s.trial_exited_early(rid, ExitedReason.ERRORED)
    assert len(ops) == 1 and isinstance(ops[0], Shutdown) and ops[0].failure
    assert s.trial_closed(rid) == []


def test_single_runs_one_trial_to_the_full_length() -> None:
    s = new_search_method(searcher_cfg("single"), HPARAMS, 1)
    result = SearchSimulation(s).run(constant_metric)
    assert len(result.trials) == 1 and result.trials[0].trained == 64


# ---- random -----------------------------------------------------------------------------------


def test_random_respects_max_trials_and_concurrency() -> None:
    s = new_search_method(searcher_cfg("random", max_trials=10, max_concurrent_trials=3), HPARAMS, 9)
    sim = SearchSimulation(s)
    assert sum(isinstance(op, Create) for op in sim.start()) == 3
    result = sim.run(constant_metric)
    assert len(result.trials) == 10
    assert all(t.trained == 64 and t.validations == [(64, 0.5)] for t in result.trials)
    assert result.max_alive == 3
    assert result.shutdown == Shutdown(failure=False)
    assert result.units_trained == 640


def test_random_without_concurrency_limit_creates_everything_at_once() -> None:
    s = new_search_method(searcher_cfg("random", max_trials=7), HPARAMS, 9)
    assert sum(isinstance(op, Create) for op in s.initial_operations()) == 7


def test_random_is_reproducible_by_experiment_seed() -> None:
    def run(seed: int) -> list[object]:
        s = new_search_method(searcher_cfg("random", max_trials=6, max_concurrent_trials=2), HPARAMS, seed)
        sim = SearchSimulation(s)
        sim.run(constant_metric)
        return sim.log

    assert run(3) == run(3)
    first, other = run(3), run(4)
    assert [op.hparams for op in first if isinstance(op, Create)] != [
        op.hparams for op in other if isinstance(op, Create)
    ]


def test_random_replaces_invalid_hp_trials_outside_the_budget() -> None:
    s = new_search_method(searcher_cfg("random", max_trials=3, max_concurrent_trials=1), HPARAMS, 2)
    sim = SearchSimulation(s)
    first = sim.start()[0].request_id
    ops = sim.report_exit(first, ExitedReason.INVALID_HP)
    assert [type(op) for op in ops] == [Create, ValidateAfter]
    result = sim.run(constant_metric)
    assert len(result.trials) == 4
    assert sum(t.exit_reason is None for t in result.trials) == 3
    assert result.shutdown == Shutdown(failure=False)


def test_random_errored_trials_are_not_replaced_and_fail_only_if_all_failed() -> None:
    s = new_search_method(searcher_cfg("random", max_trials=2, max_concurrent_trials=1), HPARAMS, 2)
    sim = SearchSimulation(s)
    a = sim.start()[0].request_id
    b = next(op for op in sim.report_exit(a, ExitedReason.ERRORED) if isinstance(op, Create)).request_id
    sim.report_validation(b, 0.1)
    assert sim.report_closed(b) == [Shutdown(failure=False)]

    s = new_search_method(searcher_cfg("random", max_trials=2), HPARAMS, 2)
    sim = SearchSimulation(s)
    a, b = (op.request_id for op in sim.start() if isinstance(op, Create))
    assert sim.report_exit(a, ExitedReason.ERRORED) == []
    assert sim.report_exit(b, "errored") == [Shutdown(failure=True, reason="every trial errored")]


def test_a_trial_that_stops_on_its_own_counts_as_finished() -> None:
    s = new_search_method(searcher_cfg("random", max_trials=2, max_concurrent_trials=1), HPARAMS, 2)
    sim = SearchSimulation(s)
    a = sim.start()[0].request_id
    ops = sim.report_closed(a)  # no Close was sent: the user's code returned early
    assert [type(op) for op in ops] == [Create, ValidateAfter]
    assert s.progress() == pytest.approx(0.5)


def test_without_a_length_trials_run_until_they_stop() -> None:
    s = new_search_method(searcher_cfg("random", max_length=None, max_trials=2, max_concurrent_trials=1), HPARAMS, 0)
    ops = s.initial_operations()
    assert [type(op) for op in ops] == [Create]
    assert s.validation_completed(ops[0].request_id, 0.1, 1000) == []
    second = s.trial_closed(ops[0].request_id)
    assert [type(op) for op in second] == [Create]
    assert s.trial_closed(second[0].request_id) == [Shutdown(failure=False)]


def test_random_progress_grows_to_one() -> None:
    s = new_search_method(searcher_cfg("random", max_trials=5, max_concurrent_trials=2), HPARAMS, 0)
    sim = SearchSimulation(s)
    sim.start()
    seen = [s.progress()]
    while sim.shutdown is None:
        if sim.closing():
            sim.report_closed(sim.closing()[0])
        else:
            rid = sim.running()[0]
            sim.report_validation(rid, 0.4, length=sim.trials[rid].trained + 32)
        seen.append(s.progress())
    assert seen == sorted(seen) and seen[0] == 0.0 and seen[-1] == 1.0


# ---- grid -------------------------------------------------------------------------------------

GRID_HPARAMS = {
    "lr": {"type": "log", "minval": -3, "maxval": -1, "base": 10, "count": 3},
    "opt": {"type": "categorical", "vals": ["sgd", "adam"]},
    "seed_hint": 1,
}


def test_grid_creates_one_trial_per_point_with_concurrency() -> None:
    s = new_search_method(searcher_cfg("grid", max_concurrent_trials=2), GRID_HPARAMS, 0)
    result = SearchSimulation(s).run(constant_metric)
    points = sorted((round(math.log10(t.hparams["lr"])), t.hparams["opt"]) for t in result.trials)
    assert points == sorted((e, opt) for e in (-3, -2, -1) for opt in ("adam", "sgd"))
    assert all(t.hparams["seed_hint"] == 1 for t in result.trials)
    assert result.max_alive == 2
    assert result.shutdown == Shutdown(failure=False)


def test_grid_does_not_replace_invalid_points() -> None:
    s = new_search_method(searcher_cfg("grid", max_concurrent_trials=1), GRID_HPARAMS, 0)
    sim = SearchSimulation(s)
    first = sim.start()[0].request_id
    sim.report_exit(first, ExitedReason.INVALID_HP)
    result = sim.run(constant_metric)
    assert len(result.trials) == 6
    assert len({(t.hparams["lr"], t.hparams["opt"]) for t in result.trials}) == 6


# ---- the shared contract ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["single", "random", "grid", "adaptive_asha"])
def test_events_for_unknown_trials_are_rejected(name: str) -> None:
    s = new_search_method(searcher_cfg(name), GRID_HPARAMS, 0)
    s.initial_operations()
    with pytest.raises(UnknownTrialError):
        s.validation_completed("nope", 0.1, 10)
    with pytest.raises(UnknownTrialError):
        s.trial_closed("nope")


@pytest.mark.parametrize("name", ["single", "random", "grid", "adaptive_asha"])
def test_initial_operations_only_once(name: str) -> None:
    s = new_search_method(searcher_cfg(name), GRID_HPARAMS, 0)
    s.initial_operations()
    with pytest.raises(RuntimeError):
        s.initial_operations()


def test_unknown_searcher_and_mismatched_snapshot_are_rejected() -> None:
    # expconf's model knows no "pbt"; a config it would take but no search method serves
    with pytest.raises(ValueError, match="searcher.name"):
        new_search_method(SingleSearcher.model_construct(name="pbt", metric="loss"), HPARAMS, 0)
    snap = new_search_method(searcher_cfg("random"), HPARAMS, 0).snapshot()
    with pytest.raises(SnapshotMismatchError):
        restore_search_method(searcher_cfg("grid"), GRID_HPARAMS, 0, snap)
