"""Structured logging: one event per line, key=value."""

from __future__ import annotations

import logging
import sys


def setup_logging(level: str = "info", stream=None) -> None:  # type: ignore[no-untyped-def]
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(logging.Formatter("ts=%(asctime)s level=%(levelname)s logger=%(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # uvicorn's access log would print every metrics post; keep it at warning.
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
