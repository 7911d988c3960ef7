"""Who a task runs as (issue 27): never as the agent's own user when the agent is root.

Determined's agent runs a trial as its user's linked agent user/group. Here every Shipyard user maps
to an OS uid and gid of their own, `task_uid_base + user id` (a trial from a master that sends no
user id runs as `nobody`, 65534): no /etc/passwd entry is needed, the kernel only knows numbers.
The agent, as root, gives the task its directory (0700, owned by that uid: the code, the info files
with the allocation's token), creates a missing shared_fs checkpoint directory sticky and writable
by all task users (like /tmp), and the runtime starts the task under that uid and gid with no
supplementary groups and no_new_privs. What the agent keeps for itself stays root's: its work dir
is traverse-only (0711), its credential 0600 in a 0700 directory, other tasks' directories 0700
owned by their users.

`task_user: agent` keeps running tasks as the agent's user (a development agent). An agent that is
not root cannot switch users and says so once; so does a root agent whose task directory is not
reachable by other users (an ancestor without o+x, e.g. /root): tasks then run as the agent's user
and the warning says how to fix it (`task_dir` elsewhere).
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Optional

from agent_bootstrap.agent.host_paths import outside_roots
from agent_bootstrap.agent.runtime.base import RunAs

log = logging.getLogger("shipyard.agent")

NOBODY = 65534
TRAVERSE_ONLY = 0o711
STICKY_SHARED = 0o1777


def unreachable_ancestor(path: Path, own: tuple[Path, ...] = ()) -> Optional[Path]:
    """The first ancestor of `path` (not `path` itself) that other users cannot traverse, if any;
    missing ones and `own` (made traverse-only by the agent) do not count."""
    mine = {p.resolve() for p in own}
    for parent in path.resolve().parents:
        if parent in mine:
            continue
        try:
            mode = os.stat(parent).st_mode
        except FileNotFoundError:
            continue
        except OSError:
            return parent
        if not mode & stat.S_IXOTH:
            return parent
    return None


def unreachable_interpreter(executable: str, prefix: str) -> Optional[Path]:
    """The directory that keeps task users from running the agent's own Python, if any: the real
    interpreter (a venv's `python3` is a link, often into /root/.pyenv) or the environment's prefix
    (its site-packages) sits under a directory other users cannot traverse."""
    for target in (Path(os.path.realpath(executable)), Path(prefix) / "lib"):
        blocked = unreachable_ancestor(target)
        if blocked is not None:
            return blocked
    return None


class TaskIdentities:
    """Decides the uid/gid of each task and prepares what it may reach."""

    def __init__(self, mode: str, uid_base: int, tasks_dir: Path, own: tuple[Path, ...] = (),
                 on_host: bool = True) -> None:
        self.uid_base = uid_base
        self.enabled = False
        if mode != "per_user":
            log.warning("event=tasks_run_as_agent_user reason=%r", "task_user: agent")
            return
        if os.geteuid() != 0:
            log.warning("event=tasks_run_as_agent_user uid=%d reason=%r", os.geteuid(),
                        "the agent is not root and cannot switch users: trials can read what this user can")
            return
        # A container sees its task directory bound at its path, not the host's directories above.
        blocked = unreachable_ancestor(tasks_dir, own) if on_host else None
        if blocked is not None:
            log.warning("event=tasks_run_as_agent_user reason=%r",
                        f"{blocked} is not traversable by other users, so a task user could not reach its "
                        f"directory under {tasks_dir}; set task_dir (or work_dir) to a path under "
                        f"traversable directories (e.g. /var/lib/shipyard-agent)")
            return
        self.enabled = True

    def run_as(self, user_id: Optional[int]) -> Optional[RunAs]:
        if not self.enabled:
            return None
        if user_id is None or user_id < 0:
            return RunAs(NOBODY, NOBODY)
        uid = self.uid_base + user_id
        return RunAs(uid, uid)


def traverse_only(path: Path) -> None:
    """A directory of the agent's that task users pass through but cannot list."""
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, TRAVERSE_ONLY)


def give_tree(root: Path, who: RunAs) -> None:
    """Hand the task directory (written by the agent) to the task's user: 0700 stays 0700."""
    for current, dirs, names in os.walk(root):
        os.chown(current, who.uid, who.gid)
        for name in dirs + names:
            os.lchown(os.path.join(current, name), who.uid, who.gid)


def shared_checkpoint_dir(path: str, roots: Iterable[Optional[str]]) -> None:
    """Create a missing checkpoint directory that every task user may write its checkpoints into,
    none may remove another's (sticky). An existing directory is the admin's: left as it is. A
    missing one outside `roots` (host_paths.py) is refused (PermissionError, saying why)."""
    p = Path(path)
    if p.exists() or not p.is_absolute():
        return
    refused = outside_roots(path, roots)
    if refused is not None:
        raise PermissionError(refused)
    p.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(p)
    except FileExistsError:
        return
    os.chmod(p, STICKY_SHARED)
