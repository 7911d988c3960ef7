"""Config builders and a step-by-step event driver shared by the searcher tests."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from pydantic import TypeAdapter

from control_plane.core.expconf import SearcherConfig
from control_plane.core.searcher import Close, Create, ExitedReason, Operation, Shutdown, ValidateAfter
from control_plane.core.searcher.simulate import SearchSimulation

HPARAMS: dict[str, Any] = {
    "lr": {"type": "log", "minval": -4, "maxval": -1, "base": 10},
    "layers": {"type": "int", "minval": 1, "maxval": 8},
    "dropout": {"type": "double", "minval": 0.0, "maxval": 0.5},
    "opt": {"type": "categorical", "vals": ["sgd", "adam", "adamw"]},
    "epochs_hint": 3,
    "model": {"width": {"type": "categorical", "vals": [64, 128]}, "act": {"type": "const", "val": "relu"}},
}


# What the tests set unless they say otherwise, per searcher (expconf's model fills in the rest).
_TEST_SETTINGS: dict[str, dict[str, Any]] = {
    "single": {},
    "random": {"max_trials": 8, "max_concurrent_trials": 0},
    "grid": {"max_concurrent_trials": 0},
    "adaptive_asha": {"max_trials": 8, "max_concurrent_trials": 0, "mode": "standard", "divisor": 4.0},
}
_SEARCHER: TypeAdapter[SearcherConfig] = TypeAdapter(SearcherConfig)


def searcher_cfg(name: str, **overrides: Any) -> SearcherConfig:
    """A typed, fully defaulted searcher config, as the experiment-config module hands it over."""
    raw = {"name": name, "metric": "loss", "max_length": {"batches": 64}, **_TEST_SETTINGS[name], **overrides}
    return _SEARCHER.validate_python(raw)


def describe(ops: Sequence[Operation], index: dict[str, int]) -> list[tuple[Any, ...]]:
    """Operations with request ids replaced by creation order (ids are opaque uuids)."""
    out: list[tuple[Any, ...]] = []
    for op in ops:
        if isinstance(op, Create):
            index.setdefault(op.request_id, len(index))
            out.append(("create", index[op.request_id]))
        elif isinstance(op, ValidateAfter):
            out.append(("validate", index[op.request_id], op.length))
        elif isinstance(op, Close):
            out.append(("close", index[op.request_id]))
        elif isinstance(op, Shutdown):
            out.append(("shutdown", op.failure))
    return out


EXIT_REASONS = (ExitedReason.ERRORED, ExitedReason.USER_CANCELED, ExitedReason.INVALID_HP)


def step(sim: SearchSimulation, choice: int, metric: float, allow_rare: bool = True) -> bool:
    """Deliver one event picked by ``choice`` among those an experiment could send now.

    Common events: trial created, trial closed (after Close), validation at the requested length.
    Rare ones (about 1 in 6): early exits of every kind, a trial stopping on its own, a validation
    before the requested length. Returns False when no event is possible.
    """
    # Hypothesis favours small and repeated integers; spreading the choice (salted with the event
    # count) through an RNG keeps every kind of event and exit reason reachable from such draws.
    rng = random.Random(choice * 1_000_003 + sim.events)
    common: list[tuple[str, str]] = [("created", rid) for rid in sim.unreported_creates()]
    common += [("closed", rid) for rid in sim.closing()]
    common += [("validate", rid) for rid in sim.running()]
    rare: list[tuple[str, str]] = []
    if allow_rare:
        for rid in sim.alive():
            trial = sim.trials[rid]
            if trial.close_requested:
                continue
            rare += [("exit", rid), ("closed", rid)]
            if trial.running and trial.target is not None and trial.target - trial.trained > 1:
                rare.append(("intermediate", rid))
    if rare and (rng.random() < 1 / 6 or not common):
        kind, rid = rng.choice(rare)
    elif common:
        kind, rid = common[0] if choice == 0 else rng.choice(common)
    else:
        return False
    if kind == "created":
        sim.report_created(rid)
    elif kind == "closed":
        sim.report_closed(rid)
    elif kind == "validate":
        sim.report_validation(rid, metric)
    elif kind == "exit":
        sim.report_exit(rid, rng.choice(EXIT_REASONS))
    else:
        trial = sim.trials[rid]
        assert trial.target is not None
        sim.report_validation(rid, metric, length=trial.trained + (trial.target - trial.trained) // 2)
    return True
