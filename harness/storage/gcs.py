"""Checkpoints in a Google Cloud Storage bucket via google-cloud-storage.

Layout: gs://{bucket}/{prefix}/{uuid}/{relpath}; empty directories are zero-byte 'dir/' objects.
`STORAGE_EMULATOR_HOST` (e.g. http://127.0.0.1:9023) points the client at an emulator with
anonymous credentials, which is how tests and air-gapped setups run.
"""

from __future__ import annotations

import logging
import os
import uuid as uuidlib
from pathlib import Path
from typing import Any

from harness.storage.base import (
    PROBE_PREFIX,
    CheckpointNotFound,
    CheckpointStorage,
    StorageError,
    StorageNotWritable,
    empty_dirs,
    safe_relpath,
    validate_uuid,
    walk_tree,
)

log = logging.getLogger("harness.storage")


def make_client(project: str | None = None) -> Any:
    from google.cloud import storage

    emulator = os.environ.get("STORAGE_EMULATOR_HOST")
    if emulator:
        from google.auth.credentials import AnonymousCredentials

        return storage.Client(
            project=project or os.environ.get("GOOGLE_CLOUD_PROJECT") or "shipyard",
            credentials=AnonymousCredentials(),
            client_options={"api_endpoint": emulator},
        )
    return storage.Client(project=project) if project else storage.Client()


class GCSStorage(CheckpointStorage):
    kind = "gcs"

    def __init__(self, bucket: str, prefix: str | None = None, client: Any = None) -> None:
        if not bucket:
            raise StorageError("checkpoint_storage.bucket is required for type gcs")
        self.bucket_name = bucket
        self.prefix = (prefix or "").strip("/")
        self._client = client or make_client()
        self._bucket = self._client.bucket(bucket)

    def describe(self) -> str:
        return f"gs://{self.bucket_name}/{self.prefix}" if self.prefix else f"gs://{self.bucket_name}"

    def _key(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, *parts) if p)

    def _ckpt_prefix(self, uuid: str) -> str:
        return self._key(validate_uuid(uuid)) + "/"

    def upload(self, src_dir: Path, uuid: str) -> None:
        from google.cloud.storage.retry import DEFAULT_RETRY

        prefix = self._ckpt_prefix(uuid)
        n = 0
        # Keys are unique per checkpoint uuid, so a retried upload cannot clobber someone else's
        # object: unconditional retries are safe here.
        for entry in walk_tree(Path(src_dir)):
            if not entry.is_dir:
                self._bucket.blob(prefix + entry.relpath).upload_from_filename(str(entry.path), retry=DEFAULT_RETRY)
                n += 1
        for d in empty_dirs(Path(src_dir)):
            self._bucket.blob(prefix + d + "/").upload_from_string(b"", retry=DEFAULT_RETRY)
        log.info("event=checkpoint_uploaded storage=gcs bucket=%s uuid=%s files=%d", self.bucket_name, uuid, n)

    def upload_file(self, src: Path, key: str) -> None:
        from google.cloud.storage.retry import DEFAULT_RETRY

        # The same key always gets the same (grown) file from the one trial writing it: retrying is safe.
        self._bucket.blob(self._key(safe_relpath(key).as_posix())).upload_from_filename(str(src), retry=DEFAULT_RETRY)

    def download(self, uuid: str, dst_dir: Path) -> None:
        prefix = self._ckpt_prefix(uuid)
        blobs = list(self._client.list_blobs(self.bucket_name, prefix=prefix))
        if not blobs:
            raise CheckpointNotFound(f"checkpoint {uuid} not found in {self.describe()}")
        dst = Path(dst_dir)
        dst.mkdir(parents=True, exist_ok=True)
        for blob in blobs:
            rel = blob.name[len(prefix):]
            if not rel:
                continue
            if rel.endswith("/"):
                (dst / safe_relpath(rel.rstrip("/"))).mkdir(parents=True, exist_ok=True)
                continue
            target = dst / safe_relpath(rel)
            target.parent.mkdir(parents=True, exist_ok=True)
            blob.download_to_filename(str(target))

    def list_files(self, uuid: str) -> dict[str, int]:
        prefix = self._ckpt_prefix(uuid)
        out: dict[str, int] = {}
        for blob in self._client.list_blobs(self.bucket_name, prefix=prefix):
            rel = blob.name[len(prefix):]
            if rel:
                out[rel] = 0 if rel.endswith("/") else int(blob.size or 0)
        return out

    def delete_files(self, uuid: str, relpaths: list[str]) -> None:
        prefix = self._ckpt_prefix(uuid)
        for rel in relpaths:
            if rel.endswith("/"):
                self._delete_blobs(prefix + safe_relpath(rel.rstrip("/")).as_posix() + "/")
            else:
                self._delete_blobs(prefix + safe_relpath(rel).as_posix(), exact=True)

    def delete(self, uuid: str) -> None:
        self._delete_blobs(self._ckpt_prefix(uuid))

    def _delete_blobs(self, prefix: str, exact: bool = False) -> None:
        from google.api_core.exceptions import NotFound

        for blob in self._client.list_blobs(self.bucket_name, prefix=prefix):
            if exact and blob.name != prefix:
                continue
            try:
                blob.delete()
            except NotFound:
                pass  # deleted concurrently; the goal is reached either way

    def check_writable(self) -> None:
        from google.api_core.exceptions import GoogleAPICallError, RetryError
        from google.auth.exceptions import GoogleAuthError

        blob = self._bucket.blob(self._key(f"{PROBE_PREFIX}{uuidlib.uuid4().hex}"))
        try:
            blob.upload_from_string(b"probe")
            blob.delete()
        except GoogleAPICallError as e:
            raise StorageNotWritable(
                f"checkpoint storage {self.describe()} is not writable: {e.code} {e.message}"
            ) from e
        except (RetryError, GoogleAuthError, OSError) as e:
            raise StorageNotWritable(f"checkpoint storage {self.describe()} is not writable: {e}") from e
