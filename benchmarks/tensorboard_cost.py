"""What the harness's TensorBoard writing costs, against torch's SummaryWriter (the writer
Determined's AUTO mode uses when torch is installed) in the same run.

- writer: scalars per second written to an event file, the harness's `EventFileWriter` (pure-Python
  CRC-32C, as in a trial environment without google-crc32c, and the C one) vs
  `torch.utils.tensorboard.SummaryWriter.add_scalar` + flush, same tags, values and steps.
- training thread: ns per `report()` call of the Core API's TensorBoard manager (it only queues;
  a background thread encodes, writes and syncs to a shared_fs storage), and the time from the
  last report to every scalar uploaded at close.

    .venv/bin/python benchmarks/tensorboard_cost.py [--scalars 20000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.storage import from_config  # noqa: E402
from harness.tensorboard import events  # noqa: E402
from harness.tensorboard.manager import TensorboardManager  # noqa: E402
from harness.tensorboard.sync import TensorboardSync  # noqa: E402
from harness.tensorboard.writer import EventFileWriter  # noqa: E402


def harness_writer(n: int, pure: bool) -> float:
    saved = events.crc32c
    if pure:
        events.crc32c = events.crc32c_pure
    try:
        with tempfile.TemporaryDirectory() as d:
            w = EventFileWriter(Path(d))
            t0 = time.perf_counter()
            for i in range(n):
                w.add_scalar("Determined/loss", 1.0 / (i + 1), i)
                if i % 100 == 99:
                    w.flush()
            w.close()
            return n / (time.perf_counter() - t0)
    finally:
        events.crc32c = saved


def torch_writer(n: int) -> float | None:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    with tempfile.TemporaryDirectory() as d:
        w = SummaryWriter(log_dir=d)
        t0 = time.perf_counter()
        for i in range(n):
            w.add_scalar("Determined/loss", 1.0 / (i + 1), i)
            if i % 100 == 99:
                w.flush()
        w.close()
        return n / (time.perf_counter() - t0)


def manager_cost(n: int) -> tuple[list[int], float, int]:
    with tempfile.TemporaryDirectory() as d:
        storage = from_config({"type": "shared_fs", "host_path": str(Path(d) / "store")})
        sync = TensorboardSync(storage, Path(d) / "local", "c/tensorboard/experiment/1/trial/1")
        m = TensorboardManager(sync).start()
        costs = []
        for i in range(n):
            metrics = {"loss": 1.0 / (i + 1), "accuracy": i / n}
            t0 = time.perf_counter_ns()
            m.report("training", i + 1, metrics, None)
            costs.append(time.perf_counter_ns() - t0)
        t0 = time.perf_counter()
        m.close()
        return costs, time.perf_counter() - t0, m.written


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scalars", type=int, default=20000)
    n = parser.parse_args().scalars
    rows = [("harness EventFileWriter, pure-Python CRC", harness_writer(n, pure=True)),
            ("harness EventFileWriter, C CRC (google-crc32c)", harness_writer(n, pure=False)),
            ("torch SummaryWriter (peer)", torch_writer(n))]
    print(f"| writer ({n} scalars, flush every 100) | scalars/s |")
    print("|---|---|")
    for name, rate in rows:
        print(f"| {name} | {'not installed' if rate is None else f'{rate:,.0f}'} |")
    costs, close_s, written = manager_cost(n)
    costs.sort()
    print()
    print(f"| Core API TensorBoard manager ({n} reports of 2 metrics) | value |")
    print("|---|---|")
    print(f"| report() p50 / p99 / max, ns | {costs[len(costs) // 2]:,} / {costs[int(len(costs) * 0.99)]:,} / "
          f"{costs[-1]:,} |")
    print(f"| report() mean, ns | {statistics.fmean(costs):,.0f} |")
    print(f"| close(): write the rest + final upload, s | {close_s:.3f} |")
    print(f"| scalars written | {written:,} of {2 * n:,} |")


if __name__ == "__main__":
    main()
