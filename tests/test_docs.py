"""The docs say what the tree has (issue 25).

The path rule. In docs/ARCHITECTURE.md, docs/CONTRIBUTING.md and docs/PERFORMANCE.md, every inline code
span (text between single backticks, outside fenced blocks) that looks like a repository path must
name something that exists. A span looks like a path when it

- is made only of letters, digits, `_`, `-`, `.` and `/` (so no spaces, `<placeholder>`, `{id}`, `*`,
  `|` or `(...)`: those are commands, routes or patterns, not paths),
- does not start with `/` (a URL path such as /api/v1/...) and holds no `..` (an elision),
- and contains a `/` or ends in `.py`.

It exists when it names a file or folder relative to the repository root, or relative to
`control_plane/` (the docs' shorthand: `api/errors.py` is control_plane/api/errors.py). A span
`a/b.name` whose last part is a module and one of its names (`services/lifecycle.reconcile_all`)
exists when `a/b.py` does.

And docs/ARCHITECTURE.md stays under 2,500 words (as `wc -w` counts them): the principles, the
picture, the flows, where to add, the seams; measured figures live in docs/PERFORMANCE.md."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ("docs/ARCHITECTURE.md", "docs/CONTRIBUTING.md", "docs/PERFORMANCE.md")
BASES = ("", "control_plane")
MAX_ARCHITECTURE_WORDS = 2500

_SPAN = re.compile(r"`([^`\n]+)`")
_PATHLIKE = re.compile(r"[A-Za-z0-9_./-]+")


def _inline_spans(text: str) -> list[str]:
    spans: list[str] = []
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            spans += _SPAN.findall(line)
    return spans


def _looks_like_path(span: str) -> bool:
    return (_PATHLIKE.fullmatch(span) is not None and not span.startswith("/") and ".." not in span
            and ("/" in span or span.endswith(".py")))


def _exists(span: str, root: Path) -> bool:
    candidates = [span]
    last = span.rstrip("/").rsplit("/", 1)[-1]
    if "/" in span and "." in last and not span.endswith((".py", "/")):
        candidates.append(span[: span.rindex(".")] + ".py")  # a module and one of its names
    return any((root / base / c).exists() for base in BASES for c in candidates)


def missing_paths(text: str, root: Path = ROOT) -> list[str]:
    """The path-like spans of `text` that name nothing in the tree at `root`, in order."""
    return [s for s in dict.fromkeys(_inline_spans(text)) if _looks_like_path(s) and not _exists(s, root)]


@pytest.mark.parametrize("doc", DOCS)
def test_every_path_in_the_docs_exists(doc: str) -> None:
    missing = missing_paths((ROOT / doc).read_text(encoding="utf-8"))
    assert missing == [], f"{doc} names paths that do not exist: {missing}"


def test_the_path_check_catches_a_missing_path(tmp_path: Path) -> None:
    (tmp_path / "control_plane" / "services").mkdir(parents=True)
    (tmp_path / "control_plane" / "services" / "lifecycle.py").write_text("")
    (tmp_path / "pyproject.toml").write_text("")
    sample = "\n".join([
        "Root-relative `pyproject.toml`, control_plane-relative `services/lifecycle.py` and",
        "`control_plane/services/`, a module's name `services/lifecycle.on_experiment_created`.",
        "Gone: `services/vanished.py`, `loops/autoscaler.py`, `control_plane/frontdoor/`, `gone.py`.",
        "Not paths: `/api/v1/experiments`, `GET /api/v1/agents/{id}`, `provisioners/<cloud>/`,",
        "`tests/control_plane/...`, `shipyard_common.settings.validate`, `master.yaml`.",
        "```",
        "a fenced block is a picture: `not/checked.py`",
        "```",
    ])
    assert missing_paths(sample, tmp_path) == [
        "services/vanished.py", "loops/autoscaler.py", "control_plane/frontdoor/", "gone.py"]


def test_architecture_stays_under_its_word_budget() -> None:
    words = len((ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8").split())
    assert words < MAX_ARCHITECTURE_WORDS, (
        f"docs/ARCHITECTURE.md has {words} words (budget {MAX_ARCHITECTURE_WORDS}): keep what stays true, "
        "move measured figures to docs/PERFORMANCE.md")
