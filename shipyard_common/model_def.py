"""Model definitions: validating the uploaded file list, packing it, and unpacking it safely.

``det experiment create cfg.yaml dir/`` sends the directory as Determined's ``v1File`` list
(``determined.common.api.bindings.v1File``): ``path`` (POSIX, relative), ``type`` (a tar typeflag
as an int: ``ord('0') == 48`` regular file, ``ord('5') == 53`` directory), ``content`` (base64;
empty for directories), ``mode`` (``st_mode``), ``mtime`` (a string-encoded int64), ``uid``,
``gid``. The master validates that list (``validate_model_definition``), stores it as one
deterministic tar.gz (``pack_model_definition``), and the agent extracts it into the trial's
working directory (``unpack_model_definition``).

Only regular files and directories exist in a model definition: links and devices are refused,
as is every path that could land outside the destination folder. ``validate`` and ``pack`` are
pure; ``unpack`` writes to disk but trusts nothing in the archive.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import io
import os
import stat
import tarfile
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_FILES",
    "ModelDefInvalid",
    "ModelFile",
    "normalize_model_path",
    "pack_model_definition",
    "unpack_model_definition",
    "validate_model_definition",
]

DEFAULT_MAX_BYTES = 96 * 1024 * 1024
DEFAULT_MAX_FILES = 100_000

# Tar typeflags as Determined sends them (ord of the tar typeflag character).
_REGULAR_TYPES = (0, ord(tarfile.REGTYPE))  # 0 is the old "\0" regular-file flag and proto3's default
_DIR_TYPE = ord(tarfile.DIRTYPE)
_REFUSED_TYPES = {
    ord(tarfile.LNKTYPE): "hard links are not allowed",
    ord(tarfile.SYMTYPE): "symbolic links are not allowed",
    ord(tarfile.CHRTYPE): "character devices are not allowed",
    ord(tarfile.BLKTYPE): "block devices are not allowed",
    ord(tarfile.FIFOTYPE): "FIFOs are not allowed",
}

_DEFAULT_FILE_MODE = 0o644
_DEFAULT_DIR_MODE = 0o755
_MAX_PATH_BYTES = 4096
_MAX_NAME_BYTES = 255


@dataclass(frozen=True)
class ModelFile:
    """One entry of a validated model definition. ``path`` is normalized (``a/b.py``, no ``./``,
    no trailing slash); ``mode`` holds permission bits only."""

    path: str
    content: bytes
    mode: int
    is_dir: bool


class ModelDefInvalid(Exception):
    """A model definition (or archive) was refused. ``path`` names the offending field, e.g.
    ``modelDefinition[3].path`` or ``archive[2]``."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")


def normalize_model_path(path: Any) -> str:
    """The canonical relative POSIX form of ``path``; ``ValueError`` says why it is refused."""
    if not isinstance(path, str):
        raise ValueError(f"must be a string (got {type(path).__name__})")
    if not path:
        raise ValueError("must not be empty")
    if "\x00" in path:
        raise ValueError("must not contain NUL characters")
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in path):
        raise ValueError("must not contain control characters")
    if "\\" in path:
        # A backslash is a separator to Windows tools and to some extraction code; never a name.
        raise ValueError("must not contain backslashes")
    if path.startswith("/"):
        raise ValueError("must be relative, not absolute")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ValueError("must not contain '..' components")
    if not parts:
        raise ValueError(f"{path!r} does not name a file inside the folder")
    try:
        encoded = [p.encode("utf-8") for p in parts]
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode") from None
    if any(len(p) > _MAX_NAME_BYTES for p in encoded):
        raise ValueError(f"has a component longer than {_MAX_NAME_BYTES} bytes")
    normalized = "/".join(parts)
    if len(normalized.encode("utf-8")) > _MAX_PATH_BYTES:
        raise ValueError(f"is longer than {_MAX_PATH_BYTES} bytes")
    return normalized


