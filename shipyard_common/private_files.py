"""Files and directories only their owner can read: the master's state (database, token key), the
CLI's token cache, `det deploy local`'s and local instances' state.

Modes are given at creation (O_CREAT with 0600, mkdir with 0700), never fixed afterwards, so there
is no moment at which another local user could open the file. Shared by the master, the CLI and the
providers, hence here."""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from pathlib import Path

FILE_MODE = 0o600
DIR_MODE = 0o700


def private_dir(path: Path) -> Path:
    """Create `path` and any missing parent with mode 0700 (Path.mkdir gives the parents the
    umask's mode). An existing directory is left as it is: it may be the user's own choice."""
    missing: list[Path] = []
    current = path
    while not current.exists():
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(d, DIR_MODE)
    return path


def _tighten(path: Path) -> None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    if st.st_mode & 0o077 and st.st_uid == os.getuid():
        os.chmod(path, stat.S_IMODE(st.st_mode) & ~0o077)


def ensure_private_file(path: Path, companions: tuple[str, ...] = ()) -> None:
    """Create an empty 0600 file at `path` if there is none; tighten an existing one we own that
    others can read or write (e.g. a database file created 0644 by an older version), and the
    existing files named `path` + each suffix in `companions` (e.g. SQLite's "-wal")."""
    private_dir(path.parent)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE)
    except FileExistsError:
        _tighten(path)
    else:
        os.close(fd)
    for suffix in companions:
        _tighten(path.with_name(path.name + suffix))


def write_private(path: Path, data: bytes, *, exclusive: bool = False) -> bool:
    """Write `data` to `path` atomically with mode 0600 (temporary file, fsync, rename, fsync of the
    directory). With `exclusive`, an existing `path` is kept and False is returned: two processes
    creating the same shared file both end up reading the one that won."""
    private_dir(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if exclusive:
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
            finally:
                tmp.unlink()
        else:
            os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return True


def loose_mode(path: Path) -> int | None:
    """The permission bits of `path` if group or others have any access to it, else None."""
    mode = stat.S_IMODE(os.stat(path).st_mode)
    return mode if mode & 0o077 else None
