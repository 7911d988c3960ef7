"""Hyperparameters: the five leaf types, Determined's shorthands (a scalar is a constant, a mapping
without ``type`` is a nested group), and the views the searcher and the grid checks take."""

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Discriminator, Field, FiniteFloat, Tag, TypeAdapter
from typing_extensions import TypeAliasType

from control_plane.core.expconf.models.base import ConfigModel, Int32
from control_plane.core.searcher.hparams import grid_size as searcher_grid_size
from control_plane.core.searcher.hparams import grid_values

__all__ = [
    "HYPERPARAMETER_TYPES",
    "CategoricalHyperparameter",
    "ConstHyperparameter",
    "DoubleHyperparameter",
    "Hyperparameter",
    "IntHyperparameter",
    "LeafHyperparameter",
    "LogHyperparameter",
    "flatten_hyperparameters",
    "grid_axis",
    "grid_size",
    "hyperparameters_to_dict",
]

HYPERPARAMETER_TYPES: tuple[str, ...] = ("const", "int", "double", "log", "categorical")


class ConstHyperparameter(ConfigModel):
    type: Literal["const"]
    val: Any


class IntHyperparameter(ConfigModel):
    type: Literal["int"]
    minval: int
    maxval: int
    count: Int32 | None = Field(default=None, ge=1)


class DoubleHyperparameter(ConfigModel):
    type: Literal["double"]
    minval: FiniteFloat
    maxval: FiniteFloat
    count: Int32 | None = Field(default=None, ge=1)


class LogHyperparameter(ConfigModel):
    """Values are ``base ** x`` for exponents x in [minval, maxval]."""

    type: Literal["log"]
    minval: FiniteFloat
    maxval: FiniteFloat
    base: FiniteFloat = Field(gt=0)
    count: Int32 | None = Field(default=None, ge=1)


class CategoricalHyperparameter(ConfigModel):
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
