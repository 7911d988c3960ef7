"""Streamed responses: newline-delimited JSON objects `{"result": …}` (or `{"error": …}`), exactly
what grpc-gateway sends and what the Determined client's `iter_lines` reads.

Streaming endpoints never hold the request's `deps.get_db` session: FastAPI closes it only after
the response, and on SQLite an open transaction would block the writers the stream waits for.
Each page is read in its own short session in a worker thread."""

from __future__ import annotations

import json
from typing import Any

STREAM_MEDIA_TYPE = "application/x-ndjson"  # one JSON object per line, not one JSON document
STREAM_BATCH = 1000


def ndjson(obj: dict[str, Any]) -> bytes:
    return (json.dumps(obj, allow_nan=False, separators=(",", ":")) + "\n").encode()


def stream_error(message: str, code: int = 500) -> bytes:
    return ndjson({"error": {"grpcCode": 13, "httpCode": code, "message": message, "httpStatus": "Internal Server Error"}})
