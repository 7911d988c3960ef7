"""A shared_fs checkpoint is a tree a trial wrote, read and pruned by the master as root
(`det checkpoint download` through the master, `det checkpoint rm`): no symbolic link in it, nor a
FIFO, is followed to what the trial could not read or delete itself."""

from __future__ import annotations

import os
import stat
import uuid as uuidlib
from pathlib import Path

import pytest

from harness.storage import CheckpointNotFound
from harness.storage.shared_fs import SharedFSStorage


def _outside(tmp_path: Path) -> Path:
    secret = tmp_path / "master-only" / "token-key"
    secret.parent.mkdir()
    secret.write_text("MASTER SECRET\n")
    secret.chmod(0o600)
    return secret


def test_download_copies_the_trials_files_and_no_link_nor_fifo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = _outside(tmp_path)
    storage = SharedFSStorage.from_config(str(tmp_path / "shared"), "exp-1")
    u = str(uuidlib.uuid4())
    ckpt = tmp_path / "shared" / "exp-1" / u
    (ckpt / "opt").mkdir(parents=True)
    (ckpt / "model.pt").write_bytes(b"weights")
    (ckpt / "opt" / "run.sh").write_text("#!/bin/sh\n")
    (ckpt / "opt" / "run.sh").chmod(0o4755)  # setuid: not carried over
    os.symlink(secret, ckpt / "innocent.bin")
    os.symlink("/proc/self/environ", ckpt / "opt" / "env.bin")
    os.symlink(secret.parent, ckpt / "linked-dir")
    os.mkfifo(ckpt / "pipe")  # would block a reader that opened it for its content
    if os.geteuid() == 0:  # a container's root keeps MKNOD: a device node is never opened
        os.mknod(ckpt / "device", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    opened: list[str] = []
    real_open = os.open

    def recording(path, flags, *args, **kw):  # type: ignore[no-untyped-def]
        opened.append(f"{path}:{flags & os.O_PATH}")
        return real_open(path, flags, *args, **kw)

    monkeypatch.setattr(os, "open", recording)
    out = tmp_path / "out"
    storage.download(u, out)
    monkeypatch.undo()
    assert not [o for o in opened if o.startswith(("device:", "pipe:")) and not o.endswith(f":{os.O_PATH}")], opened
    got = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file() or p.is_symlink()}
    assert got == {"model.pt": b"weights", "opt/run.sh": b"#!/bin/sh\n"}
    assert (out / "opt" / "run.sh").stat().st_mode & 0o7777 == 0o755
    # Listed as Determined's resources map: the same files, nothing through a link or special.
    assert storage.list_files(u) == {"model.pt": 7, "opt/": 0, "opt/run.sh": 10}


def test_a_checkpoint_or_storage_path_directory_that_is_a_link_is_not_found(tmp_path: Path) -> None:
    secret = _outside(tmp_path)
    shared = tmp_path / "shared"
    shared.mkdir()
    u = str(uuidlib.uuid4())
    os.symlink(secret.parent, shared / u)  # the checkpoint's own directory
    with pytest.raises(CheckpointNotFound):
        SharedFSStorage.from_config(str(shared)).download(u, tmp_path / "out1")
    assert SharedFSStorage.from_config(str(shared)).list_files(u) == {}
    (secret.parent / u).mkdir()
    (secret.parent / u / "k").write_text("x")
    os.symlink(secret.parent, shared / "evil")  # a storage_path directory
    with pytest.raises(CheckpointNotFound):
        SharedFSStorage.from_config(str(shared), "evil").download(u, tmp_path / "out2")
    assert not (tmp_path / "out1").exists() and not (tmp_path / "out2").exists()


def test_delete_files_never_goes_through_a_link(tmp_path: Path) -> None:
    secret = _outside(tmp_path)
    storage = SharedFSStorage.from_config(str(tmp_path / "shared"))
    u = str(uuidlib.uuid4())
    ckpt = tmp_path / "shared" / u
    (ckpt / "sub").mkdir(parents=True)
    (ckpt / "sub" / "a").write_text("a")
    os.symlink(secret.parent, ckpt / "via")  # "via/token-key" names the secret through a link
    os.symlink(secret, ckpt / "link-to-secret")
    storage.delete_files(u, ["via/token-key", "link-to-secret", "sub/", "missing/x"])
    assert secret.read_text() == "MASTER SECRET\n"
    assert not (ckpt / "link-to-secret").is_symlink() and not (ckpt / "sub").exists()
    assert (ckpt / "via").is_symlink()
