"""Drive a search method without an experiment: apply its operations to in-memory trials.

The reference shell for previews (Determined's ``det preview-search`` runs simulate.go), the
benchmark and the tests. It is strict: an operation that breaks the searcher contract (unknown
trial, work for an ended trial, a length that does not move forward, anything after Shutdown)
raises ``ProtocolViolation``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from control_plane.core.searcher.base import SearchMethod
from control_plane.core.searcher.operations import (
    Close,
    Create,
    ExitedReason,
    Operation,
    Shutdown,
    ValidateAfter,
)


class ProtocolViolation(AssertionError):
    """The searcher emitted an operation that no experiment could apply."""


@dataclass
class SimulatedTrial:
    request_id: str
    index: int
    hparams: dict[str, Any]
    trial_seed: int
    target: int | None = None
    trained: int = 0
    validations: list[tuple[int, float]] = field(default_factory=list)
    created_reported: bool = False
    close_requested: bool = False
    ended: bool = False
    exit_reason: ExitedReason | None = None
    # Whether it had a ValidateAfter outstanding when it exited early.
    exited_running: bool = False

    @property
    def running(self) -> bool:
        return self.target is not None and not self.ended


@dataclass
class SimulationResult:
    trials: list[SimulatedTrial]
    shutdown: Shutdown | None
    events: int
    units_trained: int
    max_running: int
    max_alive: int


class SearchSimulation:
    def __init__(self, method: SearchMethod) -> None:
        self.method = method
        self.trials: dict[str, SimulatedTrial] = {}
        self.order: list[str] = []
        self.log: list[Operation] = []
        self.shutdown: Shutdown | None = None
        self.events = 0
        self.max_running = 0
        self.max_alive = 0
        self._work: deque[str] = deque()
        # Kept incrementally: a preview or benchmark of 10,000 trials must not rescan them per event.
        self._running: set[str] = set()
        self._alive: set[str] = set()
        self._closing: set[str] = set()
        self._unreported: set[str] = set()
        # FIFO order for run(): creates and closes in the order the searcher sent them.
        self._create_queue: deque[str] = deque()
        self._close_queue: deque[str] = deque()

    # ---- applying operations -----------------------------------------------------------------

    def _trial(self, rid: str) -> SimulatedTrial:
        try:
            return self.trials[rid]
        except KeyError:
            raise ProtocolViolation(f"operation for unknown trial {rid}") from None

    def apply(self, ops: list[Operation]) -> list[Operation]:
        for op in ops:
            if self.shutdown is not None:
                raise ProtocolViolation(f"{op} after Shutdown")
            self.log.append(op)
            if isinstance(op, Create):
                if op.request_id in self.trials:
                    raise ProtocolViolation(f"duplicate request id {op.request_id}")
                self.trials[op.request_id] = SimulatedTrial(
                    op.request_id, len(self.order), op.hparams, op.trial_seed
                )
                self.order.append(op.request_id)
                self._alive.add(op.request_id)
                self._unreported.add(op.request_id)
                self._create_queue.append(op.request_id)
            elif isinstance(op, ValidateAfter):
                trial = self._trial(op.request_id)
                if trial.ended or trial.close_requested:
                    raise ProtocolViolation(f"{op} for a closed trial")
                if op.length <= trial.trained:
                    raise ProtocolViolation(f"{op} but the trial already trained {trial.trained}")
                trial.target = op.length
                self._running.add(op.request_id)
                self._work.append(op.request_id)
            elif isinstance(op, Close):
                trial = self._trial(op.request_id)
                if trial.close_requested:
                    raise ProtocolViolation(f"{op} twice")
                trial.close_requested = True
                trial.target = None
                self._running.discard(op.request_id)
                if not trial.ended:
                    self._closing.add(op.request_id)
                    self._close_queue.append(op.request_id)
            elif isinstance(op, Shutdown):
                if self._alive:
                    raise ProtocolViolation(f"Shutdown while trials {self.alive()} are alive")
                self.shutdown = op
        self.max_running = max(self.max_running, len(self._running))
        self.max_alive = max(self.max_alive, len(self._alive))
        return ops

    def start(self) -> list[Operation]:
        return self.apply(self.method.initial_operations())

    # ---- state -------------------------------------------------------------------------------

    def _in_creation_order(self, rids: set[str]) -> list[str]:
        return sorted(rids, key=lambda rid: self.trials[rid].index)

    def running(self) -> list[str]:
        """Trials with a ValidateAfter outstanding, oldest first."""
        return self._in_creation_order(self._running)

    def alive(self) -> list[str]:
        """Trials that have not ended (running, paused or closing), oldest first."""
        return self._in_creation_order(self._alive)

    def closing(self) -> list[str]:
        """Trials told to Close that have not reported trial_closed yet, oldest first."""
        return self._in_creation_order(self._closing)

    def unreported_creates(self) -> list[str]:
        return self._in_creation_order(self._unreported)

    # ---- events ------------------------------------------------------------------------------

    def report_created(self, rid: str) -> list[Operation]:
        self.events += 1
        self.trials[rid].created_reported = True
        self._unreported.discard(rid)
        return self.apply(self.method.trial_created(rid))

    def report_validation(self, rid: str, metric: float, length: int | None = None) -> list[Operation]:
        """The trial validated after training ``length`` units in total (default: its target)."""
        trial = self.trials[rid]
        if length is None:
            if trial.target is None:
                raise ValueError(f"trial {rid} has no outstanding ValidateAfter")
            length = trial.target
        self.events += 1
        trial.trained = max(trial.trained, length)
        trial.validations.append((length, metric))
        if trial.target is not None and length >= trial.target:
            trial.target = None
            self._running.discard(rid)
        return self.apply(self.method.validation_completed(rid, metric, length))

    def _end(self, rid: str) -> SimulatedTrial:
        self.events += 1
        trial = self.trials[rid]
        trial.ended = True
        trial.target = None
        for pending in (self._running, self._alive, self._closing):
            pending.discard(rid)
        return trial

    def report_closed(self, rid: str) -> list[Operation]:
        self._end(rid)
        return self.apply(self.method.trial_closed(rid))

    def report_exit(self, rid: str, reason: ExitedReason) -> list[Operation]:
        running = self.trials[rid].running
        trial = self._end(rid)
        trial.exited_running = running
        trial.exit_reason = reason
        return self.apply(self.method.trial_exited_early(rid, reason))

    # ---- a whole run -------------------------------------------------------------------------

    def result(self) -> SimulationResult:
        trials = [self.trials[rid] for rid in self.order]
        return SimulationResult(
            trials=trials,
            shutdown=self.shutdown,
            events=self.events,
            units_trained=sum(t.trained for t in trials),
            max_running=self.max_running,
            max_alive=self.max_alive,
        )

    def run(
        self, metric: Callable[[SimulatedTrial, int], float], max_events: int = 10_000_000
    ) -> SimulationResult:
        """Run to Shutdown: trials finish their work in the order it was asked for (FIFO)."""
        if not self.log:
            self.start()
        while self.shutdown is None and self.events < max_events:
            while self._create_queue and self._create_queue[0] not in self._unreported:
                self._create_queue.popleft()
            if self._create_queue:
                self.report_created(self._create_queue.popleft())
                continue
            while self._close_queue and self._close_queue[0] not in self._closing:
                self._close_queue.popleft()
            if self._close_queue:
                self.report_closed(self._close_queue.popleft())
                continue
            while self._work and not self.trials[self._work[0]].running:
                self._work.popleft()
            if not self._work:
                break
            trial = self.trials[self._work.popleft()]
            assert trial.target is not None
            self.report_validation(trial.request_id, metric(trial, trial.target))
        return self.result()
