"""Wire models: camelCase JSON like Determined's /api/v1, snake_case in Python."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from annotated_types import Ge, Le
from pydantic import model_validator

from shipyard_common.wire import rfc3339
from shipyard_common.wire_model import StrictWire, Wire

__all__ = [
    "INT32_MAX", "INT64_MAX", "Count32", "Count64", "Id", "Int32", "Int64", "Pagination", "ProtoWire", "StrictWire", "Wire",
    "pagination", "ts",
]

# Every integer the API takes is bounded by the column it ends up in (or is compared with): a
# value beyond it can never match or be stored, and SQLite's driver (OverflowError) and
# PostgreSQL (`integer out of range`) would otherwise turn it into a 500. Out of range is a 400
# naming the field, and the bounds are in the OpenAPI spec. Use these for path, query and body
# integers alike (`annotated_types` constraints work in both places).
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
Int32 = Annotated[int, Ge(-(2**31)), Le(INT32_MAX)]
Int64 = Annotated[int, Ge(-(2**63)), Le(INT64_MAX)]
Id = Annotated[int, Ge(1), Le(INT32_MAX)]  # row ids: Integer columns, as Determined's int32 ids
Count32 = Annotated[int, Ge(0), Le(INT32_MAX)]  # offsets, limits, run ids, versions
Count64 = Annotated[int, Ge(0), Le(INT64_MAX)]  # steps, lengths, byte sizes (BigInteger columns)


def ts(value: datetime | None) -> str | None:
    """RFC 3339 with a Z, as grpc-gateway renders timestamps."""
    if value is None:
        return None
    return rfc3339(value)


class Pagination(Wire):
    offset: int = 0
    limit: int = 0
    start_index: int = 0
    end_index: int = 0
    total: int = 0


def pagination(offset: int, limit: int, total: int, returned: int) -> Pagination:
    return Pagination(offset=offset, limit=limit, start_index=offset, end_index=offset + returned, total=total)


class ProtoWire(StrictWire):
    """A request body parsed as grpc-gateway parses Determined's (proto3's JSON mapping): a JSON
    null for a field is that field's default, as if it were absent. Determined's own client sends
    nulls for what it leaves unset (`create_model(..., metadata=None)`, `notes=None`). Only the
    top level: a null inside a JSON value (metadata) is kept. The hardening of StrictWire applies
    to what remains."""

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None}
        return data
