"""Experiment configuration: Determined-compatible schema, master defaults and validation.

The field names, shapes and defaults follow Determined's expconf (``schemas/expconf/v0``) so that a
config written for Determined 0.38 is accepted as-is. This module is a pure decision core: it parses
text, applies the master's defaults that it is handed, and says yes (a typed, fully defaulted
``ExperimentConfig`` plus warnings) or no (``ConfigInvalid`` listing *every* problem with a dotted
field path and a readable reason). No I/O, no clock, no randomness: the caller supplies the seed.

Deliberate differences from Determined, each a "say no early" choice:

* ``resources.slots_per_trial`` must be >= 1 (Determined allows 0).
* ``adaptive_asha`` refuses a ``max_length`` whose smallest rung would be shorter than one unit
  (Determined lowers ``max_rungs`` instead; ``refuse_short_asha_rungs=False`` does the same and
  only warns).
* Only ``shared_fs``, ``s3`` and ``gcs`` checkpoint storage and the ``single``, ``random``, ``grid``
  and ``adaptive_asha`` searchers are supported.
"""

import difflib
import functools
import json
import math
import posixpath
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import UnionType
from typing import Annotated, Any, ClassVar, Literal, Union, get_args, get_origin

import orjson
import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    FiniteFloat,
    Strict,
    Tag,
    TypeAdapter,
    ValidationError,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError
from typing_extensions import TypeAliasType

from control_plane.core.searcher.asha import rungs_that_fit, smallest_rung_length
from control_plane.core.searcher.hparams import axis_length, grid_values
from control_plane.core.searcher.hparams import grid_size as searcher_grid_size

__all__ = [
    "LENGTH_UNITS",
    "MAX_CONFIG_BYTES",
    "AdaptiveASHASearcher",
    "BindMount",
    "CategoricalHyperparameter",
    "CheckpointStorage",
    "ConfigInvalid",
    "ConstHyperparameter",
    "DeviceImages",
    "DeviceVariables",
    "DoubleHyperparameter",
    "Environment",
    "ExperimentConfig",
    "FieldError",
    "GCSStorage",
    "GridSearcher",
    "Hyperparameter",
    "IntHyperparameter",
    "Length",
    "LogHyperparameter",
    "PositiveLength",
    "Profiling",
    "RandomSearcher",
    "Reproducibility",
    "Resources",
    "S3Storage",
    "SearcherConfig",
    "SharedFSStorage",
    "SingleSearcher",
    "config_to_dict",
    "flatten_hyperparameters",
    "grid_axis",
    "grid_size",
    "hyperparameters_to_dict",
    "merge_defaults",
    "parse_experiment_config",
]

LENGTH_UNITS: tuple[str, ...] = ("batches", "records", "epochs")
# A config is a page of YAML; anything this large is a mistake or an attack on the parser.
MAX_CONFIG_BYTES = 2 * 1024 * 1024
# Bounds on the parsed document: YAML aliases can expand a small text into a huge tree.
_MAX_NODES = 200_000
_MAX_DEPTH = 64
# Nodes in the text itself (aliases not expanded), checked on the event stream before PyYAML
# composes anything: its pure-Python loader spends ~30 µs per node, so this caps the CPU one
# config can cost (well under a second); a real config has a few hundred nodes.
_MAX_DOCUMENT_NODES = 20_000

_INT32_MAX = 2**31 - 1
_INT64_MAX = 2**63 - 1

SEARCHER_NAMES: tuple[str, ...] = ("single", "random", "grid", "adaptive_asha")
STORAGE_TYPES: tuple[str, ...] = ("shared_fs", "s3", "gcs")
HYPERPARAMETER_TYPES: tuple[str, ...] = ("const", "int", "double", "log", "categorical")
_DEVICE_TYPES: tuple[str, ...] = ("cpu", "cuda", "rocm")


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FieldError:
    """One problem in a config. ``path`` is dotted with list indices in brackets
    (``searcher.max_length``, ``bind_mounts[0].host_path``); ``""`` means the whole document."""

    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path or '(config)'}: {self.reason}"


class ConfigInvalid(Exception):
    """The config was refused; ``errors`` lists every problem found, not just the first."""

    def __init__(self, errors: list[FieldError]) -> None:
        self.errors = list(errors)
        super().__init__(str(self))

    def __str__(self) -> str:
        n = len(self.errors)
        lines = [f"invalid experiment configuration ({n} error{'s' if n != 1 else ''}):"]
        lines += [f"  {e}" for e in self.errors]
        return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Building blocks
# --------------------------------------------------------------------------------------------


class _Model(BaseModel):
    # strict: YAML already gives typed scalars, so "2" for an int is a user mistake, not a number.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


Int32 = Annotated[int, Field(le=_INT32_MAX)]
NonEmptyStr = Annotated[str, Field(min_length=1)]


def _yaml_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "mapping"
    return type(value).__name__


