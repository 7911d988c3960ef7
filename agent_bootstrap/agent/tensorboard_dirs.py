"""Who owns the TensorBoard tree of a shared_fs checkpoint storage, where task users are per user
(identity.py). The harness writes a trial's event files under
`<storage>/<cluster_id>/tensorboard/experiment/<exp>/trial/<trial>/` (harness/tensorboard/sync.py);
had the first writer made those levels, it would own them (0755): other users' uploads would fail,
and it could make other experiments' directories ahead of them and plant event files there.

So the root agent makes them before a trial starts:
  shared levels   `<cluster_id>`, `tensorboard`, `experiment`: root's, 0755 (no task user makes
                  anything there, so no one can claim another experiment's directory);
  the experiment's `<exp>` and `<exp>/trial`: the trial's user's, 0755;
  the trial's     `trial/<trial>`: the trial's user's, 0755.
A level that is someone else's (a tree from before, or claimed through the sticky storage base) is
taken back through descriptors opened without following links (fchown/fchmod); a link or file where
a level belongs, or another user's trial directory, is renamed aside (`.aside-<name>-<hex>`), never
followed. A TensorBoard task reads a shared_fs trial directory only when its experiment's owner
owns it (harness/tensorboard/serve.py; the agent gives it that uid, `with_owner_uids`).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import secrets
import stat
from collections.abc import Callable
from typing import Optional

from agent_bootstrap.agent.runtime.base import RunAs

log = logging.getLogger("shipyard.agent")

MODE = 0o755
# harness/tensorboard/serve.py's SOURCES_ENV (the agent does not import the harness).
SOURCES_ENV = "SHIPYARD_TENSORBOARD_SOURCES"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def prepare(storage: str, cluster_id: str, experiment_id: str, trial_id: str, who: RunAs) -> None:
    """Make (or take back) the trial's TensorBoard levels under `storage`, which exists."""
    for name in (cluster_id, experiment_id, trial_id):
        if not name or name in (".", "..") or "/" in name or "\0" in name:
            raise ValueError(f"{name!r} is not a directory name")
    root = RunAs(0, 0)
    steps = ((cluster_id, root, False), ("tensorboard", root, False), ("experiment", root, False),
             (experiment_id, who, False), ("trial", who, False), (trial_id, who, True))
    fd = os.open(storage, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name, owner, aside_other_owner in steps:
            below = _level(fd, name, owner, aside_other_owner=aside_other_owner)
            os.close(fd)
            fd = below
    finally:
        os.close(fd)


def _level(parent: int, name: str, owner: RunAs, *, aside_other_owner: bool) -> int:
    """The directory `name` in `parent` owned by `owner`, mode 0755: its descriptor."""
    for _ in range(3):  # a task user may race us, once or twice, no more: each rename is its loss
        made = True
        try:
            os.mkdir(name, MODE, dir_fd=parent)
        except FileExistsError:
            made = False
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
        except OSError as e:
            if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            _aside(parent, name, "not a directory")  # a link or a file: not ours to follow
            continue
        try:
            st = os.fstat(fd)
            same = (st.st_uid, st.st_gid) == (owner.uid, owner.gid)
            keep = same or made or not aside_other_owner
            if keep and not same:
                if not made:
                    log.warning("event=tensorboard_dir_taken_back name=%s uid=%d to_uid=%d", name, st.st_uid, owner.uid)
                os.fchown(fd, owner.uid, owner.gid)
            if keep and stat.S_IMODE(st.st_mode) != MODE:
                os.fchmod(fd, MODE)
        except BaseException:
            os.close(fd)
            raise
        if keep:
            return fd
        os.close(fd)
        _aside(parent, name, f"owned by uid {st.st_uid}")
    raise PermissionError(f"cannot make the TensorBoard directory {name!r}: it keeps being replaced")


def _aside(parent: int, name: str, why: str) -> None:
    aside = f".aside-{name}-{secrets.token_hex(4)}"
    log.warning("event=tensorboard_dir_set_aside name=%s as=%s reason=%r", name, aside, why)
    os.rename(name, aside, src_dir_fd=parent, dst_dir_fd=parent)


def with_owner_uids(sources_json: str, run_as: Callable[[int], Optional[RunAs]]) -> str:
    """A TensorBoard task's sources (the master's JSON, each with its experiment's `owner` user id)
    with the uid that owner's trials run as (`uid`), for the reader's ownership check."""
    sources = json.loads(sources_json)
    for s in sources:
        owner = s.get("owner") if isinstance(s, dict) else None
        who = run_as(owner) if isinstance(owner, int) else None
        if who is not None:
            s["uid"] = who.uid
    return json.dumps(sources)
