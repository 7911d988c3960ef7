"""Test-only master entry point: `python -m tests.e2e.crash_after_launch <det-master arguments>`.

It runs the real master with every elastic pool's provider wrapped so that the process dies
(exit status 137, like SIGKILL) right after the cloud accepted a launch and before the autoscaler
recorded the result: the crash the chaos test in test_elastic_pools.py heals from."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence

from control_plane.__main__ import main
from provisioners.base import CloudInstance, LaunchResult, LaunchSpec, Provider

log = logging.getLogger("shipyard.tests.crash_after_launch")

EXIT_STATUS = 137


class CrashAfterLaunch:
    """A provider that dies with its process once its inner provider has launched."""

    def __init__(self, inner: Provider) -> None:
        self.inner = inner

    def launch(self, specs: Sequence[LaunchSpec]) -> LaunchResult:
        result = self.inner.launch(specs)
        log.warning("event=failpoint name=after_launch launched=%d", len(result.launched))
        for handler in logging.getLogger().handlers:
            handler.flush()
        os._exit(EXIT_STATUS)

    def list(self) -> list[CloudInstance]:
        return self.inner.list()

    def terminate(self, ids: Sequence[str]) -> None:
        self.inner.terminate(ids)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], wrap_provider=lambda _pool, provider: CrashAfterLaunch(provider)))
