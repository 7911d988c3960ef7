"""A pool's consolidation settings and disruption budget: the nested `consolidation:` section of an
elastic pool's `provider:` settings (`ElasticSettings.consolidation`), the one home of its defaults.

Consolidation moves the running work of an instance, by checkpoint and resume, onto the free slots
of the pool's other instances, then terminates the emptied instance
(control_plane/core/scaling/consolidation.py decides, control_plane/loops/autoscaler/consolidate.py
applies). Every move interrupts a trial for one checkpoint, one exit and one restore, so it is off
unless the pool asks for it (`enabled: true`), and bounded by the budget below when on.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any

from pydantic import BeforeValidator, Field

from shipyard_common.settings import Duration, StrictSettings, validate

DEFAULT_CONSOLIDATION_ENABLED = False
#: At most this many allocations moved per pool in any hour. 30, not 2: on benchmarks/elastic_trace.py's
#: day traces 2 an hour empties few instances (an 8-GPU one often runs 3 to 7 trials), leaving
#: provisioned/used at 1.26-1.29; 30 gives 1.17-1.19, while min_run_time bounds how often one trial moves.
DEFAULT_MAX_MOVES_PER_HOUR = 30
#: An allocation is moved only after it has run this long since it started (a move restarts it).
DEFAULT_MIN_RUN_TIME = timedelta(minutes=30)


class ConsolidationSettings(StrictSettings):
    """`provider.consolidation`: whether the pool consolidates, and its disruption budget."""

    enabled: bool = DEFAULT_CONSOLIDATION_ENABLED
    max_moves_per_hour: int = Field(DEFAULT_MAX_MOVES_PER_HOUR, ge=0)
    min_run_time: Duration = DEFAULT_MIN_RUN_TIME


def _section(value: Any) -> Any:
    """The section validated as its own model, so that its problems name its own fields."""
    return value if isinstance(value, ConsolidationSettings) else validate(ConsolidationSettings, value)


#: The field type `ElasticSettings.consolidation` declares.
ConsolidationSection = Annotated[ConsolidationSettings, BeforeValidator(_section)]
