from __future__ import annotations

import json
import math
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from control_plane.core.expconf import SearcherConfig
from control_plane.core.searcher import (
    AdaptiveAshaSearch,
    BracketPlan,
    Close,
    Create,
    ExitedReason,
    Shutdown,
    ValidateAfter,
    adaptive_asha_plan,
    asha_rungs_fit,
    new_search_method,
)
from control_plane.core.searcher.simulate import SearchSimulation
from tests.control_plane.core.searcher.helpers import HPARAMS, describe, searcher_cfg, step

WORST = sys.float_info.max

# ---- the bracket plan -------------------------------------------------------------------------


def test_plan_matches_determineds_adaptive_asha_test_case() -> None:
    cfg = searcher_cfg(
        "adaptive_asha", max_length={"batches": 9}, max_trials=5, mode="standard", max_rungs=2, divisor=3,
        max_concurrent_trials=5,
    )
    assert adaptive_asha_plan(cfg) == [
        BracketPlan(num_rungs=2, rung_lengths=(3, 9), max_trials=3, max_concurrent_trials=3),
        BracketPlan(num_rungs=1, rung_lengths=(9,), max_trials=2, max_concurrent_trials=2),
    ]


def test_rungs_are_lowered_when_max_length_or_max_trials_are_short() -> None:
    cfg = searcher_cfg("adaptive_asha", max_length={"batches": 100}, max_trials=256, mode="aggressive")
    assert adaptive_asha_plan(cfg) == [BracketPlan(4, (1, 6, 25, 100), 256, 256)]
    cfg = searcher_cfg("adaptive_asha", max_length={"batches": 1000}, max_trials=16, mode="aggressive")
    assert [p.rung_lengths for p in adaptive_asha_plan(cfg)] == [(62, 250, 1000)]


def test_exact_powers_are_not_lost_to_float_logs() -> None:
    cfg = searcher_cfg("adaptive_asha", max_length={"batches": 64}, max_trials=64, mode="aggressive", max_rungs=9)
    assert adaptive_asha_plan(cfg)[0].rung_lengths == (1, 4, 16, 64)


def test_modes_choose_brackets_like_determined() -> None:
    base = dict(max_length={"epochs": 1000}, max_trials=1000, divisor=4, max_rungs=5)
    rungs = {
        mode: [p.num_rungs for p in adaptive_asha_plan(searcher_cfg("adaptive_asha", mode=mode, **base))]
        for mode in ("aggressive", "standard", "conservative")
    }
    assert rungs == {"aggressive": [5], "standard": [5, 4, 3], "conservative": [5, 4, 3, 2, 1]}
    conservative = adaptive_asha_plan(searcher_cfg("adaptive_asha", mode="conservative", **base))
    assert [p.max_trials for p in conservative] == [680, 211, 70, 26, 13]
    assert [p.max_concurrent_trials for p in conservative] == [13] * 5


def test_concurrency_below_the_bracket_count_drops_the_gentlest_brackets() -> None:
    cfg = searcher_cfg("adaptive_asha", max_length={"epochs": 1000}, max_trials=1000, mode="conservative",
                       max_concurrent_trials=2)
    plans = adaptive_asha_plan(cfg)
    assert [p.num_rungs for p in plans] == [5, 4]
    assert [p.max_concurrent_trials for p in plans] == [1, 1]
    assert sum(p.max_trials for p in plans) == 1000


