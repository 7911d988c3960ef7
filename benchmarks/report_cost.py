"""What `report_training_metrics` costs the training loop.

Each scenario makes N calls through the real Core API (`harness.core.init()` in cluster mode, the
background reporter shipping to a dummy master that runs in a separate process so it does not
compete for this process's GIL), timing every call individually. Prints ns per call (mean, p50,
p99, p99.9, max) and whether every report was delivered.

    .venv/bin/python benchmarks/report_cost.py            # 100k calls per scenario
    .venv/bin/python benchmarks/report_cost.py --calls 20000
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import harness.core  # noqa: E402

# ---- the dummy master (runs in its own process) -------------------------------------------------

def serve(port: int) -> None:
    received = {"reports": 0, "requests": 0}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True
        wbufsize = 64 * 1024

        def log_message(self, *args: Any) -> None:
            pass

        def _reply(self, body: bytes) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path.endswith("/metrics/batch"):
                received["reports"] += len(json.loads(raw)["reports"])
            elif self.path.endswith("/metrics"):
                received["reports"] += 1
            received["requests"] += 1
            self._reply(b"{}")

        def do_GET(self) -> None:
            if self.path == "/count":
                self._reply(json.dumps(received).encode())
            elif "/signals/preemption" in self.path:
                time.sleep(1.0)  # a lazy long poll
                self._reply(b'{"preempt": false}')
            else:
                self._reply(b'{"op": null, "completed": true}')

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    server.serve_forever()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_sink() -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, __file__, "--serve", str(port)])
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            urllib.request.urlopen(url + "/count", timeout=1).read()
            return proc, url
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("sink did not start")


def sink_count(url: str) -> int:
    return json.loads(urllib.request.urlopen(url + "/count", timeout=5).read())["reports"]


# ---- measurement --------------------------------------------------------------------------------

def env_for(master_url: str, storage: Path) -> dict[str, str]:
    return {
        "DET_MASTER": master_url,
        "DET_SESSION_TOKEN": "bench",
        "DET_TRIAL_ID": "1",
        "DET_EXPERIMENT_ID": "1",
        "DET_ALLOCATION_ID": "1.1.1",
        "DET_TASK_ID": "1.1",
        "DET_TRIAL_RUN_ID": "1",
        "DET_EXPERIMENT_CONFIG": json.dumps({"checkpoint_storage": {"type": "shared_fs", "host_path": str(storage)}}),
    }


def pct(sorted_ns: list[int], q: float) -> int:
    return sorted_ns[min(len(sorted_ns) - 1, int(q * len(sorted_ns)))]


def time_calls(n: int, call: Callable[[int], None]) -> list[int]:
    out = [0] * n
    clock = time.perf_counter_ns
    for i in range(n):
        t0 = clock()
        call(i)
        out[i] = clock() - t0
    return out


def run_scenario(name: str, n: int, master_url: str | None, metrics: dict[str, Any],
                 batch_metrics: list[dict[str, Any]] | None, storage: Path) -> dict[str, Any]:
    if master_url is None:
        ctx = harness.core.init(off_cluster=True, checkpoint_storage=storage, print_metrics=False)
    else:
        cfg = harness.core.ReporterConfig(flush_timeout_s=120 if "down" not in name else 0.5)
        ctx = harness.core.init(env=env_for(master_url, storage), reporter_config=cfg)
    before = sink_count(master_url) if master_url and "down" not in name else 0
    report = ctx.train.report_training_metrics
    samples = time_calls(n, lambda i: report(i, metrics, batch_metrics))
    t_close = time.perf_counter()
    try:
        ctx.close()
    except harness.core.MetricsReportError:
        pass  # expected when the master is down
    drain_s = time.perf_counter() - t_close
    delivered: str
    if master_url is None:
        delivered = f"{len(ctx.train_sink.reports)}/{n} kept"  # type: ignore[union-attr]
    elif "down" in name:
        delivered = f"0/{n} (lost at close, as configured)"
    else:
        delivered = f"{sink_count(master_url) - before}/{n}"
    samples.sort()
    return {
        "scenario": name,
        "mean": statistics.fmean(samples),
        "p50": pct(samples, 0.50),
        "p99": pct(samples, 0.99),
        "p999": pct(samples, 0.999),
        "max": samples[-1],
        "drain_s": drain_s,
        "delivered": delivered,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=100_000)
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(args.serve)
        return

    n = args.calls
    logging.getLogger("harness").setLevel(logging.CRITICAL)  # retries while "down" are expected
    small = {"loss": 0.25, "accuracy": 0.91, "lr": 1e-3}
    large = {f"metric_{i}": i * 0.5 for i in range(50)}
    batch = [{"loss": 0.25, "accuracy": 0.9} for _ in range(32)]
    proc, url = start_sink()
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            storage = Path(tmp)
            baseline = sorted(time_calls(n, lambda i: None))
            rows.append({"scenario": "timer + empty call (baseline)", "mean": statistics.fmean(baseline),
                         "p50": pct(baseline, 0.5), "p99": pct(baseline, 0.99), "p999": pct(baseline, 0.999),
                         "max": baseline[-1], "drain_s": 0.0, "delivered": "-"})
            rows.append(run_scenario("3 metrics, master up", n, url, small, None, storage))
            rows.append(run_scenario("50 metrics, master up", n, url, large, None, storage))
            rows.append(run_scenario("3 metrics + 32 batch_metrics", n, url, small, batch, storage))
            rows.append(run_scenario("3 metrics, master down", n, f"http://127.0.0.1:{free_port()}", small, None,
                                     storage))
            rows.append(run_scenario("3 metrics, off-cluster", n, None, small, None, storage))
    finally:
        proc.terminate()
        proc.wait(10)

    print(f"\nreport_training_metrics cost on the calling thread ({n:,} calls per scenario, "
          f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]})\n")
    header = f"{'scenario':<34} {'mean ns':>9} {'p50 ns':>8} {'p99 ns':>8} {'p99.9 ns':>9} {'max ns':>10} " \
             f"{'drain s':>8}  delivered"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['scenario']:<34} {r['mean']:>9.0f} {r['p50']:>8} {r['p99']:>8} {r['p999']:>9} {r['max']:>10} "
              f"{r['drain_s']:>8.2f}  {r['delivered']}")


if __name__ == "__main__":
    main()
