"""What the CLI shows and asks: tables (rich), key-value lists, --json, and the yes/no question before a
deletion. The values in them are formatted by cli.formatting."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Sequence
from typing import Any

from cli.errors import CliError
from cli.formatting import fmt_json, fmt_metric, short_state


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None) -> None:
    # rich is imported when a table is printed: ~50 ms that `det --help` and --json output need not pay.
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
    return shutil.get_terminal_size((120, 40)).columns


def trials_table(trials: list[dict[str, Any]], title: str | None = None) -> None:
    """Trials as a table. The rung column only when some trial has left rung 0 (ASHA), so that the
    checkpoint UUID is not folded in a 100-column table."""
    with_rung = any(t.get("rung") for t in trials)
    headers = ["ID", "State", "H-Params", *(["Rung"] if with_rung else []), "Steps", "Best", "Restarts", "Checkpoint"]
    rows = [[t["id"], short_state(t.get("state")), fmt_json(t.get("hparams")),
             *([t.get("rung")] if with_rung else []), t.get("totalBatchesProcessed"),
             fmt_metric(t.get("searcherMetricValue")), t.get("restarts"),
             t.get("latestCheckpointUuid") or (t.get("bestCheckpoint") or {}).get("uuid") or ""] for t in trials]
    table(headers, rows, title=title)


def confirm(question: str, yes: bool) -> bool:
    if yes:
        return True
    if not sys.stdin or not sys.stdin.isatty():
        raise CliError(f"{question} (not asking: stdin is not a terminal; pass --yes)")
    return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")
