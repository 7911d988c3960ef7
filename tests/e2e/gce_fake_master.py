"""Test-only master entry point: `python -m tests.e2e.gce_fake_master <det-master arguments>`.

It runs the real master with its GCP pools' providers built with anonymous credentials: the local
GCE fake (tests/fakes/gce.py) checks none, and the master itself never goes without them."""

from __future__ import annotations

import sys

from google.auth.credentials import AnonymousCredentials

from control_plane.__main__ import main
from provisioners.base import Provider
from provisioners.gcp import GcpProvider


def anonymous(_pool: str, provider: Provider) -> Provider:
    if not isinstance(provider, GcpProvider):
        return provider
    return GcpProvider(provider.cfg, cluster_id=provider.cluster_id, pool=provider.pool,
                       master_url=provider.master_url, credentials=AnonymousCredentials())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], wrap_provider=anonymous))
