"""The provider error taxonomy: what went wrong with a cloud call (kind) and how far it reaches
(scope).

Providers classify their cloud's errors into it (provisioners/), and the master's pure backoff core
(control_plane/core/scaling/backoff.py) decides from it how long a pool waits before launching
again. It lives in the shared package because providers import nothing from control_plane and the
cores import no provider."""

from __future__ import annotations

from shipyard_common.compat import StrEnum


class ErrorKind(StrEnum):
    CAPACITY = "capacity"  # no capacity in this zone/subnet: try the next one
    QUOTA = "quota"  # account limit: back the pool off exponentially, show it on the pool
    THROTTLED = "throttled"  # rate limited: retry with jitter (bounded)
    AUTH = "auth"  # bad credentials / permissions: stop launching, show it
    INVALID = "invalid"  # bad configuration (image, type, subnet...): stop launching, show it
    UNKNOWN = "unknown"  # anything else: treated like a transient failure with backoff


class ErrorScope(StrEnum):
    """How much of the pool's capacity the error blocks (as SkyPilot sorts failover errors)."""

    ZONE = "zone"  # one zone, subnet or host: the pool's other locations may still work
    REGION = "region"  # every location the pool launches into
    CLOUD = "cloud"  # the whole account or provider