def _show(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Length(_Model):
    """A training length in one unit, written ``{batches: 100}`` (or records / epochs)."""

    _min_units: ClassVar[int] = 0

    unit: Literal["batches", "records", "epochs"]
    value: int

    @model_validator(mode="before")
    @classmethod
    def _from_wire(cls, data: Any) -> Any:
        if isinstance(data, Length):
            return data
        if not isinstance(data, dict):
            raise PydanticCustomError(
                "length_type",
                "must be a mapping with exactly one of batches, records, epochs (got {got})",
                {"got": _yaml_type(data)},
            )
        keys = list(data)
        unknown = [k for k in keys if k not in LENGTH_UNITS]
        if unknown:
            raise PydanticCustomError(
                "length_unit",
                "unknown unit {unit}; use exactly one of batches, records, epochs",
                {"unit": _show(unknown[0])},
            )
        if len(keys) != 1:
            got = "none" if not keys else " and ".join(keys)
            raise PydanticCustomError(
                "length_units",
                "must have exactly one of batches, records, epochs (got {got})",
                {"got": got},
            )
        unit = keys[0]
        value = data[unit]
        if type(value) is not int:
            raise PydanticCustomError(
                "length_value",
                "{unit} must be an integer (got {got})",
                {"unit": unit, "got": _yaml_type(value)},
            )
        if value < cls._min_units or value > _INT64_MAX:
            raise PydanticCustomError(
                "length_value",
                "{unit} must be >= {min} (got {value})" if value < cls._min_units else "{unit} is too large",
                {"unit": unit, "min": cls._min_units, "value": value},
            )
        return {"unit": unit, "value": value}

    @model_serializer
    def _to_wire(self) -> dict[str, int]:
        return {self.unit: self.value}


class PositiveLength(Length):
    """A length that must be at least one unit (searcher ``max_length``)."""

    _min_units: ClassVar[int] = 1


def _zero_batches() -> Length:
    return Length.model_construct(unit="batches", value=0)


# --------------------------------------------------------------------------------------------
# Hyperparameters
# --------------------------------------------------------------------------------------------


class ConstHyperparameter(_Model):
    type: Literal["const"]
    val: Any


class IntHyperparameter(_Model):
    type: Literal["int"]
    minval: int
    maxval: int
    count: Int32 | None = Field(default=None, ge=1)


class DoubleHyperparameter(_Model):
    type: Literal["double"]
    minval: FiniteFloat
    maxval: FiniteFloat
    count: Int32 | None = Field(default=None, ge=1)


class LogHyperparameter(_Model):
    """Values are ``base ** x`` for exponents x in [minval, maxval]."""

    type: Literal["log"]
    minval: FiniteFloat
    maxval: FiniteFloat
    base: FiniteFloat = Field(gt=0)
    count: Int32 | None = Field(default=None, ge=1)


class CategoricalHyperparameter(_Model):
    type: Literal["categorical"]
    vals: list[Any] = Field(min_length=1)


LeafHyperparameter = (
    ConstHyperparameter
    | IntHyperparameter
    | DoubleHyperparameter
    | LogHyperparameter
    | CategoricalHyperparameter
)


def _hp_shorthand(value: Any) -> Any:
    # Determined: a scalar (or list) is a constant; a mapping is either typed or a nested group.
    return value if isinstance(value, dict) else {"type": "const", "val": value}


def _hp_tag(value: Any) -> str | None:
    if isinstance(value, BaseModel):
        return f"hp={value.type}"  # type: ignore[attr-defined]
    if not isinstance(value, dict):
        return None
    if "type" not in value:
        return "hp=nested"
    kind = value["type"]
    return f"hp={kind}" if isinstance(kind, str) and kind in HYPERPARAMETER_TYPES else None


Hyperparameter = TypeAliasType(
    "Hyperparameter",
    Annotated[
        Annotated[ConstHyperparameter, Tag("hp=const")]
        | Annotated[IntHyperparameter, Tag("hp=int")]
        | Annotated[DoubleHyperparameter, Tag("hp=double")]
        | Annotated[LogHyperparameter, Tag("hp=log")]
        | Annotated[CategoricalHyperparameter, Tag("hp=categorical")]
        | Annotated[dict[str, "Hyperparameter"], Tag("hp=nested")],
        Discriminator(
            _hp_tag,
            custom_error_type="hp_type",
            custom_error_message="unknown hyperparameter type",
        ),
        BeforeValidator(_hp_shorthand),
    ],
)


def flatten_hyperparameters(
    hparams: Mapping[str, Any], prefix: tuple[str, ...] = ()
) -> dict[tuple[str, ...], LeafHyperparameter]:
    """Every leaf hyperparameter keyed by its route (``("optimizer", "lr")``), in config order."""
    out: dict[tuple[str, ...], LeafHyperparameter] = {}
    for name, hp in hparams.items():
        route = (*prefix, name)
        if isinstance(hp, dict):
            out.update(flatten_hyperparameters(hp, route))
        else:
            out[route] = hp
    return out


_HPARAMS_ADAPTER: TypeAdapter[dict[str, Any]] = TypeAdapter(dict[str, Hyperparameter])


def hyperparameters_to_dict(hparams: Mapping[str, Any]) -> dict[str, Any]:
    """Typed hyperparameters as the plain data the searcher takes (and the database stores)."""
    return _HPARAMS_ADAPTER.dump_python(dict(hparams), mode="json")


def grid_axis(hp: LeafHyperparameter) -> list[Any]:
    """The values a grid search tries for one hyperparameter (Determined's ``getGridAxes``), as
    the grid searcher computes them. ``count`` must be set for int/double/log; int counts are
    clamped to the size of the range."""
    return grid_values(hp.model_dump(mode="json"))


def grid_size(hparams: Mapping[str, Any]) -> int:
    """Number of trials a grid search over ``hparams`` creates: the grid searcher's own count."""
    return searcher_grid_size(hyperparameters_to_dict(hparams))


# --------------------------------------------------------------------------------------------
# Searchers
# --------------------------------------------------------------------------------------------


class _SearcherBase(_Model):
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
    max_time: Annotated[int, Field(ge=1, le=_INT64_MAX)] | None = None
    time_metric: NonEmptyStr | None = None
    mode: Literal["aggressive", "standard", "conservative"] = "standard"
    divisor: FiniteFloat = Field(default=4.0, gt=1)
    max_rungs: Int32 = Field(default=5, ge=1)
    max_concurrent_trials: Int32 = Field(default=16, ge=0)
    stop_once: bool = False
    bracket_rungs: list[Annotated[int, Field(ge=1)]] = []


def _searcher_tag(value: Any) -> str | None:
    if isinstance(value, BaseModel):
        return f"searcher={value.name}"  # type: ignore[attr-defined]
    if isinstance(value, dict) and value.get("name") in SEARCHER_NAMES:
        return f"searcher={value['name']}"
    return None


SearcherConfig = Annotated[
    Annotated[SingleSearcher, Tag("searcher=single")]
    | Annotated[RandomSearcher, Tag("searcher=random")]
    | Annotated[GridSearcher, Tag("searcher=grid")]
    | Annotated[AdaptiveASHASearcher, Tag("searcher=adaptive_asha")],
    Discriminator(_searcher_tag, custom_error_type="searcher_name", custom_error_message="unknown searcher"),
]


# --------------------------------------------------------------------------------------------
# Resources, storage, environment
# --------------------------------------------------------------------------------------------


_BYTE_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(i?b)?\s*$", re.I)
_BYTE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}


