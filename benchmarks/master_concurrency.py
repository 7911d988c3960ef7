"""The master under concurrent clients: does it hold, and does it stay reachable?

Target (issue 9): throughput never falls as clients grow; no 500 and no timeout at any level (503
with Retry-After only past the configured limit, `max_concurrent_requests` + `request_queue`);
`/info` p99 under 100 ms during the run.

The load, for each level of `--clients` (default 10, 40, 200, 1000), for `--seconds` each, against
one real master per database (`python -m control_plane`: a control process and one API worker
per core, as shipped):
- every client is an asyncio task sending one request at a time; one client in ten plays an agent
  (an agent of its own, registered without slots so that the queued experiments stay queued: a
  cluster's agents each keep one poll open; many polls of one agent would displace one another)
  and long-polls `GET /api/v1/agents/{id}/commands` (2 s) in a loop, the others send a mix of
  `GET /api/v1/experiments` (admin token) and metric reports `POST /api/v1/trials/{id}/metrics`
  for a running trial with its allocation token, half and half (unique steps per client, so every
  acknowledged report must be stored);
- a 503 is handled as the harness does: wait at least Retry-After (plus jitter), and back off
  exponentially (0.25 s doubling, random, at most 15 s) while 503s follow one another;
- a separate process (so the load generator's own event loop does not delay it), at nice -10 where
  permitted (a health checker runs on another machine: its own wait for one of the two CPUs this
  machine shares between master, generator and prober is not the master's latency), asks
  `GET /info` every 50 ms; its latencies are the `/info` column.
The trial is real: an agent registered by the benchmark is assigned the trial by the placement
loop, gets its start command (with the allocation token) and reports it running.

Each level runs `--rounds` times (default 2): the levels in the given order, then reversed, so
that what drifts over a run (growing tables, the machine's other load) weighs on every level
alike. On this shared 2-core machine one 15 s level differs from one round to the next by 8 %
and more (measured: PostgreSQL at 40 clients gave 290 and 284 ok/s, at 200 clients 310 and 283,
in one run of 40, 200, 40, 200; at 40 clients 333 and 275 in the two rounds of another run); one
round per level would read that noise as a trend.

Columns: ok/s = 2xx answers to reads and reports per second, the median round's (each round's
in "ok/s by round"); the other columns take every round together; p50/p99 = their latency (answered
ones, 503s included); polls = long-polls answered 200; then answers by status (all requests),
timeouts (client timeout 30 s, plus the poll's own for polls) and connection errors; "lost" =
acknowledged metric reports missing from the database afterwards; cpu = cores used by the master
and by this load generator (same machine); ok per master cpu-s = ok/s over the master's cores,
the master's efficiency whatever share of the machine other processes leave it (a shared 2-core
machine gives one process very different shares from one run to the next).

The verdicts at the end (exit status 1 if one fails): throughput never falls from one level to
the next (a fall: every round of the level below every round of the level before; a median a
little lower, within the rounds' spread, is printed as a dip: a saturated master's plateau); no 500, timeout or connection error; every 503 with Retry-After; /info p99
under 100 ms; no acknowledged report lost.

    .venv/bin/python benchmarks/master_concurrency.py                    # both DBs, ~7 min
    .venv/bin/python benchmarks/master_concurrency.py --db sqlite --clients 10,200 --seconds 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402

from benchmarks._common import (  # noqa: E402
    BenchPostgres,
    MasterProcess,
    loadavg,
    pct,
    print_table,
    temp_dir,
    tree_cpu_seconds,
)
from benchmarks._leanhttp import LeanClient, ProtocolError  # noqa: E402

EXPERIMENT_CONFIG = """\
name: concurrency-bench-{n}
entrypoint: python3 train.py
hyperparameters:
  lr: 0.01
searcher:
  name: single
  metric: loss
  max_length: {{batches: 100000000}}
"""
AGENT_ID = "bench-agent"
POLL_S = 2.0
CLIENT_TIMEOUT_S = 30.0
RETRY_AFTER_CAP_S = 5.0
INFO_EVERY_S = 0.05
BACKOFF_INITIAL_S = 0.25  # harness/core/_session.py's RetryPolicy
BACKOFF_MAX_S = 15.0
# The /info prober: its own process, printing its latencies (s) as JSON when its time is up.
PROBE = """
import contextlib, json, os, sys, time, httpx
# A health checker runs on another machine: here it takes a session and a nice value of its own
# (as master_load.py's generator), so its own wait for a CPU is not counted as the master's latency.
with contextlib.suppress(OSError):
    os.setsid()
