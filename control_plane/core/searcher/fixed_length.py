"""Searchers that train every trial to the full length: single, random, grid.

Each trial gets ``ValidateAfter(max_length)`` and, once it validated there, ``Close``. A new trial
starts whenever one ends, keeping at most ``max_concurrent_trials`` alive (0 = no limit), as in
Determined's random.go. Without a length (neither max_length nor max_time) trials get only
``Create`` and run until they stop on their own.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from control_plane.core.searcher.base import BaseSearchMethod, searcher_length
from control_plane.core.searcher.hparams import Grid
from control_plane.core.searcher.operations import Close, Create, ExitedReason, Operation, ValidateAfter

if TYPE_CHECKING:  # annotations only: expconf imports this package (rung and grid arithmetic)
    from control_plane.core.expconf.models.searcher import GridSearcher, RandomSearcher, SearcherConfig


class _FixedLengthSearch(BaseSearchMethod):
    # Whether a trial that exits with invalid_hp is replaced by a fresh sample.
    _replace_invalid: ClassVar[bool]

    def __init__(self, searcher_cfg: SearcherConfig, hparams_cfg: Mapping[str, Any], experiment_seed: int) -> None:
        super().__init__(searcher_cfg, hparams_cfg, experiment_seed)
        self.length = searcher_length(searcher_cfg)
        self.total_trials = self._total_trials()
        self.max_concurrent = self._max_concurrent()
        # Trials that count toward total_trials (invalid_hp replacements do not).
        self._counted = 0
        self._open = 0
        self._finished = 0
        self._validated: dict[str, int] = {}

    @abc.abstractmethod
    def _total_trials(self) -> int: ...

    def _max_concurrent(self) -> int:
        """How many trials may be alive at once; 0 means no limit."""
        cfg: RandomSearcher | GridSearcher = self.searcher_cfg  # type: ignore[assignment]
        return cfg.max_concurrent_trials

    @abc.abstractmethod
    def _next_create(self) -> Create: ...

    def _start(self, create: Create) -> list[Operation]:
        self._open += 1
        if self.length is None:
            return [create]
        return [create, ValidateAfter(create.request_id, self.length)]

    def _fill(self) -> list[Operation]:
        ops: list[Operation] = []
        while self._counted < self.total_trials and (
            self.max_concurrent <= 0 or self._open < self.max_concurrent
        ):
            ops += self._start(self._next_create())
            self._counted += 1
        return ops

    def _on_initial(self) -> list[Operation]:
        return self._fill()

    def _on_validation(self, request_id: str, metric: float, length: int) -> list[Operation]:
        self._validated[request_id] = max(length, self._validated.get(request_id, 0))
        if self.length is not None and length >= self.length:
            return [Close(request_id)]
        return []

    def _on_exited_early(self, request_id: str, reason: ExitedReason) -> list[Operation]:
        if reason == ExitedReason.INVALID_HP and self._replace_invalid and request_id not in self._closing:
            # A replaced trial is neither progress nor part of the budget; _on_ended counts it
            # as finished and starts the replacement. (A trial already told to close finished its
            # training, so it just ended.)
            self._counted -= 1
            self._finished -= 1
        return []

    def _on_ended(self, request_id: str) -> list[Operation]:
        self._open -= 1
        self._finished += 1
        self._validated.pop(request_id, None)
        return self._fill()

    def _method_progress(self) -> float:
        if self.total_trials == 0:
            return 1.0
        partial = 0.0
        if self.length:
            partial = sum(min(v / self.length, 1.0) for v in self._validated.values())
        return (self._finished + partial) / self.total_trials

    def _method_state(self) -> dict[str, Any]:
        return {
            "counted": self._counted,
            "open": self._open,
            "finished": self._finished,
            "validated": sorted([rid, n] for rid, n in self._validated.items()),
        }

    def _load_method_state(self, state: Mapping[str, Any]) -> None:
        self._counted = int(state["counted"])
        self._open = int(state["open"])
        self._finished = int(state["finished"])
        self._validated = {rid: int(n) for rid, n in state["validated"]}


class RandomSearch(_FixedLengthSearch):
    """``max_trials`` random samples, ``max_concurrent_trials`` at a time."""

    name = "random"
    _replace_invalid = True

    def _total_trials(self) -> int:
        cfg: RandomSearcher = self.searcher_cfg  # type: ignore[assignment]
        return cfg.max_trials

    def _next_create(self) -> Create:
        return self._new_trial()


class SingleSearch(RandomSearch):
    """One trial (Determined builds it as a random search with max_trials=1)."""

    name = "single"

    def _total_trials(self) -> int:
        return 1

    def _max_concurrent(self) -> int:
        return 0


class GridSearch(_FixedLengthSearch):
    """One trial per point of the cartesian product of the hyperparameters' grids."""

    name = "grid"
    # An invalid grid point stays invalid; sampling it again would loop forever.
    _replace_invalid = False

    def _total_trials(self) -> int:
        self.grid = Grid(self.hparams_cfg)
        return self.grid.size

    def _next_create(self) -> Create:
        return self._new_trial(self.grid.point(self._counted))
