"""A checkpoint's files as one archive, read by the master from the checkpoint's storage (the
`checkpoint_storage` kept on its row, through harness/storage): what Determined's
`det checkpoint download --mode master` (and `auto`, when the client cannot reach the storage
itself) fetches from `GET /checkpoints/{uuid}`. The files go through a private temporary directory
that is removed when the archive is built; the caller removes the archive once sent."""

from __future__ import annotations

import shutil
import tarfile
import tempfile
import zipfile
from pathlib import Path

from control_plane.core import states as st
from control_plane.db.models import Checkpoint
from control_plane.errors import Conflict, not_found

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