def _permission_bits(mode: Any, is_dir: bool) -> int:
    """Keep rwx bits only (no setuid/setgid/sticky); the owner can always read its own files and
    enter and write its own directories, or extraction and imports would fail."""
    if type(mode) is not int or mode < 0:
        return _DEFAULT_DIR_MODE if is_dir else _DEFAULT_FILE_MODE
    bits = mode & 0o777
    return bits | (0o700 if is_dir else 0o400)


def _decoded_len_lower_bound(b64: str) -> int:
    # Valid base64 of n characters decodes to at least n // 4 * 3 - 2 bytes.
    return max(0, len(b64) // 4 * 3 - 2)


def validate_model_definition(
    files: Sequence[Mapping[str, Any]],
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_files: int = DEFAULT_MAX_FILES,
) -> list[ModelFile]:
    """Check an uploaded ``v1File`` list and decode it, in the order given.

    Refuses (``ModelDefInvalid``) paths that escape the folder or are not canonical-able,
    links/devices/unknown types, bad base64, content on a directory, duplicate paths, a file used
    as a directory, more than ``max_files`` entries, or more than ``max_bytes`` of content."""
    if not isinstance(files, Sequence) or isinstance(files, (str, bytes)):
        raise ModelDefInvalid("modelDefinition", "must be a list of files")
    if len(files) > max_files:
        raise ModelDefInvalid(
            "modelDefinition", f"has {len(files)} entries, more than the limit of {max_files}"
        )

    out: list[ModelFile] = []
    index_of: dict[str, int] = {}
    total = 0
    for i, entry in enumerate(files):
        where = f"modelDefinition[{i}]"
        f = _validate_entry(entry, where, total_before=total, max_bytes=max_bytes)
        total += len(f.content)
        if f.path in index_of:
            raise ModelDefInvalid(
                f"{where}.path", f"duplicate path {f.path!r} (also modelDefinition[{index_of[f.path]}])"
            )
        index_of[f.path] = i
        out.append(f)
    _refuse_files_used_as_directories(out, index_of)
    return out


def _validate_entry(entry: Any, where: str, *, total_before: int, max_bytes: int) -> ModelFile:
    """One ``v1File`` entry (``where``: its field path), decoded; ``total_before``: the content
    bytes of the entries before it, which count against ``max_bytes``."""
    if not isinstance(entry, Mapping):
        raise ModelDefInvalid(where, "must be an object with path, type and content")
    try:
        path = normalize_model_path(entry.get("path"))
    except ValueError as exc:
        raise ModelDefInvalid(f"{where}.path", str(exc)) from None
    is_dir = _entry_is_dir(entry.get("type", 0), f"{where}.type", path)
    encoded = _content_text(entry.get("content"), f"{where}.content")
    # Refuse before decoding so an oversized upload costs no memory beyond the request itself.
    if total_before + _decoded_len_lower_bound(encoded) > max_bytes:
        raise _too_large(max_bytes, path)
    try:
        content = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise ModelDefInvalid(f"{where}.content", f"{path!r}: content is not valid base64") from None
    if is_dir and content:
        raise ModelDefInvalid(f"{where}.content", f"{path!r}: a directory has no content")
    if total_before + len(content) > max_bytes:
        raise _too_large(max_bytes, path)
    return ModelFile(path=path, content=content, mode=_permission_bits(entry.get("mode"), is_dir), is_dir=is_dir)


def _entry_is_dir(kind: Any, where: str, path: str) -> bool:
    """Whether the tar typeflag ``kind`` is a directory; refuses every type but files and directories."""
    if isinstance(kind, str) and kind.isdigit():
        kind = int(kind)  # proto3 JSON allows integers as strings
    if type(kind) is not int:
        raise ModelDefInvalid(where, f"must be an integer tar typeflag (got {kind!r})")
    if kind in _REFUSED_TYPES:
        raise ModelDefInvalid(where, f"{path!r}: {_REFUSED_TYPES[kind]}")
    if kind not in _REGULAR_TYPES and kind != _DIR_TYPE:
        raise ModelDefInvalid(
            where,
            f"{path!r}: unsupported file type {kind}; only regular files (48) and directories (53)",
        )
    return kind == _DIR_TYPE


def _content_text(encoded: Any, where: str) -> str:
    """The base64 text of an entry's ``content`` (absent: empty; bytes: must be ASCII)."""
    if encoded is None:
        return ""
    if isinstance(encoded, (bytes, bytearray)):
        try:
            return bytes(encoded).decode("ascii")
        except UnicodeDecodeError:
            raise ModelDefInvalid(where, "is not valid base64") from None
    if not isinstance(encoded, str):
        raise ModelDefInvalid(where, f"must be a base64 string (got {type(encoded).__name__})")
    return encoded


def _too_large(max_bytes: int, path: str) -> ModelDefInvalid:
    return ModelDefInvalid(
        "modelDefinition",
        f"model definition is larger than the limit of {max_bytes} bytes (at {path!r})",
    )


def _refuse_files_used_as_directories(files: Sequence[ModelFile], index_of: Mapping[str, int]) -> None:
    """A regular file cannot also be a parent directory of another entry."""
    regular = {f.path for f in files if not f.is_dir}
    for f in files:
        parent = f.path
        while "/" in parent:
            parent = parent.rsplit("/", 1)[0]
            if parent in regular:
                raise ModelDefInvalid(
                    f"modelDefinition[{index_of[f.path]}].path",
                    f"{f.path!r} is inside {parent!r}, which is a file",
                )


def pack_model_definition(files: Sequence[ModelFile]) -> bytes:
    """A deterministic tar.gz of ``files``: sorted by path, mtime 0, owner 0:0, no names, gzip
    header without time or file name. The same files always give the same bytes."""
    seen: set[str] = set()
    for f in files:
        try:
            if normalize_model_path(f.path) != f.path:
                raise ValueError("is not normalized")
        except ValueError as exc:
            raise ModelDefInvalid(f.path, f"path {exc}") from None
        if f.path in seen:
            raise ModelDefInvalid(f.path, "duplicate path")
        seen.add(f.path)

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for f in sorted(files, key=lambda f: f.path):
            info = tarfile.TarInfo(f.path)
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mode = _permission_bits(f.mode, f.is_dir)
            if f.is_dir:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.type = tarfile.REGTYPE
                info.size = len(f.content)
                tar.addfile(info, io.BytesIO(f.content))

    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0, compresslevel=6) as gz:
        gz.write(raw.getvalue())
    return out.getvalue()


