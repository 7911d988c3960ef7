"""A checkpoint's files as one archive, read by the master from the checkpoint's storage (the
`checkpoint_storage` kept on its row, through harness/storage): what Determined's
`det checkpoint download --mode master` (and `auto`, when the client cannot reach the storage
itself) fetches from `GET /checkpoints/{uuid}`. The files go through a private temporary directory
that is removed when the archive is built; the caller removes the archive once sent. Also
`det checkpoint rm`: removing some of a checkpoint's files (remove_files)."""

from __future__ import annotations

import shutil
import tarfile
import tempfile
import zipfile
from pathlib import Path

from sqlalchemy.orm import Session

from control_plane.auth import Principal
from control_plane.core import checkpoint_globs
from control_plane.core import states as st
from control_plane.db.models import Checkpoint
from control_plane.errors import Conflict, bad_request, not_found
from control_plane.master import Master
from control_plane.services import checkpoints

FORMATS = {"application/gzip": "tgz", "application/x-gzip": "tgz", "application/zip": "zip"}


def archive(ckpt: Checkpoint, fmt: str) -> Path:
    """A temporary .tar.gz or .zip (fmt "tgz" / "zip") of the checkpoint's files, named relative to
    the checkpoint's root."""
    from harness.storage import CheckpointNotFound, StorageError, from_config

    if ckpt.state not in (st.CheckpointState.COMPLETED, st.CheckpointState.PARTIALLY_DELETED):
        raise Conflict(f"checkpoint {ckpt.uuid} is {st.checkpoint_wire_state(ckpt.state)}: only COMPLETED or "
                       "PARTIALLY_DELETED checkpoints can be downloaded")
    if not ckpt.storage:
        raise not_found(f"checkpoint {ckpt.uuid}'s storage")
    work = Path(tempfile.mkdtemp(prefix="shipyard-ckpt-"))
    try:
        files = work / "files"
        try:
            from_config(ckpt.storage).download(ckpt.uuid, files)
        except CheckpointNotFound:
            raise not_found(f"checkpoint {ckpt.uuid}'s files in its storage") from None
        except (StorageError, Exception) as e:  # the storage's own client errors too: it is outside
            raise Conflict(f"could not read checkpoint {ckpt.uuid} from its storage: {e}") from None
        fd, name = tempfile.mkstemp(prefix=f"{ckpt.uuid}-", suffix=".tar.gz" if fmt == "tgz" else ".zip")
        out = Path(name)
        with open(fd, "wb") as f:
            if fmt == "tgz":
                with tarfile.open(fileobj=f, mode="w:gz") as tf:
                    for p in sorted(files.rglob("*")):
                        tf.add(p, arcname=p.relative_to(files).as_posix(), recursive=False)
            else:
                with zipfile.ZipFile(f, "w", zipfile.ZIP_DEFLATED) as zf:
                    for p in sorted(files.rglob("*")):
                        zf.write(p, p.relative_to(files).as_posix())
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)


def remove_files(s: Session, master: Master, p: Principal, uuids: list[str], globs: list[str]) -> None:
    """Determined's CheckpointsRemoveFiles (`det checkpoint rm UUID,... [--glob G]...`): remove the
    files the globs match from each checkpoint's storage and shrink its resources to what is left
    (STATE_PARTIALLY_DELETED); globs that match every file delete the checkpoint whole through the
    GC loop, as `det checkpoint delete`; no glob re-reads the resources from storage.

    Authorized (the checkpoints' owner, or an admin for one without an experiment) before any uuid
    is said to exist; a checkpoint in the model registry refuses the whole request. The storage is
    changed before the rows: if it fails part-way, the request changes no row and says which
    checkpoint failed, and `rm` without a glob then brings the rows back in line with storage."""
    from harness.storage import from_config

    for i, g in enumerate(globs):
        if (problem := checkpoint_globs.glob_problem(g)) is not None:
            raise bad_request(f"glob {g!r} {problem}", f"checkpointGlobs[{i}]")
    ckpts = checkpoints.owned_checkpoints(s, p, uuids, "checkpointUuids")
    checkpoints.refuse_registered(s, ckpts)
    whole: list[Checkpoint] = []
    for c in ckpts:
        if c.state in st.CKPT_GONE or not c.storage:
            continue
        try:
            storage = from_config(c.storage)
            stored = storage.list_files(c.uuid)
            gone = checkpoint_globs.removed(stored, globs)
            if globs and checkpoint_globs.removes_every_file(stored, gone):
                whole.append(c)
                continue
            storage.delete_files(c.uuid, sorted(gone))
        except Exception as e:  # the storage's own client errors too: it is outside
            raise Conflict(f"could not change checkpoint {c.uuid} in its storage: {e}") from None
        checkpoints.set_resources(c, {k: v for k, v in stored.items() if k not in gone})
    if whole:
        checkpoints.request_deletion(s, master, whole, p)
