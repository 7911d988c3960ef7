"""The layering of docs/ARCHITECTURE.md, checked on every `make test`.

Import contracts live in pyproject.toml ([tool.importlinter]); `lint-imports` checks them. What an
import graph cannot see — a pure core reading the clock — is checked here on the source."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "control_plane" / "core"

# Calls that read the wall clock or a monotonic clock: time is an input of a pure core.
CLOCK_CALLS = {("datetime", "now"), ("datetime", "utcnow"), ("datetime", "today"), ("date", "today"),
               ("time", "time"), ("time", "monotonic"), ("time", "perf_counter"), ("time", "time_ns"),
               ("time", "sleep")}


def _lint_imports() -> list[str]:
    exe = Path(sys.executable).with_name("lint-imports")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("lint-imports")
    if found is None:
        pytest.fail("lint-imports is not installed (pip install -e '.[dev]')")
    return [found]


def test_import_contracts_are_kept() -> None:
    proc = subprocess.run([*_lint_imports(), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    report = proc.stdout[proc.stdout.find("Contracts"):] if "Contracts" in proc.stdout else proc.stdout
    assert proc.returncode == 0, f"import contracts broken:\n{report}\n{proc.stderr}"
    assert "0 broken" in proc.stdout and " kept" in proc.stdout


def _clock_reads(path: Path, base: Path = ROOT) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            name = owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) else ""
            if (name, node.func.attr) in CLOCK_CALLS:
                found.append(f"{path.relative_to(base)}:{node.lineno}: {name}.{node.func.attr}()")
    return found


def test_pure_cores_never_read_the_clock() -> None:
    modules = sorted(CORE.rglob("*.py"))
    assert len(modules) > 10  # the cores are where the architecture says they are
    reads = [hit for m in modules for hit in _clock_reads(m)]
    assert reads == [], "pure cores take time as an argument:\n" + "\n".join(reads)


def test_the_clock_scan_sees_a_clock_read(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("import datetime\nimport time\n\ndef f():\n    return datetime.datetime.now(), time.monotonic()\n")
    hits = _clock_reads(sample, tmp_path)
    assert [h.rsplit(": ", 1)[1] for h in hits] == ["datetime.now()", "time.monotonic()"]
