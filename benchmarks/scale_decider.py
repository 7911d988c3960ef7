"""Scale decider vs Ray's autoscalers: decision time and instances chosen for the same demand.

    .venv/bin/python benchmarks/scale_decider.py [--sizes 1000,10000] [--seed 7]

For 1,000 and 10,000 pending trials of mixed GPU shapes (1, 2, 4, 8) and three instance types (1, 4
and 8 GPUs per instance), each decider is asked how many instances of that type to launch from an
empty pool:

* ours: `control_plane.core.scaling.decide` (demand given as counts per shape, as the scheduler reports
  it; "ours/trial" passes one PendingDemand per trial to show the aggregation cost too),
* Ray autoscaler v1: `ResourceDemandScheduler.get_nodes_to_launch` (upscaling_speed raised so the
  concurrency limit does not cut the answer; the head node it adds is not counted),
* Ray autoscaler v2: `ResourceDemandScheduler.schedule(SchedulingRequest)`.

Shapes larger than the instance type are infeasible for every decider. Ray needs
`pip install "ray[default]==2.60.0"` (the `bench` extra); without it only ours runs.

A second table prices a pool of several types (issue 28): the same trials on g5.xlarge (1 A10G) and
g5.12xlarge (4 A10G), 8-GPU trials as gangs of two whole g5.12xlarge, at the catalogue's us-east-1
prices (shipyard_common/prices.json): the larger type alone, the cheapest mix on demand, and the mix
with `capacity: spot-then-on-demand` (spot at the catalogue's estimate), with the decision time.
"""

from __future__ import annotations

import argparse
import logging
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from control_plane.core.scaling import (  # noqa: E402
    InstanceOption,
    PendingDemand,
    PoolLimits,
    decide,
    lower_bound_instances,
)
from shipyard_common import clouds  # noqa: E402

SHAPES = (1, 2, 4, 8)
SHAPE_WEIGHTS = (0.4, 0.3, 0.2, 0.1)
INSTANCE_GPUS = (1, 4, 8)
NOW = datetime(2024, 1, 1)


def make_trials(n: int, seed: int) -> list[int]:
    rnd = random.Random(seed)
    return rnd.choices(SHAPES, weights=SHAPE_WEIGHTS, k=n)


def timed(fn: Callable[[], Any], min_seconds: float = 0.2, max_runs: int = 1000) -> tuple[float, Any]:
    """Median wall time of fn over repeated runs (at least one, until min_seconds have passed)."""
    times: list[float] = []
    result: Any = None
    spent = 0.0
    while not times or (spent < min_seconds and len(times) < max_runs):
        t0 = time.perf_counter()
        result = fn()
        dt = time.perf_counter() - t0
        times.append(dt)
        spent += dt
    return statistics.median(times), result


# ------------------------------------------------------------------------------------------ ours


def ours(demand: list[PendingDemand], gpus: int) -> int:
    limits = PoolLimits(min_instances=0, max_instances=10**6, slots_per_instance=gpus)
    return decide(demand, [], limits, NOW).launch


# ------------------------------------------------------------------------------------------ ray


class _EmptyProvider:
    """The v1 scheduler only asks the provider about existing nodes; the pool is empty."""

    def non_terminated_nodes(self, tag_filters: dict[str, str]) -> list[str]:
        return []

    def node_tags(self, node_id: str) -> dict[str, str]:
        return {}


def ray_available() -> str | None:
    try:
        import ray  # noqa: F401
        from ray.autoscaler._private.resource_demand_scheduler import ResourceDemandScheduler  # noqa: F401
        from ray.autoscaler.v2.scheduler import ResourceDemandScheduler as V2  # noqa: F401
    except Exception as e:  # ImportError, or a broken install
        return f"{type(e).__name__}: {e}"
    return None


def ray_v1(trials: list[int], gpus: int) -> int:
    from ray.autoscaler._private.node_provider_availability_tracker import NodeAvailabilitySummary
    from ray.autoscaler._private.resource_demand_scheduler import ResourceDemandScheduler

    node_types = {
        "head": {"resources": {"CPU": 1}, "max_workers": 0, "node_config": {}},
        "gpu": {"resources": {"GPU": gpus}, "min_workers": 0, "max_workers": 10**6, "node_config": {}},
    }
    scheduler = ResourceDemandScheduler(
        _EmptyProvider(), node_types, max_workers=10**6, head_node_type="head", upscaling_speed=10**9
    )
    to_launch, _unfulfilled = scheduler.get_nodes_to_launch(
        nodes=[],
        launching_nodes={},
        resource_demands=[{"GPU": s} for s in trials],
        unused_resources_by_ip={},
        pending_placement_groups=[],
        max_resources_by_ip={},
        ensure_min_cluster_size=[],
        node_availability_summary=NodeAvailabilitySummary(node_availabilities={}),
    )
    return to_launch.get("gpu", 0)


def ray_v2(trials: list[int], gpus: int) -> int:
    from ray.autoscaler.v2.instance_manager.config import NodeTypeConfig
    from ray.autoscaler.v2.scheduler import ResourceDemandScheduler, SchedulingRequest
    from ray.autoscaler.v2.utils import ResourceRequestUtil
    from ray.core.generated.autoscaler_pb2 import ResourceRequestByCount

    request = SchedulingRequest(
        disable_launch_config_check=True,
        node_type_configs={
            "gpu": NodeTypeConfig(
                name="gpu", min_worker_nodes=0, max_worker_nodes=10**6, resources={"GPU": gpus}
            )
        },
        max_num_nodes=10**6,
        resource_requests=[
            ResourceRequestByCount(request=ResourceRequestUtil.make({"GPU": s}), count=c)
            for s, c in Counter(trials).items()
        ],
    )
    reply = ResourceDemandScheduler().schedule(request)
    return sum(r.count for r in reply.to_launch if r.instance_type == "gpu")


