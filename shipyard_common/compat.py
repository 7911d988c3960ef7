"""What the agent and the harness need from Pythons newer than the oldest they run on (3.9).

The master runs on 3.11+ and gets the standard library's own classes from here."""

from __future__ import annotations

import enum
import sys

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:

    class StrEnum(str, enum.Enum):
        """enum.StrEnum before 3.11: members are strings, and `str()`/`format()` give the value."""

        def __str__(self) -> str:
            return str.__str__(self)

        def __format__(self, spec: str) -> str:
            return str.__format__(str.__str__(self), spec)

        @staticmethod
        def _generate_next_value_(name: str, start: int, count: int, last_values: list[str]) -> str:
            return name.lower()


__all__ = ["StrEnum"]
