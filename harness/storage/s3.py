"""Checkpoints in an S3 bucket (or anything speaking the S3 API: MinIO, moto) via boto3.

Layout: s3://{bucket}/{prefix}/{uuid}/{relpath}. Object stores have no directories, so an empty
directory is kept as a zero-byte object whose key ends in '/'.
"""

from __future__ import annotations

import logging
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

_DELETE_CHUNK = 1000  # DeleteObjects takes at most 1000 keys


class S3Storage(CheckpointStorage):
    kind = "s3"

    def __init__(
        self,
        bucket: str,
        prefix: str | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
        endpoint_url: str | None = None,
        region: str | None = None,
        client: Any = None,
    ) -> None:
        if not bucket:
            raise StorageError("checkpoint_storage.bucket is required for type s3")
        self.bucket = bucket
        self.prefix = (prefix or "").strip("/")
        self.endpoint_url = endpoint_url
        self._client = client or self._make_client(access_key, secret_key, endpoint_url, region)

    @staticmethod
    def _make_client(access_key: str | None, secret_key: str | None, endpoint_url: str | None,
                     region: str | None) -> Any:
        import boto3
        from botocore.config import Config

        # botocore's "standard" retry mode: bounded attempts, exponential backoff with jitter,
        # only on throttling / 5xx / connection errors.
        config = Config(
            retries={"max_attempts": 6, "mode": "standard"},
            connect_timeout=10,
            read_timeout=60,
            # Custom endpoints (MinIO, moto, on-prem) rarely have virtual-host DNS for buckets.
            s3={"addressing_style": "path"} if endpoint_url else None,
        )
        return boto3.session.Session().client(
            "s3",
            aws_access_key_id=access_key or None,
            aws_secret_access_key=secret_key or None,
            endpoint_url=endpoint_url or None,
            region_name=region or None,
            config=config,
        )

    def describe(self) -> str:
        where = f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"
        return f"{where} (endpoint {self.endpoint_url})" if self.endpoint_url else where

    def _key(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, *parts) if p)

    def _ckpt_prefix(self, uuid: str) -> str:
        return self._key(validate_uuid(uuid)) + "/"

    def _keys(self, prefix: str) -> list[str]:
        keys: list[str] = []
        paginator = self._client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
            keys.extend(obj["Key"] for obj in page.get("Contents", []))
        return keys

    def upload(self, src_dir: Path, uuid: str) -> None:
        prefix = self._ckpt_prefix(uuid)
        n = 0
        for entry in walk_tree(Path(src_dir)):
            if not entry.is_dir:
                self._client.upload_file(str(entry.path), self.bucket, prefix + entry.relpath)
                n += 1
        for d in empty_dirs(Path(src_dir)):
            self._client.put_object(Bucket=self.bucket, Key=prefix + d + "/", Body=b"")
        log.info("event=checkpoint_uploaded storage=s3 bucket=%s uuid=%s files=%d", self.bucket, uuid, n)

    def upload_file(self, src: Path, key: str) -> None:
        self._client.upload_file(str(src), self.bucket, self._key(safe_relpath(key).as_posix()))

    def download(self, uuid: str, dst_dir: Path) -> None:
        prefix = self._ckpt_prefix(uuid)
        keys = self._keys(prefix)
        if not keys:
            raise CheckpointNotFound(f"checkpoint {uuid} not found in {self.describe()}")
        dst = Path(dst_dir)
        dst.mkdir(parents=True, exist_ok=True)
        for key in keys:
            rel = key[len(prefix):]
            if not rel:
                continue
            if rel.endswith("/"):
                (dst / safe_relpath(rel.rstrip("/"))).mkdir(parents=True, exist_ok=True)
                continue
            target = dst / safe_relpath(rel)
            target.parent.mkdir(parents=True, exist_ok=True)
            self._client.download_file(self.bucket, key, str(target))

    def list_files(self, uuid: str) -> dict[str, int]:
        prefix = self._ckpt_prefix(uuid)
        out: dict[str, int] = {}
        for page in self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                rel = obj["Key"][len(prefix):]
                if rel:
                    out[rel] = 0 if rel.endswith("/") else int(obj["Size"])
        return out

    def delete_files(self, uuid: str, relpaths: list[str]) -> None:
        prefix = self._ckpt_prefix(uuid)
        whole = [prefix + safe_relpath(r.rstrip("/")).as_posix() + "/" for r in relpaths if r.endswith("/")]
        keys = {prefix + safe_relpath(r).as_posix() for r in relpaths if not r.endswith("/")}
        for d in whole:
            keys.update(self._keys(d))
        self._delete_keys(sorted(keys), uuid)

    def delete(self, uuid: str) -> None:
        self._delete_keys(self._keys(self._ckpt_prefix(uuid)), uuid)

    def _delete_keys(self, keys: list[str], uuid: str) -> None:
        for i in range(0, len(keys), _DELETE_CHUNK):
            chunk = keys[i:i + _DELETE_CHUNK]
            resp = self._client.delete_objects(
                Bucket=self.bucket, Delete={"Objects": [{"Key": k} for k in chunk], "Quiet": True}
            )
            errors = resp.get("Errors") or []
            if errors:
                first = errors[0]
                raise StorageError(
                    f"deleting checkpoint {uuid} from {self.describe()}: {len(errors)} objects failed, "
                    f"e.g. {first.get('Key')}: {first.get('Code')} {first.get('Message')}"
                )

    def check_writable(self) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        key = self._key(f"{PROBE_PREFIX}{uuidlib.uuid4().hex}")
        try:
            self._client.put_object(Bucket=self.bucket, Key=key, Body=b"probe")
            self._client.delete_object(Bucket=self.bucket, Key=key)
        except ClientError as e:
            err = e.response.get("Error", {})
            raise StorageNotWritable(
                f"checkpoint storage {self.describe()} is not writable: "
                f"{err.get('Code', 'error')}: {err.get('Message', str(e))}"
            ) from e
        except BotoCoreError as e:
            raise StorageNotWritable(f"checkpoint storage {self.describe()} is not writable: {e}") from e
