"""Replay a seeded day of trial arrivals through scale policies and compare cost against queue wait.

    .venv/bin/python benchmarks/elastic_trace.py [--seed 11] [--experiments 60] [--max-instances 40]

The trace: experiments arrive through the day (a Poisson process, busier in working hours), each
submitting a handful of trials of one GPU shape (1, 2, 4 or 8 GPUs; a second trace adds 3 and 6) that run for a log-normal time
(median 45 min). The pool has 8-GPU instances that boot in 90 s +- 30 s. Every 5 s (Determined's
provisioner loop) trials that finished free their slots, booted instances connect, a FIFO first-fit
scheduler (with backfill) places queued trials whole on connected instances, and the policy decides
on the unplaced remainder.

Policies, all on the same trace and the same boot delays:

* determined: an emulation of Determined's provisioner (scale_decider.go + calculateDesiredNewAgentNum):
  launch ceil(pending slots / slots per instance) - recently launched instances, reap instances idle
  longer than max_idle_agent_period (default 20 min) down to min_instances,
* ours with Determined's default idle period (20 min), and with Shipyard's default (5 min), and a few
  other idle periods to show the trade-off.

Reported: GPU-hours provisioned (billed from launch to termination) and used by trials, utilization,
mean / p95 / max queue wait, the number of launches, and the relaunches (launches within 2 minutes
of a termination: an instance reaped just before demand came back).

A third trace is bursty: one trial at a time, 1 to 10 minutes apart, short trials (median 8 min), so
instances keep going idle between arrivals. It compares each idle period "before" (the decider without
arrival history: an idle instance goes after max_idle_agent_period) and "after" (scale-down
hysteresis: the decider is given the arrivals of the last 30 minutes and keeps an idle instance while
the next arrival is due within 2 x max_idle_agent_period).
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from control_plane.core.scaling import (  # noqa: E402
    DEFAULT_ARRIVAL_WINDOW,
    DEFAULT_MAX_IDLE_AGENT_PERIOD,
    Arrival,
    InstanceView,
    PendingDemand,
    PoolLimits,
    ScaleDecision,
    Termination,
    decide,
)

DAY = 24 * 3600.0
TICK = 5.0
SLOTS = 8
BOOT_S, BOOT_JITTER_S = 90.0, 30.0
EPOCH = datetime(2024, 1, 1)
RELAUNCH_S = 120.0  # a launch this soon after a termination is a relaunch (flapping)
Policy = Callable[
    [Sequence[PendingDemand], Sequence[InstanceView], PoolLimits, datetime, Sequence[Arrival]], ScaleDecision
]


def before(
    demand: Sequence[PendingDemand], instances: Sequence[InstanceView], limits: PoolLimits, now: datetime,
    arrivals: Sequence[Arrival],
) -> ScaleDecision:
    """Our decider without the arrival history: no scale-down hysteresis."""
    return decide(demand, instances, limits, now)


def after(
    demand: Sequence[PendingDemand], instances: Sequence[InstanceView], limits: PoolLimits, now: datetime,
    arrivals: Sequence[Arrival],
) -> ScaleDecision:
    """Our decider given the arrivals of the window (what the autoscaler reads from allocations)."""
    return decide(demand, instances, limits, now, arrivals)


# ------------------------------------------------------------------------------------------ trace


@dataclass(frozen=True)
class TrialSpec:
    id: int
    arrival: float
    slots: int
    duration: float


GPU_SHAPES = ((1, 2, 4, 8), (0.4, 0.3, 0.2, 0.1))
ODD_SHAPES = ((1, 2, 3, 4, 6, 8), (0.3, 0.2, 0.1, 0.15, 0.1, 0.15))


def make_trace(
    seed: int, experiments: int, shapes: tuple[tuple[int, ...], tuple[float, ...]]
) -> list[TrialSpec]:
    rnd = random.Random(seed)

    def rate(t: float) -> float:  # relative arrival rate: quiet nights, busy 9:00-19:00
        hour = (t / 3600) % 24
        return 1.0 if 9 <= hour < 19 else 0.25

    mean_rate = experiments / sum(rate(h * 3600) * 3600 for h in range(24))
    trials: list[TrialSpec] = []
    t = 0.0
    while True:
        t += rnd.expovariate(mean_rate)  # thinning: candidate arrivals at the peak rate
        if t >= DAY:
            break
        if rnd.random() > rate(t):
            continue
        slots = rnd.choices(shapes[0], weights=shapes[1])[0]
        n = 1 + min(int(rnd.expovariate(1 / 6)), 30)
        for _ in range(n):
            duration = min(max(rnd.lognormvariate(math.log(45 * 60), 0.9), 120.0), 10 * 3600.0)
            trials.append(TrialSpec(len(trials), t + rnd.uniform(0, 60), slots, duration))
    trials.sort(key=lambda x: x.arrival)
    return trials


def make_bursty_trace(seed: int, hours: float = 10.0) -> list[TrialSpec]:
    """One trial at a time, 1 to 10 minutes apart, short trials (log-normal, median 8 min)."""
    rnd = random.Random(seed)
    trials: list[TrialSpec] = []
    t = 0.0
    while True:
        t += rnd.uniform(60.0, 600.0)
        if t >= hours * 3600:
            return trials
        slots = rnd.choices(GPU_SHAPES[0], weights=GPU_SHAPES[1])[0]
        duration = min(max(rnd.lognormvariate(math.log(8 * 60), 0.7), 60.0), 3600.0)
        trials.append(TrialSpec(len(trials), t, slots, duration))


# ------------------------------------------------------------------------------------------ determined


def determined_policy(
    demand: Sequence[PendingDemand], instances: Sequence[InstanceView], limits: PoolLimits, now: datetime,
    arrivals: Sequence[Arrival] = (),
) -> ScaleDecision:
    """Determined's provisioner: desired = ceil(pending slots / slots per agent); launch
    clamp(min - n, desired - recently launched, max - n); reap agents idle longer than the idle
    period while more than min_instances remain."""
    live = [i for i in instances if i.state not in ("stopping", "terminated")]
    slot_sum = sum(d.slots * d.count for d in demand if d.slots <= limits.slots_per_instance)
    desired = math.ceil(slot_sum / limits.slots_per_instance)
    recently = [
        i for i in live if not i.agent_connected and now - i.launched_at < limits.max_agent_starting_period
    ]
    launch = max(
        0,
        min(max(desired - len(recently), limits.min_instances - len(live)), limits.max_instances - len(live)),
    )
    out: list[Termination] = []
    for inst in live:
        if (
            inst.agent_connected
            and inst.idle_since is not None
            and inst.busy_slots == 0
            and now - inst.idle_since > limits.max_idle_agent_period
            and len(live) - len(out) > limits.min_instances
        ):
            out.append(Termination(inst.id, "long idle"))
    return ScaleDecision(launch=launch, terminate=tuple(out))


# ------------------------------------------------------------------------------------------ simulation


@dataclass
class Instance:
    id: str
    launched_at: float
    boot_s: float
    connected_at: float | None = None
    terminated_at: float | None = None
    running: dict[int, int] = field(default_factory=dict)  # trial id -> slots
    idle_since: float | None = None

    def free(self) -> int:
        return SLOTS - sum(self.running.values())

    def view(self) -> InstanceView:
        connected = self.connected_at is not None
        return InstanceView(
            id=self.id,
            state="running" if connected else "starting",
            launched_at=EPOCH + timedelta(seconds=self.launched_at),
            agent_connected=connected,
            agent_first_connected_at=EPOCH + timedelta(seconds=self.connected_at) if connected else None,
            agent_disconnected_since=None,
            busy_slots=SLOTS - self.free(),
            idle_since=(
                EPOCH + timedelta(seconds=self.idle_since)
                if self.idle_since is not None and not self.running
                else None
            ),
        )


@dataclass
class Result:
    name: str
    provisioned_gpu_h: float
    used_gpu_h: float
    waits_min: list[float]
    launches: int
    relaunches: int
    peak_instances: int
    cpu_s: float

    def row(self) -> str:
        waits = sorted(self.waits_min)
        mean = sum(waits) / len(waits)
        p95 = waits[min(len(waits) - 1, int(0.95 * len(waits)))]
        util = self.used_gpu_h / self.provisioned_gpu_h
        return (
            f"{self.name:<33} {self.provisioned_gpu_h:>9.1f} {self.used_gpu_h:>7.1f} {util:>6.1%} "
            f"{mean:>8.2f} {p95:>8.2f} {waits[-1]:>8.1f} {self.launches:>8} {self.relaunches:>9} "
            f"{self.peak_instances:>5} "
            f"{self.cpu_s:>7.1f}"
        )


def simulate(name: str, policy: Policy, limits: PoolLimits, trace: list[TrialSpec], seed: int) -> Result:
    t0 = time.perf_counter()
    instances: dict[str, Instance] = {}
    retired: list[Instance] = []
    queue: list[TrialSpec] = []  # FIFO
    ends: dict[int, tuple[float, str]] = {}  # trial id -> (end time, instance id)
    started: dict[int, float] = {}
    launches = relaunches = peak = 0
    last_termination = -math.inf
    recent: deque[Arrival] = deque()  # the arrivals of the decider's window
    next_arrival = 0
    now = 0.0
    while next_arrival < len(trace) or queue or ends or instances:
        now += TICK
        if now > 3 * DAY:
            raise RuntimeError(f"{name}: the pool did not drain within 3 days")
        # Trials that finished free their slots; an instance whose last trial ended goes idle then.
        for tid, (end, iid) in list(ends.items()):
            if end <= now:
                inst = instances[iid]
                del inst.running[tid], ends[tid]
                if not inst.running:
                    inst.idle_since = end
        for inst in instances.values():
            if inst.connected_at is None and inst.launched_at + inst.boot_s <= now:
                inst.connected_at = inst.idle_since = inst.launched_at + inst.boot_s
        while next_arrival < len(trace) and trace[next_arrival].arrival <= now:
            arriving = trace[next_arrival]
            queue.append(arriving)
            recent.append(Arrival(EPOCH + timedelta(seconds=arriving.arrival), arriving.slots))
            next_arrival += 1
        while recent and recent[0].at <= EPOCH + timedelta(seconds=now) - limits.arrival_window:
            recent.popleft()
        # FIFO first fit with backfill over connected instances in launch order.
        connected = [i for i in instances.values() if i.connected_at is not None]
        waiting: list[TrialSpec] = []
        for trial in queue:
            host = next((i for i in connected if i.free() >= trial.slots), None)
            if host is None:
                waiting.append(trial)
                continue
            host.running[trial.id] = trial.slots
            host.idle_since = None
            started[trial.id] = now
            ends[trial.id] = (now + trial.duration, host.id)
        queue = waiting

        demand = [PendingDemand(s, c) for s, c in Counter(t.slots for t in queue).items()]
        decision = policy(
            demand, [i.view() for i in instances.values()], limits, EPOCH + timedelta(seconds=now), recent
        )
        for term in decision.terminate:
            inst = instances.pop(term.id)
            if inst.running:
                raise RuntimeError(f"{name} terminated busy instance {inst.id}")
            inst.terminated_at = now
            retired.append(inst)
            last_termination = now
        for _ in range(decision.launch):
            if now - last_termination <= RELAUNCH_S:
                relaunches += 1
            # The n-th launch boots equally fast under every policy.
            boot = BOOT_S + random.Random(seed * 100_003 + launches).uniform(-BOOT_JITTER_S, BOOT_JITTER_S)
            iid = f"i-{launches:05d}"
            instances[iid] = Instance(iid, now, boot)
            launches += 1
        peak = max(peak, len(instances))

    provisioned = sum((i.terminated_at or now) - i.launched_at for i in retired) * SLOTS / 3600
    used = sum(t.slots * t.duration for t in trace) / 3600
    waits = [(started[t.id] - t.arrival) / 60 for t in trace]
    return Result(name, provisioned, used, waits, launches, relaunches, peak, time.perf_counter() - t0)


def replay(label: str, trace: list[TrialSpec], seed: int, max_instances: int) -> None:
    shapes = Counter(t.slots for t in trace)
    print(
        f"trace ({label}): seed {seed}, {len(trace)} trials in a day "
        f"({', '.join(f'{c}x{s}' for s, c in sorted(shapes.items()))} GPUs), "
        f"{sum(t.slots * t.duration for t in trace) / 3600:.0f} GPU-hours of work; "
        f"{SLOTS}-GPU instances, max {max_instances}, boot {BOOT_S:.0f}s +- {BOOT_JITTER_S:.0f}s, {TICK:.0f}s loop"
    )

    def limits(idle: timedelta) -> PoolLimits:
        return PoolLimits(0, max_instances, SLOTS, max_idle_agent_period=idle)

    twenty = timedelta(minutes=20)
    ours_default = f"ours, {DEFAULT_MAX_IDLE_AGENT_PERIOD.seconds // 60}m idle (our dflt)"
    runs: list[tuple[str, Policy, PoolLimits]] = [
        ("determined, 20m idle (dflt)", determined_policy, limits(twenty)),
        ("ours, 20m idle", before, limits(twenty)),
        (ours_default, before, limits(DEFAULT_MAX_IDLE_AGENT_PERIOD)),
        ("  + hysteresis", after, limits(DEFAULT_MAX_IDLE_AGENT_PERIOD)),
        ("determined, 5m idle", determined_policy, limits(DEFAULT_MAX_IDLE_AGENT_PERIOD)),
        ("ours, 2m idle", before, limits(timedelta(minutes=2))),
        ("ours, 10m idle", before, limits(timedelta(minutes=10))),
    ]
    run_table(runs, trace, seed)


def run_table(runs: list[tuple[str, Policy, PoolLimits]], trace: list[TrialSpec], seed: int) -> None:
    header = (
        f"{'policy':<33} {'prov GPUh':>9} {'used':>7} {'util':>6} {'wait avg':>8} {'wait p95':>8} "
        f"{'wait max':>8} {'launches':>8} {'relaunch':>9} {'peak':>5} {'sim s':>7}"
    )
    print(header)
    print("-" * len(header))
    for name, policy, lim in runs:
        print(simulate(name, policy, lim, trace, seed).row(), flush=True)


def replay_bursty(trace: list[TrialSpec], seed: int, max_instances: int) -> None:
    gaps = [b.arrival - a.arrival for a, b in zip(trace, trace[1:], strict=False)]
    print(
        f"trace (bursty): seed {seed}, {len(trace)} trials one at a time over {trace[-1].arrival / 3600:.0f} h, "
        f"{min(gaps) / 60:.1f} to {max(gaps) / 60:.1f} min apart, "
        f"{sum(t.slots * t.duration for t in trace) / 3600:.0f} GPU-hours of work; "
        f"arrival window {DEFAULT_ARRIVAL_WINDOW.seconds // 60}m"
    )

    def limits(idle: timedelta) -> PoolLimits:
        return PoolLimits(0, max_instances, SLOTS, max_idle_agent_period=idle)

    runs: list[tuple[str, Policy, PoolLimits]] = [("determined, 20m idle (dflt)", determined_policy,
                                                   limits(timedelta(minutes=20)))]
    for minutes in (2, 5, 10):
        lim = limits(timedelta(minutes=minutes))
        dflt = " (our dflt)" if lim.max_idle_agent_period == DEFAULT_MAX_IDLE_AGENT_PERIOD else ""
        runs += [(f"determined, {minutes}m idle", determined_policy, lim),
                 (f"ours, {minutes}m idle{dflt}, before", before, lim),
                 (f"ours, {minutes}m idle{dflt}, after", after, lim)]
    run_table(runs, trace, seed)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--experiments", type=int, default=60, help="mean experiments per day")
    parser.add_argument("--max-instances", type=int, default=40)
    args = parser.parse_args()

    for label, shape_mix in (
        ("power-of-two GPU shapes", GPU_SHAPES),
        ("with 3- and 6-GPU shapes", ODD_SHAPES),
    ):
        trace = make_trace(args.seed, args.experiments, shape_mix)
        replay(label, trace, args.seed, args.max_instances)
        print()
    replay_bursty(make_bursty_trace(args.seed), args.seed, args.max_instances)
    print()
    print("GPU-hours provisioned are billed from launch to termination (boot and idle included);")
    print("queue waits in minutes from arrival to start; 'relaunch' counts launches within 2 minutes of a")
    print("termination; 'sim s' is the wall time of the replay. 'before': our decider without arrival history;")
    print("'after' / '+ hysteresis': given the arrivals of the last 30 minutes (scale-down hysteresis).")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
