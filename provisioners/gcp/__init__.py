"""The GCP provider: the Compute Engine instances of a `type: gcp` pool.

- `config`: the pool's settings (`GcpPoolConfig`), checked without the GCP SDK;
- `names`: the labels, metadata keys, instance names and request ids Shipyard writes;
- `errors`: how Compute Engine's errors are sorted into the provider taxonomy;
- `lookups`: the API clients, the call wrapper and the reads (get, list, describe);
- `provider`: `GcpProvider`, which adds launches and deletions.

Importing this package imports no GCP SDK: the registry reads `PROVIDER_TYPE.config` to check a
pool's section (the master's API workers do, to show effective settings); google-cloud-compute comes
with the first provider built, or the first use of a name below that lives in `errors` or `provider`.
"""

from __future__ import annotations

from provisioners.base import ProviderType, UserDataKind, lazy_build, lazy_exports
from provisioners.gcp.config import GcpPoolConfig as GcpPoolConfig
from provisioners.gcp.names import LABEL_MANAGED_BY as LABEL_MANAGED_BY
from provisioners.gcp.names import instance_name as instance_name
from provisioners.gcp.names import label_value as label_value
from provisioners.gcp.names import request_id as request_id

__getattr__ = lazy_exports(__name__, {
    "GcpProvider": "provider",
    "GceOperationError": "errors",
    "classify_error": "errors",
})

# GCE metadata values allow 256 KiB.
PROVIDER_TYPE = ProviderType(name="gcp", config=GcpPoolConfig, build=lazy_build(f"{__name__}.provider"),
                             user_data=UserDataKind.CLOUD_INIT, user_data_limit=256 * 1024, parks=True)
