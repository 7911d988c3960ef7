"""Build a search method from an experiment's (validated, defaulted) config, or restore one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from control_plane.core.searcher.asha import AdaptiveAshaSearch
from control_plane.core.searcher.base import BaseSearchMethod
from control_plane.core.searcher.fixed_length import GridSearch, RandomSearch, SingleSearch

if TYPE_CHECKING:  # annotations only: expconf imports this package (rung and grid arithmetic)
    from control_plane.core.expconf.models.searcher import SearcherConfig

SEARCH_METHODS: dict[str, type[BaseSearchMethod]] = {
    cls.name: cls for cls in (SingleSearch, RandomSearch, GridSearch, AdaptiveAshaSearch)
}


def _method_class(searcher_cfg: SearcherConfig) -> type[BaseSearchMethod]:
    name = searcher_cfg.name
    try:
        return SEARCH_METHODS[name]
    except KeyError:
        raise ValueError(
            f"searcher.name: unsupported searcher {name!r} (expected one of {', '.join(SEARCH_METHODS)})"
        ) from None


def new_search_method(
    searcher_cfg: SearcherConfig, hparams_cfg: Mapping[str, Any], experiment_seed: int
) -> BaseSearchMethod:
    return _method_class(searcher_cfg)(searcher_cfg, hparams_cfg, experiment_seed)


def restore_search_method(
    searcher_cfg: SearcherConfig,
    hparams_cfg: Mapping[str, Any],
    experiment_seed: int,
    snapshot: Mapping[str, Any],
) -> BaseSearchMethod:
    """The search method exactly as it was when ``snapshot()`` returned ``snapshot``."""
    return _method_class(searcher_cfg).restore(searcher_cfg, hparams_cfg, experiment_seed, snapshot)