@settings(max_examples=300, deadline=None)
@given(
    length=st.integers(1, 5000),
    max_trials=st.integers(1, 3000),
    divisor=st.sampled_from([1.2, 1.5, 2.0, 3.0, 4.0, 5.5, 10.0]),
    max_rungs=st.integers(1, 8),
    mct=st.integers(0, 40),
    mode=st.sampled_from(["aggressive", "standard", "conservative"]),
)
def test_plan_invariants(length: int, max_trials: int, divisor: float, max_rungs: int, mct: int, mode: str) -> None:
    cfg = searcher_cfg("adaptive_asha", max_length={"batches": length}, max_trials=max_trials, divisor=divisor,
                       max_rungs=max_rungs, max_concurrent_trials=mct, mode=mode)
    assert asha_rungs_fit(cfg) is None
    plans = adaptive_asha_plan(cfg)
    assert sum(p.max_trials for p in plans) == max_trials
    assert all(p.max_trials >= 1 for p in plans)
    if mct > 0:
        assert sum(p.max_concurrent_trials for p in plans) <= mct
    assert [p.num_rungs for p in plans] == sorted({p.num_rungs for p in plans}, reverse=True)
    for p in plans:
        lengths = p.rung_lengths
        assert len(lengths) == p.num_rungs <= max_rungs
        assert lengths[-1] == length and lengths[0] >= 1
        assert all(a < b for a, b in zip(lengths, lengths[1:], strict=False))
        # Determined's lengths, length / divisor^(n-1-i) truncated, whenever those are distinct
        determined = [max(int(length / divisor ** (p.num_rungs - 1 - i)), 1) for i in range(p.num_rungs)]
        if all(a < b for a, b in zip(determined, determined[1:], strict=False)):
            assert list(lengths) == determined
        else:
            assert divisor < 2  # only a divisor close to 1 truncates two rungs to one length


def test_asha_rungs_fit_reports_configs_without_room_for_a_rung() -> None:
    assert asha_rungs_fit(searcher_cfg("adaptive_asha", max_length={"batches": 100}, max_rungs=5)) is None
    assert asha_rungs_fit(searcher_cfg("random", max_length=None)) is None
    msg = asha_rungs_fit(searcher_cfg("adaptive_asha", max_length=None))
    assert msg is not None and msg.startswith("searcher.max_length")
    # A sub-unit length, a divisor <= 1 or an unknown mode never reaches the plan: the model refuses it.
    for bad in ({"max_length": {"batches": 0}}, {"divisor": 1.0}, {"mode": "reckless"}):
        with pytest.raises(ValidationError):
            searcher_cfg("adaptive_asha", **bad)


def test_max_time_with_its_metric_is_the_length() -> None:
    cfg = searcher_cfg("adaptive_asha", max_length=None, max_time=30, time_metric="seconds", max_trials=1,
                       mode="aggressive", max_rungs=1)
    s = new_search_method(cfg, HPARAMS, 0)
    assert s.initial_operations()[1] == ValidateAfter(s.snapshot()["requested"][0], 30)


# ---- behaviour on hand-checked cases ----------------------------------------------------------


def run_constant_trials(cfg: SearcherConfig, values: list[float], exit_at_first: set[int] = frozenset()) -> list[tuple]:
    """Each trial reports values[creation index] at every rung; trials in exit_at_first error out
    instead of reporting. Returns (value, trained, lengths validated) per trial."""
    sim = SearchSimulation(new_search_method(cfg, HPARAMS, 0))
    sim.start()
    while sim.shutdown is None:
        if sim.unreported_creates():
            sim.report_created(sim.unreported_creates()[0])
        elif sim.closing():
            sim.report_closed(sim.closing()[0])
        else:
            trial = sim.trials[sim.running()[0]]
            if trial.index in exit_at_first:
                sim.report_exit(trial.request_id, ExitedReason.ERRORED)
            else:
                sim.report_validation(trial.request_id, values[trial.index])
    return [(values[t.index], t.trained, [n for n, _ in t.validations]) for t in sim.result().trials]


@pytest.mark.parametrize("smaller_is_better", [True, False])
@pytest.mark.parametrize("early_exit", [False, True])
def test_determineds_adaptive_asha_simulation_cases(smaller_is_better: bool, early_exit: bool) -> None:
    # master/pkg/searcher/adaptive_asha_test.go: 900 batches in 100-batch units.
    cfg = searcher_cfg(
        "adaptive_asha", max_length={"batches": 9}, max_trials=5, mode="standard", max_rungs=2, divisor=3,
        max_concurrent_trials=5, smaller_is_better=smaller_is_better,
    )
    values = [0.1, 0.2, 0.3, 0.4, 0.5] if smaller_is_better else [0.5, 0.4, 0.3, 0.2, 0.1]
    trials = run_constant_trials(cfg, values, exit_at_first={1} if early_exit else set())
    trained = [t[1] for t in trials]
    assert trained == [9, 0 if early_exit else 3, 3, 9, 9]
    assert trials[0][2] == [3, 9]


