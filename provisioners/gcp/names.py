"""What Shipyard names and labels on Compute Engine: the labels and metadata keys it writes on every
instance, the instance name and the insert's requestId of a launch. Pure functions, no GCP SDK.
"""

from __future__ import annotations

import hashlib
import re
import uuid

from provisioners.base import TAG_CLUSTER, TAG_LAUNCH_ID, TAG_MANAGED_BY, TAG_POOL, label_key

CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"

# Metadata keys. `user-data` is what cloud-init reads on GCE images; the rest carry exact values
# that label rules would mangle (uppercase, dots, URLs).
METADATA_USER_DATA = "user-data"
METADATA_MASTER = "shipyard-master"
METADATA_CLUSTER = "shipyard-cluster-id"
METADATA_POOL = "shipyard-pool"
METADATA_LAUNCH_ID = "shipyard-launch-id"

LABEL_MANAGED_BY = label_key(TAG_MANAGED_BY)
LABEL_CLUSTER = label_key(TAG_CLUSTER)
LABEL_POOL = label_key(TAG_POOL)
LABEL_LAUNCH_ID = label_key(TAG_LAUNCH_ID)
# Custom label keys may not start with it.
RESERVED_LABEL_PREFIX = "shipyard-"

# A fixed namespace so a launch id maps to the same requestId in every master process.
_REQUEST_ID_NAMESPACE = uuid.UUID("6f1d2c3e-5b7a-4c1e-9a0b-5368697079a1")


def label_value(value: str) -> str:
    """A GCE label value for `value`: lowercase, [a-z0-9_-], at most 63 characters.

    Long values keep a hash suffix so two different long ids do not collapse onto one label.
    """
    v = re.sub(r"[^a-z0-9_-]", "-", value.lower())
    if len(v) > 63:
        v = f"{v[:54]}-{hashlib.sha256(value.encode()).hexdigest()[:8]}"
    return v


def request_id(launch_id: str, zone: str) -> str:
    """The GCE requestId for inserting `launch_id` in `zone`.

    Per zone, because GCE answers a repeated requestId with the first operation: after a capacity
    failure in one zone, the same id would replay that failure in the next.
    """
    return str(uuid.uuid5(_REQUEST_ID_NAMESPACE, f"{launch_id}/{zone}"))


def instance_name(prefix: str, cluster_id: str, launch_id: str) -> str:
    """A valid GCE instance name that is a pure function of the launch, so a retried insert
    collides with (instead of duplicating) an instance that already exists."""
    digest = hashlib.sha256(f"{cluster_id}\0{launch_id}".encode()).hexdigest()[:16]
    return f"{prefix}-{digest}"


def last_segment(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]
