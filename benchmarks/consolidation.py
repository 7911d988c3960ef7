"""Consolidation decision: how long the pure core (control_plane/core/scaling/consolidation.py) takes
per autoscaler tick as pools grow, against the peer it is built from: one pass of the pool's
scheduling policy over the same pool, in the same run (the core runs one such pass for its baseline
and one per candidate it simulates, the most saving first, at most MAX_SIMULATIONS).

    .venv/bin/python benchmarks/consolidation.py [--instances 10,100,1000] [--pending 0,1000] [--runs 3]

Each pool: instances of 8 slots, each running two 1-slot allocations of priorities 1..98 that ran an
hour (every instance a candidate), and --pending allocations of 1, 2, 4 or 8 slots at priority 99
(never holding a move back; a move that would displace one the pool places now is refused). Reported:
ms per decision (best of --runs), candidates simulated, ms of one scheduling pass, the decision's
cost in passes, and the instance chosen."""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from unittest import mock

from control_plane.core.scaling import consolidation
from control_plane.core.scaling.consolidation import Budget, ConsolidationDecision, InstanceSlots, decide
from control_plane.core.scheduling import AgentSlots, PendingAllocation, RunningAllocation, scheduling_policy

NOW = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
BUDGET = Budget(max_moves_per_hour=10, min_run_time=timedelta(minutes=30))


def pool(n: int, pending: int, rng: random.Random) -> tuple[list[InstanceSlots], list[RunningAllocation],
                                                               list[PendingAllocation]]:
    instances, running = [], []
    for i in range(n):
        ids = tuple(f"i{i}-{s}" for s in range(8))
        instances.append(InstanceSlots(f"i{i:05d}", AgentSlots(f"a{i}", ids, frozenset(ids[:2]))))
        for k in range(2):
            running.append(RunningAllocation.on(f"r{i}-{k}", f"a{i}", ids[k:k + 1], priority=rng.randint(1, 98),
                                                order=(NOW - timedelta(hours=1)).timestamp()))
    queue = [PendingAllocation(f"p{k}", rng.choice([1, 2, 4, 8]), priority=99, order=float(k)) for k in range(pending)]
    return instances, running, queue


def best_ms(fn: Callable[[], Any], runs: int) -> tuple[float, Any]:
    best, out = float("inf"), None
    for _ in range(runs):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1000, out


def measure(n: int, pending: int, runs: int) -> str:
    instances, running, queue = pool(n, pending, random.Random(7))
    simulated = [0]
    real = consolidation._simulate

    def counting(*a: Any, **k: Any) -> Any:
        simulated[0] += 1
        return real(*a, **k)

    def one_decision() -> ConsolidationDecision:
        simulated[0] = 0
        with mock.patch.object(consolidation, "_simulate", counting):
            return decide(instances, running, queue, BUDGET, [], NOW)

    ms, decision = best_ms(one_decision, runs)
    agents = [i.agent for i in instances]
    pass_ms, _ = best_ms(lambda: scheduling_policy().schedule(queue, running, agents, preemption=False), runs)
    plan = decision.plan.instance if decision.plan else "none"
    return f"{n:>9} {pending:>7} {ms:>11.1f} {simulated[0]:>9} {pass_ms:>11.1f} {ms / pass_ms:>9.1f}  {plan}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--instances", default="10,100,1000")
    ap.add_argument("--pending", default="0,1000")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    print(f"{'instances':>9} {'pending':>7} {'decision ms':>11} {'simulated':>9} {'one pass ms':>11} "
          f"{'in passes':>9}  plan")
    for n in (int(x) for x in args.instances.split(",")):
        for p in (int(x) for x in args.pending.split(",")):
            print(measure(n, p, args.runs), flush=True)


if __name__ == "__main__":
    main()
