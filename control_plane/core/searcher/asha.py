"""Adaptive ASHA: asynchronous successive halving brackets run side by side.

Follows Determined's adaptive_asha.go (bracket plan), asha.go (promotion-based ASHA) and
asha_stopping.go (``stop_once``), after Li et al., "A System for Massively Parallel Hyperparameter
Tuning" (MLSys 2020).

Promotion-based bracket: a trial that validated at rung ``i`` waits there (paused) until it ranks
in the top ``1/divisor`` of everything rung ``i`` has seen; then it is promoted with a
``ValidateAfter`` to rung ``i+1``'s length. Each validation yields exactly one unit of new work: a
promotion, or else a new trial while fewer than ``max_trials`` were made, which keeps the number
of running trials at the bracket's concurrency. Once every trial reported at the bottom rung,
trials that can no longer be promoted are closed.

Stopping bracket (``stop_once``): a trial continues to the next rung only if it is in the top
``1/divisor`` of its rung *when it reports*; otherwise it is closed at once and never resumed.

Deliberate differences from Determined, all in edge cases:

- rung lengths are strictly increasing (two rungs never share a length, which a divisor close
  to 1 with a short max_length would cause); the top rung is always the full length;
- the number of rungs is computed with exact integer powers, not ``int(log(x)/log(d))``, which
  under-counts exact powers because of float rounding;
- with ``0 < max_concurrent_trials < number of brackets`` only the first
  ``max_concurrent_trials`` brackets run (Determined raises the limit to the bracket count);
  and bracket trial budgets never add up to more than ``max_trials``;
- a trial that exits while paused is only marked exited (Determined would rank it a second time
  in its rung), and a closed trial that an invalid_hp removal makes due for promotion is ranked
  worst at the next rung instead of being sent work.
"""

from __future__ import annotations

import bisect
import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from control_plane.core.searcher.base import BaseSearchMethod, searcher_length
from control_plane.core.searcher.operations import Close, Create, ExitedReason, Operation, ValidateAfter

if TYPE_CHECKING:  # annotations only: expconf imports this package (rung and grid arithmetic)
    from control_plane.core.expconf.models.searcher import AdaptiveASHASearcher, SearcherConfig

# A trial that exited early ranks as if it had reported the worst possible metric. Finite so that
# snapshots stay strict JSON (PostgreSQL's jsonb rejects Infinity).
WORST_METRIC = sys.float_info.max

MODES = ("aggressive", "standard", "conservative")

NewTrial = Callable[[], Create]
_metric_key = itemgetter(0)


@dataclass(frozen=True)
class BracketPlan:
    num_rungs: int
    rung_lengths: tuple[int, ...]
    max_trials: int
    max_concurrent_trials: int


def _floor_log(x: float, base: float) -> int:
    """Largest k with base**k <= x, for x >= 1 and base > 1, without float-log rounding."""
    # Start from the float estimate and correct it by exact powers: counting up from 0 would take
    # millions of steps for a divisor just above 1.
    k = max(int(math.log(x) / math.log(base)), 0) if x >= 1 else 0
    while k > 0 and base**k > x * (1 + 1e-12):
        k -= 1
    while base ** (k + 1) <= x * (1 + 1e-12):
        k += 1
    return k


def rungs_that_fit(length: float, divisor: float) -> int:
    """How many rungs of at least one unit each fit in ``length`` (the top rung is ``length``,
    each one below is ``divisor`` times shorter). The plan never uses more; config validation
    reports a ``max_rungs`` above it."""
    return _floor_log(length, divisor) + 1


def smallest_rung_length(length: float, num_rungs: int, divisor: float) -> float:
    """The bottom rung's length before rounding: ``length / divisor**(num_rungs-1)``."""
    return length / divisor ** (num_rungs - 1)


def rung_lengths(length: int, num_rungs: int, divisor: float) -> tuple[int, ...]:
    """Total units a trial has trained when it reports at each rung: length / divisor^(n-1-i)."""
    if not 1 <= num_rungs <= length:
        raise ValueError(f"cannot fit {num_rungs} rungs of distinct lengths in {length} units")
    # Rung i must leave room for i shorter rungs below it and n-1-i longer ones above it; within
    # that window take Determined's length, then bump rungs that truncation made equal (only
    # possible with a divisor close to 1). The bumps stay inside the windows.
    lengths = [
        min(max(int(smallest_rung_length(length, num_rungs - i, divisor)), i + 1), length - (num_rungs - 1 - i))
        for i in range(num_rungs)
    ]
    for i in range(1, num_rungs):
        lengths[i] = max(lengths[i], lengths[i - 1] + 1)
    return tuple(lengths)


