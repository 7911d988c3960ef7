"""Checkpoints in a directory every agent mounts at the same path (NFS, a local disk in dev)."""

from __future__ import annotations

import logging
import os
import shutil
import uuid as uuidlib
from pathlib import Path

from harness.storage.base import (
    PROBE_PREFIX,
    CheckpointNotFound,
    CheckpointStorage,
    StorageConfigError,
    StorageNotWritable,
    list_resources,
    safe_relpath,
    validate_uuid,
)

log = logging.getLogger("harness.storage")


def resolve_base(host_path: str, storage_path: str | None) -> Path:
    """Determined's rule: storage_path is relative to host_path, or absolute but inside it."""
    if not host_path:
        raise StorageConfigError("checkpoint_storage.host_path is required for type shared_fs")
    host = Path(host_path).expanduser()
    if not host.is_absolute():
        raise StorageConfigError(f"checkpoint_storage.host_path must be absolute, got {host_path!r}")
    if not storage_path:
        return host
    sp = Path(storage_path)
    if sp.is_absolute():
        try:
            sp.relative_to(host)
        except ValueError:
            raise StorageConfigError(
                f"checkpoint_storage.storage_path {storage_path!r} must be inside host_path {host_path!r}"
            ) from None
        return sp
    if ".." in sp.parts:
        raise StorageConfigError(f"checkpoint_storage.storage_path must not contain '..', got {storage_path!r}")
    return host / sp


class SharedFSStorage(CheckpointStorage):
    kind = "shared_fs"

    def __init__(self, base: Path) -> None:
        self.base = Path(base)

    @classmethod
    def from_config(cls, host_path: str, storage_path: str | None = None) -> SharedFSStorage:
        return cls(resolve_base(host_path, storage_path))

    def describe(self) -> str:
        return f"shared_fs:{self.base}"

    def _dir(self, uuid: str) -> Path:
        return self.base / validate_uuid(uuid)

    def direct_path(self, uuid: str) -> Path:
        return self._dir(uuid)

    def upload(self, src_dir: Path, uuid: str) -> None:
        src = Path(src_dir)
        dst = self._dir(uuid)
        if src.resolve() == dst.resolve():
            return  # store_path wrote in place; nothing to copy
        self.base.mkdir(parents=True, exist_ok=True)
        if not dst.exists():
            # Copy beside the destination, then rename: a reader never sees half a checkpoint.
            tmp = self.base / f".tmp-{uuid}-{uuidlib.uuid4().hex[:8]}"
            try:
                shutil.copytree(src, tmp, symlinks=False)
                os.replace(tmp, dst)
                return
            except OSError:
                shutil.rmtree(tmp, ignore_errors=True)
                if not dst.exists():
                    raise
        # A second upload to the same uuid (sharded writers) merges into the existing tree.
        shutil.copytree(src, dst, symlinks=False, dirs_exist_ok=True)

    def upload_file(self, src: Path, key: str) -> None:
        dst = self.base / safe_relpath(key)
        dst.parent.mkdir(parents=True, exist_ok=True)
        # Copy beside it, then rename: a reader (TensorBoard) never sees a half-copied file.
        tmp = dst.parent / f".tmp-{dst.name}-{uuidlib.uuid4().hex[:8]}"
        try:
            shutil.copyfile(src, tmp)
            os.replace(tmp, dst)
        except OSError:
            tmp.unlink(missing_ok=True)
            raise

    def download(self, uuid: str, dst_dir: Path) -> None:
        src = self._dir(uuid)
        if not src.is_dir():
            raise CheckpointNotFound(f"checkpoint {uuid} not found in {self.describe()}")
        shutil.copytree(src, Path(dst_dir), symlinks=False, dirs_exist_ok=True)

    def delete(self, uuid: str) -> None:
        shutil.rmtree(self._dir(uuid), ignore_errors=True)

    def list_files(self, uuid: str) -> dict[str, int]:
        root = self._dir(uuid)
        return list_resources(root) if root.is_dir() else {}

    def delete_files(self, uuid: str, relpaths: list[str]) -> None:
        root = self._dir(uuid)
        for rel in relpaths:
            path = root / safe_relpath(rel.rstrip("/"))
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)

    def check_writable(self) -> None:
        probe = self.base / f"{PROBE_PREFIX}{uuidlib.uuid4().hex}"
        try:
            self.base.mkdir(parents=True, exist_ok=True)
            probe.write_bytes(b"probe")
            probe.unlink()
        except OSError as e:
            raise StorageNotWritable(
                f"checkpoint storage {self.describe()} is not writable: {type(e).__name__}: {e}"
            ) from e
