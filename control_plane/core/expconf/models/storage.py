"""The checkpoint_storage section: shared_fs, s3 or gcs, told apart by ``type``, with the GC
policy fields they share."""

from typing import Annotated, Literal

from pydantic import Discriminator, Field, Tag

from control_plane.core.expconf.models.base import ConfigModel, Int32, NonEmptyStr, tagged_by

__all__ = ["STORAGE_TYPES", "CheckpointStorage", "GCSStorage", "S3Storage", "SharedFSStorage"]

STORAGE_TYPES: tuple[str, ...] = ("shared_fs", "s3", "gcs")


class _StorageBase(ConfigModel):
    type: str  # narrowed to a Literal by each storage; declared here so dumps list it first
    save_experiment_best: Int32 = Field(default=0, ge=0)
    save_trial_best: Int32 = Field(default=1, ge=0)
    save_trial_latest: Int32 = Field(default=1, ge=0)


class SharedFSStorage(_StorageBase):
    type: Literal["shared_fs"]
    host_path: NonEmptyStr
    storage_path: NonEmptyStr | None = None
    propagation: str = "rprivate"


class S3Storage(_StorageBase):
    type: Literal["s3"]
    bucket: NonEmptyStr
    prefix: str | None = None
    # Both or neither: without keys the agent uses its instance role / default credentials.
    access_key: NonEmptyStr | None = None
    secret_key: NonEmptyStr | None = None
    endpoint_url: NonEmptyStr | None = None


class GCSStorage(_StorageBase):
    type: Literal["gcs"]
    bucket: NonEmptyStr
    prefix: str | None = None


CheckpointStorage = Annotated[
    Annotated[SharedFSStorage, Tag("storage=shared_fs")]
    | Annotated[S3Storage, Tag("storage=s3")]
    | Annotated[GCSStorage, Tag("storage=gcs")],
    Discriminator(
        tagged_by("type", "storage", STORAGE_TYPES),
        custom_error_type="storage_type",
        custom_error_message="unknown storage",
    ),
]