def _mode_brackets(mode: str, max_rungs: int) -> list[int]:
    if mode == "aggressive":
        return [max_rungs]
    if mode == "standard":
        return list(range((max_rungs - 1) // 2 + 1, max_rungs + 1))
    if mode == "conservative":
        return list(range(1, max_rungs + 1))
    raise ValueError(f"searcher.mode: expected one of {', '.join(MODES)}, got {mode!r}")


def _bracket_max_trials(max_trials: int, divisor: float, brackets: list[int]) -> list[int]:
    # Roughly equal total budget per bracket: a bracket of n rungs spends about n * max_length to
    # evaluate divisor^(n-1) configurations.
    weights = [divisor ** (n - 1) / n for n in brackets]
    total = sum(weights)
    trials = [max(int(w / total * max_trials), 1) for w in weights]
    trials[0] += max(max_trials - sum(trials), 0)
    return trials


def _bracket_max_concurrent(max_concurrent: int, divisor: float, bracket_trials: list[int]) -> list[int]:
    n = len(bracket_trials)
    if max_concurrent == 0:
        # Enough to keep every bracket busy with roughly equal work.
        return [max(bracket_trials[-1], int(divisor))] * n
    per, remainder = divmod(max_concurrent, n)
    return [per + (1 if i < remainder else 0) for i in range(n)]


def adaptive_asha_plan(searcher_cfg: AdaptiveASHASearcher) -> list[BracketPlan]:
    """The brackets an adaptive_asha searcher runs, most aggressive early stopping first.

    The config is expconf's typed model, which holds the defaults and the bounds (divisor > 1;
    max_rungs, max_trials and the length at least 1). Raises ``ValueError`` with the field's path
    when it has no length (expconf's semantic checks refuse that, not the model).
    """
    length = searcher_length(searcher_cfg)
    if length is None:
        raise ValueError("searcher.max_length: adaptive_asha needs max_length (or max_time)")
    divisor = searcher_cfg.divisor
    max_rungs = searcher_cfg.max_rungs
    max_trials = searcher_cfg.max_trials
    max_concurrent = searcher_cfg.max_concurrent_trials
    mode = searcher_cfg.mode

    # Like Determined, fewer rungs when max_length or max_trials cannot feed max_rungs of them
    # (each rung needs >= 1 unit and the top rung needs >= 1 trial); also never more rungs than
    # distinct integer lengths.
    max_rungs = max(
        1,
        min(max_rungs, rungs_that_fit(length, divisor), _floor_log(max_trials, divisor) + 1, length),
    )
    brackets = sorted(_mode_brackets(mode, max_rungs), reverse=True)
    if 0 < max_concurrent < len(brackets):
        brackets = brackets[:max_concurrent]
    trials = _bracket_max_trials(max_trials, divisor, brackets)
    while sum(trials) > max_trials and len(brackets) > 1:
        brackets = brackets[:-1]
        trials = _bracket_max_trials(max_trials, divisor, brackets)
    concurrent = _bracket_max_concurrent(max_concurrent, divisor, trials)
    return [
        BracketPlan(
            num_rungs=n,
            rung_lengths=rung_lengths(length, n, divisor),
            max_trials=t,
            max_concurrent_trials=c,
        )
        for n, t, c in zip(brackets, trials, concurrent, strict=True)
    ]


def asha_rungs_fit(searcher_cfg: SearcherConfig) -> str | None:
    """None if an adaptive_asha config yields rungs of at least one unit each, else the reason.

    Like Determined, max_rungs is lowered when max_length is too short for
    divisor^(max_rungs-1) (e.g. 100 batches, divisor 4 -> 4 rungs of 1, 6, 25, 100), so only a
    missing length fails here (the model refuses a sub-unit one). Other searchers always fit.
    """
    if searcher_cfg.name != "adaptive_asha":
        return None
    try:
        adaptive_asha_plan(searcher_cfg)
    except ValueError as e:
        return str(e)
    return None


class AshaBracket:
    """One bracket of promotion-based ASHA. Metrics are stored sign-normalized: smaller is better."""

    def __init__(self, plan: BracketPlan, divisor: float, smaller_is_better: bool) -> None:
        self.plan = plan
        self.divisor = divisor
        self.smaller_is_better = smaller_is_better
        self.lengths = plan.rung_lengths
        self.top = plan.num_rungs - 1
        # Per rung, [metric, request_id, promoted] sorted by metric (arrival order among ties).
        self.rung_metrics: list[list[list[Any]]] = [[] for _ in self.lengths]
        # Per rung, trials training toward it (or that exited while promoted to it).
        self.rung_outstanding = [0] * len(self.lengths)
        self.trial_rungs: dict[str, int] = {}
        # Trials with an outstanding ValidateAfter, and its length.
        self.running: dict[str, int] = {}
        self.early_exit: set[str] = set()
        self.closed: set[str] = set()
        self.trials_completed = 0
        self.invalid_trials = 0
        # Rungs [0, final_rungs) are closed out: nothing trains toward them or below them, so no
        # result (hence no promotion) can reach them again, and rescanning them finds nothing.
        # Only an invalid_hp removal reopens them. Saves O(trials) per event late in a search.
        self.final_rungs = 0

    # ---- helpers -----------------------------------------------------------------------------

    def _normalize(self, metric: float) -> float:
        if metric != metric:  # NaN ranks last
            return WORST_METRIC
        value = metric if self.smaller_is_better else -metric
        return min(max(value, -WORST_METRIC), WORST_METRIC)

    def _concurrency(self) -> int:
        if self.plan.max_concurrent_trials > 0:
            return min(self.plan.max_concurrent_trials, self.plan.max_trials)
        return max(min(int(self.divisor**self.top), self.plan.max_trials), 1)

    def _all_trials(self) -> int:
        return len(self.trial_rungs) - self.invalid_trials

    def _start_new(self, new_trial: NewTrial) -> list[Operation]:
        create = new_trial()
        rid = create.request_id
        self.trial_rungs[rid] = 0
        self.rung_outstanding[0] += 1
        self.running[rid] = self.lengths[0]
        return [create, ValidateAfter(rid, self.lengths[0], rung=0)]

    def _resume(self, rid: str, rung: int) -> ValidateAfter:
        self.trial_rungs[rid] = rung
        self.rung_outstanding[rung] += 1
        self.running[rid] = self.lengths[rung]
        return ValidateAfter(rid, self.lengths[rung], rung=rung)

    def _close(self, rid: str) -> Close:
        self.closed.add(rid)
        return Close(rid)

    # ---- events ------------------------------------------------------------------------------

    def initial(self, new_trial: NewTrial) -> list[Operation]:
        ops: list[Operation] = []
        for _ in range(self._concurrency()):
            ops += self._start_new(new_trial)
        return ops

    def validation_completed(self, new_trial: NewTrial, rid: str, metric: float, length: int) -> list[Operation]:
        target = self.running.get(rid)
        if target is None or length < target:
            return []  # an intermediate validation, or a repeat of one already counted
        del self.running[rid]
        return self._report(new_trial, rid, self._normalize(metric))

    def exited_early(self, new_trial: NewTrial, rid: str, reason: ExitedReason) -> list[Operation]:
        self.early_exit.add(rid)
        self.closed.add(rid)
        if rid not in self.running:
            return []  # paused or closing: nothing is waiting on it
        del self.running[rid]
        if reason == ExitedReason.INVALID_HP:
            # Forget the trial entirely and try another sample in its place.
            self.invalid_trials += 1
            self.final_rungs = 0
            rung = self.trial_rungs[rid]
            self.rung_outstanding[rung] -= 1
            for metrics in self.rung_metrics[: rung + 1]:
                for i, entry in enumerate(metrics):
                    if entry[1] == rid:
                        del metrics[i]
                        break
            return self._start_new(new_trial)
        return self._report(new_trial, rid, WORST_METRIC)

    def ended(self, rid: str) -> None:
        self.trials_completed += 1
        if rid not in self.closed:
            # Closed by someone else while paused: never promote it again.
            self.early_exit.add(rid)
            self.closed.add(rid)

    def _rank_at_top(self, rid: str, metric: float) -> list[Operation]:
        """A result at the top rung: ranked there, and the trial is done."""
        self.rung_metrics[self.top].append([metric, rid, False])
        if rid in self.closed:  # exited, or closed out before it was ranked here
            return []
        return [self._close(rid)]

    # ---- promotion-based ASHA ----------------------------------------------------------------

    def _promotions(self, rung: int, rid: str, metric: float) -> list[str]:
        """Insert a result into a rung; return the trial to promote, if any.

        Invariant: every trial among the rung's best floor(n / divisor) results is promoted. Adding
        one result grows that set by at most one, so at most one promotion is due.
        """
        metrics = self.rung_metrics[rung]
        old_num_promote = int(len(metrics) / self.divisor)
        num_promote = int((len(metrics) + 1) / self.divisor)
        index = bisect.bisect_right(metrics, metric, key=_metric_key)
        promote_now = index < num_promote
        metrics.insert(index, [metric, rid, promote_now])
        if promote_now:
            return [rid]
        if num_promote != old_num_promote and not metrics[old_num_promote][2]:
            metrics[old_num_promote][2] = True
            return [metrics[old_num_promote][1]]
        return []

    def _report(self, new_trial: NewTrial, rid: str, metric: float) -> list[Operation]:
        rung = self.trial_rungs[rid]
        self.rung_outstanding[rung] -= 1
        if rung == self.top:
            return self._after_report(new_trial, self._rank_at_top(rid, metric), added_work=False)
        return self._below_top(new_trial, rung, rid, metric)

    def _below_top(self, new_trial: NewTrial, rung: int, rid: str, metric: float) -> list[Operation]:
        ops: list[Operation] = []
        added_work = False
        for promoted in self._promotions(rung, rid, metric):
            if promoted in self.closed:
                # It cannot train any more: rank it at the next rung as if it had reported
                # the worst possible result there. Besides early exits this covers a trial
                # already closed out when an invalid_hp removal reordered its rung
                # (Determined would send work to the closed trial).
                self.trial_rungs[promoted] = rung + 1
                self.rung_outstanding[rung + 1] += 1
                return ops + self._report(new_trial, promoted, WORST_METRIC)
            ops.append(self._resume(promoted, rung + 1))
            added_work = True
        return self._after_report(new_trial, ops, added_work)

    def _after_report(self, new_trial: NewTrial, ops: list[Operation], added_work: bool) -> list[Operation]:
        """Each result yields one unit of new work: a promotion, else a new trial while the budget
        lasts. Then rungs nothing can reach any more are closed out."""
        if not added_work and self._all_trials() < self.plan.max_trials:
            ops += self._start_new(new_trial)
        if len(self.rung_metrics[0]) == self.plan.max_trials:
            ops += self._close_out_rungs()
        return ops

    def _close_out_rungs(self) -> list[Operation]:
        """Close trials that can no longer be promoted: those in rungs below which nothing runs."""
        ops: list[Operation] = []
        for rung in range(self.final_rungs, len(self.rung_metrics)):
            if self.rung_outstanding[rung] > 0:
                break
            for _, rid, promoted in self.rung_metrics[rung]:
                if not promoted and rid not in self.closed:
                    ops.append(self._close(rid))
            self.final_rungs = rung + 1
        return ops

    # ---- progress and persistence ------------------------------------------------------------

    def progress(self) -> float:
        reported = len(self.rung_metrics[0])
        # Determined's estimate: 20% headroom until every trial reported at the bottom rung.
        progress = reported / (1.2 * self.plan.max_trials)
        if reported >= self.plan.max_trials:
            done = (self.trials_completed - self.invalid_trials) / self.plan.max_trials
            progress = max(done, progress)
        return progress

    def state(self) -> dict[str, Any]:
        return {
            "rung_metrics": [[list(e) for e in metrics] for metrics in self.rung_metrics],
            "rung_outstanding": list(self.rung_outstanding),
            "trial_rungs": sorted([rid, r] for rid, r in self.trial_rungs.items()),
            "running": sorted([rid, n] for rid, n in self.running.items()),
            "early_exit": sorted(self.early_exit),
            "closed": sorted(self.closed),
            "trials_completed": self.trials_completed,
            "invalid_trials": self.invalid_trials,
            "final_rungs": self.final_rungs,
        }

    def load_state(self, state: Mapping[str, Any]) -> None:
        metrics_by_rung = state["rung_metrics"]
        if len(metrics_by_rung) != len(self.lengths):
            raise ValueError("snapshot has a different number of rungs than the config")
        self.rung_metrics = [[[float(m), str(rid), bool(p)] for m, rid, p in metrics] for metrics in metrics_by_rung]
        self.rung_outstanding = [int(n) for n in state["rung_outstanding"]]
        self.trial_rungs = {rid: int(r) for rid, r in state["trial_rungs"]}
        self.running = {rid: int(n) for rid, n in state["running"]}
        self.early_exit = set(state["early_exit"])
        self.closed = set(state["closed"])
        self.trials_completed = int(state["trials_completed"])
        self.invalid_trials = int(state["invalid_trials"])
        self.final_rungs = int(state["final_rungs"])


class AshaStoppingBracket(AshaBracket):
    """``stop_once``: decide at each rung whether the trial continues; stopped trials never resume."""

    def _continue_training(self, rung: int, rid: str, metric: float) -> bool:
        metrics = self.rung_metrics[rung]
        # Continue if in the top 1/divisor so far, or while the rung has seen fewer than divisor.
        num_promote = max(int((len(metrics) + 1) / self.divisor), 1)
        index = bisect.bisect_left(metrics, metric, key=_metric_key)
        promote = index < num_promote
        metrics.insert(index, [metric, rid, promote])
        return promote

    def _below_top(self, new_trial: NewTrial, rung: int, rid: str, metric: float) -> list[Operation]:
        ops: list[Operation] = []
        added_work = False
        # Rank even an exited trial, so the rung's cutoff accounts for it; but an exited trial
        # never occupies a place in a higher rung.
        keep_going = self._continue_training(rung, rid, metric)
        if rid not in self.early_exit:
            if keep_going:
                ops.append(self._resume(rid, rung + 1))
                added_work = True
            else:
                ops.append(self._close(rid))
        return self._after_report(new_trial, ops, added_work)

    def _after_report(self, new_trial: NewTrial, ops: list[Operation], added_work: bool) -> list[Operation]:
        # Stopped trials never resume, so there is no rung to close out.
        if not added_work and self._all_trials() < self.plan.max_trials:
            ops += self._start_new(new_trial)
        return ops


class AdaptiveAshaSearch(BaseSearchMethod):
    """Determined's adaptive_asha: a tournament of ASHA brackets; events go to the owning bracket."""

    name = "adaptive_asha"
    _unexpected_close_is_exit = True

    def __init__(
        self, searcher_cfg: AdaptiveASHASearcher, hparams_cfg: Mapping[str, Any], experiment_seed: int
    ) -> None:
        super().__init__(searcher_cfg, hparams_cfg, experiment_seed)
        self.plans = adaptive_asha_plan(searcher_cfg)
        bracket_cls = AshaStoppingBracket if searcher_cfg.stop_once else AshaBracket
        self.brackets: list[AshaBracket] = [
            bracket_cls(p, searcher_cfg.divisor, searcher_cfg.smaller_is_better) for p in self.plans
        ]
        self._trial_bracket: dict[str, int] = {}

    def _mark(self, bracket: int, ops: list[Operation]) -> list[Operation]:
        for op in ops:
            if isinstance(op, Create):
                self._trial_bracket[op.request_id] = bracket
        return ops

    def _on_initial(self) -> list[Operation]:
        ops: list[Operation] = []
        for i, bracket in enumerate(self.brackets):
            ops += self._mark(i, bracket.initial(self._new_trial))
        return ops

    def _on_validation(self, request_id: str, metric: float, length: int) -> list[Operation]:
        i = self._trial_bracket[request_id]
        return self._mark(i, self.brackets[i].validation_completed(self._new_trial, request_id, metric, length))

    def _on_exited_early(self, request_id: str, reason: ExitedReason) -> list[Operation]:
        i = self._trial_bracket[request_id]
        return self._mark(i, self.brackets[i].exited_early(self._new_trial, request_id, reason))

    def _on_ended(self, request_id: str) -> list[Operation]:
        self.brackets[self._trial_bracket[request_id]].ended(request_id)
        return []

    def _has_outstanding_work(self, request_id: str) -> bool:
        return request_id in self.brackets[self._trial_bracket[request_id]].running

    def _method_progress(self) -> float:
        return sum(b.progress() for b in self.brackets) / len(self.brackets)

    def _method_state(self) -> dict[str, Any]:
        return {
            "brackets": [b.state() for b in self.brackets],
            "trial_bracket": sorted([rid, i] for rid, i in self._trial_bracket.items()),
        }

    def _load_method_state(self, state: Mapping[str, Any]) -> None:
        if len(state["brackets"]) != len(self.brackets):
            raise ValueError("snapshot has a different number of brackets than the config")
        for bracket, bracket_state in zip(self.brackets, state["brackets"], strict=True):
            bracket.load_state(bracket_state)
        self._trial_bracket = {rid: int(i) for rid, i in state["trial_bracket"]}
