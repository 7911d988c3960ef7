"""The CLI without a master: start-up cost, packing a model directory, and refusals that need no
server (missing config, oversized or escaping model directory, unreachable master, no login)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli.commands import experiment
from cli.commands.experiment import TYPE_DIR, TYPE_FILE, Ignore, pack_model_dir
from cli.errors import CliError
from cli.output import confirm
from tests.cli.conftest import Det, one_error_line
from tests.conftest import ROOT
from tests.pg import free_port

HEAVY = ("httpx", "rich", "fastapi", "sqlalchemy", "pydantic", "yaml", "uvicorn", "starlette", "pulumi", "boto3",
         "google.cloud", "infra", "dataclasses")

PROBE = """
import contextlib, io, json, sys
from cli.main import main
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    try:
        main({argv!r})
    except SystemExit:
        pass
print(json.dumps({{"out": buf.getvalue(), "heavy": sorted(m for m in {heavy!r} if m in sys.modules)}}))
"""


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["experiment", "--help"], ["trial", "logs", "--help"]])
def test_help_and_version_import_nothing_heavy(argv: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-c", PROBE.format(argv=argv, heavy=HEAVY)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["heavy"] == []
    assert ("det (shipyard)" if argv == ["--version"] else "usage: det") in result["out"]


def test_every_group_is_registered(det: Det) -> None:
    r = det("--help")
    for name in ("experiment", "trial", "checkpoint", "agent", "slot", "resource-pool", "model"):
        assert name in r.out
    # A group without a verb shows its help instead of failing with a traceback.
    r = det("experiment", "label")
    assert r.code == 2 and "add" in r.out and "remove" in r.out


# -- packing ---------------------------------------------------------------------------------------
def _tree(root: Path) -> Path:
    (root / "pkg" / "__pycache__").mkdir(parents=True)
    (root / ".git").mkdir()
    (root / "train.py").write_text("print('hi')\n")
    (root / "pkg" / "model.py").write_text("X = 1\n")
    (root / "pkg" / "model.pyc").write_bytes(b"\0junk")
    (root / "pkg" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"junk")
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    os.chmod(root / "train.py", 0o755)
    return root


def test_pack_model_dir_is_determineds_v1file_list(tmp_path: Path) -> None:
    files = pack_model_dir(_tree(tmp_path / "m"))
    by_path = {f["path"]: f for f in files}
    assert sorted(by_path) == ["pkg", "pkg/model.py", "train.py"]
    assert by_path["pkg"]["type"] == TYPE_DIR == 53 and by_path["pkg"]["content"] == ""
    train = by_path["train.py"]
    assert train["type"] == TYPE_FILE == 48
    assert base64.b64decode(train["content"]) == b"print('hi')\n"
    assert train["mode"] & 0o777 == 0o755
    assert train["mtime"] == str(int((tmp_path / "m" / "train.py").stat().st_mtime))
    assert (train["uid"], train["gid"]) == (0, 0)
    # A directory comes before what it holds (the master creates it first).
    assert [f["path"] for f in files].index("pkg") < [f["path"] for f in files].index("pkg/model.py")


def test_detignore(tmp_path: Path) -> None:
    root = _tree(tmp_path / "m")
    (root / "data").mkdir()
    (root / "data" / "big.bin").write_bytes(b"x" * 100)
    (root / "data" / "keep.txt").write_text("k")
    (root / "notes.md").write_text("n")
    (root / "pkg" / "notes.md").write_text("n")
    (root / "logs").write_text("a file named like a directory pattern")
    (root / ".detignore").write_text("# comment\n\ndata/*\n!data/keep.txt\n*.md\nlogs/\n")
    paths = {f["path"] for f in pack_model_dir(root)}
    assert paths == {"pkg", "pkg/model.py", "train.py", "data", "data/keep.txt", "logs"}
    assert ".detignore" not in paths


def test_ignore_rules() -> None:
    ig = Ignore.parse(["/top.txt", "build/", "**/cache", "a/*.tmp"])
    assert ig.ignored("top.txt", False) and not ig.ignored("sub/top.txt", False)
    assert ig.ignored("x/build", True) and not ig.ignored("x/build", False)
    assert ig.ignored("deep/er/cache", True) and ig.ignored("cache", False)
    assert ig.ignored("a/b.tmp", False) and not ig.ignored("c/b.tmp", False)


def test_symlinks_inside_are_followed_outside_refused(tmp_path: Path) -> None:
    root = _tree(tmp_path / "m")
    (root / "alias.py").symlink_to(root / "train.py")
    (root / "pkg2").symlink_to(root / "pkg", target_is_directory=True)
    by_path = {f["path"]: f for f in pack_model_dir(root)}
    assert by_path["alias.py"]["type"] == TYPE_FILE
    assert base64.b64decode(by_path["alias.py"]["content"]) == b"print('hi')\n"
    assert by_path["pkg2"]["type"] == TYPE_DIR and "pkg2/model.py" in by_path

    (tmp_path / "secret").write_text("s")
    (root / "leak").symlink_to(tmp_path / "secret")
    with pytest.raises(CliError, match="outside"):
        pack_model_dir(root)


def test_symlink_loop_refused(tmp_path: Path) -> None:
    root = _tree(tmp_path / "m")
    (root / "pkg" / "up").symlink_to(root, target_is_directory=True)
    with pytest.raises(CliError, match="parent"):
        pack_model_dir(root)


def test_size_limit(tmp_path: Path) -> None:
    root = _tree(tmp_path / "m")
    (root / "weights.bin").write_bytes(b"w" * 2000)
    assert len(pack_model_dir(root, limit=10_000)) == 4
    with pytest.raises(CliError, match="more than"):
        pack_model_dir(root, limit=1000)
    (root / ".detignore").write_text("*.bin\n")
    assert len(pack_model_dir(root, limit=1000)) == 3


def test_missing_or_non_directory_model_dir(tmp_path: Path) -> None:
    with pytest.raises(CliError, match="does not exist"):
        pack_model_dir(tmp_path / "nope")
    (tmp_path / "f").write_text("x")
    with pytest.raises(CliError, match="not a directory"):
        pack_model_dir(tmp_path / "f")


# -- refusals through main() -----------------------------------------------------------------------
def _unreachable() -> str:
    return f"http://127.0.0.1:{free_port()}"


def test_config_file_missing_is_one_line(det: Det, tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    line = one_error_line(det("experiment", "create", tmp_path / "nope.yaml", tmp_path / "m", master=_unreachable()))
    assert "nope.yaml" in line and "not found" in line


def test_config_file_not_utf8_is_one_line(det: Det, tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "c.yaml").write_bytes(b"name: \xff\xfe\n")
    line = one_error_line(det("experiment", "create", tmp_path / "c.yaml", tmp_path / "m", master=_unreachable()))
    assert "UTF-8" in line


def test_model_dir_over_limit_fails_before_upload(det: Det, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(experiment, "MAX_MODEL_DEF_BYTES", 1024)
    root = _tree(tmp_path / "m")
    (root / "data.bin").write_bytes(b"d" * 4096)
    (tmp_path / "c.yaml").write_text("entrypoint: python3 train.py\n")
    # The master is unreachable: the size error proves nothing was sent.
    line = one_error_line(det("experiment", "create", tmp_path / "c.yaml", root, master=_unreachable()))
    assert "more than 1.0 KiB" in line and ".detignore" in line


def test_master_unreachable_is_one_line(det: Det) -> None:
    url = _unreachable()
    line = one_error_line(det("master", "info", master=url))
    assert "cannot reach the master" in line and url in line


def test_not_logged_in_is_one_line(det: Det) -> None:
    for argv in (["experiment", "list"], ["trial", "logs", "1"], ["agent", "list"], ["checkpoint", "list", "1"],
                 ["resource-pool", "list"], ["model", "list"]):
        r = det(*argv, master=_unreachable())
        assert r.code == 1
        assert "not logged in" in one_error_line(r)


def test_confirmation_needs_a_terminal_or_yes() -> None:
    # stdin is not a terminal under pytest: no prompt that would hang a script.
    with pytest.raises(CliError, match="--yes"):
        confirm("Delete?", yes=False)
    assert confirm("Delete?", yes=True)


def test_usage_error_exits_2(det: Det) -> None:
    r = det("experiment", "describe", "not-a-number")
    assert r.code == 2 and "invalid int value" in r.err