def _scan_archive(tar: tarfile.TarFile, max_bytes: int, max_files: int) -> list[tuple[str, tarfile.TarInfo]]:
    """Read every header and refuse the archive before anything is written. Sizes are checked
    header by header, so a bomb is refused before its data is decompressed."""
    members: list[tuple[str, tarfile.TarInfo]] = []
    kinds: dict[str, bool] = {}
    total = 0
    while True:
        member = tar.next()
        if member is None:
            return members
        where = f"archive[{len(members)}]"
        if len(members) >= max_files:
            raise ModelDefInvalid("archive", f"has more than {max_files} entries")
        try:
            path = normalize_model_path(member.name)
        except ValueError as exc:
            raise ModelDefInvalid(where, f"member {member.name!r}: path {exc}") from None
        if member.type in (tarfile.REGTYPE, tarfile.AREGTYPE):
            is_dir = False
        elif member.type == tarfile.DIRTYPE:
            is_dir = True
        else:
            reason = _REFUSED_TYPES.get(ord(member.type), f"unsupported member type {member.type!r}")
            raise ModelDefInvalid(where, f"member {member.name!r}: {reason}")
        if path in kinds:
            raise ModelDefInvalid(where, f"member {member.name!r}: duplicate path {path!r}")
        total += member.size
        if total > max_bytes:
            raise ModelDefInvalid("archive", f"unpacks to more than the limit of {max_bytes} bytes")
        kinds[path] = is_dir
        members.append((path, member))


