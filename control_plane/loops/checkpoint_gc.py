"""The checkpoint GC loop: delete the files of checkpoints marked STATE_DELETING (by
services/checkpoint_gc.py when an experiment ends) and mark them STATE_DELETED. Level-triggered: a
crash between the two leaves rows in STATE_DELETING, which the next pass finishes."""

from __future__ import annotations

import logging

from sqlalchemy import select

from control_plane.core import states as st
from control_plane.db.engine import transaction
from control_plane.db.models import Checkpoint
from control_plane.master import Master

log = logging.getLogger("shipyard.gc")


def delete_pending(master: Master, limit: int = 100) -> int:
    """Delete the files of checkpoints in STATE_DELETING; returns how many finished."""
    from harness.storage import CheckpointNotFound, from_config

    with master.sessions() as s:
        rows = [(c.uuid, dict(c.storage or {})) for c in s.scalars(
            select(Checkpoint).where(Checkpoint.state == st.CheckpointState.DELETING).limit(limit))]
    done = 0
    for uuid, storage in rows:
        try:
            if storage:
                from_config(storage).delete(uuid)
        except CheckpointNotFound:
            pass
        except Exception as e:  # storage down: stay DELETING, retried on the next pass
            log.warning("event=checkpoint_delete_failed uuid=%s error=%s", uuid, e)
            continue
        with transaction(master.sessions) as s:
            c = s.get(Checkpoint, uuid)
            if c is not None and c.state == st.CheckpointState.DELETING:
                c.state, c.resources, c.size_bytes = st.CheckpointState.DELETED, {}, 0
                done += 1
        log.info("event=checkpoint_deleted uuid=%s", uuid)
    return done


def register(master: Master) -> None:
    master.add_loop("checkpoint-gc", lambda: delete_pending(master), 5.0)