with contextlib.suppress(OSError):
    os.setpriority(os.PRIO_PROCESS, 0, -10)
with contextlib.suppress(OSError), open("/proc/self/autogroup", "w") as f:
    f.write("-10")
url, until, every = sys.argv[1], time.monotonic() + float(sys.argv[2]), float(sys.argv[3])
ok, failed = [], 0
with httpx.Client(timeout=30) as c:
    while time.monotonic() < until:
        t0 = time.monotonic()
        try:
            if c.get(url + "/info").status_code == 200:
                ok.append(time.monotonic() - t0)
            else:
                failed += 1
        except httpx.HTTPError:
            failed += 1
        time.sleep(every)
print(json.dumps({"ok": ok, "failed": failed}))
"""


@dataclass
class Setup:
    url: str
    admin: str
    agent_token: str
    session_id: str
    trial_id: int
    alloc_token: str
    pool_token: str
    pollers: list[tuple[str, str, str]] = field(default_factory=list)  # (agent id, credential, session)


@dataclass
class Level:
    clients: int
    seconds: float
    ok: int = 0
    polls: int = 0
    status: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    info: list[float] = field(default_factory=list)
    info_failed: int = 0
    acked_reports: int = 0
    retry_after_missing: int = 0


# ---- set-up: an agent, a running trial and its allocation token ---------------------------------
def register_pollers(s: Setup, count: int, level: int) -> None:
    """`count` agents without slots (nothing is placed on them), one per polling client, new for
    each level: between levels they are silent for longer than the heartbeat timeout (the level's
    last answers are awaited), and a master rightly declares such agents lost."""
    s.pollers = []
    with httpx.Client(base_url=s.url, timeout=60) as c:
        for k in range(count):
            agent_id = f"bench-poller-{level}-{k:04d}"
            r = c.post("/api/v1/agents/register", headers={"Authorization": f"Bearer {s.pool_token}"},
                       json={"agentId": agent_id, "resourcePool": "default", "slots": []})
            r.raise_for_status()
            reg = r.json()
            s.pollers.append((agent_id, reg.get("agentCredential") or s.pool_token, reg["sessionId"]))


def set_up(url: str, token: str, experiments: int) -> Setup:
    from examples.demo import files_of

    h = {"Authorization": f"Bearer {token}"}
    c = httpx.Client(base_url=url, headers=h, timeout=60)
    r = c.post("/api/v1/agents/tokens", json={"resourcePool": "default"})
    r.raise_for_status()
    agent_token = pool_token = r.json()["token"]
    r = c.post("/api/v1/agents/register", headers={"Authorization": f"Bearer {agent_token}"},
               json={"agentId": AGENT_ID, "resourcePool": "default", "slots": [{"id": "0", "type": "cpu"}]})
    r.raise_for_status()
    reg = r.json()
    # A per-agent credential, where the master hands one out at enrolment, replaces the pool token.
    agent_token = reg.get("agentCredential") or agent_token
    session_id = reg["sessionId"]
    model_dir = temp_dir("concurrency-model-")
    (model_dir / "train.py").write_text("print('never runs: the benchmark plays the agent')\n")
    for n in range(experiments):  # a list worth reading; only the first gets the slot
        r = c.post("/api/v1/experiments", json={"config": EXPERIMENT_CONFIG.format(n=n), "modelDefinition": files_of(model_dir)})
        r.raise_for_status()
    shutil.rmtree(model_dir, ignore_errors=True)
    ah = {"Authorization": f"Bearer {agent_token}"}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        r = c.get(f"/api/v1/agents/{AGENT_ID}/commands", headers=ah, params={"sessionId": session_id, "timeoutSeconds": 2})
        r.raise_for_status()
        for cmd in r.json()["commands"]:
            if cmd["type"] == "start":
                spec = cmd["spec"]
                events = [{"allocationId": cmd["allocationId"], "type": t} for t in ("starting", "running")]
                c.post(f"/api/v1/agents/{AGENT_ID}/events", headers=ah,
                       json={"sessionId": session_id, "events": events}).raise_for_status()
                return Setup(url, token, agent_token, session_id, int(spec["trialId"]), spec["token"], pool_token)
    raise RuntimeError("the agent was never given the trial")


def stored_reports(db_url: str, trial_id: int) -> int:
    from sqlalchemy import func, select

    from control_plane.db.engine import make_engine
    from control_plane.db.models import Metric

    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            return int(conn.scalar(select(func.count()).select_from(Metric).where(Metric.trial_id == trial_id)) or 0)
    finally:
        engine.dispose()


# ---- the load -------------------------------------------------------------------------------------
async def run_level(s: Setup, lv: Level, step_base: int) -> None:
    admin_h = {"Authorization": f"Bearer {s.admin}"}
    alloc_h = {"Authorization": f"Bearer {s.alloc_token}"}
    # One client (one keep-alive connection) per simulated client, as separate processes would
    # have; benchmarks/_leanhttp.py's, whose CPU per request is a tenth of httpx's: on this machine
    # the generator's CPU is taken from the master it measures.
    https = [LeanClient(s.url, timeout=CLIENT_TIMEOUT_S) for _ in range(lv.clients)]
    try:
        stop_at = time.monotonic() + lv.seconds

        async def client(idx: int) -> None:
            http = https[idx]
            rnd = random.Random(idx)
            step = step_base + idx * 1_000_000
            await asyncio.sleep(rnd.random() * 0.5)  # do not all start in the same millisecond
            poll = idx % 10 == 9
            shed = 0  # 503s in a row
            while time.monotonic() < stop_at:
                report = not poll and rnd.random() < 0.5
                t0 = time.monotonic()
                try:
                    if poll:
                        poller_id, credential, session_id = s.pollers[idx // 10]
                        r = await http.request("GET", f"/api/v1/agents/{poller_id}/commands",
                                               headers={"Authorization": f"Bearer {credential}"},
                                               params={"sessionId": session_id, "timeoutSeconds": POLL_S},
                                               timeout=CLIENT_TIMEOUT_S + POLL_S)
                    elif report:
                        step += 1
                        body = {"group": "training", "metrics": {
                            "trialId": s.trial_id, "trialRunId": 1, "stepsCompleted": step,
                            "metrics": {"avgMetrics": {"loss": 1.0 / step, "acc": 0.5}}}}
                        r = await http.request("POST", f"/api/v1/trials/{s.trial_id}/metrics", headers=alloc_h,
                                               json=body)
                    else:
                        r = await http.request("GET", "/api/v1/experiments", headers=admin_h, params={"limit": 20})
                except TimeoutError:
                    lv.status["timeout"] += 1
                    continue
                except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ProtocolError):
                    lv.status["conn error"] += 1
                    await asyncio.sleep(0.1)
                    continue
                elapsed = time.monotonic() - t0
                lv.status[str(r.status_code)] += 1
                if not poll:
                    lv.latencies.append(elapsed)
                shed = shed + 1 if r.status_code == 503 else 0
                if r.status_code < 300:
                    lv.polls += int(poll)
                    lv.ok += int(not poll)
                    lv.acked_reports += int(report)
                elif r.status_code == 503:
                    retry_after = r.headers.get("retry-after")
                    if retry_after is None:
                        lv.retry_after_missing += 1
                    hint = min(float(retry_after or 1), RETRY_AFTER_CAP_S)
                    backoff = rnd.uniform(0, min(BACKOFF_MAX_S, BACKOFF_INITIAL_S * 2 ** min(shed, 10)))
                    await asyncio.sleep(max(backoff, hint * (1 + 0.5 * rnd.random())))
                else:
                    await asyncio.sleep(0.1)

        probe = await asyncio.create_subprocess_exec(sys.executable, "-c", PROBE, s.url, str(lv.seconds),
                                                     str(INFO_EVERY_S), stdout=asyncio.subprocess.PIPE)
        await asyncio.gather(*(client(i) for i in range(lv.clients)))
        out, _ = await probe.communicate()
        probed = json.loads(out)
        lv.info, lv.info_failed = probed["ok"], probed["failed"]
    finally:
        await asyncio.gather(*(h.aclose() for h in https))


@dataclass
class Measured:
    """One level's measurements in one round, with what the master and this generator spent."""

    lv: Level
    wall: float
    master_cpu: float  # cores
    load_cpu: float
    loadavg: str

    @property
    def ok_per_s(self) -> float:
        return self.lv.ok / self.wall


