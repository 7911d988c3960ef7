"""The searcher interface and the bookkeeping every search method shares.

A search method is a pure state machine: the experiment feeds it events (trial created, validation
completed, trial closed, trial exited early) and applies the operations it returns. It does no I/O
and never reads the clock. ``snapshot()`` is a complete JSON-serializable state; restoring it with
the same configs and seed continues exactly where the search was, down to the request ids.

Event contract for the experiment (the shell):

- call ``initial_operations()`` once, when the experiment starts;
- ``trial_created(id)`` once the trial of a ``Create`` exists (bookkeeping only);
- ``validation_completed(id, metric, length)`` with the searcher metric and the total units trained;
  a validation before the requested ``ValidateAfter`` length is ignored, so the shell may forward
  every validation;
- ``trial_exited_early(id, reason)`` when a trial ended without being closed by the searcher
  (error, user cancel, invalid hyperparameters). The trial counts as closed from then on;
- ``trial_closed(id)`` when a trial is gone. After an early exit it is a no-op. For a trial the
  searcher never closed it means the trial stopped on its own: searchers with a fixed training
  length treat it as finished, ASHA treats a trial with outstanding work as user-canceled.

Every event is idempotent past the first delivery, so replaying events after a crash is safe.
``Shutdown`` is emitted once every trial the searcher asked for has ended; it has
``failure=True`` when all of them errored (Determined's rule).
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from control_plane.core.searcher.hparams import TrialFactory
from control_plane.core.searcher.operations import (
    Close,
    Create,
    ExitedReason,
    Operation,
    Shutdown,
    ValidateAfter,
)

if TYPE_CHECKING:  # annotations only: expconf imports this package (rung and grid arithmetic)
    from control_plane.core.expconf.models.searcher import SearcherConfig

__all__ = [
    "BaseSearchMethod",
    "Close",
    "Create",
    "ExitedReason",
    "Operation",
    "SearchMethod",
    "SnapshotMismatchError",
    "Shutdown",
    "UnknownTrialError",
    "ValidateAfter",
    "searcher_length",
]

SNAPSHOT_VERSION = 1


class UnknownTrialError(ValueError):
    """An event named a request id this searcher never created."""


class SnapshotMismatchError(ValueError):
    """A snapshot does not belong to this kind of searcher (or to this code's snapshot format)."""


@runtime_checkable
class SearchMethod(Protocol):
    def initial_operations(self) -> list[Operation]: ...

    def trial_created(self, request_id: str) -> list[Operation]: ...

    def validation_completed(self, request_id: str, metric: float, length: int) -> list[Operation]: ...

    def trial_closed(self, request_id: str) -> list[Operation]: ...

    def trial_exited_early(self, request_id: str, reason: ExitedReason) -> list[Operation]: ...

    def progress(self) -> float: ...

    def snapshot(self) -> dict[str, Any]: ...


def searcher_length(searcher_cfg: SearcherConfig) -> int | None:
    """The training length searchers emit, in the configured unit (``max_length``'s, or
    ``max_time`` in its ``time_metric``); None when the training code decides."""
    length = searcher_cfg.training_length()
    return None if length is None else length[1]


class BaseSearchMethod(abc.ABC):
    """Shared bookkeeping: which trials were requested, created, closed, exited; Shutdown; snapshot.

    Subclasses implement the ``_on_*`` hooks and hold only their own state. Hooks may call
    ``self._new_trial()`` to get a ``Create`` from the seeded factory.
    """

    name: ClassVar[str]
    # Whether trial_closed for a trial the searcher never closed is really an early exit.
    _unexpected_close_is_exit: ClassVar[bool] = False

    def __init__(self, searcher_cfg: SearcherConfig, hparams_cfg: Mapping[str, Any], experiment_seed: int) -> None:
        self.searcher_cfg = searcher_cfg
        self.hparams_cfg = hparams_cfg
        self.experiment_seed = int(experiment_seed)
        self._factory = TrialFactory(hparams_cfg, self.experiment_seed)
        self._started = False
        self._requested: list[str] = []
        self._requested_set: set[str] = set()
        self._created: set[str] = set()
        self._ended: set[str] = set()
        self._closing: set[str] = set()
        self._exits: dict[str, ExitedReason] = {}
        self._failures = 0
        self._shutdown = False

    # ---- hooks -------------------------------------------------------------------------------

    @abc.abstractmethod
    def _on_initial(self) -> list[Operation]: ...

    @abc.abstractmethod
    def _on_validation(self, request_id: str, metric: float, length: int) -> list[Operation]: ...

    @abc.abstractmethod
    def _on_exited_early(self, request_id: str, reason: ExitedReason) -> list[Operation]:
        """The trial ended without being closed; ``_on_ended`` follows."""

    @abc.abstractmethod
    def _on_ended(self, request_id: str) -> list[Operation]:
        """Called exactly once per trial, when it closed or exited early."""

    @abc.abstractmethod
    def _method_progress(self) -> float: ...

    @abc.abstractmethod
    def _method_state(self) -> dict[str, Any]: ...

    @abc.abstractmethod
    def _load_method_state(self, state: Mapping[str, Any]) -> None: ...

    def _has_outstanding_work(self, request_id: str) -> bool:
        return False

    # ---- public interface --------------------------------------------------------------------

    def _new_trial(self, hparams: dict[str, Any] | None = None) -> Create:
        return self._factory.create(hparams)

    def _check_known(self, request_id: str) -> None:
        if request_id not in self._requested_set:
            raise UnknownTrialError(f"searcher never created a trial with request id {request_id!r}")

    def _finish(self, ops: list[Operation]) -> list[Operation]:
        for op in ops:
            if isinstance(op, Create):
                self._requested.append(op.request_id)
                self._requested_set.add(op.request_id)
            elif isinstance(op, Close):
                self._closing.add(op.request_id)
        if not self._shutdown and len(self._ended) == len(self._requested):
            failure = bool(self._requested) and self._failures >= len(self._requested)
            reason = "every trial errored" if failure else ""
            ops.append(Shutdown(failure=failure, reason=reason))
            self._shutdown = True
        return ops

    def initial_operations(self) -> list[Operation]:
        if self._started:
            raise RuntimeError("initial_operations() may only be called once per search")
        self._started = True
        return self._finish(self._on_initial())

    def trial_created(self, request_id: str) -> list[Operation]:
        self._check_known(request_id)
        self._created.add(request_id)
        return []

    def validation_completed(self, request_id: str, metric: float, length: int) -> list[Operation]:
        self._check_known(request_id)
        if self._shutdown or request_id in self._ended or request_id in self._closing:
            return []
        return self._finish(self._on_validation(request_id, float(metric), int(length)))

    def trial_exited_early(self, request_id: str, reason: ExitedReason | str) -> list[Operation]:
        self._check_known(request_id)
        if self._shutdown or request_id in self._ended:
            return []
        reason = ExitedReason(reason)
        self._exits[request_id] = reason
        if reason == ExitedReason.ERRORED:
            self._failures += 1
        ops = self._on_exited_early(request_id, reason)
        self._ended.add(request_id)
        ops += self._on_ended(request_id)
        return self._finish(ops)

    def trial_closed(self, request_id: str) -> list[Operation]:
        self._check_known(request_id)
        if self._shutdown or request_id in self._ended:
            return []
        if (
            self._unexpected_close_is_exit
            and request_id not in self._closing
            and self._has_outstanding_work(request_id)
        ):
            return self.trial_exited_early(request_id, ExitedReason.USER_CANCELED)
        self._ended.add(request_id)
        return self._finish(self._on_ended(request_id))

    def progress(self) -> float:
        if self._shutdown:
            return 1.0
        p = self._method_progress()
        if p != p:  # NaN
            return 0.0
        return min(max(p, 0.0), 1.0)

    @property
    def is_shutdown(self) -> bool:
        return self._shutdown

    # ---- persistence -------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        # Sets are written sorted and ordered data as lists: a JSONB column reorders object keys,
        # and nothing here may depend on key order.
        return {
            "version": SNAPSHOT_VERSION,
            "searcher": self.name,
            "creates": self._factory.creates,
            "started": self._started,
            "requested": list(self._requested),
            "created": sorted(self._created),
            "ended": sorted(self._ended),
            "closing": sorted(self._closing),
            "exits": sorted([rid, reason.value] for rid, reason in self._exits.items()),
            "failures": self._failures,
            "shutdown": self._shutdown,
            "method": self._method_state(),
        }

    def _load(self, snapshot: Mapping[str, Any]) -> None:
        if snapshot.get("version") != SNAPSHOT_VERSION:
            raise SnapshotMismatchError(f"unsupported searcher snapshot version {snapshot.get('version')!r}")
        if snapshot.get("searcher") != self.name:
            raise SnapshotMismatchError(
                f"snapshot is of a {snapshot.get('searcher')!r} searcher, config says {self.name!r}"
            )
        self._factory.creates = int(snapshot["creates"])
        self._started = bool(snapshot["started"])
        self._requested = list(snapshot["requested"])
        self._requested_set = set(self._requested)
        self._created = set(snapshot["created"])
        self._ended = set(snapshot["ended"])
        self._closing = set(snapshot["closing"])
        self._exits = {rid: ExitedReason(reason) for rid, reason in snapshot["exits"]}
        self._failures = int(snapshot["failures"])
        self._shutdown = bool(snapshot["shutdown"])
        self._load_method_state(snapshot["method"])

    @classmethod
    def restore(
        cls,
        searcher_cfg: SearcherConfig,
        hparams_cfg: Mapping[str, Any],
        experiment_seed: int,
        snapshot: Mapping[str, Any],
    ) -> BaseSearchMethod:
        method = cls(searcher_cfg, hparams_cfg, experiment_seed)
        method._load(snapshot)
        return method
