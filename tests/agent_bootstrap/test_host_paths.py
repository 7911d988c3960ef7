"""The agent makes a missing directory for a task (a writable bind source, a shared checkpoint
directory) only below the cluster's checkpoint storage root the master names, or its own work dir:
never `/etc/systemd/system/x.service.d`, and never through a symlink a trial planted in the storage.
Real directories; no engine needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_bootstrap.agent import identity
from agent_bootstrap.agent.host_paths import outside_roots
from agent_bootstrap.agent.runtime import Mount
from agent_bootstrap.agent.runtime.base import StartFailed
from agent_bootstrap.agent.runtime.docker import make_bind_sources


@pytest.fixture
def places(tmp_path: Path) -> tuple[Path, Path, Path]:
    root, work, host = tmp_path / "storage", tmp_path / "work", tmp_path / "etc"
    for d in (root, work, host):
        d.mkdir()
    (root / "link").symlink_to(host)  # what a trial writing to the storage can leave there
    return root, work, host


def test_only_paths_below_the_roots_may_be_made(places: tuple[Path, Path, Path]) -> None:
    root, work, host = places
    roots = (str(root), None, str(work))
    for ok in (root, root / "team" / "a", work / "x", Path(f"{root}/../storage/new")):
        assert outside_roots(str(ok), roots) is None, ok
    for bad in (host / "x.service.d", root / "link" / "x.service.d", Path(f"{root}-sibling"), Path("/")):
        reason = outside_roots(str(bad), roots)
        assert reason is not None and str(bad) in reason and "create it on the host first" in reason
    assert outside_roots(str(root / "x"), (None,)) is not None  # a master that names no root: only the work dir


def test_the_docker_runtime_refuses_a_missing_writable_source_outside_them(places: tuple[Path, Path, Path]) -> None:
    root, work, host = places
    with pytest.raises(StartFailed) as e:
        make_bind_sources([Mount(str(root / "link" / "x.service.d"), "/ckpt")], None, (str(root), str(work)))
    assert e.value.exit_code == 125 and "cannot bind" in str(e.value) and "create it on the host first" in str(e.value)
    assert not (host / "x.service.d").exists()
    make_bind_sources([Mount(str(root / "ckpt"), "/ckpt")], None, (str(root), str(work)))
    assert (root / "ckpt").is_dir()
    # An existing source anywhere is mounted as it is (the master decided); a read-only one is never made.
    make_bind_sources([Mount(str(host), "/h"), Mount(str(host / "ro"), "/ro", read_only=True)], None, ())
    assert not (host / "ro").exists()


def test_the_shared_checkpoint_directory_is_held_to_the_same_roots(places: tuple[Path, Path, Path]) -> None:
    root, work, host = places
    with pytest.raises(PermissionError, match="create it on the host first"):
        identity.shared_checkpoint_dir(str(root / "link" / "x.service.d"), (str(root), str(work)))
    assert not (host / "x.service.d").exists()
    identity.shared_checkpoint_dir(str(root / "exp"), (str(root), str(work)))
    assert (root / "exp").is_dir() and (root / "exp").stat().st_mode & 0o7777 == identity.STICKY_SHARED