def test_a_paused_trial_is_promoted_when_the_rung_fills() -> None:
    cfg = searcher_cfg("adaptive_asha", max_length={"batches": 4}, max_trials=4, mode="aggressive", divisor=2,
                       max_rungs=3, max_concurrent_trials=1)
    s = new_search_method(cfg, HPARAMS, 0)
    t0 = s.initial_operations()[0].request_id
    ops = s.validation_completed(t0, 0.1, 1)  # first at rung 0: nothing to promote yet
    assert [type(op) for op in ops] == [Create, ValidateAfter]
    t1 = ops[0].request_id
    # second result: the rung now promotes its best, t0, which was waiting
    assert s.validation_completed(t1, 0.5, 1) == [ValidateAfter(t0, 2, rung=1)]


def test_stop_once_stops_trials_outside_the_top_fraction_at_once() -> None:
    cfg = searcher_cfg("adaptive_asha", max_length={"batches": 4}, max_trials=4, mode="aggressive", divisor=2,
                       max_rungs=3, max_concurrent_trials=1, stop_once=True)
    trials = run_constant_trials(cfg, [0.5, 0.4, 0.6, 0.3])
    assert [t[1] for t in trials] == [4, 4, 1, 4]
    assert trials[2][2] == [1]


def test_promotion_asha_on_the_same_sequence_pauses_instead() -> None:
    cfg = searcher_cfg("adaptive_asha", max_length={"batches": 4}, max_trials=4, mode="aggressive", divisor=2,
                       max_rungs=3, max_concurrent_trials=1)
    trials = run_constant_trials(cfg, [0.5, 0.4, 0.6, 0.3])
    assert [t[1] for t in trials] == [1, 2, 1, 4]


def test_nan_metrics_rank_last() -> None:
    cfg = searcher_cfg("adaptive_asha", max_length={"batches": 4}, max_trials=2, mode="aggressive", divisor=2,
                       max_rungs=2, max_concurrent_trials=2)
    for smaller in (True, False):
        trials = run_constant_trials(cfg.model_copy(update={"smaller_is_better": smaller}), [math.nan, 1e9 if smaller else -1e9])
        assert [t[1] for t in trials] == [2, 4]


@pytest.mark.parametrize("stop_once", [False, True])
def test_invalid_hp_trials_are_replaced_outside_the_budget(stop_once: bool) -> None:
    cfg = searcher_cfg("adaptive_asha", max_length={"batches": 16}, max_trials=4, mode="aggressive", divisor=2,
                       max_concurrent_trials=2, stop_once=stop_once)
    sim = SearchSimulation(new_search_method(cfg, HPARAMS, 0))
    first = sim.start()[0].request_id
    ops = sim.report_exit(first, ExitedReason.INVALID_HP)
    assert [type(op) for op in ops] == [Create, ValidateAfter] and ops[1].length == 4  # rungs 4, 8, 16
    finished = sim.run(lambda t, n: float(t.index))
    assert len(finished.trials) == 5
    assert finished.shutdown == Shutdown(failure=False)
    assert max(t.trained for t in finished.trials) == 16


def test_a_closed_out_trial_made_due_by_an_invalid_hp_removal_gets_no_work() -> None:
    cfg = searcher_cfg("adaptive_asha", max_length={"batches": 4}, max_trials=4, mode="aggressive", divisor=2,
                       max_rungs=3, max_concurrent_trials=1)
    s = new_search_method(cfg, HPARAMS, 0)
    t0 = s.initial_operations()[0].request_id
    t1 = s.validation_completed(t0, 0.1, 1)[0].request_id
    assert s.validation_completed(t1, 0.2, 1) == [ValidateAfter(t0, 2, rung=1)]
    t2 = s.validation_completed(t0, 0.1, 2)[0].request_id
    t3 = s.validation_completed(t2, 0.3, 1)[0].request_id
    # rung 0 is full: t1 is promoted, t2 and t3 can never be, so they are closed out
    assert s.validation_completed(t3, 0.4, 1) == [ValidateAfter(t1, 2, rung=1), Close(t2), Close(t3)]
    ops = s.trial_exited_early(t1, ExitedReason.INVALID_HP)
    t4 = ops[0].request_id
    assert ops == [Create(t4, ops[0].hparams, ops[0].trial_seed), ValidateAfter(t4, 1)]
    # t1's removal makes the closed t2 due at rung 0: it ranks last at rung 1 instead of getting
    # work, which in turn promotes t0 to the top
    assert s.validation_completed(t4, 0.5, 1) == [ValidateAfter(t0, 4, rung=2), Close(t4)]


