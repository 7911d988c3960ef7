"""The task's account inside its container (pure): a task runs as its own uid:gid (agent/identity.py),
which the image's /etc/passwd and /etc/group do not know. Without an entry, whatever asks who the
user is fails there: sshd (a shell task cannot start), `getpass.getuser()` (torch's compile caches),
`id -un`, a prompt's `whoami`. Determined's containers add the user at start; Shipyard's run
unprivileged, so the agent writes the image's files with the task's entries added and binds them
read-only over /etc/passwd and /etc/group (only when the image lacks the uid or the gid).

Works on Python 3.9 (the agent's floor)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Optional

# An image's /etc/passwd or /etc/group larger than this is not read (the agent's memory).
MAX_FILE_BYTES = 1 << 20


def _ids(text: str, column: int) -> dict[str, str]:
    """name → the id in `column` of a passwd/group text (malformed lines skipped)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":")
        if len(parts) > column and parts[0]:
            out[parts[0]] = parts[column]
    return out


def _unique(name: str, taken: dict[str, str], wanted_id: int) -> str:
    return name if name not in taken else f"{name}-{wanted_id}"


def with_task_account(passwd: str, group: str, *, name: str, uid: int, gid: int, home: str,
                      shell: str = "/bin/sh") -> tuple[Optional[str], Optional[str]]:
    """(passwd, group) with the task's user and group added, each None when the image has it already.
    A name the image uses for another id gets the id appended."""
    users = _ids(passwd, 2)
    groups = _ids(group, 2)
    new_group = None
    group_name = next((n for n, i in groups.items() if i == str(gid)), None)
    if group_name is None:
        group_name = _unique(name, groups, gid)
        new_group = _append(group, f"{group_name}:x:{gid}:")
    new_passwd = None
    if str(uid) not in users.values():
        user = _unique(name, users, uid)
        new_passwd = _append(passwd, f"{user}:x:{uid}:{gid}:Shipyard task user:{home}:{shell}")
    return new_passwd, new_group


def _append(text: str, line: str) -> str:
    return (text if not text or text.endswith("\n") else text + "\n") + line + "\n"


def write_file(root: Path, name: str, text: str) -> Path:
    """`text` as root/<its digest>/<name> (0644, directories 0755), written once: a file bound into
    containers, in a directory only the agent writes. Written to a temporary name and renamed."""
    data = text.encode()
    folder = root / hashlib.sha256(data).hexdigest()[:24]
    path = folder / name
    if path.is_file() and not path.is_symlink():
        return path
    folder.mkdir(mode=0o755, parents=True, exist_ok=True)
    os.chmod(root, 0o755)
    tmp = folder / f".{name}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return path
