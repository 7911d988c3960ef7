"""Which missing host directories the agent may make for a task (as root, and then hand to the
task's user): only below the roots it was given (the cluster's checkpoint storage root, which the
master names in each task's ContainerSpec.storage_root, and the agent's own work dir).

The paths come from an experiment config; the master refuses a shared_fs storage elsewhere unless
its admin allows host access, but a directory the agent makes is a privilege of its own (a trial
that owns a new `/etc/systemd/system/x.service.d`, or a sticky world-writable one there, is root on
the agent), so the agent checks too. Paths are compared after resolving symlinks: a trial can plant
`root/link -> /etc` in the storage it writes to, and `storage_path: link/x` must not follow it."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Optional


def outside_roots(path: str, roots: Iterable[Optional[str]]) -> Optional[str]:
    """None when `path` (resolved) is one of `roots` or below one; else why the agent will not make it."""
    given = [r for r in roots if r]
    real = os.path.realpath(path)
    for root in given:
        base = os.path.realpath(root)
        if real == base or real.startswith(base.rstrip("/") + "/"):
            return None
    where = " or ".join(given) if given else "no root given"
    return (f"{path} does not exist and the agent makes missing directories only under the cluster's checkpoint "
            f"storage and its work dir ({where}); create it on the host first")