def test_a_closed_out_trial_ranked_into_the_top_rung_is_not_closed_twice() -> None:
    cfg = searcher_cfg("adaptive_asha", max_length={"batches": 2}, max_trials=4, mode="aggressive", divisor=2,
                       max_rungs=2, max_concurrent_trials=2)
    s = new_search_method(cfg, HPARAMS, 0)
    t0, t1 = (op.request_id for op in s.initial_operations() if isinstance(op, Create))
    t2 = s.validation_completed(t0, 0.1, 1)[0].request_id
    assert s.validation_completed(t1, 0.2, 1) == [ValidateAfter(t0, 2, rung=1)]
    t3 = s.validation_completed(t2, 0.3, 1)[0].request_id
    assert s.validation_completed(t3, 0.4, 1) == [ValidateAfter(t1, 2, rung=1), Close(t2), Close(t3)]
    t4 = s.trial_exited_early(t1, ExitedReason.INVALID_HP)[0].request_id
    # t2 becomes due again and is ranked (worst) in the top rung; it was closed already
    assert s.validation_completed(t4, 0.5, 1) == [Close(t4)]
    assert s.validation_completed(t0, 0.1, 2) == [Close(t0)]


def test_a_running_trial_that_stops_on_its_own_counts_as_canceled() -> None:
    cfg = searcher_cfg("adaptive_asha", max_length={"batches": 16}, max_trials=3, mode="aggressive", divisor=2,
                       max_concurrent_trials=1)
    s = new_search_method(cfg, HPARAMS, 0)
    t0 = s.initial_operations()[0].request_id
    ops = s.trial_closed(t0)  # it never reported: without this the bracket would wait for it
    assert [type(op) for op in ops] == [Create, ValidateAfter]
    assert s.snapshot()["exits"] == [[t0, "user_canceled"]]


def test_a_paused_trial_closed_from_outside_is_never_resumed() -> None:
    cfg = searcher_cfg("adaptive_asha", max_length={"batches": 4}, max_trials=4, mode="aggressive", divisor=2,
                       max_rungs=3, max_concurrent_trials=1)
    s = new_search_method(cfg, HPARAMS, 0)
    t0 = s.initial_operations()[0].request_id
    t1 = s.validation_completed(t0, 0.1, 1)[0].request_id
    assert s.trial_closed(t0) == []  # paused t0 killed by a user
    ops = s.validation_completed(t1, 0.5, 1)
    # t0 would have been promoted; it ranks as a worst result at rung 1 instead, and work goes on
    assert all(op.request_id != t0 for op in ops if not isinstance(op, Shutdown))
    assert [type(op) for op in ops] == [Create, ValidateAfter]


def test_snapshot_is_strict_json_even_with_exited_trials() -> None:
    cfg = searcher_cfg("adaptive_asha", max_length={"batches": 16}, max_trials=3, divisor=2, max_concurrent_trials=1)
    s = new_search_method(cfg, HPARAMS, 0)
    t0 = s.initial_operations()[0].request_id
    s.trial_exited_early(t0, ExitedReason.ERRORED)
    text = json.dumps(s.snapshot(), allow_nan=False)
    assert str(WORST) in text or repr(WORST) in text


