"""Text as the database can store it."""

from __future__ import annotations

import re

_SURROGATES = re.compile(r"[\ud800-\udfff]")


def clean_text(value: str) -> str:
    """PostgreSQL text cannot hold NUL and UTF-8 cannot hold lone surrogates (what undecodable bytes
    become in some clients); both are stored as U+FFFD."""
    if "\x00" in value:
        value = value.replace("\x00", "\ufffd")
    return _SURROGATES.sub("\ufffd", value)