# ------------------------------------------------------------------------------------------ main


def fmt_time(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="1000,10000", help="comma-separated numbers of pending trials")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    logging.disable(logging.WARNING)  # Ray warns once per infeasible shape
    ray_missing = ray_available()
    if ray_missing:
        print(f"ray is not installed or broken ({ray_missing}); running ours only.")
        print('install it with: .venv/bin/pip install "ray[default]==2.60.0"')

    header = (
        f"{'demands':>7} {'type':>5} | {'ours':>9} {'inst':>5} | {'ours/trial':>10} {'inst':>5} | "
        f"{'ray v1':>9} {'inst':>5} | {'ray v2':>9} {'inst':>5} | {'LB':>5} {'LB+shapes':>9} | {'v2/ours':>8}"
    )
    print(header)
    print("-" * len(header))
    failures: list[str] = []
    for n in sizes:
        trials = make_trials(n, args.seed)
        for gpus in INSTANCE_GPUS:
            by_shape = [PendingDemand(s, c) for s, c in Counter(trials).items()]
            per_trial = [PendingDemand(s, 1) for s in trials]
            lower = lower_bound_instances(by_shape, gpus)
            feasible_shapes = len({s for s in trials if s <= gpus})
            t_ours, n_ours = timed(lambda: ours(by_shape, gpus))  # noqa: B023 (called right here)
            t_trial, n_trial = timed(lambda: ours(per_trial, gpus))  # noqa: B023
            row = (
                f"{n:>7} {str(gpus) + 'gpu':>5} | {fmt_time(t_ours):>9} {n_ours:>5} | "
                f"{fmt_time(t_trial):>10} {n_trial:>5} | "
            )
            if ray_missing:
                row += f"{'n/a':>9} {'':>5} | {'n/a':>9} {'':>5} | "
                speedup = "n/a"
            else:
                print(f"  ... ray on {n} trials / {gpus}-GPU instances", file=sys.stderr, flush=True)
                t_v1, n_v1 = timed(lambda: ray_v1(trials, gpus), min_seconds=0.0)  # noqa: B023
                t_v2, n_v2 = timed(lambda: ray_v2(trials, gpus), min_seconds=0.0)  # noqa: B023
                row += f"{fmt_time(t_v1):>9} {n_v1:>5} | {fmt_time(t_v2):>9} {n_v2:>5} | "
                speedup = f"{t_v2 / t_ours:,.0f}x"
                if n == max(sizes) and t_v2 / t_ours < 100:
                    failures.append(f"{n} trials on {gpus}-GPU: only {t_v2 / t_ours:.0f}x faster than ray v2")
            row += f"{lower:>5} {lower + feasible_shapes:>9} | {speedup:>8}"
            print(row, flush=True)
            if max(n_ours, n_trial) > lower + feasible_shapes:
                failures.append(f"{n} trials on {gpus}-GPU: {n_ours} instances > lower bound + shapes")
            if n_ours != n_trial:
                failures.append(f"{n} trials on {gpus}-GPU: counts and per-trial demand disagree")

    print()
    print("LB = ceil(feasible GPUs / GPUs per instance); shapes larger than the instance are infeasible.")
    print("times: median wall time per decision (ours repeated >= 0.2 s; Ray once: it is deterministic).")
    failures += several_types(sizes, args.seed)
    if failures:
        print("TARGETS MISSED:")
        for f in failures:
            print(f"  {f}")
        return 1
    targets = "100x faster than ray v2 at the largest size and " if not ray_missing else ""
    print(f"targets met: {targets}never more instances than lower bound + one per shape; "
          "the mix never costs more than one type alone")
    return 0


def _options(spot: bool) -> list[InstanceOption]:
    out = []
    for name in ("g5.xlarge", "g5.12xlarge"):
        price = clouds.regional_price("aws", "us-east-1", name)
        assert price is not None
        gpus = clouds.aws_gpus(name) or 0
        out.append(InstanceOption(name, gpus, price.on_demand))
        if spot:
            out.append(InstanceOption(name, gpus, price.spot, spot=True))
    return out


def several_types(sizes: list[int], seed: int) -> list[str]:
    """The cost of the same demand on one type, on the cheapest mix, and on the mix with spot."""
    print()
    header = (f"{'trials':>7} | {'g5.12xlarge alone':>18} | {'mix on demand':>18} | {'mix + spot':>18} | "
              f"{'saved':>6} | {'decide':>8}")
    print(header)
    print("-" * len(header))
    failures = []
    for n in sizes:
        counts = Counter(make_trials(n, seed))
        demand = [PendingDemand(4, counts[8], instances=2) if s == 8 else PendingDemand(s, counts[s])
                  for s in SHAPES if counts[s]]
        row = f"{n:>7} | "
        costs = []
        for options in ([o for o in _options(False) if o.instance_type == "g5.12xlarge"], _options(False),
                        _options(True)):
            limits = PoolLimits(0, 10**6, max(o.slots for o in options), options=tuple(options))
            t, d = timed(lambda limits=limits, demand=demand: decide(demand, [], limits, NOW))
            costs.append(d.usd_per_hour or 0.0)
            row += f"${costs[-1]:>9,.2f} ({d.launch:>5}) | "
        row += f"{1 - costs[2] / costs[0]:>6.0%} | {fmt_time(t):>8}"
        print(row, flush=True)
        if costs[1] > costs[0] + 1e-6:
            failures.append(f"{n} trials: the mix (${costs[1]:.2f}/h) costs more than one type alone")
    print("$/h of the instances launched from an empty pool (count in brackets); decide: the mix with spot.")
    return failures


if __name__ == "__main__":
    raise SystemExit(main())
