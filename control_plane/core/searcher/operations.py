"""What a searcher asks the experiment to do, and why a trial can end without being asked to.

Operations take effect as soon as the experiment receives them (there is no per-trial queue):

- ``Create``: make a new trial with these hyperparameters and seed.
- ``ValidateAfter``: train the trial until ``length`` units *in total* (not an increment), then
  validate and report the searcher metric through ``validation_completed``. ``rung`` says which
  rung of the search that length is (ASHA), so nobody else recomputes rung arithmetic.
- ``Close``: the trial has no further work; stop it and report ``trial_closed`` once it is gone.
- ``Shutdown``: the search is over (every trial it asked for has ended).

A trial that finished its ``ValidateAfter`` and got neither a new ``ValidateAfter`` nor a ``Close``
is *paused*: it needs no slot, and may later be resumed (promotion in ASHA) or closed.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class ExitedReason(enum.StrEnum):
    """Why a trial ended without the searcher closing it (Determined's ``ExitedReason``)."""

    ERRORED = "errored"
    USER_CANCELED = "user_canceled"
    # The user's code said these hyperparameters cannot be trained; searchers that sample
    # replace such a trial, if it still had work outstanding, with a fresh one that does not
    # count against max_trials.
    INVALID_HP = "invalid_hp"


@dataclass(frozen=True)
class Create:
    request_id: str
    hparams: dict[str, Any] = field(hash=False)
    trial_seed: int


@dataclass(frozen=True)
class ValidateAfter:
    request_id: str
    length: int
    # The searcher's own label for this length: the ASHA rung (index into its bracket's rung
    # lengths) the trial is training toward; 0 for searchers without rungs. The shell stores it
    # as is and never derives it from the length.
    rung: int = 0


@dataclass(frozen=True)
class Close:
    request_id: str


@dataclass(frozen=True)
class Shutdown:
    failure: bool = False
    reason: str = ""


Operation = Create | ValidateAfter | Close | Shutdown
