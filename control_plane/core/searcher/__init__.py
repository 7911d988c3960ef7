"""Hyperparameter searchers: pure state machines, metrics in, trial operations out.

See ``base`` for the event contract. ``new_search_method`` builds one from an experiment's typed
searcher config (``ExperimentConfig.searcher``: expconf holds every default) and its
hyperparameters as plain data; ``restore_search_method`` continues one from its ``snapshot()``.
"""

from control_plane.core.searcher.asha import (
    AdaptiveAshaSearch,
    BracketPlan,
    adaptive_asha_plan,
    asha_rungs_fit,
)
from control_plane.core.searcher.base import (
    BaseSearchMethod,
    Close,
    Create,
    ExitedReason,
    Operation,
    SearchMethod,
    Shutdown,
    SnapshotMismatchError,
    UnknownTrialError,
    ValidateAfter,
    searcher_length,
)
from control_plane.core.searcher.fixed_length import GridSearch, RandomSearch, SingleSearch
from control_plane.core.searcher.hparams import grid_size
from control_plane.core.searcher.methods import SEARCH_METHODS, new_search_method, restore_search_method

__all__ = [
    "SEARCH_METHODS",
    "AdaptiveAshaSearch",
    "BaseSearchMethod",
    "BracketPlan",
    "Close",
    "Create",
    "ExitedReason",
    "GridSearch",
    "Operation",
    "RandomSearch",
    "SearchMethod",
    "Shutdown",
    "SingleSearch",
    "SnapshotMismatchError",
    "UnknownTrialError",
    "ValidateAfter",
    "adaptive_asha_plan",
    "asha_rungs_fit",
    "grid_size",
    "new_search_method",
    "restore_search_method",
    "searcher_length",
]
