"""The one exception the CLI turns into a single readable line and a non-zero exit."""

from __future__ import annotations


class CliError(Exception):
    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code
