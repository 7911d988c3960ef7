"""CLI tests run `cli.main.main([...])` in-process against a real `det-master` process.

One master per database (SQLite and PostgreSQL) for the whole tests/cli package: starting one
takes seconds, so the tests share it and each uses its own user / experiment names."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ADMIN_PASSWORD, LiveMaster

# Tables are as wide as the terminal: fix it, so that what a test looks for (a UUID, an agent id)
# is never folded across lines, whatever terminal (or none) the suite runs under.
os.environ["COLUMNS"] = "240"


@dataclass
class Result:
    code: int
    out: str
    err: str


@pytest.fixture(scope="package", params=["sqlite", "postgres"])
def cli_master(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveMaster]:
    base = tmp_path_factory.mktemp("cli-master")
    if request.param == "sqlite":
        db_url = f"sqlite:///{base / 'shipyard.db'}"
    else:
        db_url = request.getfixturevalue("postgres_server").create_database()
    m = LiveMaster(db_url, base / "state")
    m.start()
    yield m
    m.stop()


@pytest.fixture
def cli_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Token cache in a fresh directory; no ambient master or credentials."""
    cache = tmp_path / "cli-home"
    monkeypatch.setenv("SHIPYARD_CLI_DIR", str(cache))
    for name in ("DET_MASTER", "DET_USER", "DET_PASS", "SHIPYARD_DEBUG"):
        monkeypatch.delenv(name, raising=False)
    return cache


Det = Callable[..., Result]


@pytest.fixture
def det(cli_env: Path, capsys: pytest.CaptureFixture[str]) -> Det:
    """det("experiment", "list") → Result(code, out, err); -m is added when `master` is given."""

    def run(*argv: str, master: str | None = None) -> Result:
        from cli.main import main

        capsys.readouterr()
        args = (["-m", master] if master else []) + [str(a) for a in argv]
        try:
            code = main(args)
        except SystemExit as e:  # argparse usage errors
            code = int(e.code or 0)
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


@pytest.fixture
def admin_det(det: Det, cli_master: LiveMaster) -> Det:
    """`det` against the module's master, logged in as admin."""
    r = det("user", "login", "admin", "--password", ADMIN_PASSWORD, master=cli_master.url)
    assert r.code == 0, r.err

    def run(*argv: str) -> Result:
        return det(*argv, master=cli_master.url)

    return run


def one_error_line(r: Result) -> str:
    """The failure contract: non-zero exit, exactly one `det: error:` line, no traceback."""
    assert r.code != 0, (r.out, r.err)
    lines = [x for x in r.err.splitlines() if x.strip()]
    assert len(lines) == 1, r.err
    assert lines[0].startswith("det: error: "), r.err
    assert "Traceback" not in r.err
    return lines[0]