def _ensure_dir(root: Path, rel: str, created: list[tuple[Path, int]], mode: int | None) -> Path:
    """Create ``root/rel`` one component at a time, refusing to pass through anything that is not
    a real directory (a symlink planted in the destination must not redirect the extraction)."""
    current = root
    parts = rel.split("/") if rel else []
    for depth, part in enumerate(parts):
        current = current / part
        try:
            st = os.lstat(current)
        except FileNotFoundError:
            os.mkdir(current, 0o700)
            is_leaf = depth == len(parts) - 1
            created.append((current, mode if (is_leaf and mode is not None) else _DEFAULT_DIR_MODE))
            continue
        if not stat.S_ISDIR(st.st_mode):
            raise ModelDefInvalid("archive", f"{current} exists and is not a directory")
        if depth == len(parts) - 1 and mode is not None:
            created.append((current, mode))
    return current


def unpack_model_definition(
    archive: bytes,
    dest: Path,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_files: int = DEFAULT_MAX_FILES,
) -> None:
    """Extract a model-definition archive into ``dest`` (created if missing).

    Every header is checked before anything is written: only regular files and directories, no
    path that leaves ``dest``, no duplicates, at most ``max_files`` entries and ``max_bytes`` of
    content. Writing never follows a symlink already present under ``dest``. Regular files that
    already exist are replaced; ownership and timestamps from the archive are ignored."""
    dest = Path(dest)
    try:
        tar = tarfile.open(fileobj=io.BytesIO(archive), mode="r:*")
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        raise ModelDefInvalid("archive", f"not a valid tar.gz archive: {exc}") from None
    with tar:
        try:
            members = _scan_archive(tar, max_bytes, max_files)
        except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
            raise ModelDefInvalid("archive", f"not a valid tar.gz archive: {exc}") from None

        # ``dest`` itself may be reached through a symlink (the agent chooses it); only what is
        # under it is distrusted.
        if dest.exists() and not dest.is_dir():
            raise ModelDefInvalid("archive", f"destination {dest} is not a directory")
        dest.mkdir(parents=True, exist_ok=True)
        dir_modes: list[tuple[Path, int]] = []
        for path, member in members:
            mode = _permission_bits(member.mode, member.isdir())
            if member.isdir():
                _ensure_dir(dest, path, dir_modes, mode)
                continue
            parent, _, name = path.rpartition("/")
            target_dir = _ensure_dir(dest, parent, dir_modes, None)
            target = target_dir / name
            try:
                st = os.lstat(target)
            except FileNotFoundError:
                pass
            else:
                if not stat.S_ISREG(st.st_mode):
                    raise ModelDefInvalid("archive", f"{target} exists and is not a regular file")
                os.unlink(target)
            source = tar.extractfile(member)
            if source is None:  # pragma: no cover - regular members always have a file object
                raise ModelDefInvalid("archive", f"member {member.name!r} has no data")
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            try:
                with os.fdopen(fd, "wb", closefd=False) as out:
                    remaining = member.size
                    while remaining > 0:
                        chunk = source.read(min(remaining, 1 << 20))
                        if not chunk:
                            raise ModelDefInvalid("archive", f"member {member.name!r} is truncated")
                        out.write(chunk)
                        remaining -= len(chunk)
                os.fchmod(fd, mode)
            finally:
                os.close(fd)
        # Directory modes last and deepest first, so a read-only directory does not block its
        # own contents from being written.
        for directory, mode in sorted(dir_modes, key=lambda item: len(item[0].parts), reverse=True):
            os.chmod(directory, mode)
