"""What the request telemetry (control_plane/frontdoor/access_log.py: Prometheus counters, latency
histogram, access log line) costs per request, measured on the ASGI call alone (no server, no
network): a trivial application called with and without the wrapper, the difference per request.

    .venv/bin/python benchmarks/request_telemetry.py [--requests 200000]

Two routes: a trial's metric report (the cluster's lane: counted, logged at debug, so no line is
formatted) and a user's GET (counted and logged at info through the master's formatter to
/dev/null). Target: under 30 µs per request."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from control_plane.frontdoor.access_log import RequestTelemetry  # noqa: E402
from control_plane.logs import setup_logging  # noqa: E402


class _Route:
    def __init__(self, path_format: str) -> None:
        self.path_format = path_format


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    scope["route"] = scope["_route"]  # what the router does
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


async def _send(_message: Any) -> None:
    return None


async def _receive() -> Any:
    return {"type": "http.request", "body": b"", "more_body": False}


async def _per_request_s(app: Any, method: str, path: str, template: str, n: int) -> float:
    route = _Route(template)
    start = time.perf_counter()
    for _ in range(n):
        scope = {"type": "http", "method": method, "path": path, "client": ("10.0.0.7", 40000), "_route": route}
        await app(scope, _receive, _send)
    return (time.perf_counter() - start) / n


async def main_async(n: int) -> None:
    cases = (("trial report (cluster lane, debug)", "POST", "/api/v1/trials/17/metrics",
              "/api/v1/trials/{trialId}/metrics"),
             ("user GET (logged at info)", "GET", "/api/v1/experiments/17", "/api/v1/experiments/{experimentId}"))
    wrapped = RequestTelemetry(_app)
    print(f"{'route':40} {'bare µs':>9} {'wrapped µs':>11} {'overhead µs':>12}")
    for label, method, path, template in cases:
        await _per_request_s(wrapped, method, path, template, 1000)  # warm: label children, level cache
        bare = min([await _per_request_s(_app, method, path, template, n) for _ in range(3)])
        full = min([await _per_request_s(wrapped, method, path, template, n) for _ in range(3)])
        print(f"{label:40} {bare * 1e6:9.2f} {full * 1e6:11.2f} {(full - bare) * 1e6:12.2f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=200_000)
    args = p.parse_args()
    setup_logging("info", stream=open(os.devnull, "w"))  # noqa: SIM115 - for the life of the process
    logging.getLogger("shipyard.access").setLevel(logging.INFO)
    asyncio.run(main_async(args.requests))


if __name__ == "__main__":
    main()