def round_orders(levels: list[int], rounds: int) -> list[list[int]]:
    """The levels' order in each round: as given, then reversed, and so on. What drifts over a run
    (the tables grow, the machine's other load comes and goes) then weighs on every level alike,
    instead of on the last levels only."""
    return [levels if r % 2 == 0 else levels[::-1] for r in range(rounds)]


def bench_db(db: str, db_url: str, levels: list[int], seconds: float, experiments: int, base: Path,
             rounds: int) -> tuple[dict[int, list[Measured]], int]:
    """Every level, once per round, against one master: the measurements by level, and the
    acknowledged reports missing from the database at the end."""
    master = MasterProcess(db_url, base / db)
    master.start()
    by_level: dict[int, list[Measured]] = {c: [] for c in levels}
    try:
        s = set_up(master.url, master.token(), experiments)
        # The agent's own heartbeat, as its daemon would keep it, between levels too (the pollers
        # among the clients only run during a level).
        stop_heartbeat = threading.Event()
        heartbeat = threading.Thread(target=agent_heartbeat, args=(s, stop_heartbeat), daemon=True)
        heartbeat.start()
        acked = 0
        n = 0
        for r, order in enumerate(round_orders(levels, rounds)):
            for clients in order:
                lv = Level(clients, seconds)
                register_pollers(s, clients // 10 + 1, n)
                t0, cpu0, own0 = time.monotonic(), tree_cpu_seconds(master.proc.pid), time.process_time()
                asyncio.run(run_level(s, lv, step_base=n * 10_000_000_000))
                wall = time.monotonic() - t0
                m = Measured(lv, wall, (tree_cpu_seconds(master.proc.pid) - cpu0) / wall,
                             (time.process_time() - own0) / wall, loadavg())
                by_level[clients].append(m)
                acked += lv.acked_reports
                n += 1
                print(f"  {db} round {r + 1}/{rounds} {clients:>5} clients: {m.ok_per_s:7.1f} ok/s, "
                      f"503 {lv.status['503']}, master {m.master_cpu:.2f} cores, load {m.loadavg}", flush=True)
                time.sleep(2)  # let the last long-polls end before the next level
        lost = acked - stored_reports(db_url, s.trial_id)
    finally:
        if "stop_heartbeat" in locals():
            stop_heartbeat.set()
            heartbeat.join(CLIENT_TIMEOUT_S + POLL_S)
        master.stop()
    return by_level, lost


def level_row(db: str, clients: int, ms: list[Measured], lost: str) -> list[str]:
    """One level over its rounds: ok/s is the median round's, the latencies and answers those of
    every round together."""
    rates = sorted(m.ok_per_s for m in ms)
    median = statistics.median(rates)
    status: Counter[str] = Counter()
    lat: list[float] = []
    info: list[float] = []
    for m in ms:
        status.update(m.lv.status)
        lat += m.lv.latencies
        info += m.lv.info
    lat.sort()
    info.sort()
    master_cpu = statistics.mean(m.master_cpu for m in ms)
    other = {k: v for k, v in status.items() if k not in ("200", "503", "500", "timeout", "conn error")}
    return [
        db, str(clients), f"{median:.1f}", " ".join(f"{m.ok_per_s:.0f}" for m in ms),
        f"{pct(lat, 0.5) * 1000:.0f}", f"{pct(lat, 0.99) * 1000:.0f}", str(sum(m.lv.polls for m in ms)),
        str(status["200"]), str(status["503"]), str(status["500"]), str(status["timeout"]), str(status["conn error"]),
        " ".join(f"{k}:{v}" for k, v in sorted(other.items())) or "-",
        f"{pct(info, 0.99) * 1000:.1f}", str(sum(m.lv.info_failed for m in ms)),
        str(sum(m.lv.retry_after_missing for m in ms)),
        f"{master_cpu:.2f}/{statistics.mean(m.load_cpu for m in ms):.2f}",
        f"{median / master_cpu:.0f}" if master_cpu else "-", lost,
    ]


def verdicts(db: str, levels: list[int], by_level: dict[int, list[Measured]], lost: int) -> list[tuple[str, bool]]:
    """The issue's targets for one database, each with the figures it was judged on."""
    medians = [statistics.median(m.ok_per_s for m in by_level[c]) for c in levels]
    ms = [m for c in levels for m in by_level[c]]
    count = Counter[str]()
    for m in ms:
        count.update(m.lv.status)
    info = sorted(x for m in ms for x in m.lv.info)
    # A fall: every round of a level below every round of the level before. A median a little
    # below the one before, within the spread of that level's own rounds, is the machine's noise
    # on a plateau (the master saturated), and is printed as such.
    rounds = [sorted(m.ok_per_s for m in by_level[c]) for c in levels]
    falls = [f"{levels[i - 1]} -> {levels[i]} clients" for i in range(1, len(levels))
             if rounds[i][-1] < rounds[i - 1][0]]
    dips = [f"{a} -> {b} clients: {x:.1f} -> {y:.1f}, within the rounds' spread"
            for a, b, x, y in zip(levels, levels[1:], medians, medians[1:], strict=False) if y < x]
    steps = " -> ".join(f"{x:.1f}" for x in medians)
    return [
        (f"{db}: throughput never falls as clients grow (median ok/s by level: {steps}; "
         + (f"falls {', '.join(falls)}" if falls else f"median dips {'; '.join(dips)}" if dips else "never lower")
         + ")", not falls),
        (f"{db}: no 500, no timeout, no connection error at any level "
         f"({count['500']} / {count['timeout']} / {count['conn error']})",
         count["500"] == count["timeout"] == count["conn error"] == 0),
        (f"{db}: every 503 carries Retry-After ({sum(m.lv.retry_after_missing for m in ms)} without, "
         f"of {count['503']})", all(m.lv.retry_after_missing == 0 for m in ms)),
        (f"{db}: /info p99 over the run under 100 ms ({pct(info, 0.99) * 1000:.1f} ms; {sum(m.lv.info_failed for m in ms)} failed)",
         pct(info, 0.99) < 0.1 and all(m.lv.info_failed == 0 for m in ms)),
        (f"{db}: no acknowledged report lost ({lost} lost)", lost == 0),
    ]


def agent_heartbeat(s: Setup, stop: threading.Event) -> None:
    """Long-poll like the agent daemon: again at once after an answer, after Retry-After on a 503."""
    with httpx.Client(base_url=s.url, headers={"Authorization": f"Bearer {s.agent_token}"},
                      timeout=CLIENT_TIMEOUT_S + POLL_S) as c:
        while not stop.is_set():
            try:
                r = c.get(f"/api/v1/agents/{AGENT_ID}/commands", params={"sessionId": s.session_id, "timeoutSeconds": POLL_S})
            except httpx.HTTPError:
                stop.wait(0.5)
                continue
            if r.status_code == 503:
                stop.wait(min(float(r.headers.get("retry-after") or 1), RETRY_AFTER_CAP_S))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", choices=["sqlite", "postgres", "both"], default="both")
    ap.add_argument("--clients", default="10,40,200,1000")
    ap.add_argument("--seconds", type=float, default=15.0, help="per level and round")
    ap.add_argument("--rounds", type=int, default=2,
                    help="times each level runs: in the given order, then reversed, ... (default 2)")
    ap.add_argument("--experiments", type=int, default=10, help="experiments in the listed table")
    ap.add_argument("--pg-fsync", action="store_true", help="PostgreSQL with fsync on (default off)")
    ap.add_argument("--client-retry-cap", type=float, default=5.0,
                    help="the longest Retry-After a client honours (default 5 s; the harness honours up to 30 s)")
    ap.add_argument("--max-concurrent", type=int, default=None,
                    help="the master's max_concurrent_requests (default: its own, from db_pool_size)")
    args = ap.parse_args()
    globals()["RETRY_AFTER_CAP_S"] = args.client_retry_cap
    if args.max_concurrent:  # MasterProcess passes the environment on to the master
        os.environ["SHIPYARD_MAX_CONCURRENT_REQUESTS"] = str(args.max_concurrent)
    levels = [int(x) for x in args.clients.split(",")]
    base = temp_dir("master-concurrency-")
    results: list[tuple[str, dict[int, list[Measured]], int]] = []
    try:
        if args.db in ("sqlite", "both"):
            results.append(("sqlite", *bench_db("sqlite", f"sqlite:///{base / 'sqlite.db'}", levels, args.seconds,
                                                 args.experiments, base, args.rounds)))
        if args.db in ("postgres", "both"):
            pg = BenchPostgres(fsync=args.pg_fsync)
            pg.start()
            try:
                results.append(("postgres", *bench_db("postgres", pg.create_database(), levels, args.seconds,
                                                       args.experiments, base, args.rounds)))
            finally:
                pg.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print()
    print(f"{args.seconds:.0f} s per level and round, {args.rounds} round(s) (levels in order, then reversed); "
          f"long-polls {POLL_S:.0f} s; client timeout {CLIENT_TIMEOUT_S:.0f} s; /info every {INFO_EVERY_S * 1000:.0f} ms")
    rows = [level_row(db, c, by_level[c], str(lost) if c == levels[-1] else "")
            for db, by_level, lost in results for c in levels]
    print_table(["db", "clients", "ok/s", "ok/s by round", "p50 ms", "p99 ms", "polls", "200", "503", "500", "timeout",
                 "conn err", "other", "/info p99 ms", "/info failed", "503 w/o Retry-After", "cpu master/load",
                 "ok per master cpu-s", "lost"], rows, right=set(range(1, 19)))
    print()
    passed = True
    for db, by_level, lost in results:
        for text, ok in verdicts(db, levels, by_level, lost):
            print(f"  {text}: {'PASS' if ok else 'FAIL'}")
            passed = passed and ok
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