@pytest.mark.parametrize("stop_once", [False, True])
@pytest.mark.parametrize("mode", ["aggressive", "standard", "conservative"])
def test_full_runs_use_every_trial_and_reach_the_top(stop_once: bool, mode: str) -> None:
    cfg = searcher_cfg("adaptive_asha", max_length={"batches": 256}, max_trials=60, mode=mode,
                       max_concurrent_trials=6, stop_once=stop_once)
    s = new_search_method(cfg, HPARAMS, 11)
    result = SearchSimulation(s).run(lambda t, n: t.hparams["dropout"] + 1.0 / n)
    assert len(result.trials) == 60
    assert result.shutdown == Shutdown(failure=False)
    assert result.max_running <= 6
    assert any(t.trained == 256 for t in result.trials)
    # early stopping saves budget against training all 60 to the end
    assert result.units_trained < 60 * 256 * 0.75
    assert s.progress() == 1.0


# ---- brute-force references -------------------------------------------------------------------


class ReferencePromotionAsha:
    """ASHA (Li et al.) computed the slow, obvious way: after every result, the best
    floor(n / divisor) results of a rung (ties: earlier first) must all have been promoted."""

    def __init__(self, lengths: tuple[int, ...], max_trials: int, divisor: float, concurrency: int) -> None:
        self.lengths, self.top = lengths, len(lengths) - 1
        self.max_trials, self.divisor, self.concurrency = max_trials, divisor, concurrency
        self.results: list[list[tuple[float, int, int]]] = [[] for _ in lengths]
        self.promoted: list[set[int]] = [set() for _ in lengths]
        self.rung: dict[int, int] = {}
        self.running: set[int] = set()
        self.exited: set[int] = set()
        self.closed: set[int] = set()
        self.created = 0
        self.seq = 0

    def _create(self) -> list[tuple[Any, ...]]:
        t = self.created
        self.created += 1
        self.rung[t] = 0
        self.running.add(t)
        return [("create", t), ("validate", t, self.lengths[0])]

    def start(self) -> list[tuple[Any, ...]]:
        return [op for _ in range(self.concurrency) for op in self._create()]

    def report(self, t: int, metric: float) -> list[tuple[Any, ...]]:
        self.running.discard(t)
        return self._result(t, metric)

    def exit(self, t: int) -> list[tuple[Any, ...]]:
        was_running = t in self.running
        self.running.discard(t)
        self.exited.add(t)
        self.closed.add(t)
        return self._result(t, WORST) if was_running else []

    def _result(self, t: int, metric: float) -> list[tuple[Any, ...]]:
        r = self.rung[t]
        ops: list[tuple[Any, ...]] = []
        new_work = False
        if r == self.top:
            if t not in self.exited:
                ops.append(("close", t))
                self.closed.add(t)
        else:
            self.seq += 1
            self.results[r].append((metric, self.seq, t))
            best = [x for _, _, x in sorted(self.results[r])[: int(len(self.results[r]) / self.divisor)]]
            due = [x for x in best if x not in self.promoted[r]]
            assert len(due) <= 1
            for x in due:
                self.promoted[r].add(x)
                self.rung[x] = r + 1
                if x in self.exited:
                    return ops + self._result(x, WORST)
                self.running.add(x)
                ops.append(("validate", x, self.lengths[r + 1]))
                new_work = True
        if not new_work and self.created < self.max_trials:
            ops += self._create()
        if len(self.results[0]) == self.max_trials:
            for r in range(self.top):
                if any(self.rung[x] == r for x in self.running):
                    break
                for _, _, x in sorted(self.results[r]):
                    if x not in self.promoted[r] and x not in self.closed:
                        ops.append(("close", x))
                        self.closed.add(x)
        return ops


class ReferenceStoppingAsha(ReferencePromotionAsha):
    """stop_once: continue iff the new result ranks (ahead of equal results) within the top
    max(1, floor(n / divisor)) of its rung, n counting itself."""

    def _result(self, t: int, metric: float) -> list[tuple[Any, ...]]:
        r = self.rung[t]
        ops: list[tuple[Any, ...]] = []
        new_work = False
        if r == self.top:
            if t not in self.exited:
                ops.append(("close", t))
                self.closed.add(t)
        else:
            rank = sum(1 for m, _, _ in self.results[r] if m < metric)
            self.seq += 1
            self.results[r].append((metric, self.seq, t))
            keep_going = rank < max(int(len(self.results[r]) / self.divisor), 1)
            if t not in self.exited:
                if keep_going:
                    self.rung[t] = r + 1
                    self.running.add(t)
                    ops.append(("validate", t, self.lengths[r + 1]))
                    new_work = True
                else:
                    ops.append(("close", t))
                    self.closed.add(t)
        if not new_work and self.created < self.max_trials:
            ops += self._create()
        return ops


