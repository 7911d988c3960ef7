"""Checkpoint storage backends, chosen from the experiment config's `checkpoint_storage`.

    {"type": "shared_fs", "host_path": "/mnt/ckpt", "storage_path": "exp"}   -> SharedFSStorage
    {"type": "s3", "bucket": ..., "prefix": ..., "access_key": ..., "secret_key": ...,
     "endpoint_url": ...}                                                    -> S3Storage
    {"type": "gcs", "bucket": ..., "prefix": ...}                            -> GCSStorage

A string is accepted too (handy off-cluster): "s3://bucket/prefix", "gs://bucket/prefix", or a
local directory path.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.storage.base import (
    CheckpointNotFound,
    CheckpointStorage,
    StorageConfigError,
    StorageError,
    StorageNotWritable,
    list_resources,
)
from harness.storage.shared_fs import SharedFSStorage

__all__ = [
    "CheckpointNotFound",
    "CheckpointStorage",
    "StorageConfigError",
    "StorageError",
    "StorageNotWritable",
    "SharedFSStorage",
    "from_config",
    "list_resources",
]


def from_config(config: Mapping[str, Any] | str | Path) -> CheckpointStorage:
    if isinstance(config, (str, Path)):
        return _from_string(str(config))
    if not isinstance(config, Mapping):
        raise StorageConfigError(f"checkpoint_storage must be a mapping or a string, got {type(config).__name__}")
    kind = config.get("type")
    if kind == "shared_fs":
        return SharedFSStorage.from_config(config.get("host_path") or "", config.get("storage_path"))
    if kind == "s3":
        from harness.storage.s3 import S3Storage

        _require(config, "bucket", kind)
        return S3Storage(
            bucket=config["bucket"],
            prefix=config.get("prefix"),
            access_key=config.get("access_key"),
            secret_key=config.get("secret_key"),
            endpoint_url=config.get("endpoint_url"),
            region=config.get("region"),
        )
    if kind == "gcs":
        from harness.storage.gcs import GCSStorage

        _require(config, "bucket", kind)
        return GCSStorage(bucket=config["bucket"], prefix=config.get("prefix"))
    raise StorageConfigError(
        f"checkpoint_storage.type: unsupported value {kind!r} (expected shared_fs, s3 or gcs)"
    )


def _require(config: Mapping[str, Any], key: str, kind: str) -> None:
    if not config.get(key):
        raise StorageConfigError(f"checkpoint_storage.{key} is required for type {kind}")


def _from_string(spec: str) -> CheckpointStorage:
    for scheme, kind in (("s3://", "s3"), ("gs://", "gcs")):
        if spec.startswith(scheme):
            bucket, _, prefix = spec[len(scheme):].partition("/")
            return from_config({"type": kind, "bucket": bucket, "prefix": prefix or None})
    return SharedFSStorage(Path(spec).expanduser().absolute())
