"""Wire models: camelCase JSON like Determined's /api/v1, snake_case in Python."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class Wire(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class StrictWire(Wire):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


def ts(value: datetime | None) -> str | None:
    """RFC 3339 with a Z, as grpc-gateway renders timestamps."""
    if value is None:
        return None
    return value.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Pagination(Wire):
    offset: int = 0
    limit: int = 0
    start_index: int = 0
    end_index: int = 0
    total: int = 0


def pagination(offset: int, limit: int, total: int, returned: int) -> Pagination:
    return Pagination(offset=offset, limit=limit, start_index=offset, end_index=offset + returned, total=total)