@settings(max_examples=200, deadline=None)
@given(
    stop_once=st.booleans(),
    smaller_is_better=st.booleans(),
    max_trials=st.integers(1, 24),
    divisor=st.sampled_from([2.0, 2.5, 3.0, 4.0]),
    max_rungs=st.integers(1, 4),
    length=st.sampled_from([16, 27, 64, 100]),
    mct=st.integers(1, 6),
    metrics=st.lists(st.integers(0, 6), min_size=1, max_size=50),
    choices=st.lists(st.integers(0, 1000), min_size=1, max_size=50),
    with_exits=st.booleans(),
)
def test_asha_matches_brute_force_reference(
    stop_once: bool, smaller_is_better: bool, max_trials: int, divisor: float, max_rungs: int, length: int,
    mct: int, metrics: list[int], choices: list[int], with_exits: bool,
) -> None:
    check_against_reference(stop_once, smaller_is_better, max_trials, divisor, max_rungs, length, mct, metrics,
                            choices, with_exits)


@settings(max_examples=100, deadline=None)
@given(
    stop_once=st.booleans(),
    max_trials=st.integers(16, 40),
    mct=st.integers(1, 8),
    metrics=st.lists(st.integers(0, 20), min_size=5, max_size=60),
    choices=st.lists(st.integers(0, 1000), min_size=1, max_size=60),
    with_exits=st.booleans(),
)
def test_deep_brackets_match_brute_force_reference(
    stop_once: bool, max_trials: int, mct: int, metrics: list[int], choices: list[int], with_exits: bool
) -> None:
    # Five rungs of halving: promotions and close-outs several rungs up.
    check_against_reference(stop_once, True, max_trials, 2.0, 5, 64, mct, metrics, choices, with_exits)


def check_against_reference(
    stop_once: bool, smaller_is_better: bool, max_trials: int, divisor: float, max_rungs: int, length: int,
    mct: int, metrics: list[int], choices: list[int], with_exits: bool,
) -> None:
    cfg = searcher_cfg("adaptive_asha", mode="aggressive", max_length={"batches": length}, max_trials=max_trials,
                       divisor=divisor, max_rungs=max_rungs, max_concurrent_trials=mct, stop_once=stop_once,
                       smaller_is_better=smaller_is_better)
    (plan,) = adaptive_asha_plan(cfg)
    ref_cls = ReferenceStoppingAsha if stop_once else ReferencePromotionAsha
    ref = ref_cls(plan.rung_lengths, max_trials, divisor, min(mct, max_trials))
    sim = SearchSimulation(new_search_method(cfg, HPARAMS, 0))
    index: dict[str, int] = {}
    assert describe(sim.start(), index) == ref.start()

    for i in range(10_000):
        for rid in sim.unreported_creates():
            assert sim.report_created(rid) == []
        for rid in sim.closing():
            sim.report_closed(rid)
        if sim.shutdown is not None:
            break
        choice = choices[i % len(choices)]
        if with_exits and choice % 7 == 0:
            candidates = [rid for rid in sim.alive() if not sim.trials[rid].close_requested]
            rid = candidates[choice % len(candidates)]
            real = describe(sim.report_exit(rid, ExitedReason.ERRORED), index)
            expected = ref.exit(index[rid])
        else:
            running = sim.running()
            assert running, "the search stalled"
            rid = running[choice % len(running)]
            metric = float(metrics[i % len(metrics)])
            real = describe(sim.report_validation(rid, metric), index)
            expected = ref.report(index[rid], metric if smaller_is_better else -metric)
        assert [op for op in real if op[0] != "shutdown"] == expected
    assert sim.shutdown is not None
    assert ref.created == max_trials == len(sim.trials)


