"""Structured logging: one event per line, key=value.

Values often come from requests (a username, a path, a metric group), so every message is written
with its control characters escaped (`escape_controls`): a newline in a username must not start a
second, forged `event=...` line. A traceback, written after the message, keeps its lines."""

from __future__ import annotations

import logging
import re
import sys

# C0 and C1 control characters, DEL, and the Unicode line and paragraph separators.
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(m: re.Match[str]) -> str:
    c = m.group()
    return _NAMED.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def escape_controls(text: str) -> str:
    """`text` on one line: control characters as escapes (`\\n`, `\\x1b`, `\\u2028`)."""
    return text if text.isprintable() else _CONTROLS.sub(_escaped, text)


class EventFormatter(logging.Formatter):
    """The master's line format, with every message on one line (`escape_controls`)."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        record.message = escape_controls(record.message)
        return super().formatMessage(record)


def setup_logging(level: str = "info", stream=None) -> None:  # type: ignore[no-untyped-def]
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(EventFormatter("ts=%(asctime)s level=%(levelname)s logger=%(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # uvicorn's access log would print every metrics post; keep it at warning.
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
