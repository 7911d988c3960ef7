"""Every command of the real `det` (determined 0.38.1), and the README's compatibility table read as
the commands its rows cover.

- `cli_tree(python)`: the real CLI's command tree (tests/compat/walk_cli.py, run by the interpreter
  of the venv holding the package: one subprocess).
- `leaves(tree)`: every leaf command path (`("master", "info")`, `("experiment", "set", "weight")`).
- `table_rows(readme)`: the rows of the table under "### Determined's own client": each row's
  first cell names commands in code spans (`det user login / logout / whoami`, `det agent list`,
  `det slot list`), its second its state.

The shorthand of a code span: `det A B / C / D E` is `A B`, `A C`, `A D E`: each part after a ` / `
replaces the end of the first part's path (the longest head of it under which the part names a real
command); `[...]`, flags, placeholders (`ID`, `COMMAND...`) and what follows them are not part of the
path. Aliases (`det e`, `det cmd`) read as their main names. A path that stops at a group
(`det deploy aws`) covers every leaf under it. Rows naming no `det` command (the SDK's, trial code's,
the "by role" rule) cover none."""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WALKER = Path(__file__).resolve().parent / "walk_cli.py"
SECTION = "### Determined's own client"
STATES = ("yes", "partial", "no")
EXEMPT_STATES = ("by role",)  # rows about a rule, not a command
_WORD = re.compile(r"[a-z][a-z0-9_-]*")

Path_ = tuple[str, ...]


def cli_tree(python: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHONPATH", "DET_"))}
    p = subprocess.run([str(python), "-W", "ignore", str(WALKER)], capture_output=True, text=True, env=env,
                       timeout=60, check=False)
    if p.returncode != 0:
        raise RuntimeError(f"walking the 0.38.1 CLI failed ({p.returncode}): {p.stderr[-2000:]}")
    return json.loads(p.stdout)


def leaves(tree: dict[str, Any], prefix: Path_ = ()) -> list[Path_]:
    out: list[Path_] = []
    for name, node in tree.items():
        out.extend(leaves(node["subs"], prefix + (name,)) if node["subs"] else [prefix + (name,)])
    return out


def resolve(tree: dict[str, Any], words: list[str]) -> Path_ | None:
    """The main names of `words` (aliases allowed), or None where they name no command."""
    path: list[str] = []
    level = tree
    for word in words:
        name = next((n for n, node in level.items() if word == n or word in node["aliases"]), None)
        if name is None:
            return None
        path.append(name)
        level = level[name]["subs"]
    return tuple(path) if path else None


def _words(part: str) -> list[str]:
    out = []
    for token in part.split():
        if not _WORD.fullmatch(token):
            break  # a flag or a placeholder: the path ends here
        out.append(token)
    return out


def span_paths(span: str, tree: dict[str, Any]) -> list[Path_]:
    """The command paths one code span names (span without its backticks, starting with `det `);
    ValueError naming the part that names no command."""
    text = span.removeprefix("det ")
    while True:  # [...] may nest: `[--mode auto / direct / master]`
        stripped = re.sub(r"\[[^\[\]]*\]", " ", text)
        if stripped == text:
            break
        text = stripped
    parts = [_words(p) for p in text.split(" / ")]
    first = resolve(tree, parts[0])
    if first is None:
        raise ValueError(f"`{span}`: `{' '.join(parts[0])}` is no command of the 0.38.1 CLI")
    paths = [first]
    for words in parts[1:]:
        found = next((p for k in range(len(first) - 1, -1, -1)
                      if (p := resolve(tree, list(first[:k]) + words)) is not None), None)
        if found is None:
            raise ValueError(f"`{span}`: `{' '.join(words)}` names no command after `{' '.join(first[:-1])}`")
        paths.append(found)
    return paths


@dataclass
class Row:
    cell: str
    state: str  # normalised: lower case, stripped
    notes: str
    paths: list[Path_] = field(default_factory=list)


def table_rows(readme: str, tree: dict[str, Any]) -> list[Row]:
    start = readme.index(SECTION)
    end = readme.find("\n## ", start)
    rows = []
    for line in readme[start:end if end >= 0 else None].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) < 3 or set(cells[1]) <= set("-: ") or cells[1] == "works":
            continue  # not a row, the separator or the header
        spans = [s for s in re.findall(r"`([^`]*)`", cells[0]) if s.startswith("det ")]
        row = Row(cells[0], cells[1].lower(), " | ".join(cells[2:]))
        for span in spans:
            row.paths.extend(span_paths(span, tree))
        rows.append(row)
    return rows


def covered(leaf: Path_, rows: list[Row]) -> bool:
    return any(leaf[:len(p)] == p for row in rows for p in row.paths)
