"""Checkpoints: save a directory to checkpoint storage under a fresh uuid and tell the master.

    with ctx.checkpoint.store_path({"steps_completed": 100}) as (path, uuid):
        save_model(path)          # uploaded and reported when the block exits without error

    with ctx.checkpoint.restore_path(ctx.info.latest_checkpoint) as path:
        load_model(path)

shared_fs writes and reads in place (no copy); s3/gcs go through a temporary directory.
Every checkpoint carries a `metadata.json` with the user's metadata, so off-cluster `get_metadata`
works without a master. On a cluster the checkpoint is reported with
`POST /api/v1/checkpoints` (v1Checkpoint: uuid, taskId, allocationId, reportTime, resources,
metadata, state, training). Re-posting the same uuid is safe for the master (upsert), so the
report is retried like any other call.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import tempfile
import time
import uuid as uuidlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from harness.core import _wire
from harness.core._distributed import DistributedContext
from harness.core._session import APIError, NotFoundError, Session
from harness.storage import CheckpointNotFound, CheckpointStorage, list_resources

log = logging.getLogger("harness.core")

METADATA_FILE = "metadata.json"


class CheckpointRegistry(Protocol):
    """Where checkpoint records live: the master, or (off-cluster) nowhere but a log line."""

    requires_steps_completed: bool

    def reported(self, uuid: str, resources: dict[str, int], metadata: dict[str, Any]) -> None: ...
    def metadata(self, uuid: str) -> dict[str, Any] | None: ...
    def deleted(self, uuid: str) -> None: ...


class MasterCheckpointRegistry:
    requires_steps_completed = True

    def __init__(self, session: Session, *, task_id: str | None, allocation_id: str | None,
                 trial_id: int | None, experiment_id: int | None) -> None:
        self._session = session
        self._task_id = task_id
        self._allocation_id = allocation_id
        self._trial_id = trial_id
        self._experiment_id = experiment_id

    def reported(self, uuid: str, resources: dict[str, int], metadata: dict[str, Any]) -> None:
        body: dict[str, Any] = {
            "uuid": uuid,
            "taskId": self._task_id,
            "allocationId": self._allocation_id,
            "reportTime": _wire.rfc3339(time.time()),
            # int64 travels as a string in grpc-gateway JSON; Determined's client sends strings.
            "resources": {k: str(v) for k, v in resources.items()},
            "metadata": metadata,
            "state": "STATE_COMPLETED",
        }
        if self._trial_id is not None:
            body["training"] = {"trialId": self._trial_id, "experimentId": self._experiment_id}
        self._session.post("/api/v1/checkpoints", body)
        log.info("event=checkpoint_reported uuid=%s trial_id=%s steps_completed=%s", uuid, self._trial_id,
                 metadata.get("steps_completed"))

    def metadata(self, uuid: str) -> dict[str, Any] | None:
        resp = self._session.get(f"/api/v1/checkpoints/{uuid}")
        ckpt = resp.get("checkpoint") if isinstance(resp, dict) else None
        return dict((ckpt or {}).get("metadata") or {})

    def deleted(self, uuid: str) -> None:
        # Determined's PATCH /api/v1/checkpoints with no resources left marks it deleted. Best
        # effort: the bytes are already gone, and the master's GC reconciles what remains.
        body = {"checkpoints": [{"uuid": uuid, "resources": {"resources": {}}}]}
        try:
            self._session.patch("/api/v1/checkpoints", body)
        except APIError as e:
            log.warning("event=checkpoint_delete_not_recorded uuid=%s error=%r", uuid, str(e))


class LocalCheckpointRegistry:
    requires_steps_completed = False

    def __init__(self) -> None:
        self.checkpoints: dict[str, dict[str, Any]] = {}

    def reported(self, uuid: str, resources: dict[str, int], metadata: dict[str, Any]) -> None:
        self.checkpoints[uuid] = {"resources": resources, "metadata": metadata}
        log.info("event=checkpoint_saved uuid=%s files=%d off_cluster=true", uuid,
                 sum(1 for k in resources if not k.endswith("/")))

    def metadata(self, uuid: str) -> dict[str, Any] | None:
        entry = self.checkpoints.get(uuid)
        return dict(entry["metadata"]) if entry else None  # else: read metadata.json from storage

    def deleted(self, uuid: str) -> None:
        self.checkpoints.pop(uuid, None)


class CheckpointContext:
    def __init__(self, storage: CheckpointStorage, dist: DistributedContext, registry: CheckpointRegistry) -> None:
        self.storage = storage
        self._dist = dist
        self._registry = registry

    # ---- saving ---------------------------------------------------------------------------------

    def _check_metadata(self, metadata: dict[str, Any] | None, shard: bool, what: str) -> dict[str, Any]:
        if shard and self._dist.size > 1:
            raise NotImplementedError("sharded checkpoints across several processes are not supported yet")
        if not self._dist.is_chief:
            raise RuntimeError(f"{what}(shard=False) may only be called by the chief (rank 0), "
                               f"not rank {self._dist.rank}")
        metadata = dict(metadata or {})
        if self._registry.requires_steps_completed and "steps_completed" not in metadata:
            raise ValueError("checkpoint metadata must include 'steps_completed'")
        return metadata

    @contextlib.contextmanager
    def store_path(self, metadata: dict[str, Any] | None = None, *,
                   shard: bool = False) -> Iterator[tuple[Path, str]]:
        """Yield (directory to save into, checkpoint uuid); upload and report when the block exits.
        If the block raises, nothing is uploaded or reported and the directory is removed."""
        metadata = self._check_metadata(metadata, shard, "store_path")
        uuid = str(uuidlib.uuid4())
        direct = self.storage.direct_path(uuid)
        if direct is not None:
            direct.mkdir(parents=True, exist_ok=False)
            path, cleanup_tmp = direct, False
        else:
            path, cleanup_tmp = Path(tempfile.mkdtemp(prefix=f"ckpt-{uuid[:8]}-")), True
        try:
            try:
                yield path, uuid
            except BaseException:
                shutil.rmtree(path, ignore_errors=True)
                raise
            self._finish(path, uuid, metadata)
        finally:
            if cleanup_tmp:
                shutil.rmtree(path, ignore_errors=True)

    def upload(self, ckpt_dir: str | Path, metadata: dict[str, Any] | None = None, *, shard: bool = False) -> str:
        """Copy ckpt_dir (its contents, not its name) into storage as a new checkpoint; return the uuid."""
        metadata = self._check_metadata(metadata, shard, "upload")
        src = Path(ckpt_dir)
        if not src.is_dir():
            raise FileNotFoundError(f"checkpoint directory {src} does not exist")
        uuid = str(uuidlib.uuid4())
        # metadata.json is written into a staging copy so the caller's directory stays untouched.
        with tempfile.TemporaryDirectory(prefix=f"ckpt-{uuid[:8]}-") as tmp:
            staged = Path(tmp) / "ckpt"
            shutil.copytree(src, staged, symlinks=False)
            self._finish(staged, uuid, metadata)
        return uuid

    def _finish(self, path: Path, uuid: str, metadata: dict[str, Any]) -> None:
        (path / METADATA_FILE).write_text(json.dumps(_wire.jsonable(metadata), indent=2))
        resources = list_resources(path)
        t0 = time.monotonic()
        self.storage.upload(path, uuid)
        log.info("event=checkpoint_stored uuid=%s storage=%s bytes=%d seconds=%.3f", uuid, self.storage.describe(),
                 sum(resources.values()), time.monotonic() - t0)
        self._registry.reported(uuid, resources, metadata)

    # ---- loading --------------------------------------------------------------------------------

    @contextlib.contextmanager
    def restore_path(self, uuid: str) -> Iterator[Path]:
        """Yield a local directory holding checkpoint `uuid` (treat it as read-only)."""
        direct = self.storage.direct_path(uuid)
        if direct is not None:
            if not direct.is_dir():
                raise CheckpointNotFound(f"checkpoint {uuid} not found in {self.storage.describe()}")
            yield direct
            return
        tmp = Path(tempfile.mkdtemp(prefix=f"restore-{uuid[:8]}-"))
        try:
            self.storage.download(uuid, tmp)
            yield tmp
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def download(self, uuid: str, dest: str | Path) -> None:
        self.storage.download(uuid, Path(dest))

    def get_metadata(self, uuid: str) -> dict[str, Any]:
        try:
            found = self._registry.metadata(uuid)
        except NotFoundError:
            raise CheckpointNotFound(f"checkpoint {uuid} is not known to the master") from None
        if found is not None:
            return found
        with self.restore_path(uuid) as path:
            meta_file = path / METADATA_FILE
            return json.loads(meta_file.read_text()) if meta_file.exists() else {}

    def delete(self, uuid: str) -> None:
        self.storage.delete(uuid)
        self._registry.deleted(uuid)
        log.info("event=checkpoint_deleted uuid=%s storage=%s", uuid, self.storage.describe())
