"""The searcher section: one model per supported search method, told apart by ``name``."""

from typing import Annotated, Literal

from pydantic import Discriminator, Field, FiniteFloat, Tag

from control_plane.core.expconf.models.base import (
    INT64_MAX,
    ConfigModel,
    Int32,
    Length,
    NonEmptyStr,
    PositiveLength,
    tagged_by,
)

__all__ = [
    "SEARCHER_NAMES",
    "AdaptiveASHASearcher",
    "GridSearcher",
    "RandomSearcher",
    "SearcherConfig",
    "SingleSearcher",
]

SEARCHER_NAMES: tuple[str, ...] = ("single", "random", "grid", "adaptive_asha")


class _SearcherBase(ConfigModel):
    name: str  # narrowed to a Literal by each searcher; declared here so dumps list it first
    metric: NonEmptyStr
    smaller_is_better: bool = True
    source_trial_id: Int32 | None = Field(default=None, ge=1)
    source_checkpoint_uuid: NonEmptyStr | None = None

    def training_length(self) -> tuple[str, int] | None:
        """``(unit, amount)`` a trial trains for at most; the unit is batches/records/epochs or,
        for ``max_time``, the ``time_metric`` name. None when the training code decides."""
        max_length: Length | None = getattr(self, "max_length", None)
        if max_length is not None:
            return (max_length.unit, max_length.value)
        max_time: int | None = getattr(self, "max_time", None)
        time_metric: str | None = getattr(self, "time_metric", None)
        if max_time is not None and time_metric is not None:
            return (time_metric, max_time)
        return None


class SingleSearcher(_SearcherBase):
    """One trial with constant hyperparameters (non-constant ones are sampled once)."""

    name: Literal["single"]
    max_length: PositiveLength | None = None


class RandomSearcher(_SearcherBase):
    name: Literal["random"]
    max_trials: Int32 = Field(ge=1)
    max_length: PositiveLength | None = None
    # 0 means unlimited.
    max_concurrent_trials: Int32 = Field(default=16, ge=0)


class GridSearcher(_SearcherBase):
    name: Literal["grid"]
    max_length: PositiveLength | None = None
    max_concurrent_trials: Int32 = Field(default=16, ge=0)


class AdaptiveASHASearcher(_SearcherBase):
    name: Literal["adaptive_asha"]
    max_trials: Int32 = Field(ge=1)
    # Exactly one of max_length, or max_time with time_metric (Determined >= 0.38).
    max_length: PositiveLength | None = None
    max_time: Annotated[int, Field(ge=1, le=INT64_MAX)] | None = None
    time_metric: NonEmptyStr | None = None
    mode: Literal["aggressive", "standard", "conservative"] = "standard"
    divisor: FiniteFloat = Field(default=4.0, gt=1)
    max_rungs: Int32 = Field(default=5, ge=1)
    max_concurrent_trials: Int32 = Field(default=16, ge=0)
    stop_once: bool = False
    bracket_rungs: list[Annotated[int, Field(ge=1)]] = []


SearcherConfig = Annotated[
    Annotated[SingleSearcher, Tag("searcher=single")]
    | Annotated[RandomSearcher, Tag("searcher=random")]
    | Annotated[GridSearcher, Tag("searcher=grid")]
    | Annotated[AdaptiveASHASearcher, Tag("searcher=adaptive_asha")],
    Discriminator(
        tagged_by("name", "searcher", SEARCHER_NAMES),
        custom_error_type="searcher_name",
        custom_error_message="unknown searcher",
    ),
]
