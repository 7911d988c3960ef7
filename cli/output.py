"""Tables (rich) and --json output."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title, show_lines=False, header_style="bold")
    for h in headers:
        t.add_column(h, overflow="fold")
    for r in rows:
        t.add_row(*["" if v is None else str(v) for v in r])
    Console(width=max(100, _term_width())).print(t)


def kv(pairs: Sequence[tuple[str, Any]]) -> None:
    width = max((len(k) for k, _ in pairs), default=0)
    for k, v in pairs:
        print(f"{k.ljust(width)}  {'' if v is None else v}")


def _term_width() -> int:
    import shutil

    return shutil.get_terminal_size((120, 40)).columns


def short_state(state: str | None) -> str:
    return (state or "").removeprefix("STATE_")
