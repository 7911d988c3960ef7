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


# -- import cycles -----------------------------------------------------------------------------------
# A cycle makes start-up order matter and hides which module is the lower layer. Function-local imports
# count: they only defer the cycle to the first call. `if TYPE_CHECKING:` imports never run, so they don't.
PRODUCT_PACKAGES = ("control_plane", "provisioners", "agent_bootstrap", "harness", "cli", "shipyard_common", "infra")


def _module_name(path: Path, base: Path) -> str:
    parts = path.relative_to(base).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement, at module level or in a function, except under `if TYPE_CHECKING:`."""
    found: list[ast.Import | ast.ImportFrom] = []
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
            continue
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else ""
            if name == "TYPE_CHECKING":
                todo.extend(node.orelse)
                continue
        todo.extend(ast.iter_child_nodes(node))
    return found


def _import_graph(base: Path, packages: tuple[str, ...]) -> dict[str, dict[str, str]]:
    """module → {module it imports: "path:line" of the first such import}, within `packages` under `base`.
    `from pkg import name` is an import of the submodule pkg.name when there is one, else of pkg; an
    import of a module that is not there counts for its nearest package that is."""
    files = {_module_name(p, base): p for pkg in packages for p in sorted((base / pkg).rglob("*.py"))}
    graph: dict[str, dict[str, str]] = {m: {} for m in files}

    def ours(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    for mod, path in files.items():
        for node in _runtime_imports(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [ours(a.name) for a in node.names]
            else:
                source = node.module or ""
                if node.level:
                    anchor = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
                    for _ in range(node.level - 1):
                        anchor = anchor.rpartition(".")[0]
                    source = ".".join(part for part in (anchor, node.module) if part)
                targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in files else ours(source) for a in node.names]
            for target in targets:
                if target is not None and target != mod:
                    graph[mod].setdefault(target, f"{path.relative_to(base)}:{node.lineno}")
    return graph


def _import_cycles(graph: dict[str, dict[str, str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        work = [(root, iter(sorted(graph[root])))]
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while not component or component[-1] != node:
                    component.append(stack.pop())
                    on_stack.discard(component[-1])
                if len(component) > 1:
                    cycles.append(sorted(component))
    return sorted(cycles)


def _shortest_loop(graph: dict[str, dict[str, str]], component: list[str]) -> str:
    """One loop through the component's first module, each import with its place, for the message."""
    start, members = component[0], set(component)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for m in frontier:
            for target in sorted(graph[m]):
                if target == start:
                    path = [m]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    path.reverse()
                    steps = zip(path, [*path[1:], start], strict=True)
                    return " -> ".join(f"{a} ({graph[a][b]})" for a, b in steps) + f" -> {start}"
                if target in members and target not in came_from:
                    came_from[target] = m
                    following.append(target)
        frontier = following
    return ""


def _describe_cycles(graph: dict[str, dict[str, str]]) -> list[str]:
    return [f"{len(c)} modules {c}: {_shortest_loop(graph, c)}" for c in _import_cycles(graph)]


def test_no_import_cycle_among_the_product_modules() -> None:
    graph = _import_graph(ROOT, PRODUCT_PACKAGES)
    assert len(graph) > 100 and sum(map(len, graph.values())) > 300  # the scan sees the tree
    cycles = _describe_cycles(graph)
    for line in cycles:
        print(line)
    assert cycles == [], "import cycles among the product modules:\n" + "\n".join(cycles)


def test_the_cycle_scan_sees_a_cycle(tmp_path: Path) -> None:
    files = {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg import b\n",  # b is a submodule: an import of pkg.b
        "pkg/b.py": "def f():\n    from . import c\n",  # function-local and relative
        "pkg/c.py": "import pkg.a\nfrom typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from pkg import d\n",
        "pkg/d.py": "from .sub.e import X\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/e.py": "from .. import d\n\nX = 1\n",
        "pkg/f.py": "from pkg import a\n",  # imports into a cycle, is not in one
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    graph = _import_graph(tmp_path, ("pkg",))
    assert graph["pkg.c"] == {"pkg.a": "pkg/c.py:1"}  # the TYPE_CHECKING import is no edge
    # Were c -> d an edge, the two cycles would be one.
    assert _import_cycles(graph) == [["pkg.a", "pkg.b", "pkg.c"], ["pkg.d", "pkg.sub.e"]]
    assert _describe_cycles(graph)[0] == ("3 modules ['pkg.a', 'pkg.b', 'pkg.c']: pkg.a (pkg/a.py:1) -> "
                                          "pkg.b (pkg/b.py:2) -> pkg.c (pkg/c.py:1) -> pkg.a")
