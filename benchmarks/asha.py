"""ASHA benchmark: Shipyard's adaptive_asha against Optuna's SuccessiveHalvingPruner and plain random search.

Every method searches the same space with the same budget (max_trials configurations, max_length
units each at most) on a seeded synthetic learning-curve problem:

    loss(t) = final(hp) + (start - final(hp)) * exp(-t / tau(hp)) + noise

on two problems over the same space: "crossing", where low learning rates converge slowly to good
losses and high ones quickly to worse ones, so early results mislead early stopping; and
"parallel", where every curve has the same time constant, so early ranking is final ranking.
Reported per method, mean over seeds: training units spent, best loss observed at full length,
the noiseless loss of that trial, and trials trained to full length.

Shipyard's searchers are driven directly (no master): trials train on ``--concurrency`` simulated
workers in simulated time, and events reach the searcher in the order trials finish. Optuna runs
its trials one after another (its pruner is stop-based, like ``stop_once``), with a RandomSampler so
that only the early-stopping rule differs from random search.

The second table measures the searcher itself: time per event with 10,000 trials.

Run: .venv/bin/python benchmarks/asha.py [--seeds 10] [--trials 100] [--timing-trials 10000]
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from control_plane.core.expconf import (  # noqa: E402
    AdaptiveASHASearcher,
    GridSearcher,
    RandomSearcher,
    SearcherConfig,
    SingleSearcher,
)
from control_plane.core.searcher import (  # noqa: E402
    Close,
    Create,
    ExitedReason,
    Operation,
    SearchMethod,
    Shutdown,
    ValidateAfter,
    adaptive_asha_plan,
    new_search_method,
)
from control_plane.core.searcher.simulate import SearchSimulation  # noqa: E402

try:
    import optuna
except ImportError:  # the bench extra is optional
    optuna = None

HPARAMS: dict[str, Any] = {
    "lr": {"type": "log", "minval": -4, "maxval": -1, "base": 10},
    "width": {"type": "categorical", "vals": [32, 64, 128, 256]},
    "dropout": {"type": "double", "minval": 0.0, "maxval": 0.5},
    "optimizer": {"type": "categorical", "vals": ["sgd", "adam"]},
}
START_LOSS = 2.3
NOISE = 0.02
WIDTH_FINAL = {32: 0.12, 64: 0.05, 128: 0.0, 256: 0.02}
WIDTH_SLOWDOWN = {32: 0.6, 64: 0.8, 128: 1.0, 256: 1.3}


# ---- the synthetic problem --------------------------------------------------------------------


def final_loss(hp: dict[str, Any]) -> float:
    lr_term = 0.4 * ((math.log10(hp["lr"]) + 2.5) / 1.5) ** 2  # best at lr = 10^-2.5
    return (
        0.05 + lr_term + 0.6 * (hp["dropout"] - 0.15) ** 2
        + (0.08 if hp["optimizer"] == "sgd" else 0.0) + WIDTH_FINAL[hp["width"]]
    )


@dataclass(frozen=True)
class Problem:
    """``crossing``: low learning rates (and sgd, wide nets) learn slowly but end best, so early
    results mislead early stopping. Otherwise every curve has the same time constant and the
    ranking at any length is the final ranking (up to noise)."""

    name: str
    crossing: bool

    def time_constant(self, hp: dict[str, Any]) -> float:
        if not self.crossing:
            return 40.0
        tau = 40.0 * math.sqrt(1e-2 / hp["lr"]) * WIDTH_SLOWDOWN[hp["width"]]
        return tau * (1.5 if hp["optimizer"] == "sgd" else 1.0)

    def true_loss(self, hp: dict[str, Any], units: int) -> float:
        final = final_loss(hp)
        return final + (START_LOSS - final) * math.exp(-units / self.time_constant(hp))

    def observed_loss(self, hp: dict[str, Any], units: int, noise_key: str) -> float:
        return self.true_loss(hp, units) + random.Random(f"{noise_key}/{units}").gauss(0.0, NOISE)


PROBLEMS = (
    Problem("crossing curves: slow learners end best", crossing=True),
    Problem("parallel curves: early ranking is the final ranking", crossing=False),
)


def unit_cost(hp: dict[str, Any]) -> float:
    """Simulated seconds per unit: wider networks train slower."""
    return WIDTH_SLOWDOWN[hp["width"]]


@dataclass
class RunResult:
    units: int
    best_final: float  # lowest loss observed at full length
    chosen_true: float  # noiseless loss at full length of that trial: what the user really gets
    full_length_trials: int


def summarize(
    problem: Problem, units: int, finals: list[tuple[float, dict[str, Any]]], max_length: int
) -> RunResult:
    best, hp = min(finals, key=lambda f: f[0])
    return RunResult(units, best, problem.true_loss(hp, max_length), len(finals))


# ---- Shipyard, driven directly ----------------------------------------------------------------


@dataclass
class _Trial:
    hp: dict[str, Any]
    key: str
    trained: int = 0
    losses: dict[int, float] = field(default_factory=dict)


def run_shipyard(problem: Problem, searcher_cfg: SearcherConfig, seed: int, max_length: int) -> RunResult:
    method = new_search_method(searcher_cfg, HPARAMS, seed)
    trials: dict[str, _Trial] = {}
    finishing: list[tuple[float, int, str, int]] = []  # (sim time, tiebreak, request id, length)
    inbox: list[tuple[str, str]] = []  # events due now: ("created"|"closed", request id)
    clock = 0.0
    done = False
    counter = 0

    def apply(ops: list[Operation]) -> None:
        nonlocal done, counter
        for op in ops:
            if isinstance(op, Create):
                trials[op.request_id] = _Trial(op.hparams, f"shipyard/{seed}/{op.trial_seed}")
                inbox.append(("created", op.request_id))
            elif isinstance(op, ValidateAfter):
                trial = trials[op.request_id]
                counter += 1
                finish = clock + (op.length - trial.trained) * unit_cost(trial.hp)
                heapq.heappush(finishing, (finish, counter, op.request_id, op.length))
            elif isinstance(op, Close):
                inbox.append(("closed", op.request_id))
            elif isinstance(op, Shutdown):
                done = True

    apply(method.initial_operations())
    while not done:
        if inbox:
            kind, rid = inbox.pop(0)
            apply(method.trial_created(rid) if kind == "created" else method.trial_closed(rid))
            continue
        if not finishing:
            raise RuntimeError("search stalled")
        clock, _, rid, length = heapq.heappop(finishing)
        trial = trials[rid]
        trial.trained = length
        loss = problem.observed_loss(trial.hp, length, trial.key)
        trial.losses[length] = loss
        apply(method.validation_completed(rid, loss, length))

    finals = [(t.losses[max_length], t.hp) for t in trials.values() if max_length in t.losses]
    return summarize(problem, sum(t.trained for t in trials.values()), finals, max_length)


# ---- Optuna -----------------------------------------------------------------------------------


def run_optuna(problem: Problem, seed: int, max_trials: int, rungs: tuple[int, ...], divisor: int) -> RunResult:
    assert optuna is not None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    max_length = rungs[-1]
    pruner = optuna.pruners.SuccessiveHalvingPruner(
        min_resource=rungs[0], reduction_factor=divisor, min_early_stopping_rate=0
    )
    study = optuna.create_study(
        direction="minimize", sampler=optuna.samplers.RandomSampler(seed=seed), pruner=pruner
    )
    spent = 0
    finals: list[tuple[float, dict[str, Any]]] = []

    def objective(trial: Any) -> float:
        nonlocal spent
        hp = {
            "lr": trial.suggest_float("lr", 1e-4, 1e-1, log=True),
            "width": trial.suggest_categorical("width", [32, 64, 128, 256]),
            "dropout": trial.suggest_float("dropout", 0.0, 0.5),
            "optimizer": trial.suggest_categorical("optimizer", ["sgd", "adam"]),
        }
        key = f"optuna/{seed}/{trial.number}"
        for step in rungs[:-1]:
            trial.report(problem.observed_loss(hp, step, key), step)
            if trial.should_prune():
                spent += step
                raise optuna.TrialPruned()
        spent += max_length
        loss = problem.observed_loss(hp, max_length, key)
        finals.append((loss, hp))
        return loss

    study.optimize(objective, n_trials=max_trials)
    return summarize(problem, spent, finals, max_length)


# ---- searcher speed ---------------------------------------------------------------------------


class TimedMethod:
    """Times every call into a search method (and nothing of the driver around it).

    CPU time of this process, not wall time: the machine may be shared, and a searcher call does
    no I/O, so CPU time is what it costs.
    """

    def __init__(self, method: SearchMethod) -> None:
        self.method = method
        self.durations: list[float] = []

    def _timed(self, call: Callable[..., Any], *args: Any) -> Any:
        start = time.process_time()
        result = call(*args)
        self.durations.append(time.process_time() - start)
        return result

    def initial_operations(self) -> list[Operation]:
        return self._timed(self.method.initial_operations)

    def trial_created(self, request_id: str) -> list[Operation]:
        return self._timed(self.method.trial_created, request_id)

    def validation_completed(self, request_id: str, metric: float, length: int) -> list[Operation]:
        return self._timed(self.method.validation_completed, request_id, metric, length)

    def trial_closed(self, request_id: str) -> list[Operation]:
        return self._timed(self.method.trial_closed, request_id)

    def trial_exited_early(self, request_id: str, reason: ExitedReason) -> list[Operation]:
        return self._timed(self.method.trial_exited_early, request_id, reason)

    def progress(self) -> float:
        return self.method.progress()

    def snapshot(self) -> dict[str, Any]:
        return self.method.snapshot()


def time_searcher(searcher_cfg: SearcherConfig) -> dict[str, float]:
    timed = TimedMethod(new_search_method(searcher_cfg, HPARAMS, 0))
    sim = SearchSimulation(timed)
    result = sim.run(lambda t, n: PROBLEMS[0].observed_loss(t.hparams, n, f"timing/{t.trial_seed}"))
    assert result.shutdown is not None
    durations = sorted(timed.durations)
    start = time.process_time()
    snapshot_text = json.dumps(timed.snapshot())
    snapshot_s = time.process_time() - start
    return {
        "trials": len(result.trials),
        "events": len(durations),
        "mean_us": statistics.fmean(durations) * 1e6,
        "p99_us": durations[int(0.99 * (len(durations) - 1))] * 1e6,
        "max_ms": durations[-1] * 1e3,
        "snapshot_kb": len(snapshot_text) / 1024,
        "snapshot_ms": snapshot_s * 1e3,
    }


# ---- main -------------------------------------------------------------------------------------


_SEARCHERS = {"single": SingleSearcher, "random": RandomSearcher, "grid": GridSearcher,
              "adaptive_asha": AdaptiveASHASearcher}


def searcher_cfg(name: str, **overrides: Any) -> SearcherConfig:
    """The typed searcher config the master would hand over: the benchmark's settings, each kept
    only where that searcher has the field."""
    cfg: dict[str, Any] = {
        "name": name, "metric": "loss", "smaller_is_better": True, "max_length": {"batches": 512},
        "max_time": None, "time_metric": None, "max_trials": 100, "max_concurrent_trials": 8,
        "mode": "aggressive", "divisor": 4.0, "max_rungs": 5, "stop_once": False,
    }
    cfg.update(overrides)
    model = _SEARCHERS[name]
    return model.model_validate({k: v for k, v in cfg.items() if k in model.model_fields})


def compare(problem: Problem, args: argparse.Namespace, common: dict[str, Any], rungs: tuple[int, ...],
            with_optuna: bool) -> None:
    asha_units: dict[int, int] = {}

    def shipyard(name: str, seed: int, **overrides: Any) -> RunResult:
        return run_shipyard(problem, searcher_cfg(name, **dict(common, **overrides)), seed, args.max_length)

    def asha_aggressive(seed: int) -> RunResult:
        result = shipyard("adaptive_asha", seed)
        asha_units[seed] = result.units
        return result

    def random_at_asha_budget(seed: int) -> RunResult:
        # As many full-length trials as ASHA (aggressive) spent units on, for the same seed.
        return shipyard("random", seed, max_trials=max(1, round(asha_units[seed] / args.max_length)))

    methods: list[tuple[str, Callable[[int], RunResult]]] = [
        ("shipyard adaptive_asha aggressive", asha_aggressive),
        ("shipyard adaptive_asha aggressive stop_once", lambda s: shipyard("adaptive_asha", s, stop_once=True)),
        ("  the same on 1 worker (like optuna)",
         lambda s: shipyard("adaptive_asha", s, stop_once=True, max_concurrent_trials=1)),
        ("shipyard adaptive_asha standard", lambda s: shipyard("adaptive_asha", s, mode="standard")),
    ]
    if with_optuna:
        methods.append(("optuna SuccessiveHalvingPruner",
                        lambda s: run_optuna(problem, s, args.trials, rungs, args.divisor)))
    methods.append(("shipyard random, ASHA aggressive's units", random_at_asha_budget))
    methods.append(("shipyard random (no early stopping)", lambda s: shipyard("random", s)))

    print(f"Problem: {problem.name}")
    header = (f"{'method':<44}{'units':>8}{'vs random':>10}{'best final loss':>18}{'true loss':>18}"
              f"{'full-length':>13}{'wall s':>8}")
    print(header)
    print("-" * len(header))
    rows = []
    for name, run in methods:
        start = time.perf_counter()
        results = [run(seed) for seed in range(args.seeds)]
        wall = time.perf_counter() - start
        units = statistics.fmean(r.units for r in results)
        rows.append((name, units, results, statistics.fmean(r.full_length_trials for r in results), wall))
    random_units = rows[-1][1]

    def mean_sd(values: list[float]) -> str:
        spread = statistics.stdev(values) if len(values) > 1 else 0.0
        return f"{statistics.fmean(values):.4f} ± {spread:.4f}"

    for name, units, results, full, wall in rows:
        print(f"{name:<44}{units:>8,.0f}{units / random_units:>10.0%}"
              f"{mean_sd([r.best_final for r in results]):>18}{mean_sd([r.chosen_true for r in results]):>18}"
              f"{full:>13.1f}{wall:>8.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--trials", type=int, default=100, help="max_trials for every method")
    parser.add_argument("--max-length", type=int, default=512, help="units a trial trains at most")
    parser.add_argument("--divisor", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=8, help="simulated workers for Shipyard")
    parser.add_argument("--timing-trials", type=int, default=10_000)
    args = parser.parse_args()

    common = {"max_trials": args.trials, "max_length": {"batches": args.max_length}, "divisor": float(args.divisor),
              "max_concurrent_trials": args.concurrency}
    (plan,) = adaptive_asha_plan(searcher_cfg("adaptive_asha", **common))
    rungs = plan.rung_lengths
    geometric = tuple(rungs[0] * args.divisor**i for i in range(len(rungs)))

    with_optuna = False
    if optuna is None:
        optuna_note = "optuna is not installed (pip install optuna==5.0.0): its rows are skipped"
    elif geometric != rungs:
        optuna_note = f"rungs {rungs} are not min_resource*divisor^k, so Optuna's SHA cannot match them: skipped"
    else:
        with_optuna = True
        optuna_note = (f"optuna {optuna.__version__}: SuccessiveHalvingPruner(min_resource={rungs[0]}, "
                       f"reduction_factor={args.divisor}), RandomSampler, trials run one at a time")
    print(f"Synthetic learning curves: {args.trials} trials, max_length {args.max_length} units, "
          f"divisor {args.divisor}, rungs {rungs}, {args.seeds} seeds; Shipyard on {args.concurrency} "
          "simulated workers unless noted")
    print(f"  {optuna_note}")
    print("  best final loss: lowest loss observed at full length (noise sd 0.02, so the best of many")
    print("  observations dips below the truth); true loss: noiseless loss of that trial. Optimum ~0.05.")
    print("  Means ± sd over seeds.")
    for problem in PROBLEMS:
        print()
        compare(problem, args, common, rungs, with_optuna)

    print()
    n = args.timing_trials
    print(f"Searcher CPU time per event, {n:,} trials, 100 running at a time (FIFO event order); "
          "snapshot = JSON of the finished search")
    timing_header = (f"{'searcher':<42}{'events':>9}{'mean µs':>10}{'p99 µs':>10}{'max ms':>9}"
                     f"{'snapshot KB':>13}{'snapshot ms':>13}")
    print(timing_header)
    print("-" * len(timing_header))
    timing_common = {"max_trials": n, "max_concurrent_trials": 100}
    for label, cfg in [
        ("random", searcher_cfg("random", max_length={"batches": 100}, **timing_common)),
        ("adaptive_asha aggressive", searcher_cfg("adaptive_asha", max_length={"batches": 4096}, **timing_common)),
        ("adaptive_asha aggressive stop_once",
         searcher_cfg("adaptive_asha", max_length={"batches": 4096}, stop_once=True, **timing_common)),
        ("adaptive_asha standard", searcher_cfg("adaptive_asha", max_length={"batches": 4096}, mode="standard",
                                                **timing_common)),
    ]:
        t = time_searcher(cfg)
        print(f"{label:<42}{t['events']:>9,.0f}{t['mean_us']:>10.1f}{t['p99_us']:>10.1f}{t['max_ms']:>9.2f}"
              f"{t['snapshot_kb']:>13,.0f}{t['snapshot_ms']:>13.1f}")


if __name__ == "__main__":
    main()