def byte_size(value: int | str | None) -> int | None:
    """Bytes from a size as Docker reads one: an integer, or text like ``512m``, ``4G``, ``1.5GiB``
    (binary units); None stays None. Raises ValueError on anything else."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    m = _BYTE_SIZE.match(str(value))
    if not m:
        raise ValueError(f"{value!r} is not a size (bytes, or a number with k, m, g or t, e.g. 4G)")
    return int(float(m.group(1)) * _BYTE_UNITS[m.group(2).lower()])


def _check_byte_size(value: Any) -> Any:
    try:
        byte_size(value)
    except ValueError as e:
        raise PydanticCustomError("byte_size", "{reason}", {"reason": str(e)}) from None
    return value


ByteSize = Annotated[Annotated[int, Field(ge=0)] | NonEmptyStr | None, AfterValidator(_check_byte_size)]


class Resources(_Model):
    slots_per_trial: Int32 = Field(default=1, ge=1)
    max_slots: Int32 | None = Field(default=None, ge=1)
    weight: FiniteFloat = Field(default=1.0, gt=0)
    priority: int | None = Field(default=None, ge=1, le=99)
    # Empty means "the master's default pool"; parse_experiment_config fills in the name.
    resource_pool: str = ""
    # Size of the container's /dev/shm (PyTorch data loaders need more than Docker's 64 MiB).
    shm_size: ByteSize = None
    # Shipyard: the container's memory limit (a trial over it is OOM-killed and says so).
    memory: ByteSize = None
    is_single_node: bool = False
    devices: list[Any] = []
    # Deprecated in Determined, accepted so old configs still load.
    agent_label: str = ""
    native_parallel: bool = False


class _StorageBase(_Model):
    type: str  # narrowed to a Literal by each storage; declared here so dumps list it first
    save_experiment_best: Int32 = Field(default=0, ge=0)
    save_trial_best: Int32 = Field(default=1, ge=0)
    save_trial_latest: Int32 = Field(default=1, ge=0)


class SharedFSStorage(_StorageBase):
    type: Literal["shared_fs"]
    host_path: NonEmptyStr
    storage_path: NonEmptyStr | None = None
    propagation: str = "rprivate"


class S3Storage(_StorageBase):
    type: Literal["s3"]
    bucket: NonEmptyStr
    prefix: str | None = None
    # Both or neither: without keys the agent uses its instance role / default credentials.
    access_key: NonEmptyStr | None = None
    secret_key: NonEmptyStr | None = None
    endpoint_url: NonEmptyStr | None = None


class GCSStorage(_StorageBase):
    type: Literal["gcs"]
    bucket: NonEmptyStr
    prefix: str | None = None


def _storage_tag(value: Any) -> str | None:
    if isinstance(value, BaseModel):
        return f"storage={value.type}"  # type: ignore[attr-defined]
    if isinstance(value, dict) and value.get("type") in STORAGE_TYPES:
        return f"storage={value['type']}"
    return None


CheckpointStorage = Annotated[
    Annotated[SharedFSStorage, Tag("storage=shared_fs")]
    | Annotated[S3Storage, Tag("storage=s3")]
    | Annotated[GCSStorage, Tag("storage=gcs")],
    Discriminator(_storage_tag, custom_error_type="storage_type", custom_error_message="unknown storage"),
]


def _per_device(value: Any, leaf_ok: Any) -> dict[str, Any] | None:
    """If ``value`` is Determined's per-device form ``{cpu:…, cuda:…, rocm:…}`` (``gpu`` is the
    pre-0.17.6 name of ``cuda``), return it keyed by cpu/cuda/rocm; otherwise None."""
    if not isinstance(value, dict) or not value:
        return None
    if not set(value) <= {"cpu", "cuda", "gpu", "rocm"} or not all(leaf_ok(v) for v in value.values()):
        return None
    if "gpu" in value and "cuda" in value:
        raise PydanticCustomError("device_map", "set only one of cuda and gpu (gpu is the old name of cuda)")
    out = dict(value)
    if "gpu" in out:
        out["cuda"] = out.pop("gpu")
    return out


_ENV_NAME = re.compile(r"^[^=\x00]+=", re.S)


def _env_entries(entries: list[Any], where: str) -> list[str]:
    for i, entry in enumerate(entries):
        if not isinstance(entry, str) or not _ENV_NAME.match(entry):
            raise PydanticCustomError(
                "env_entry",
                "{where}entry {i} ({entry}) must be a string NAME=VALUE",
                {"where": where, "i": i, "entry": _show(entry)},
            )
    return list(entries)


def _env_scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _normalize_env_vars(value: Any) -> Any:
    """Accept a list of ``NAME=VALUE``, Determined's per-device map of such lists, or a plain
    ``{NAME: VALUE}`` mapping; store Determined's per-device form."""
    if isinstance(value, DeviceVariables):
        return value
    if value is None:
        return {}
    if isinstance(value, list):
        entries = _env_entries(value, "")
        return {d: entries for d in _DEVICE_TYPES}
    per_device = _per_device(value, lambda v: v is None or isinstance(v, list))
    if per_device is not None:
        return {d: _env_entries(per_device.get(d) or [], f"{d}: ") for d in _DEVICE_TYPES}
    if isinstance(value, dict):
        entries = []
        for name, val in value.items():
            if not name or "=" in name or val is None or isinstance(val, (dict, list)):
                raise PydanticCustomError(
                    "env_entry",
                    "{name}: a NAME: VALUE mapping needs a non-empty name without '=' and a scalar value",
                    {"name": _show(name)},
                )
            entries.append(f"{name}={_env_scalar(val)}")
        return {d: entries for d in _DEVICE_TYPES}
    raise PydanticCustomError(
        "env_type",
        "must be a list of NAME=VALUE strings or a mapping (got {got})",
        {"got": _yaml_type(value)},
    )


class DeviceVariables(_Model):
    """Environment variables per device type, as ``NAME=VALUE`` strings."""

    cpu: list[str] = []
    cuda: list[str] = []
    rocm: list[str] = []

    def as_dict(self, device: Literal["cpu", "cuda", "rocm"] = "cpu") -> dict[str, str]:
        return dict(entry.split("=", 1) for entry in getattr(self, device))  # type: ignore[misc]


def _normalize_image(value: Any) -> Any:
    if isinstance(value, DeviceImages):
        return value
    if value is None:
        return {}
    if isinstance(value, str):
        return {d: value for d in _DEVICE_TYPES}
    per_device = _per_device(value, lambda v: v is None or isinstance(v, str))
    if per_device is not None:
        return per_device
    raise PydanticCustomError(
        "image_type",
        "must be an image name or a mapping with cpu, cuda and/or rocm (got {got})",
        {"got": _yaml_type(value) if not isinstance(value, dict) else "mapping with other keys"},
    )


class DeviceImages(_Model):
    """Container image per device type: agents whose runtime is docker run the trial in it; agents
    running processes refuse a task that sets one."""

    cpu: str | None = None
    cuda: str | None = None
    rocm: str | None = None


