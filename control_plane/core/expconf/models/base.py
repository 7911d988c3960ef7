"""The building blocks every section of the config is made of: the strict model base, bounded
integers, non-empty strings and training lengths (``{batches: 100}``)."""

from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator
from pydantic_core import PydanticCustomError

from control_plane.core.expconf.describe import show, yaml_type

__all__ = [
    "INT32_MAX",
    "INT64_MAX",
    "LENGTH_UNITS",
    "ConfigModel",
    "Int32",
    "Length",
    "NonEmptyStr",
    "PositiveLength",
    "tagged_by",
    "zero_batches",
]

LENGTH_UNITS: tuple[str, ...] = ("batches", "records", "epochs")

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


class ConfigModel(BaseModel):
    # strict: YAML already gives typed scalars, so "2" for an int is a user mistake, not a number.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


Int32 = Annotated[int, Field(le=INT32_MAX)]
NonEmptyStr = Annotated[str, Field(min_length=1)]


def tagged_by(field: str, prefix: str, choices: tuple[str, ...]) -> Callable[[Any], str | None]:
    """The discriminator of a union whose members ``field`` tells apart: a model's or a mapping's
    tag (``prefix=value``), or None (the union's own error) for a value naming none of ``choices``."""

    def tag(value: Any) -> str | None:
        if isinstance(value, BaseModel):
            return f"{prefix}={getattr(value, field)}"
        if isinstance(value, dict) and value.get(field) in choices:
            return f"{prefix}={value[field]}"
        return None

    return tag


class Length(ConfigModel):
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
                {"got": yaml_type(data)},
            )
        keys = list(data)
        unknown = [k for k in keys if k not in LENGTH_UNITS]
        if unknown:
            raise PydanticCustomError(
                "length_unit",
                "unknown unit {unit}; use exactly one of batches, records, epochs",
                {"unit": show(unknown[0])},
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
                {"unit": unit, "got": yaml_type(value)},
            )
        if value < cls._min_units or value > INT64_MAX:
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


def zero_batches() -> Length:
    return Length.model_construct(unit="batches", value=0)
