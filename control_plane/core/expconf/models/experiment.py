"""The whole experiment config, and the one typed accessor for a stored one
(``ExperimentConfig.from_stored``) with its inverse, ``config_to_dict``."""

import functools
import json
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import orjson
from pydantic import BeforeValidator, Field, Strict, ValidationError
from pydantic_core import PydanticCustomError

from control_plane.core.expconf.defaults import merge_defaults
from control_plane.core.expconf.describe import show
from control_plane.core.expconf.errors import ConfigInvalid
from control_plane.core.expconf.messages import field_errors
from control_plane.core.expconf.models.base import (
    INT32_MAX,
    INT64_MAX,
    ConfigModel,
    Length,
    NonEmptyStr,
    zero_batches,
)
from control_plane.core.expconf.models.environment import Environment
from control_plane.core.expconf.models.hyperparameters import Hyperparameter
from control_plane.core.expconf.models.resources import Resources
from control_plane.core.expconf.models.searcher import SearcherConfig
from control_plane.core.expconf.models.storage import CheckpointStorage

__all__ = ["BindMount", "Entrypoint", "ExperimentConfig", "Profiling", "Reproducibility", "config_to_dict"]


class BindMount(ConfigModel):
    host_path: NonEmptyStr
    container_path: NonEmptyStr
    read_only: bool = False
    propagation: str = "rprivate"


class Reproducibility(ConfigModel):
    # Determined: 0 <= seed < 2**31. None only if neither the config nor the caller chose one.
    experiment_seed: Annotated[int, Field(ge=0, le=INT32_MAX)] | None = None


class Profiling(ConfigModel):
    enabled: bool = False
    begin_on_batch: Annotated[int, Field(ge=0)] = 0
    end_after_batch: Annotated[int, Field(ge=0)] | None = None
    sync_timings: bool = True


def _check_entrypoint(value: Any) -> Any:
    if isinstance(value, str) and value.strip():
        return value
    if isinstance(value, list) and value and all(isinstance(v, str) and v for v in value):
        return value
    raise PydanticCustomError(
        "entrypoint",
        "must be a non-empty string or a non-empty list of non-empty strings (got {got})",
        {"got": show(value)},
    )


Entrypoint = Annotated[str | list[str], BeforeValidator(_check_entrypoint)]


class ExperimentConfig(ConfigModel):
    """A validated, fully defaulted experiment config (Determined field names)."""

    name: str | None = None
    description: str | None = None
    labels: list[NonEmptyStr] = []
    workspace: NonEmptyStr | None = None
    project: NonEmptyStr | None = None
    data: dict[str, Any] = {}
    entrypoint: Entrypoint
    hyperparameters: dict[str, Hyperparameter] = {}
    searcher: SearcherConfig
    resources: Resources = Resources()
    max_restarts: Annotated[int, Strict(), Field(ge=0, le=INT32_MAX)] = 5
    min_validation_period: Length = Field(default_factory=zero_batches)
    min_checkpoint_period: Length = Field(default_factory=zero_batches)
    perform_initial_validation: bool = False
    checkpoint_policy: Literal["best", "all", "none"] = "best"
    checkpoint_storage: CheckpointStorage
    environment: Environment = Environment()
    bind_mounts: list[BindMount] = []
    records_per_epoch: Annotated[int, Strict(), Field(ge=0, le=INT64_MAX)] = 0
    scheduling_unit: Annotated[int, Strict(), Field(ge=1, le=INT32_MAX)] = 100
    reproducibility: Reproducibility = Reproducibility()
    profiling: Profiling = Profiling()
    optimizations: dict[str, Any] = {}
    log_policies: list[dict[str, Any]] = []
    debug: bool = False

    @classmethod
    def from_stored(cls, stored: Mapping[str, Any]) -> "ExperimentConfig":
        """The typed, fully defaulted config of a stored experiment (``Experiment.config``).

        The one way the rest of the master reads an experiment's config: defaults live in this
        model only. Rows written by older versions go through the same model, so a field they lack
        gets today's default. Cached by content (the model is frozen, so sharing it is safe).
        Raises ``ConfigInvalid`` if the row no longer validates."""
        return _from_stored(_canonical(stored))

    @property
    def searcher_seed(self) -> int:
        """The experiment seed the searcher runs with; 0 for a row stored before a seed was
        always chosen at creation."""
        return self.reproducibility.experiment_seed or 0


def _canonical(stored: Mapping[str, Any]) -> str | bytes:
    """The cache key of a stored config: its JSON with sorted keys. orjson writes it in an eighth
    of `json`'s time (a listing of experiments and every validation report read a config); what
    orjson cannot write (an integer beyond 64 bits) falls back to `json`. A stored config holds no
    NaN or infinity (the parser refuses them), the one place the two would read back differently."""
    try:
        return orjson.dumps(stored, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:
        return json.dumps(stored, sort_keys=True, separators=(",", ":"))


@functools.lru_cache(maxsize=512)
def _from_stored(canonical: str | bytes) -> ExperimentConfig:
    raw = merge_defaults(json.loads(canonical))
    try:
        return ExperimentConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigInvalid(field_errors(ExperimentConfig, raw, exc)) from None


def config_to_dict(cfg: ExperimentConfig) -> dict[str, Any]:
    """The fully defaulted config as JSON-safe data (what the database stores and the API returns).
    Feeding it back to ``parse_experiment_config`` yields the same config."""
    return cfg.model_dump(mode="json")
