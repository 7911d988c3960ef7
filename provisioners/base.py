"""The one seam every place instances come from sits behind.

A provider is `launch / list / terminate` plus one error taxonomy that the autoscaler acts on.
Providers hold no state that matters: instances are found again by their cloud tags, so a
restarted master rebuilds its picture from `list()`.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

# Tag keys written on every instance. AWS takes them as tags; GCP labels only allow [a-z0-9_-],
# so the GCP provider maps ':' to '-' (see `label_key`).
TAG_MANAGED_BY = "shipyard:managed-by"
TAG_CLUSTER = "shipyard:cluster-id"
TAG_POOL = "shipyard:pool"
TAG_MASTER = "shipyard:master"
TAG_LAUNCH_ID = "shipyard:launch-id"
MANAGED_BY_VALUE = "shipyard"


def label_key(tag_key: str) -> str:
    """GCP label form of a tag key: lowercase, ':' → '-'."""
    return tag_key.replace(":", "-").lower()


class InstanceState(enum.StrEnum):
    PENDING = "pending"  # accepted by the cloud, not yet running
    RUNNING = "running"
    STOPPING = "stopping"  # shutting down / being deleted
    TERMINATED = "terminated"


class ErrorKind(enum.StrEnum):
    CAPACITY = "capacity"  # no capacity in this zone/subnet: try the next one
    QUOTA = "quota"  # account limit: back the pool off exponentially, show it on the pool
    THROTTLED = "throttled"  # rate limited: retry with jitter (bounded)
    AUTH = "auth"  # bad credentials / permissions: stop launching, show it
    INVALID = "invalid"  # bad configuration (image, type, subnet...): stop launching, show it
    UNKNOWN = "unknown"  # anything else: treated like a transient failure with backoff


class ErrorScope(enum.StrEnum):
    ZONE = "zone"
    REGION = "region"
    CLOUD = "cloud"


class ProviderError(Exception):
    def __init__(
        self,
        kind: ErrorKind,
        message: str,
        *,
        scope: ErrorScope = ErrorScope.REGION,
        code: str = "",
        location: str = "",
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.scope = scope
        self.code = code  # the cloud's own error code, e.g. InsufficientInstanceCapacity
        self.location = location  # subnet id or zone the error applies to

    def __str__(self) -> str:
        where = f" at {self.location}" if self.location else ""
        code = f" ({self.code})" if self.code else ""
        return f"{self.kind.value}{code}{where}: {self.args[0]}"


@dataclass(frozen=True)
class LaunchSpec:
    """One instance to launch. `launch_id` is chosen by the master and recorded before the call;
    it is the idempotency key (AWS ClientToken / GCE requestId) and is tagged on the instance so
    that a crash between launch and record can be healed by the orphan sweep."""

    launch_id: str
    user_data: str


@dataclass(frozen=True)
class CloudInstance:
    id: str  # the cloud's instance id (AWS i-..., GCE instance name)
    state: InstanceState
    launched_at: datetime
    launch_id: str | None = None
    private_ip: str | None = None
    public_ip: str | None = None
    location: str = ""  # subnet id or zone
    instance_type: str = ""
    spot: bool = False
    tags: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class LaunchResult:
    launched: tuple[CloudInstance, ...]
    # Partial failures (e.g. capacity in every subnet after some succeeded) are reported here,
    # not raised, so the caller records what did launch.
    error: ProviderError | None = None


class Provider(Protocol):
    """launch / list / terminate. Every call is bounded in time and attempts."""

    def launch(self, specs: Sequence[LaunchSpec]) -> LaunchResult: ...

    def list(self) -> list[CloudInstance]:
        """Every non-terminated instance carrying this cluster's and this pool's tags."""
        ...

    def terminate(self, ids: Sequence[str]) -> None:
        """Idempotent: terminating an instance that is already gone is not an error."""
        ...
