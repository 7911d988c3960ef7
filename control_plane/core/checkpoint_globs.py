"""Which of a checkpoint's files `det checkpoint rm --glob G` removes (Determined's
CheckpointsRemoveFiles), decided from the checkpoint's resources alone. Pure.

Globs are pathlib's, relative to the checkpoint's root: `*`, `?` and `[...]` within one path part,
`**` for any number of parts (`**/*` is everything, Determined's own full-delete glob). A glob that
matches a directory removes everything under it. Resources name files by relative path and
directories with a trailing `/` (Determined's map)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from fnmatch import fnmatchcase


def glob_problem(glob: str) -> str | None:
    """Why Determined refuses this glob, or None: an empty one would name the checkpoint's root,
    and `..` could leave it."""
    if not glob:
        return "cannot be an empty string"
    if ".." in glob:
        return "cannot contain '..'"
    if glob.startswith("/"):
        return "must be relative to the checkpoint's root"
    return None


def _match(parts: list[str], pattern: list[str]) -> bool:
    if not pattern:
        return not parts
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        return any(_match(parts[i:], rest) for i in range(len(parts) + 1))
    return bool(parts) and fnmatchcase(parts[0], head) and _match(parts[1:], rest)


def matches(path: str, glob: str) -> bool:
    """Whether the file or directory `path` (no trailing slash), or a directory above it, is
    matched by `glob`."""
    parts = [p for p in path.split("/") if p]
    pattern = [p for p in glob.split("/") if p and p != "."]
    return any(_match(parts[:n], pattern) for n in range(1, len(parts) + 1))


def removed(resources: Mapping[str, int], globs: Iterable[str]) -> set[str]:
    """The resource keys (files, and `dir/` entries) that the globs remove."""
    globs = list(globs)
    return {key for key in resources if any(matches(key.rstrip("/"), g) for g in globs)}


def removes_every_file(resources: Mapping[str, int], gone: set[str]) -> bool:
    """Whether nothing but (emptied) directories would be left: the checkpoint is then deleted
    whole, as Determined's DeleteCheckpoints (CheckpointsRemoveFiles with `**/*`) does."""
    return bool(gone) and all(key in gone for key in resources if not key.endswith("/"))
