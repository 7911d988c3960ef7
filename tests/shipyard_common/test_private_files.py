"""shipyard_common/private_files.py and the state written through it: the CLI's token cache,
`det deploy local`'s state directory, the local provider's instance directory."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from shipyard_common import private_files


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(autouse=True)
def _permissive_umask() -> object:
    # The modes must not depend on a careful umask.
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_private_dir_creates_every_missing_level_0700(tmp_path: Path) -> None:
    leaf = private_files.private_dir(tmp_path / "a" / "b" / "c")
    for d in (tmp_path / "a", tmp_path / "a" / "b", leaf):
        assert mode(d) == 0o700
    (tmp_path / "mine").mkdir(mode=0o755)
    private_files.private_dir(tmp_path / "mine")
    assert mode(tmp_path / "mine") == 0o755  # an existing directory is the user's choice


def test_write_private_is_0600_atomic_and_replaces_a_loose_file(tmp_path: Path) -> None:
    path = tmp_path / "d" / "secret"
    private_files.write_private(path, b"one")
    assert path.read_bytes() == b"one" and mode(path) == 0o600 and mode(path.parent) == 0o700
    path.chmod(0o644)
    private_files.write_private(path, b"two")
    assert path.read_bytes() == b"two" and mode(path) == 0o600
    assert not private_files.write_private(path, b"three", exclusive=True)
    assert path.read_bytes() == b"two"
    assert sorted(p.name for p in path.parent.iterdir()) == ["secret"]


def test_ensure_private_file_creates_or_tightens(tmp_path: Path) -> None:
    db = tmp_path / "db" / "shipyard.db"
    private_files.ensure_private_file(db, companions=("-wal",))
    assert db.read_bytes() == b"" and mode(db) == 0o600
    db.write_bytes(b"data")
    db.chmod(0o644)
    wal = db.with_name("shipyard.db-wal")
    wal.write_bytes(b"")
    wal.chmod(0o664)
    private_files.ensure_private_file(db, companions=("-wal", "-shm"))
    assert db.read_bytes() == b"data" and mode(db) == 0o600 and mode(wal) == 0o600
    assert not db.with_name("shipyard.db-shm").exists()


def test_the_cli_token_cache_is_private(tmp_path: Path) -> None:
    from cli.session import TokenStore

    store = TokenStore(tmp_path / "home" / ".shipyard" / "auth.json")
    store.put("http://m", "alice", "tok")
    assert mode(store.path) == 0o600 and mode(store.path.parent) == 0o700
    assert store.get("http://m") == ("alice", "tok")


def test_deploy_local_state_is_private(tmp_path: Path) -> None:
    from cli.deploy_local import LocalCluster

    cluster = LocalCluster(tmp_path / "local")
    cluster.write({"master_url": "http://127.0.0.1:1"})
    assert mode(cluster.state_dir) == 0o700 and mode(cluster.run_file) == 0o600
    assert cluster.read() == {"master_url": "http://127.0.0.1:1"}


def test_the_local_providers_directory_is_private(tmp_path: Path) -> None:
    from provisioners.local import LocalPoolConfig, LocalProvider

    LocalProvider(LocalPoolConfig.from_dict({}), cluster_id="c", pool="p", master_url="http://127.0.0.1:9",
                  state_dir=tmp_path / "master")
    for d in (tmp_path / "master", tmp_path / "master" / "local-instances", tmp_path / "master" / "local-instances" / "p"):
        assert mode(d) == 0o700
