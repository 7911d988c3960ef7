"""Properties of every searcher under arbitrary event orders (drawn by hypothesis)."""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from control_plane.core.expconf import SearcherConfig
from control_plane.core.searcher import (
    ExitedReason,
    Operation,
    grid_size,
    new_search_method,
    restore_search_method,
)
from control_plane.core.searcher.simulate import SearchSimulation
from tests.control_plane.core.searcher.helpers import searcher_cfg, step

# Every searcher, grid included, can run over this space (12 grid points).
HP: dict[str, Any] = {
    "lr": {"type": "log", "minval": -4, "maxval": -1, "base": 10, "count": 2},
    "layers": {"type": "int", "minval": 1, "maxval": 8, "count": 3},
    "opt": {"type": "categorical", "vals": ["sgd", "adam"]},
    "batch": 32,
}

CONFIGS: dict[str, st.SearchStrategy[SearcherConfig]] = {
    "single": st.builds(lambda: searcher_cfg("single")),
    "random": st.builds(
        lambda mt, mct: searcher_cfg("random", max_trials=mt, max_concurrent_trials=mct),
        st.integers(1, 12),
        st.integers(0, 5),
    ),
    "grid": st.builds(lambda mct: searcher_cfg("grid", max_concurrent_trials=mct), st.integers(0, 5)),
    "adaptive_asha": st.builds(
        lambda mt, mct, mode, stop_once, divisor, rungs, length, smaller: searcher_cfg(
            "adaptive_asha", max_trials=mt, max_concurrent_trials=mct, mode=mode, stop_once=stop_once,
            divisor=divisor, max_rungs=rungs, max_length={"batches": length}, smaller_is_better=smaller,
        ),
        st.integers(1, 30),
        st.integers(0, 6),
        st.sampled_from(["aggressive", "standard", "conservative"]),
        st.booleans(),
        st.sampled_from([2.0, 3.0, 4.0]),
        st.integers(1, 4),
        st.sampled_from([8, 16, 64, 100]),
        st.booleans(),
    ),
}
# ASHA has the most state, so it gets half the examples.
configs = st.sampled_from(["single", "random", "grid", "adaptive_asha", "adaptive_asha", "adaptive_asha"]).flatmap(
    CONFIGS.__getitem__
)
metric_values = st.lists(
    st.one_of(st.integers(0, 5).map(float), st.floats(-1e6, 1e6), st.just(math.nan), st.just(math.inf)),
    min_size=1,
    max_size=40,
)
event_choices = st.lists(st.integers(0, 10**6), min_size=10, max_size=100)


def normalized(snapshot: dict[str, Any]) -> dict[str, Any]:
    # What comes back from a JSONB column: strict JSON, keys reordered.
    return json.loads(json.dumps(snapshot, sort_keys=True, allow_nan=False))


def drive(
    cfg: SearcherConfig, seed: int, choices: list[int], metrics: list[float], restore_every_step: bool
) -> tuple[list[Operation], list[float], dict[str, Any]]:
    sim = SearchSimulation(new_search_method(cfg, HP, seed))
    sim.start()
    progress: list[float] = []

    def maybe_restore() -> None:
        if restore_every_step:
            snap = normalized(sim.method.snapshot())
            sim.method = restore_search_method(cfg, HP, seed, snap)
            assert normalized(sim.method.snapshot()) == snap

    for i, choice in enumerate(choices):
        maybe_restore()
        if not step(sim, choice, metrics[i % len(metrics)]):
            break
        progress.append(sim.method.progress())
    for _ in range(10_000):
        maybe_restore()
        if sim.shutdown is not None or not step(sim, 0, 0.5, allow_rare=False):
            break
        progress.append(sim.method.progress())
    return sim.log, progress, normalized(sim.method.snapshot())


@settings(max_examples=100, deadline=None)
@given(cfg=configs, seed=st.integers(0, 2**32 - 1), choices=event_choices, metrics=metric_values)
def test_restoring_at_every_step_continues_exactly(
    cfg: SearcherConfig, seed: int, choices: list[int], metrics: list[float]
) -> None:
    uninterrupted = drive(cfg, seed, choices, metrics, restore_every_step=False)
    restored = drive(cfg, seed, choices, metrics, restore_every_step=True)
    assert restored == uninterrupted


@settings(max_examples=200, deadline=None)
@given(cfg=configs, seed=st.integers(0, 2**32 - 1), choices=event_choices, metrics=metric_values)
def test_budget_concurrency_and_shutdown_hold_under_any_event_order(
    cfg: SearcherConfig, seed: int, choices: list[int], metrics: list[float]
) -> None:
    name = cfg.name
    budget = {"single": 1, "grid": grid_size(HP)}.get(name) or cfg.max_trials  # type: ignore[union-attr]
    mct = 0 if name == "single" else cfg.max_concurrent_trials  # type: ignore[union-attr]
    sim = SearchSimulation(new_search_method(cfg, HP, seed))
    sim.start()

    def replaced() -> int:
        # Searchers that sample replace a trial that reported invalid hyperparameters while it
        # still had work to do; grid cannot (the point is what it is).
        if name == "grid":
            return 0
        return sum(t.exit_reason == ExitedReason.INVALID_HP and t.exited_running for t in sim.trials.values())

    def check() -> None:
        assert len(sim.trials) <= budget + replaced()
        if mct > 0:
            # Fixed-length searchers start a trial when one ends; ASHA pauses trials without work,
            # so for it only trials with an outstanding ValidateAfter take a slot.
            busy = sim.running() if name == "adaptive_asha" else sim.alive()
            assert len(busy) <= mct
        assert 0.0 <= sim.method.progress() <= 1.0

    check()
    for i, choice in enumerate(choices):
        if not step(sim, choice, metrics[i % len(metrics)]):
            break
        check()
    for _ in range(10_000):
        if sim.shutdown is not None or not step(sim, 0, 0.5, allow_rare=False):
            break
        check()

    # Liveness: with only ordinary events left, every search finishes.
    assert sim.shutdown is not None, "search stalled"
    trials = list(sim.trials.values())
    assert all(t.ended for t in trials)
    assert len(trials) == budget + replaced()
    assert sim.shutdown.failure == all(t.exit_reason == ExitedReason.ERRORED for t in trials)
    assert sim.method.progress() == 1.0
    # Nothing moves after Shutdown.
    for t in trials:
        assert sim.method.trial_closed(t.request_id) == []
        assert sim.method.validation_completed(t.request_id, 0.0, 10**9) == []
