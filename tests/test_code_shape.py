"""The shape of the product code (issue 25): no function over 80 lines unless its docstring says why.

A long function is allowed only with a paragraph of its docstring that starts with "Long because"
— a reason a reviewer can weigh (a declarative table, a protocol read top to bottom), not a habit.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("control_plane", "provisioners", "agent_bootstrap", "harness", "cli", "shipyard_common", "infra")
MAX_LINES = 80
REASON = "Long because"


def long_functions(root: Path, packages: tuple[str, ...] = PRODUCT) -> list[str]:
    found = []
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            if "migrations" in path.parts:  # Alembic revisions: generated, append-only history
                continue
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                doc = ast.get_docstring(node) or ""
                if lines > MAX_LINES and not any(p.strip().startswith(REASON) for p in doc.split("\n\n")):
                    found.append(f"{path.relative_to(root)}:{node.lineno}: {node.name} ({lines} lines)")
    return found


def test_no_product_function_is_over_80_lines_without_a_reason() -> None:
    found = long_functions(ROOT)
    assert found == [], "split these, or say why in the docstring ('Long because ...'):\n" + "\n".join(found)


def test_the_scan_sees_a_long_function_and_accepts_a_reason(tmp_path: Path) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_LINES))
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text(
        f"def long():\n{body}\n\ndef explained():\n    \"\"\"A table.\n\n    Long because it is one table.\"\"\"\n{body}"
        f"\n\ndef short():\n    return 1\n")
    assert long_functions(tmp_path, ("pkg",)) == [f"pkg/m.py:1: long ({MAX_LINES + 1} lines)"]
