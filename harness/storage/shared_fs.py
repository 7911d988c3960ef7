"""Checkpoints in a directory every agent mounts at the same path (NFS, a local disk in dev)."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import stat
import uuid as uuidlib
from pathlib import Path, PurePosixPath

from harness.storage.base import (
    PROBE_PREFIX,
    CheckpointNotFound,
    CheckpointStorage,
    StorageConfigError,
    StorageError,
    StorageNotWritable,
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


def _open_below(root: Path, parts: list[str]) -> int:
    """A descriptor of the directory root/parts..., no part of it a symbolic link (ELOOP)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def _remove_tree_at(parent: int, name: str) -> None:
    """Remove directory `name` of `parent` and what is in it, through descriptors: a link inside is
    removed, never followed; what cannot be removed is left."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent)
    except OSError:
        return
    try:
        with os.scandir(fd) as entries:
            children = [(e.name, e.is_dir(follow_symlinks=False)) for e in entries]
        for child, is_dir in children:
            try:
                if is_dir:
                    _remove_tree_at(fd, child)
                else:
                    os.unlink(child, dir_fd=fd)
            except OSError:
                pass
    finally:
        os.close(fd)
    try:
        os.rmdir(name, dir_fd=parent)
    except OSError:
        pass


def _open_regular(dirfd: int, name: str) -> int | None:
    """A read descriptor of `name` (in directory `dirfd`) when it is a regular file, else None: a
    symbolic link, a FIFO, a socket or a device is never opened for reading (opening some devices
    acts on them). Asked of an O_PATH descriptor, then reopened through /proc, so nothing swapped in
    between is opened either."""
    try:
        path_fd = os.open(name, os.O_PATH | os.O_NOFOLLOW, dir_fd=dirfd)
    except FileNotFoundError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(path_fd).st_mode):
            return None
        return os.open(f"/proc/self/fd/{path_fd}", os.O_RDONLY)
    finally:
        os.close(path_fd)


def _copy_regular(dirfd: int, name: str, dst: Path) -> bool:
    """Copy the regular file `name` (in directory `dirfd`) to dst; False, copying nothing, for
    anything else (_open_regular)."""
    fd = _open_regular(dirfd, name)
    if fd is None:
        return False
    with open(fd, "rb") as src:
        mode = os.fstat(fd).st_mode
        with open(dst, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
            os.fchmod(out.fileno(), stat.S_IMODE(mode) & 0o777)  # its permissions, no setuid/setgid/sticky
    return True


class SharedFSStorage(CheckpointStorage):
    kind = "shared_fs"

    def __init__(self, base: Path, root: Path | None = None) -> None:
        """`base`: where checkpoints go; `root`: the configured host_path it lies in (default: base
        itself), the part of the path trusted to be no one's symbolic link (download)."""
        self.base = Path(base)
        self.root = Path(root) if root is not None else self.base

    @classmethod
    def from_config(cls, host_path: str, storage_path: str | None = None) -> SharedFSStorage:
        base = resolve_base(host_path, storage_path)
        return cls(base, Path(host_path).expanduser() if base.is_relative_to(Path(host_path).expanduser()) else None)

    def describe(self) -> str:
        return f"shared_fs:{self.base}"

    def _dir(self, uuid: str) -> Path:
        return self.base / validate_uuid(uuid)

    def _parts(self, uuid: str) -> list[str]:
        """The checkpoint's directory as names below self.root."""
        return [*self.base.relative_to(self.root).parts, validate_uuid(uuid)]

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
        """The checkpoint's regular files and directories, never through a symbolic link: the tree
        was written by a trial, and the reader may see more than it (the master reads it as root
        for `det checkpoint download`). A link anywhere below the configured host_path (a
        storage_path directory, the checkpoint's own, one inside it) is left out with a log line;
        so are FIFOs and devices. Directory descriptors all the way (os.fwalk), so a link swapped
        in while it reads is not followed either."""
        try:
            top = _open_below(self.root, self._parts(uuid))
        except OSError as e:
            if e.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                raise CheckpointNotFound(f"checkpoint {uuid} not found in {self.describe()}") from None
            raise
        dst = Path(dst_dir)
        try:
            for dirpath, dirnames, filenames, dirfd in os.fwalk(".", dir_fd=top, follow_symlinks=False):
                here = dst / dirpath
                here.mkdir(parents=True, exist_ok=True)
                for name in list(dirnames):
                    if stat.S_ISLNK(os.stat(name, dir_fd=dirfd, follow_symlinks=False).st_mode):
                        dirnames.remove(name)
                        log.warning("event=checkpoint_link_skipped uuid=%s path=%s", uuid, PurePosixPath(dirpath, name))
                for name in filenames:
                    if not _copy_regular(dirfd, name, here / name):
                        log.warning("event=checkpoint_link_skipped uuid=%s path=%s", uuid, PurePosixPath(dirpath, name))
        finally:
            os.close(top)

    def delete(self, uuid: str) -> None:
        shutil.rmtree(self._dir(uuid), ignore_errors=True)

    def list_files(self, uuid: str) -> dict[str, int]:
        """Determined's resources map of the checkpoint (files with their size, directories as
        'dir/': 0), read through directory descriptors as download reads it: links, FIFOs and
        devices are not listed, nothing is followed."""
        try:
            top = _open_below(self.root, self._parts(uuid))
        except OSError as e:
            if e.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                return {}
            raise
        out: dict[str, int] = {}
        try:
            for dirpath, dirnames, filenames, dirfd in os.fwalk(".", dir_fd=top, follow_symlinks=False):
                rel = PurePosixPath(dirpath)
                for name in sorted(dirnames):
                    if stat.S_ISDIR(os.stat(name, dir_fd=dirfd, follow_symlinks=False).st_mode):
                        out[f"{(rel / name).as_posix()}/"] = 0
                for name in sorted(filenames):
                    st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
                    if stat.S_ISREG(st.st_mode):
                        out[(rel / name).as_posix()] = st.st_size
        finally:
            os.close(top)
        return dict(sorted(out.items()))

    def delete_files(self, uuid: str, relpaths: list[str]) -> None:
        """Each path's file, link or tree; reached through directory descriptors, no link followed
        (the master deletes as root in a tree a trial wrote): a path through a link is left alone."""
        for rel in relpaths:
            path = safe_relpath(rel.rstrip("/"))
            try:
                parent = _open_below(self.root, [*self._parts(uuid), *path.parent.parts])
            except OSError as e:
                if e.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                    continue
                raise
            try:
                mode = os.stat(path.name, dir_fd=parent, follow_symlinks=False).st_mode
                if stat.S_ISDIR(mode):
                    _remove_tree_at(parent, path.name)
                else:
                    os.unlink(path.name, dir_fd=parent)
            except FileNotFoundError:
                pass
            except RecursionError:
                raise StorageError(f"checkpoint {uuid}: {rel} is nested too deep to remove") from None
            finally:
                os.close(parent)

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
