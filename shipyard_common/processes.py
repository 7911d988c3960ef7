"""Process groups: starting a detached session leader, asking whether it (or its group) lives, and
stopping a whole group with a grace period.

Used by the agent's process runtime (a task is a process group), the local provider (a local
"instance" is an agent's process group) and `det deploy local` (master and agents). A process
started with `start_new_session=True` leads its own session and group, so its group id is its pid
and one signal reaches it and every descendant that stayed in the group.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path


def pid_alive(pid: int) -> bool:
    """Whether a process exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return True  # no /proc (macOS): existence is all we can tell


def group_alive(pgid: int) -> bool:
    """Whether any process (zombies included) is still in the group."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def signal_group(pgid: int, sig: int) -> None:
    """Signal every process of the group; a group that is already gone is not an error."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def stop_process_group(pgid: int, grace: float = 15.0, poll_interval: float = 0.1) -> None:
    """SIGTERM the group; SIGKILL it if its leader has not exited after `grace` seconds."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not pid_alive(pgid):
                return
            time.sleep(poll_interval)


def start_session(argv: Sequence[str], log_path: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Start `argv` detached: its own session (so it outlives us and `stop_process_group` reaches its
    children), stdin from /dev/null, stdout and stderr appended to `log_path`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    # 0600: a log may name paths and settings that are nobody else's business (issue 27).
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "ab") as out:
        return subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)
