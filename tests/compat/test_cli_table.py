"""The README's compatibility table names every command of the real 0.38.1 `det` with a state
(issue 30): the CLI's argparse tree is walked in the package's own venv (one subprocess, no cluster)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.compat.cli_commands import EXEMPT_STATES, STATES, cli_tree, covered, leaves, span_paths, table_rows

README = Path(__file__).resolve().parents[2] / "README.md"

# A small tree in walk_cli.py's shape, for the shorthand's rules.
TREE = {
    "experiment": {"aliases": ["e"], "subs": {
        "pause": {"aliases": [], "subs": {}},
        "list": {"aliases": ["ls"], "subs": {}},
        "label": {"aliases": [], "subs": {"add": {"aliases": [], "subs": {}}, "remove": {"aliases": [], "subs": {}}}},
        "set": {"aliases": [], "subs": {"weight": {"aliases": [], "subs": {}}, "priority": {"aliases": [], "subs": {}}}},
    }},
    "checkpoint": {"aliases": ["c"], "subs": {"download": {"aliases": [], "subs": {}},
                                             "describe": {"aliases": [], "subs": {}}}},
}


def test_span_shorthand() -> None:
    assert span_paths("det e pause / label add / label remove / ls", TREE) == [
        ("experiment", "pause"), ("experiment", "label", "add"), ("experiment", "label", "remove"),
        ("experiment", "list")]
    assert span_paths("det experiment set priority / weight", TREE) == [
        ("experiment", "set", "priority"), ("experiment", "set", "weight")]
    # brackets (nested slashes too), flags and placeholders end the path
    assert span_paths("det c download [--mode auto / direct / master] ID / describe UUID", TREE) == [
        ("checkpoint", "download"), ("checkpoint", "describe")]
    assert span_paths("det experiment", TREE) == [("experiment",)]  # a group
    with pytest.raises(ValueError, match="`unpause` names no command"):
        span_paths("det experiment pause / unpause", TREE)
    with pytest.raises(ValueError, match="`exp list` is no command"):
        span_paths("det exp list", TREE)


@pytest.fixture(scope="module")
def real_tree(compat_python: Path) -> dict:
    return cli_tree(compat_python)


def test_readme_table_covers_every_command(real_tree: dict) -> None:
    all_leaves = leaves(real_tree)
    # the walk reached the nested groups of the main tree and of `det deploy`'s own
    for leaf in [("master", "info"), ("experiment", "set", "weight"), ("deploy", "aws", "up"), ("user", "whoami")]:
        assert leaf in all_leaves, leaf
    rows = table_rows(README.read_text(), real_tree)
    bad_state = [f"{r.cell} → {r.state!r}" for r in rows if r.state not in STATES + EXEMPT_STATES]
    assert not bad_state, f"states must be one of {STATES} (or a rule's {EXEMPT_STATES}): {bad_state}"
    missing = [" ".join(leaf) for leaf in all_leaves if not covered(leaf, rows)]
    assert not missing, (f"{len(missing)} of the 0.38.1 CLI's {len(all_leaves)} commands have no row in README's "
                         f"table: det {', det '.join(missing)}")