class RegistryAuth(_Model):
    """Credentials for pulling `image` (Docker's names, as Determined takes them)."""

    username: str | None = None
    password: str | None = None
    auth: str | None = None
    email: str | None = None
    serveraddress: str | None = None
    identitytoken: str | None = None
    registrytoken: str | None = None


class Environment(_Model):
    image: Annotated[DeviceImages, BeforeValidator(_normalize_image)] = DeviceImages()
    environment_variables: Annotated[DeviceVariables, BeforeValidator(_normalize_env_vars)] = (
        DeviceVariables()
    )
    force_pull_image: bool = False
    registry_auth: RegistryAuth | None = None
    pod_spec: dict[str, Any] | None = None
    add_capabilities: list[str] = []
    drop_capabilities: list[str] = []
    ports: dict[str, Annotated[int, Field(ge=1, le=65535)]] = {}
    proxy_ports: list[dict[str, Any]] = []


class BindMount(_Model):
    host_path: NonEmptyStr
    container_path: NonEmptyStr
    read_only: bool = False
    propagation: str = "rprivate"


class Reproducibility(_Model):
    # Determined: 0 <= seed < 2**31. None only if neither the config nor the caller chose one.
    experiment_seed: Annotated[int, Field(ge=0, le=_INT32_MAX)] | None = None


class Profiling(_Model):
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
        {"got": _show(value)},
    )


Entrypoint = Annotated[str | list[str], BeforeValidator(_check_entrypoint)]


class ExperimentConfig(_Model):
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
    max_restarts: Annotated[int, Strict(), Field(ge=0, le=_INT32_MAX)] = 5
    min_validation_period: Length = Field(default_factory=_zero_batches)
    min_checkpoint_period: Length = Field(default_factory=_zero_batches)
    perform_initial_validation: bool = False
    checkpoint_policy: Literal["best", "all", "none"] = "best"
    checkpoint_storage: CheckpointStorage
    environment: Environment = Environment()
    bind_mounts: list[BindMount] = []
    records_per_epoch: Annotated[int, Strict(), Field(ge=0, le=_INT64_MAX)] = 0
    scheduling_unit: Annotated[int, Strict(), Field(ge=1, le=_INT32_MAX)] = 100
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


# --------------------------------------------------------------------------------------------
# Reading the text
# --------------------------------------------------------------------------------------------


