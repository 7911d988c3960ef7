"""Wire models: camelCase JSON like Determined's /api/v1, snake_case in Python."""

from __future__ import annotations

from datetime import datetime

from shipyard_common.wire import rfc3339
from shipyard_common.wire_model import StrictWire, Wire

__all__ = ["Pagination", "StrictWire", "Wire", "pagination", "ts"]


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