def force_full_close_out_scans(method: Any) -> None:
    """Make every bracket rescan all rungs at close-out, as Determined does."""
    for bracket in method.brackets:

        class FullRescan(type(bracket)):  # type: ignore[misc]
            def _close_out_rungs(self) -> list[Any]:
                self.final_rungs = 0
                return super()._close_out_rungs()

        bracket.__class__ = FullRescan


@settings(max_examples=100, deadline=None)
@given(
    max_trials=st.integers(4, 40),
    mct=st.integers(1, 8),
    mode=st.sampled_from(["aggressive", "conservative"]),
    metrics=st.lists(st.integers(0, 20).map(float), min_size=5, max_size=60),
    choices=st.lists(st.integers(0, 10**6), min_size=20, max_size=150),
)
def test_close_out_bookkeeping_matches_a_full_rescan(
    max_trials: int, mct: int, mode: str, metrics: list[float], choices: list[int]
) -> None:
    cfg = searcher_cfg("adaptive_asha", mode=mode, max_length={"batches": 64}, max_trials=max_trials, divisor=2.0,
                       max_rungs=5, max_concurrent_trials=mct)
    fast = SearchSimulation(new_search_method(cfg, HPARAMS, 3))
    slow_method = new_search_method(cfg, HPARAMS, 3)
    force_full_close_out_scans(slow_method)
    slow = SearchSimulation(slow_method)
    assert fast.start() == slow.start()
    for i in range(5000):
        # Same state, same choice: both get the same event (exits of every kind included, for
        # long enough to reach the late stage where rungs are closed out).
        choice, allow_rare = choices[i % len(choices)], i < 400
        moved = step(fast, choice, metrics[i % len(metrics)], allow_rare)
        assert moved == step(slow, choice, metrics[i % len(metrics)], allow_rare)
        assert fast.log == slow.log
        if not moved or fast.shutdown is not None:
            break
    assert fast.shutdown is not None


# ---- the rung a ValidateAfter is for ------------------------------------------------------------


def test_validate_after_carries_the_rung_of_the_searchers_plan() -> None:
    # max_length 10 with the default divisor and max_rungs: two rungs (2 and 10 batches), so the
    # trials' rungs are 0 then 1 (the shell used to derive 3 and 4 from the length).
    cfg = searcher_cfg("adaptive_asha", max_length={"batches": 10}, max_trials=4, mode="aggressive")
    (plan,) = adaptive_asha_plan(cfg)
    assert plan.rung_lengths == (2, 10)
    s = new_search_method(cfg, HPARAMS, 0)
    first = [op for op in s.initial_operations() if isinstance(op, ValidateAfter)]
    assert [(op.length, op.rung) for op in first] == [(2, 0)] * 4
    ops = []
    for metric, op in zip((0.1, 0.2, 0.3, 0.4), first, strict=True):
        ops += s.validation_completed(op.request_id, metric, 2)
    assert ValidateAfter(first[0].request_id, 10, rung=1) in ops


@settings(max_examples=60, deadline=None)
@given(
    length=st.integers(1, 300),
    divisor=st.sampled_from([2.0, 3.0, 4.0, 1.5]),
    max_rungs=st.integers(1, 6),
    mode=st.sampled_from(["aggressive", "standard", "conservative"]),
    stop_once=st.booleans(),
)
def test_every_validate_after_length_is_the_length_of_its_rung(
    length: int, divisor: float, max_rungs: int, mode: str, stop_once: bool
) -> None:
    cfg = searcher_cfg("adaptive_asha", max_length={"batches": length}, max_trials=12, divisor=divisor,
                       max_rungs=max_rungs, mode=mode, stop_once=stop_once)
    plans = adaptive_asha_plan(cfg)
    method = new_search_method(cfg, HPARAMS, 1)
    assert isinstance(method, AdaptiveAshaSearch)
    sim = SearchSimulation(method)
    sim.run(lambda t, n: float((t.index * 7) % 5))
    validates = [op for op in sim.log if isinstance(op, ValidateAfter)]
    assert validates
    for op in validates:
        plan = plans[method._trial_bracket[op.request_id]]
        assert op.rung < plan.num_rungs and plan.rung_lengths[op.rung] == op.length, op
