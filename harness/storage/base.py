"""The checkpoint storage seam: one interface, one module per place bytes can live.

A checkpoint is a directory tree stored under its uuid. Backends copy whole trees in and out;
the Core API decides when (store_path / restore_path / upload / download) and talks to the master.
"""

from __future__ import annotations

import os
import re
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

# Written and deleted by check_writable(); a dot-name so it never looks like a checkpoint uuid.
PROBE_PREFIX = ".shipyard-write-probe-"

_SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class StorageError(Exception):
    """Checkpoint storage failed in a way the caller should see."""


class StorageConfigError(StorageError):
    """The checkpoint_storage section cannot be turned into a backend."""


class StorageNotWritable(StorageError):
    """The storage cannot take a write right now (missing bucket, read-only dir, bad credentials)."""


class CheckpointNotFound(StorageError):
    """No checkpoint with that uuid exists in the storage."""


@dataclass(frozen=True)
class TreeEntry:
    relpath: str  # POSIX, relative to the checkpoint root, no trailing slash
    is_dir: bool
    path: Path
    size: int  # 0 for directories


def validate_uuid(uuid: str) -> str:
    """A checkpoint id becomes a path segment or key prefix; refuse anything that could escape it."""
    if not isinstance(uuid, str) or not _SAFE_ID.fullmatch(uuid) or uuid.startswith(PROBE_PREFIX):
        raise ValueError(f"invalid checkpoint id {uuid!r}: expected letters, digits, '.', '_' or '-'")
    return uuid


def safe_relpath(relpath: str) -> PurePosixPath:
    """Object keys come from the store; never let one write outside the destination directory."""
    p = PurePosixPath(relpath)
    if p.is_absolute() or any(part in ("..", "") for part in p.parts) or not p.parts:
        raise StorageError(f"refusing unsafe object path {relpath!r} in checkpoint")
    return p


def walk_tree(root: Path) -> Iterator[TreeEntry]:
    """Every file and directory under root (not root itself), parents before children, sorted."""
    root = Path(root)
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        base = Path(dirpath)
        rel_base = base.relative_to(root)
        for d in dirnames:
            rel = (rel_base / d).as_posix()
            yield TreeEntry(relpath=rel, is_dir=True, path=base / d, size=0)
        for f in sorted(filenames):
            full = base / f
            rel = (rel_base / f).as_posix()
            yield TreeEntry(relpath=rel, is_dir=False, path=full, size=full.stat().st_size)


def list_resources(root: Path) -> dict[str, int]:
    """Determined's resources map: files by relative path with their size, directories as 'dir/': 0."""
    return {(e.relpath + "/" if e.is_dir else e.relpath): e.size for e in walk_tree(root)}


def empty_dirs(root: Path) -> list[str]:
    """Directories with no children: object stores have no directories, so these need a marker."""
    out = []
    for e in walk_tree(root):
        if e.is_dir and not any(e.path.iterdir()):
            out.append(e.relpath)
    return out


class CheckpointStorage(ABC):
    """upload / download / delete of checkpoint trees, plus a write probe for fail-fast at init."""

    kind: str = "abstract"

    @abstractmethod
    def upload(self, src_dir: Path, uuid: str) -> None:
        """Copy the tree under src_dir to the checkpoint `uuid` (merging into what is there)."""

    @abstractmethod
    def download(self, uuid: str, dst_dir: Path) -> None:
        """Copy checkpoint `uuid` into dst_dir (created if missing). CheckpointNotFound if absent."""

    @abstractmethod
    def delete(self, uuid: str) -> None:
        """Remove checkpoint `uuid`. Deleting something already gone is not an error."""

    @abstractmethod
    def check_writable(self) -> None:
        """Write and delete a small probe object; StorageNotWritable with the reason if that fails."""

    @abstractmethod
    def upload_file(self, src: Path, key: str) -> None:
        """Copy one file to `key` (a relative POSIX path under the storage's base or prefix,
        outside any checkpoint: TensorBoard's event files), replacing what is there."""

    @abstractmethod
    def list_files(self, uuid: str) -> dict[str, int]:
        """Checkpoint `uuid`'s resources as stored now (files with sizes, directories as 'dir/': 0);
        empty if it is absent."""

    @abstractmethod
    def delete_files(self, uuid: str, relpaths: list[str]) -> None:
        """Remove these resources of checkpoint `uuid` (a 'dir/' entry with everything under it).
        Removing something already gone is not an error."""

    def direct_path(self, uuid: str) -> Path | None:
        """A local path where the checkpoint lives, for backends that need no copy (shared_fs)."""
        return None

    @abstractmethod
    def describe(self) -> str:
        """Where the bytes go, for log lines and error messages."""