class _ConfigLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys and keeps dates as strings (JSON has no dates)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *defaults` may be overridden by explicit keys, as YAML intends
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:  # unhashable; the base class reports it with its position
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found duplicate key {key!r} (first at line {seen[key].start_mark.line + 1})",
                    key_node.start_mark,
                )
            seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _construct_str(loader: _ConfigLoader, node: yaml.ScalarNode) -> str:
    value = loader.construct_scalar(node)
    # JSON writes astral characters as "\ud83d\ude00"; YAML decodes each half separately.
    if _SURROGATE.search(value):
        try:
            value = value.encode("utf-16", "surrogatepass").decode("utf-16")
        except UnicodeDecodeError:
            pass  # a lone surrogate; reported by _json_problems
    return value


_ConfigLoader.add_constructor("tag:yaml.org,2002:str", _construct_str)
# YAML 1.1 (PyYAML) reads ``1e-5`` as a string because it has no dot; YAML 1.2, JSON and
# Determined's Go parser read a float. Same pattern as PyYAML's, with the dot made optional
# when there is an exponent.
_FLOAT = re.compile(
    r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
    |[-+]?\.[0-9_]+(?:[eE][-+]?[0-9]+)?
    |[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)
_ConfigLoader.yaml_implicit_resolvers = {
    ch: [
        (tag, _FLOAT if tag == "tag:yaml.org,2002:float" else rx)
        for tag, rx in resolvers
        if tag != "tag:yaml.org,2002:timestamp"
    ]
    for ch, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _load_document(text: str | bytes) -> Any:
    if isinstance(text, (bytes, bytearray)):
        if len(text) > MAX_CONFIG_BYTES:
            raise ConfigInvalid([FieldError("", f"config is larger than {MAX_CONFIG_BYTES} bytes")])
        try:
            text = bytes(text).decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise ConfigInvalid(
                [
                    FieldError(
                        "", f"config is not valid UTF-8 (byte 0x{text[exc.start]:02x} at offset {exc.start})"
                    )
                ]
            ) from None
    elif len(text.encode("utf-8", "surrogatepass")) > MAX_CONFIG_BYTES:
        raise ConfigInvalid([FieldError("", f"config is larger than {MAX_CONFIG_BYTES} bytes")])
    try:
        _check_shape(text)
        return yaml.load(text, Loader=_ConfigLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = exc.problem or exc.context or "unreadable"
        raise ConfigInvalid([FieldError("", f"invalid YAML{where}: {problem}")]) from None
    except yaml.YAMLError as exc:
        raise ConfigInvalid([FieldError("", f"invalid YAML: {exc}")]) from None
    except RecursionError:
        raise ConfigInvalid([FieldError("", "invalid YAML: nested too deeply")]) from None


# libyaml's parser when PyYAML has it (it ships in PyYAML's wheels): a fast, iterative event stream.
_EventLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _check_shape(text: str) -> None:
    """Refuse, from the document's event stream and before it is composed, a document nested
    deeper than _MAX_DEPTH, with more than _MAX_DOCUMENT_NODES nodes, or whose aliases expand to
    more than _MAX_NODES values ("billion laughs"): PyYAML's composer recurses once per level and
    its scanner is quadratic in flow nesting, so 6 KB of `[[[[` cost seconds. Same rules and
    messages as `_json_problems`, which still checks the loaded tree. Malformed text is left to the
    loader, whose messages say where."""
    too_big = f"config is too large (more than {_MAX_NODES} values after expanding aliases)"
    nodes = 0
    expanded: dict[str, int] = {}  # anchor → values its node expands to
    # one entry per open collection: [values inside it so far (expanded), its anchor]
    open_: list[list[Any]] = [[0, None]]
    try:
        for event in yaml.parse(text, Loader=_EventLoader):
            if isinstance(event, yaml.CollectionEndEvent):
                size, anchor = open_.pop()
                if anchor is not None:
                    expanded[anchor] = size
                open_[-1][0] += size
                if open_[-1][0] > _MAX_NODES:
                    raise ConfigInvalid([FieldError("", too_big)])
                continue
            if not isinstance(event, yaml.NodeEvent):
                continue  # stream and document boundaries
            nodes += 1
            if len(open_) - 1 > _MAX_DEPTH:
                raise ConfigInvalid([FieldError("", f"nested more than {_MAX_DEPTH} levels deep")])
            if nodes > _MAX_DOCUMENT_NODES:
                raise ConfigInvalid([FieldError("", f"config is too large (more than {_MAX_DOCUMENT_NODES} values)")])
            if isinstance(event, yaml.CollectionStartEvent):
                open_.append([1, event.anchor])
                continue
            size = expanded.get(event.anchor, 1) if isinstance(event, yaml.AliasEvent) else 1
            if isinstance(event, yaml.ScalarEvent) and event.anchor is not None:
                expanded[event.anchor] = 1
            open_[-1][0] += size
            if open_[-1][0] > _MAX_NODES:
                raise ConfigInvalid([FieldError("", too_big)])
    except yaml.YAMLError:
        return


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _json_problems(doc: Any) -> list[FieldError]:
    """Everything that would not survive a trip through JSON/JSONB, plus size bounds (which also
    stop alias bombs and self-referencing aliases). Problems come out in document order."""
    problems: list[FieldError] = []
    budget = _MAX_NODES
    # (path, node, depth, problem): a non-None problem is reported when popped, keeping order.
    stack: list[tuple[str, Any, int, str | None]] = [("", doc, 0, None)]
    while stack:
        path, node, depth, problem = stack.pop()
        if problem is not None:
            problems.append(FieldError(path, problem))
            continue
        budget -= 1
        if budget < 0:
            return [
                FieldError("", f"config is too large (more than {_MAX_NODES} values after expanding aliases)")
            ]
        if depth > _MAX_DEPTH:
            return [FieldError(path, f"nested more than {_MAX_DEPTH} levels deep")]
        if isinstance(node, dict):
            for key, value in reversed(node.items()):
                if not isinstance(key, str):
                    stack.append(
                        (_join(path, str(key)), None, depth, f"keys must be strings (got {_yaml_type(key)})")
                    )
                elif _string_problem(key) is not None:
                    stack.append((path, None, depth, f"keys {_string_problem(key)}"))
                else:
                    stack.append((_join(path, key), value, depth + 1, None))
        elif isinstance(node, list):
            for i in reversed(range(len(node))):
                stack.append((_join(path, i), node[i], depth + 1, None))
        elif isinstance(node, float):
            if not math.isfinite(node):
                problems.append(FieldError(path, "must be a finite number (got .nan/.inf)"))
        elif isinstance(node, str):
            if _string_problem(node) is not None:
                problems.append(FieldError(path, str(_string_problem(node))))
        elif node is not None and not isinstance(node, (bool, int)):
            problems.append(FieldError(path, f"unsupported YAML value of type {_yaml_type(node)}"))
    return problems


def _string_problem(text: str) -> str | None:
    if "\x00" in text:
        return "must not contain NUL characters"
    if _SURROGATE.search(text):
        return "must be valid Unicode (found an unpaired surrogate)"
    return None


# --------------------------------------------------------------------------------------------
# Master defaults
# --------------------------------------------------------------------------------------------

_STORAGE_COMMON = ("save_experiment_best", "save_trial_best", "save_trial_latest")
_SCHEMA_SECTIONS = (
    "searcher",
    "resources",
    "checkpoint_storage",
    "environment",
    "reproducibility",
    "profiling",
    "min_validation_period",
    "min_checkpoint_period",
)


def _merge_storage(exp: Any, default: Mapping[str, Any] | None) -> Any:
    """Determined's union merge: the experiment's storage wins; the master's fills the gaps. GC
    fields always merge; type-specific fields only when both name the same type (or the
    experiment names none, e.g. ``checkpoint_storage: {save_trial_best: 3}``)."""
    if default is None:
        return exp
    default = {k: v for k, v in default.items() if v is not None}
    if exp is None:
        return dict(default)
    if not isinstance(exp, dict):
        return exp  # wrong type; validation reports it
    merged = {k: v for k, v in default.items() if k in _STORAGE_COMMON}
    if "type" not in exp or exp.get("type") == default.get("type"):
        merged = dict(default)
    merged.update(exp)
    return merged


def merge_defaults(
    raw: Mapping[str, Any],
    *,
    default_checkpoint_storage: Mapping[str, Any] | None = None,
    default_resource_pool: str = "default",
    experiment_seed: int | None = None,
) -> dict[str, Any]:
    """Apply the master's defaults to a parsed (not yet validated) config; returns a new dict.

    Like Determined, an explicit ``null`` in a schema field means "unset, use the default" (stored
    Determined configs are full of them); values inside free-form fields (hyperparameter
    constants, ``data``, ...) are left alone."""
    out = {k: v for k, v in raw.items() if v is not None}
    for section in _SCHEMA_SECTIONS:
        if isinstance(out.get(section), dict):
            out[section] = {k: v for k, v in out[section].items() if v is not None}
    if isinstance(out.get("bind_mounts"), list):
        out["bind_mounts"] = [
            {k: v for k, v in m.items() if v is not None} if isinstance(m, dict) else m
            for m in out["bind_mounts"]
        ]
    storage = _merge_storage(out.get("checkpoint_storage"), default_checkpoint_storage)
    if storage is None:
        out.pop("checkpoint_storage", None)  # reported as missing, with advice
    else:
        out["checkpoint_storage"] = storage

    resources = out.get("resources")
    if resources is None:
        resources = {}
    if isinstance(resources, dict) and not resources.get("resource_pool"):
        resources = {**resources, "resource_pool": default_resource_pool}
    out["resources"] = resources

    repro = out.get("reproducibility")
    if repro is None:
        repro = {}
    if isinstance(repro, dict) and repro.get("experiment_seed") is None and experiment_seed is not None:
        repro = {**repro, "experiment_seed": experiment_seed}
    out["reproducibility"] = repro
    return out


# --------------------------------------------------------------------------------------------
# Turning pydantic's errors into FieldErrors
# --------------------------------------------------------------------------------------------

_UNION_TAGS = frozenset(
    [f"hp={t}" for t in (*HYPERPARAMETER_TYPES, "nested")]
    + [f"searcher={n}" for n in SEARCHER_NAMES]
    + [f"storage={t}" for t in STORAGE_TYPES]
)


def _members(tp: Any, tag: str | None = None) -> list[tuple[str | None, Any]]:
    """Flatten aliases, Annotated and unions into (union tag, type) leaves."""
    if isinstance(tp, TypeAliasType):
        return _members(tp.__value__, tag)
    if isinstance(tp, str):  # the forward reference inside the recursive Hyperparameter alias
        return _members(Hyperparameter, tag)
    if get_origin(tp) is Annotated:
        inner, *meta = get_args(tp)
        own = next((m.tag for m in meta if isinstance(m, Tag)), tag)
        return _members(inner, own)
    if get_origin(tp) in (Union, UnionType):
        return [leaf for arg in get_args(tp) for leaf in _members(arg, tag)]
    return [(tag, tp)]


def _fields_at(loc: tuple[str | int, ...]) -> set[str]:
    """Field names the schema allows at ``loc`` (for "did you mean" hints)."""
    candidates: list[tuple[str | None, Any]] = [(None, ExperimentConfig)]
    for part in loc:
        if isinstance(part, str) and part in _UNION_TAGS:
            candidates = [(t, tp) for t, tp in candidates if t == part] or candidates
            continue
        following: list[tuple[str | None, Any]] = []
        for _, tp in candidates:
            if isinstance(tp, type) and issubclass(tp, BaseModel) and part in tp.model_fields:
                following += _members(tp.model_fields[part].annotation)
            elif get_origin(tp) is dict and isinstance(part, str):
                following += _members(get_args(tp)[1])
            elif get_origin(tp) is list and isinstance(part, int):
                following += _members(get_args(tp)[0])
        candidates = following
    names: set[str] = set()
    for _, tp in candidates:
        if isinstance(tp, type) and issubclass(tp, Length):
            names.update(LENGTH_UNITS)
        elif isinstance(tp, type) and issubclass(tp, BaseModel):
            names.update(tp.model_fields)
    return names


def _resolve_loc(raw: Any, loc: tuple[str | int, ...]) -> tuple[str, Any, Any]:
    """Walk ``loc`` through the raw document, dropping union tags; returns (path, node, parent)."""
    path, node, parent = "", raw, None
    for part in loc:
        if isinstance(part, str) and part in _UNION_TAGS and not (isinstance(node, dict) and part in node):
            continue
        if isinstance(node, dict) and part in node:
            parent, node = node, node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            parent, node = node, node[part]
        else:
            parent, node = node, None
        path = _join(path, part)
    return path, node, parent


def _bound(ctx: dict[str, Any], key: str) -> Any:
    value = ctx.get(key)
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _reason(err: Mapping[str, Any], path: str, node: Any) -> tuple[str, str]:
    kind = err["type"]
    ctx = err.get("ctx") or {}
    got = err.get("input")
    field = path.rsplit(".", 1)[-1]
    if kind == "missing":
        if path == "checkpoint_storage":
            return path, (
                "no checkpoint storage configured: set checkpoint_storage in the experiment config "
                "or a default checkpoint_storage in the master config"
            )
        return path, "required field is missing"
    if kind == "extra_forbidden":
        allowed = _fields_at(tuple(err["loc"])[:-1])
        hint = difflib.get_close_matches(field, allowed, n=1, cutoff=0.75)
        return path, "unknown field" + (f" (did you mean {hint[0]!r}?)" if hint else "")
    if kind == "hp_type":
        if not isinstance(node, dict):
            return path, f"must be a hyperparameter mapping (got {_yaml_type(node)})"
        return _join(path, "type"), (
            f"unknown hyperparameter type {_show(node.get('type'))}; "
            f"expected one of {', '.join(HYPERPARAMETER_TYPES)}"
        )
    if kind == "searcher_name":
        if not isinstance(node, dict):
            return path, f"must be a mapping (got {_yaml_type(node)})"
        if "name" not in node:
            return _join(path, "name"), "required field is missing"
        return _join(path, "name"), (
            f"unknown searcher {_show(node['name'])}; expected one of {', '.join(SEARCHER_NAMES)}"
        )
    if kind == "storage_type":
        if not isinstance(node, dict):
            return path, f"must be a mapping (got {_yaml_type(node)})"
        if "type" not in node:
            return _join(path, "type"), "required field is missing"
        return _join(path, "type"), (
            f"unsupported checkpoint storage type {_show(node['type'])}; "
            f"expected one of {', '.join(STORAGE_TYPES)}"
        )
    type_names = {
        "int_type": "an integer",
        "int_from_float": "an integer",
        "float_type": "a number",
        "string_type": "a string",
        "bool_type": "a boolean (true or false)",
        "list_type": "a list",
        "dict_type": "a mapping",
        "model_type": "a mapping",
        "model_attributes_type": "a mapping",
    }
    if kind in type_names:
        return path, f"must be {type_names[kind]} (got {_yaml_type(got)})"
    if kind == "greater_than_equal":
        return path, f"must be >= {_bound(ctx, 'ge')} (got {_show(got)})"
    if kind == "greater_than":
        return path, f"must be > {_bound(ctx, 'gt')} (got {_show(got)})"
    if kind == "less_than_equal":
        return path, f"must be <= {_bound(ctx, 'le')} (got {_show(got)})"
    if kind == "less_than":
        return path, f"must be < {_bound(ctx, 'lt')} (got {_show(got)})"
    if kind == "too_short":
        if ctx.get("min_length") == 1:
            return path, "must not be empty"
        return path, f"must have at least {ctx.get('min_length')} items"
    if kind == "string_too_short":
        return path, "must not be empty"
    if kind == "finite_number":
        return path, "must be a finite number"
    if kind == "literal_error":
        return path, f"must be one of {ctx.get('expected')} (got {_show(got)})"
    message = str(err.get("msg", "is invalid"))
    message = message.removeprefix("Value error, ")
    if message.startswith("Input should be "):
        message = "must be " + message.removeprefix("Input should be ")
    return path, message


def _field_errors(raw: Any, exc: ValidationError) -> list[FieldError]:
    out: list[FieldError] = []
    for err in exc.errors(include_url=False):
        path, node, _ = _resolve_loc(raw, tuple(err["loc"]))
        out.append(FieldError(*_reason(err, path, node)))
    return out


# --------------------------------------------------------------------------------------------
# Checks pydantic cannot express (they need several fields or a precise path)
# --------------------------------------------------------------------------------------------

_FIELD_ADAPTERS: dict[str, TypeAdapter[Any]] = {
    name: TypeAdapter(Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation)
    for name, info in ExperimentConfig.model_fields.items()
}


_HP_ADAPTER: TypeAdapter[Any] = TypeAdapter(Hyperparameter)


def _valid_hparams(raw: dict[str, Any]) -> dict[str, Any]:
    """The hyperparameters that validate on their own, so their range checks still run when a
    sibling is broken (the broken one is already reported)."""
    out: dict[str, Any] = {}
    for name, value in raw.items():
        try:
            out[name] = _HP_ADAPTER.validate_python(value)
        except ValidationError:
            if isinstance(value, dict) and "type" not in value:
                out[name] = _valid_hparams(value)
    return out


def _route_path(route: tuple[str, ...]) -> str:
    return ".".join(("hyperparameters", *route))


def _check_hyperparameters(hparams: dict[str, Any], errors: list[FieldError], warnings: list[str]) -> None:
    for route, hp in flatten_hyperparameters(hparams).items():
        path = _route_path(route)
        if isinstance(hp, (IntHyperparameter, DoubleHyperparameter, LogHyperparameter)):
            if hp.minval >= hp.maxval:
                errors.append(
                    FieldError(
                        _join(path, "minval"),
                        f"minval ({hp.minval}) must be less than maxval ({hp.maxval})",
                    )
                )
        if isinstance(hp, LogHyperparameter) and hp.base == 1:
            warnings.append(f"{path}.base: a log hyperparameter with base 1 always takes the value 1")


def _check_searcher(
    searcher: Any,
    hparams: dict[str, Any] | None,
    max_grid_trials: int,
    errors: list[FieldError],
    warnings: list[str],
    refuse_short_rungs: bool,
) -> None:
    if searcher.source_trial_id is not None and searcher.source_checkpoint_uuid is not None:
        errors.append(
            FieldError(
                "searcher.source_checkpoint_uuid",
                "set at most one of source_trial_id and source_checkpoint_uuid",
            )
        )
    if searcher.metric != searcher.metric.strip():
        warnings.append(f"searcher.metric: {searcher.metric!r} has leading or trailing whitespace")

    max_trials = getattr(searcher, "max_trials", None)
    max_concurrent = getattr(searcher, "max_concurrent_trials", 0)
    if max_trials is not None and max_concurrent > max_trials:
        warnings.append(
            f"searcher.max_concurrent_trials: {max_concurrent} is more than max_trials ({max_trials}); "
            f"at most {max_trials} trials will run at once"
        )

    if isinstance(searcher, AdaptiveASHASearcher):
        _check_asha(searcher, errors, warnings, refuse_short_rungs)

    if hparams is None:
        return
    leaves = flatten_hyperparameters(hparams)
    if isinstance(searcher, SingleSearcher):
        varying = [".".join(r) for r, hp in leaves.items() if not isinstance(hp, ConstHyperparameter)]
        if varying:
            warnings.append(
                "hyperparameters: the single searcher samples one value for non-constant "
                f"hyperparameters ({', '.join(varying)})"
            )
    if isinstance(searcher, GridSearcher):
        missing = False
        for route, hp in leaves.items():
            if (
                isinstance(hp, (IntHyperparameter, DoubleHyperparameter, LogHyperparameter))
                and hp.count is None
            ):
                errors.append(
                    FieldError(
                        _join(_route_path(route), "count"),
                        "grid search requires count for int, double and log hyperparameters",
                    )
                )
                missing = True
        if missing or any(
            isinstance(hp, (IntHyperparameter, DoubleHyperparameter, LogHyperparameter))
            and hp.minval >= hp.maxval
            for hp in leaves.values()
        ):
            return
        size = grid_size(hparams)
        if size > max_grid_trials:
            lengths = {".".join(r): axis_length(hp.model_dump(mode="json")) for r, hp in leaves.items()}
            axes = [f"{name}: {n}" for name, n in lengths.items() if n > 1]
            errors.append(
                FieldError(
                    "hyperparameters",
                    f"grid search would create {size} trials ({' x '.join(axes)}), "
                    f"more than the limit of {max_grid_trials}",
                )
            )
        elif max_concurrent > size:
            warnings.append(
                f"searcher.max_concurrent_trials: {max_concurrent} is more than the {size} grid points; "
                f"at most {size} trials will run at once"
            )


def _check_asha(
    searcher: AdaptiveASHASearcher, errors: list[FieldError], warnings: list[str], refuse_short_rungs: bool
) -> None:
    has_time = searcher.max_time is not None or searcher.time_metric is not None
    if searcher.max_length is not None and has_time:
        errors.append(
            FieldError("searcher.max_time", "set either max_length or max_time with time_metric, not both")
        )
        return
    if searcher.max_length is None and not has_time:
        errors.append(
            FieldError(
                "searcher.max_length", "adaptive_asha requires max_length (or max_time with time_metric)"
            )
        )
        return
    if has_time:
        if searcher.max_time is None:
            errors.append(FieldError("searcher.max_time", "required when time_metric is set"))
            return
        if searcher.time_metric is None:
            errors.append(FieldError("searcher.time_metric", "required when max_time is set"))
            return
        field, unit, total = "searcher.max_time", searcher.time_metric, searcher.max_time
    else:
        assert searcher.max_length is not None
        field, unit, total = "searcher.max_length", searcher.max_length.unit, searcher.max_length.value
    # The bracket with the most rungs starts at max / divisor**(max_rungs-1); under one unit the
    # rung cannot be trained (the searcher plans fewer rungs, as Determined does).
    divisor, rungs = searcher.divisor, searcher.max_rungs
    fits = rungs_that_fit(total, divisor)
    if fits < rungs:
        smallest = smallest_rung_length(total, rungs, divisor)
        needed = total / smallest
        what = (
            f"the smallest rung would be {smallest:.3g} {unit} ({total} / divisor {_fmt_num(divisor)} ** "
            f"(max_rungs {rungs} - 1)), less than one unit"
        )
        if refuse_short_rungs:
            errors.append(
                FieldError(
                    field,
                    f"{what}: raise it to at least {math.ceil(needed - 1e-9)} {unit}, "
                    f"or set max_rungs to {fits} or less",
                )
            )
        else:
            warnings.append(
                f"{field}: {what}; like Determined, at most {fits} rung{'s' if fits != 1 else ''} will be used"
            )


def _fmt_num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _check_storage(storage: Any, errors: list[FieldError]) -> None:
    base = "checkpoint_storage"
    if isinstance(storage, SharedFSStorage):
        if not posixpath.isabs(storage.host_path):
            errors.append(FieldError(f"{base}.host_path", "must be an absolute path"))
        if storage.storage_path is not None:
            sp = storage.storage_path
            if ".." in sp.split("/"):
                errors.append(FieldError(f"{base}.storage_path", "must not contain '..'"))
            elif posixpath.isabs(sp):
                host = posixpath.normpath(storage.host_path)
                norm = posixpath.normpath(sp)
                if norm != host and not norm.startswith(host.rstrip("/") + "/"):
                    errors.append(
                        FieldError(
                            f"{base}.storage_path",
                            "must be a relative directory or a subdirectory of host_path",
                        )
                    )
    if isinstance(storage, (S3Storage, GCSStorage)) and storage.prefix is not None:
        if ".." in storage.prefix.split("/"):
            errors.append(FieldError(f"{base}.prefix", "must not contain '..'"))
    if isinstance(storage, S3Storage):
        if (storage.access_key is None) != (storage.secret_key is None):
            missing = "secret_key" if storage.secret_key is None else "access_key"
            errors.append(FieldError(f"{base}.{missing}", "access_key and secret_key must be set together"))
        if storage.endpoint_url is not None and not re.match(r"^https?://[^/\s]+", storage.endpoint_url):
            errors.append(FieldError(f"{base}.endpoint_url", "must be an http:// or https:// URL"))


def _lengths(parts: Mapping[str, Any]) -> Iterator[tuple[str, Length]]:
    for name in ("min_validation_period", "min_checkpoint_period"):
        if isinstance(parts.get(name), Length):
            yield name, parts[name]
    searcher = parts.get("searcher")
    if searcher is not None and getattr(searcher, "max_length", None) is not None:
        yield "searcher.max_length", searcher.max_length


def _semantic_checks(
    parts: Mapping[str, Any],
    max_grid_trials: int,
    errors: list[FieldError],
    warnings: list[str],
    *,
    hparams_complete: bool,
    refuse_short_rungs: bool,
) -> None:
    hparams = parts.get("hyperparameters")
    if hparams is not None:
        _check_hyperparameters(hparams, errors, warnings)
    if parts.get("searcher") is not None:
        # Grid sizing over a partial set of hyperparameters would be meaningless.
        whole = hparams if hparams_complete else None
        _check_searcher(parts["searcher"], whole, max_grid_trials, errors, warnings, refuse_short_rungs)

    resources = parts.get("resources")
    if isinstance(resources, Resources) and resources.max_slots is not None:
        if resources.max_slots < resources.slots_per_trial:
            errors.append(
                FieldError(
                    "resources.max_slots",
                    f"max_slots ({resources.max_slots}) is less than slots_per_trial "
                    f"({resources.slots_per_trial}); no trial could ever be scheduled",
                )
            )

    if parts.get("checkpoint_storage") is not None:
        _check_storage(parts["checkpoint_storage"], errors)

    for i, mount in enumerate(parts.get("bind_mounts") or []):
        if not posixpath.isabs(mount.host_path):
            errors.append(FieldError(f"bind_mounts[{i}].host_path", "must be an absolute path"))
        if posixpath.normpath(mount.container_path) == ".":
            errors.append(
                FieldError(f"bind_mounts[{i}].container_path", "must not be the working directory '.'")
            )

    if "workspace" in parts and "project" in parts:
        if (parts["workspace"] is None) != (parts["project"] is None):
            missing = "project" if parts["project"] is None else "workspace"
            errors.append(FieldError(missing, "workspace and project must be set together"))

    labels = parts.get("labels") or []
    if len(set(labels)) != len(labels):
        warnings.append("labels: duplicate labels are stored once")

    if parts.get("records_per_epoch") == 0:
        for path, length in _lengths(parts):
            if length.unit == "epochs":
                warnings.append(
                    f"{path}: lengths in epochs need the epoch size; records_per_epoch is not set, so "
                    "only training code that knows its epoch length (e.g. PyTorchTrial) can honour it"
                )


# --------------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------------


def parse_experiment_config(
    text: str | bytes,
    *,
    default_checkpoint_storage: dict[str, Any] | None = None,
    default_resource_pool: str = "default",
    experiment_seed: int | None = None,
    max_grid_trials: int = 10_000,
    refuse_short_asha_rungs: bool = True,
) -> tuple[ExperimentConfig, list[str]]:
    """Parse, default and validate a YAML (or JSON) experiment config.

    Returns the fully defaulted config and human-readable warnings; raises ``ConfigInvalid``
    listing every problem. ``default_checkpoint_storage`` is the master's, merged like Determined
    does; ``experiment_seed`` is used when the config sets none, so the stored config replays.
    ``refuse_short_asha_rungs=False`` turns the "smallest ASHA rung under one unit" error into a
    warning (Determined itself lowers max_rungs in that case)."""
    doc = _load_document(text)
    if not isinstance(doc, dict):
        got = "an empty document" if doc is None else f"a {_yaml_type(doc)}"
        raise ConfigInvalid([FieldError("", f"the config must be a mapping of fields (got {got})")])
    problems = _json_problems(doc)
    if problems:
        raise ConfigInvalid(problems)

    raw = merge_defaults(
        doc,
        default_checkpoint_storage=default_checkpoint_storage,
        default_resource_pool=default_resource_pool,
        experiment_seed=experiment_seed,
    )
    errors: list[FieldError] = []
    warnings: list[str] = []
    config: ExperimentConfig | None = None
    complete = True
    try:
        config = ExperimentConfig.model_validate(raw)
        parts: dict[str, Any] = {name: getattr(config, name) for name in ExperimentConfig.model_fields}
    except ValidationError as exc:
        errors.extend(_field_errors(raw, exc))
        # Validate sections one by one so cross-field checks still run on the parts that are fine.
        parts = {}
        for name, adapter in _FIELD_ADAPTERS.items():
            if name not in raw:
                info = ExperimentConfig.model_fields[name]
                if not info.is_required():
                    parts[name] = info.get_default(call_default_factory=True)
                continue
            try:
                parts[name] = adapter.validate_python(raw[name])
            except ValidationError:
                if name == "hyperparameters" and isinstance(raw[name], dict):
                    parts[name] = _valid_hparams(raw[name])
                    complete = False
    _semantic_checks(
        parts,
        max_grid_trials,
        errors,
        warnings,
        hparams_complete=complete,
        refuse_short_rungs=refuse_short_asha_rungs,
    )
    if errors:
        raise ConfigInvalid(list(dict.fromkeys(errors)))
    assert config is not None
    return config, warnings


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
        raise ConfigInvalid(_field_errors(raw, exc)) from None


def config_to_dict(cfg: ExperimentConfig) -> dict[str, Any]:
    """The fully defaulted config as JSON-safe data (what the database stores and the API returns).
    Feeding it back to ``parse_experiment_config`` yields the same config."""
    return cfg.model_dump(mode="json")
