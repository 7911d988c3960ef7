"""Metrics ingest: Shipyard's master against MLflow's tracking server, same load, same database kind.

Target (issue): at least 3x MLflow's throughput at equal durability.

The load: `--clients` trial clients (threads, one keep-alive HTTP connection each), every one
sending training reports of `--metrics` numbers each, `--batch` reports per request and one
request in flight per client at a time, the way the Core API's background reporter ships them.
Every client first sends `--warmup` requests (not measured); then all start together and each
stops after `--reports` reports or `--seconds`, whichever comes first (so a run takes a known time
whatever the machine does).

- Shipyard: the real master (`python -m control_plane`: a control process and one API worker per
  core, as the product runs);
  the trials come from one experiment submitted with a `random` searcher (max_trials = clients) and
  no agents (they stay queued but exist); reports go to `POST /api/v1/trials/{id}/metrics/batch`
  with the admin (experiment owner) token.
- MLflow: `mlflow server --backend-store-uri <db> --workers N` for each N of `--mlflow-workers`;
  one run per trial client; `MlflowClient().log_batch(run_id, metrics=[Metric...])` with the same
  number of metric points per call (reports per request x metrics per report), synchronous. Its
  SQLAlchemy pool is sized to the clients (its default 5+10 per worker times out at 32 clients)
  and its job runner is off (MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false: huey consumers for GenAI
  jobs, no part of tracking, that otherwise take ~0.8 of a core here while idle).

All servers of one database kind stay up together and the measured phases alternate between them,
`--rounds` times (median reports/s over rounds; latencies pooled), so the load that other
processes put on the machine falls on every system alike.

Databases: SQLite (a file per system) and PostgreSQL (one throwaway server from tests/pg.py with
fsync ON, a database per system; the test suite turns fsync off, a durability comparison must
not). SQLite durability differs by default: Shipyard uses WAL + synchronous=NORMAL (durable across
a process crash; an OS crash or power loss can lose the last commits), MLflow keeps SQLite's
defaults (rollback journal + synchronous=FULL, durable across power loss). The run prints the
pragmas each engine actually gets and adds a Shipyard row with synchronous=FULL: that row is the
equal-durability comparison on SQLite.

    .venv/bin/python benchmarks/metrics_ingest.py                       # both DBs, ~3-4 min on 2 cores
    .venv/bin/python benchmarks/metrics_ingest.py --db sqlite --rounds 1 --seconds 10
    .venv/bin/python benchmarks/metrics_ingest.py --mlflow-workers 1,4 --clients 64 --batch 50
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402

from benchmarks._common import (  # noqa: E402
    BenchPostgres,
    MasterProcess,
    MlflowServer,
    loadavg,
    pct,
    print_table,
    temp_dir,
    tree_cpu_seconds,
)

METRIC_NAMES = ["loss", "accuracy", "lr", "grad_norm", "samples_per_second", "epoch", "val_gap", "aux_loss"]
SYNC_NAMES = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}

EXPERIMENT_CONFIG = """\
name: metrics-ingest-bench
entrypoint: python3 train.py
hyperparameters:
  lr: {{type: log, base: 10, minval: -4, maxval: -1}}
searcher:
  name: random
  metric: validation_loss
  smaller_is_better: true
  max_length: {{batches: 100000000}}
  max_trials: {trials}
  max_concurrent_trials: 0
resources:
  slots_per_trial: 1
"""


@dataclass
class Load:
    clients: int
    reports: int  # per client and round, at most
    batch: int  # reports per request
    metrics: int  # numbers per report
    warmup: int  # requests per client before the first measured round
    seconds: float  # a client's measured round ends after this long, even with reports left

    @property
    def batches(self) -> int:
        return -(-self.reports // self.batch)


@dataclass
class Round:
    reports: int
    seconds: float
    latencies_ms: list[float]
    errors: int
    first_error: str
    server_cpu_s: float
    db_cpu_s: float | None
    client_cpu_s: float

    @property
    def rate(self) -> float:
        return self.reports / self.seconds if self.seconds else 0.0


@dataclass
class Target:
    """One system on one database, started once and measured for several rounds."""

    system: str
    db: str
    durability: str
    start: Callable[[], None]
    stop: Callable[[], None]
    server_pid: Callable[[], int]
    verify: Callable[[], str] = lambda: ""
    # One sender per client: each call posts that client's next batch and raises on any failure.
    senders: list[Callable[[], None]] = field(default_factory=list)
    sent: list[int] = field(default_factory=list)  # requests that succeeded, per client
    rounds: list[Round] = field(default_factory=list)


def metric_values(step: int, n: int) -> dict[str, float]:
    return {METRIC_NAMES[k % len(METRIC_NAMES)] + ("" if k < len(METRIC_NAMES) else f"_{k}"):
            1.0 / (step + k + 1) for k in range(n)}


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def warm_up(target: Target, load: Load) -> None:
    def client(idx: int) -> None:
        for _ in range(load.warmup):
            target.senders[idx]()
            target.sent[idx] += 1

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(len(target.senders))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def measure(target: Target, load: Load, pg: BenchPostgres | None) -> Round:
    """Every client on its own thread; all start together, each stops after its reports or when
    the time is up; the round lasts until the last one is done."""
    t_start: list[float] = []
    start = threading.Barrier(len(target.senders) + 1, action=lambda: t_start.append(time.perf_counter()))
    lock = threading.Lock()
    ends: list[float] = []
    latencies: list[float] = []
    errors: list[str] = []

    def client(idx: int) -> None:
        send = target.senders[idx]
        lat: list[float] = []
        errs: list[str] = []
        start.wait()
        deadline = t_start[0] + load.seconds
        for _ in range(load.batches):
            t0 = time.perf_counter()
            if t0 >= deadline:
                break
            try:
                send()
                lat.append((time.perf_counter() - t0) * 1000)
                target.sent[idx] += 1
            except Exception as e:  # counted and shown; the load goes on
                errs.append(repr(e)[:300])
        t_end = time.perf_counter()
        with lock:
            latencies.extend(lat)
            errors.extend(errs)
            ends.append(t_end)

    def cpu() -> tuple[float, float | None]:
        db_cpu = None
        if pg is not None:
            db_cpu = tree_cpu_seconds(int((pg.data / "postmaster.pid").read_text().split()[0]))
        return tree_cpu_seconds(target.server_pid()), db_cpu

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(len(target.senders))]
    for t in threads:
        t.start()
    server0, db0 = cpu()
    client0 = time.process_time()
    start.wait()
    for t in threads:
        t.join()
    seconds = max(ends) - t_start[0]
    server1, db1 = cpu()
    latencies.sort()
    return Round(
        reports=len(latencies) * load.batch, seconds=seconds, latencies_ms=latencies, errors=len(errors),
        first_error=errors[0] if errors else "", server_cpu_s=server1 - server0,
        db_cpu_s=None if db0 is None or db1 is None else db1 - db0, client_cpu_s=time.process_time() - client0,
    )


# ---- Shipyard -----------------------------------------------------------------------------------
def shipyard_target(db: str, db_url: str, load: Load, workdir: Path, experiments: int,
                    full_sync: bool = False) -> Target:
    durability = "fsync=on, synchronous_commit=on" if db == "postgres" else (
        "WAL, synchronous=FULL" if full_sync else "WAL, synchronous=NORMAL (its default)")
    master = MasterProcess(db_url, workdir, sqlite_synchronous_full=full_sync)
    target = Target("shipyard", db, durability, start=lambda: None, stop=master.stop,
                    server_pid=lambda: master.proc.pid if master.proc else 0)
    stored = [0] * load.clients
    clients: list[httpx.Client] = []

    def start() -> None:
        master.start()
        token = master.token()
        trial_ids: list[int] = []
        for k in range(experiments):  # the clients split as evenly as they go
            trial_ids += shipyard_trials(master.url, token, load.clients // experiments +
                                         (1 if k < load.clients % experiments else 0))
        for idx, trial_id in enumerate(trial_ids):
            c = httpx.Client(base_url=master.url, timeout=300,
                             headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
            clients.append(c)
            target.senders.append(shipyard_sender(c, trial_id, load, stored, idx))
        target.sent.extend([0] * len(trial_ids))

    def stop() -> None:
        for c in clients:
            c.close()
        master.stop()

    target.start, target.stop = start, stop
    target.verify = lambda: f"{sum(stored)}/{sum(target.sent) * load.batch} reports stored"
    return target


def shipyard_trials(url: str, token: str, n: int) -> list[int]:
    from examples.demo import files_of

    model_dir = temp_dir("ingest-model-")
    (model_dir / "train.py").write_text("print('never runs: the benchmark starts no agents')\n")
    h = {"Authorization": f"Bearer {token}"}
    r = httpx.post(url + "/api/v1/experiments", headers=h, timeout=60,
                   json={"config": EXPERIMENT_CONFIG.format(trials=n), "modelDefinition": files_of(model_dir)})
    shutil.rmtree(model_dir, ignore_errors=True)
    r.raise_for_status()
    exp_id = r.json()["experiment"]["id"]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        trials = httpx.get(f"{url}/api/v1/experiments/{exp_id}/trials", headers=h, timeout=30).json()["trials"]
        if len(trials) >= n:
            return sorted(t["id"] for t in trials)[:n]
        time.sleep(0.2)
    raise RuntimeError(f"experiment {exp_id} did not create {n} trials")


def shipyard_sender(c: httpx.Client, trial_id: int, load: Load, stored: list[int], idx: int) -> Callable[[], None]:
    path = f"/api/v1/trials/{trial_id}/metrics/batch"
    next_step = [1]

    def send() -> None:
        first = next_step[0]
        now = rfc3339(time.time())
        reports = [{"group": "training", "metrics": {
            "trialId": trial_id, "trialRunId": 1, "stepsCompleted": step,
            "metrics": {"avgMetrics": metric_values(step, load.metrics)}, "reportTime": now}}
            for step in range(first, first + load.batch)]
        r = c.post(path, content=json.dumps({"reports": reports}).encode())
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.text[:200]}")
        next_step[0] = first + load.batch
        stored[idx] += int(r.json().get("stored", 0))

    return send


def sqlite_pragmas_shipyard(db_url: str, full: bool) -> str:
    from sqlalchemy import event, text

    from control_plane.db.engine import make_engine

    engine = make_engine(db_url)
    if full:  # the same listener the launcher in _common adds
        event.listen(engine, "connect", lambda dbapi_conn, _record: dbapi_conn.execute("PRAGMA synchronous=FULL"))
    with engine.connect() as conn:
        jm = conn.execute(text("PRAGMA journal_mode")).scalar()
        sync = conn.execute(text("PRAGMA synchronous")).scalar()
    engine.dispose()
    return f"journal_mode={jm} synchronous={SYNC_NAMES.get(int(sync or 0), sync)}"


# ---- MLflow -------------------------------------------------------------------------------------
def mlflow_target(db: str, backend_uri: str, load: Load, workers: int, workdir: Path) -> Target:
    durability = "fsync=on, synchronous_commit=on" if db == "postgres" else \
        "rollback journal, synchronous=FULL (its default)"
    server = MlflowServer(backend_uri, workdir, workers, pool_size=load.clients)
    target = Target(f"mlflow --workers {workers}", db, durability, start=lambda: None, stop=server.stop,
                    server_pid=lambda: server.proc.pid if server.proc else 0)
    run_ids: list[str] = []

    def start() -> None:
        from mlflow.entities import Metric
        from mlflow.tracking import MlflowClient

        server.start()
        client = MlflowClient(tracking_uri=server.url)
        exp_id = client.create_experiment(f"ingest-{workers}-{time.time_ns()}")
        run_ids.extend(client.create_run(exp_id, run_name=f"trial-{i}").info.run_id for i in range(load.clients))
        for run_id in run_ids:
            next_step = [1]

            def send(run_id: str = run_id, next_step: list[int] = next_step) -> None:
                first = next_step[0]
                ts_ms = int(time.time() * 1000)
                points = [Metric(k, v, ts_ms, step) for step in range(first, first + load.batch)
                          for k, v in metric_values(step, load.metrics).items()]
                client.log_batch(run_id, metrics=points, synchronous=True)
                next_step[0] = first + load.batch

            target.senders.append(send)
        target.sent.extend([0] * len(run_ids))

        def verify() -> str:
            checks = []
            for idx in sorted({0, len(run_ids) - 1}):
                got = len(client.get_metric_history(run_ids[idx], METRIC_NAMES[0]))
                checks.append(f"run {idx}: {got}/{target.sent[idx] * load.batch}")
            return f"'{METRIC_NAMES[0]}' points " + ", ".join(checks)

        target.verify = verify

    target.start = start
    return target


def sqlite_pragmas_mlflow(db_file: Path) -> str:
    from mlflow.store.db.utils import create_sqlalchemy_engine
    from sqlalchemy import text

    engine = create_sqlalchemy_engine(f"sqlite:///{db_file}")
    with engine.connect() as conn:
        jm = conn.execute(text("PRAGMA journal_mode")).scalar()
        sync = conn.execute(text("PRAGMA synchronous")).scalar()
    engine.dispose()
    return f"journal_mode={jm} synchronous={SYNC_NAMES.get(int(sync or 0), sync)}"


# ---- driver -------------------------------------------------------------------------------------
def run_db(db: str, load: Load, args: argparse.Namespace, base: Path, notes: list[str]) -> list[Target]:
    systems = {x.strip() for x in args.systems.split(",") if x.strip()}
    workers = [int(w) for w in args.mlflow_workers.split(",") if w.strip()] if "mlflow" in systems else []
    pg: BenchPostgres | None = None
    targets: list[Target] = []
    if db == "sqlite":
        ship = f"sqlite:///{base / 'shipyard.db'}"
        if "shipyard" in systems:
            targets.append(shipyard_target("sqlite", ship, load, base / "shipyard", args.experiments))
            if not args.no_full_sync_row:
                targets.append(shipyard_target("sqlite", f"sqlite:///{base / 'shipyard-full.db'}", load,
                                               base / "shipyard-full", args.experiments, full_sync=True))
        # MLflow servers of one kind share a database: their schema migrations run on first start only.
        targets += [mlflow_target("sqlite", f"sqlite:///{base / 'mlflow.db'}", load, w, base / f"mlflow-{w}")
                    for w in workers]
    else:
        pg = BenchPostgres(fsync=args.pg_fsync == "on")
        pg.start()
        notes.append(f"postgres: one throwaway server (tests/pg.py's initdb + pg_ctl), fsync={args.pg_fsync}, "
                     "synchronous_commit=on, a database per system")
        if "shipyard" in systems:
            targets.append(shipyard_target("postgres", pg.create_database(), load, base / "shipyard-pg",
                                           args.experiments))
        # The driver stays explicit: SQLAlchemy 2.1's default for postgresql:// is psycopg 3.
        mlflow_db = pg.create_database()
        targets += [mlflow_target("postgres", mlflow_db, load, w, base / f"mlflow-pg-{w}") for w in workers]
    try:
        for t in targets:
            t0 = time.monotonic()
            t.start()
            warm_up(t, load)
            print(f"  {t.system} on {db} ({t.durability}): up and warmed in {time.monotonic() - t0:.1f} s",
                  flush=True)
        for r in range(args.rounds):
            for t in targets:
                rd = measure(t, load, pg)
                t.rounds.append(rd)
                print(f"  round {r + 1}/{args.rounds} {t.system:<19} {db:<8} {rd.rate:>7,.0f} reports/s  "
                      f"p50 {pct(rd.latencies_ms, 0.5):>7.1f} ms  p99 {pct(rd.latencies_ms, 0.99):>8.1f} ms  "
                      f"errors {rd.errors}  (load average {loadavg()})", flush=True)
        for t in targets:
            print(f"  {t.system} on {db}: {t.verify()}", flush=True)
    finally:
        for t in targets:
            t.stop()
        if pg is not None:
            pg.stop()
    if db == "sqlite":
        mlflow = sqlite_pragmas_mlflow(base / "mlflow.db") if workers else "-"
        notes.append(f"sqlite pragmas as each engine opens its file: shipyard {sqlite_pragmas_shipyard(ship, False)}; "
                     f"shipyard FULL row {sqlite_pragmas_shipyard(ship, True)}; mlflow {mlflow}")
    return targets


def per_100(cpu_s: float | None, reports: int) -> str:
    return f"{cpu_s * 1000 / reports * 100:.0f}" if cpu_s is not None and reports else "-"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", choices=["sqlite", "postgres", "both"], default="both")
    ap.add_argument("--clients", type=int, default=32, help="concurrent trial clients (default 32)")
    ap.add_argument("--reports", type=int, default=5000,
                    help="measured reports per client and round, at most (default 5000)")
    ap.add_argument("--seconds", type=float, default=12, help="measured phase per system and round, at most (default 12)")
    ap.add_argument("--rounds", type=int, default=2, help="alternating measured rounds per system (default 2)")
    ap.add_argument("--batch", type=int, default=25, help="reports per request (default 25)")
    ap.add_argument("--metrics", type=int, default=5, help="numbers per report (default 5)")
    ap.add_argument("--warmup", type=int, default=2, help="unmeasured requests per client first (default 2)")
    ap.add_argument("--mlflow-workers", default="4",
                    help="comma-separated worker counts for mlflow server (default 4, its own default; "
                         "1 worker measured no faster on either database)")
    ap.add_argument("--experiments", type=int, default=1,
                    help="Shipyard experiments the trials are spread over (default 1: one search of N trials)")
    ap.add_argument("--systems", default="shipyard,mlflow", help="which to run (default shipyard,mlflow)")
    ap.add_argument("--no-full-sync-row", action="store_true", help="skip the Shipyard SQLite synchronous=FULL row")
    ap.add_argument("--pg-fsync", choices=["on", "off"], default="on")
    ap.add_argument("--keep", action="store_true", help="keep the databases and server logs")
    args = ap.parse_args()

    args.experiments = max(1, min(args.experiments, args.clients))
    load = Load(args.clients, args.reports, args.batch, args.metrics, args.warmup, args.seconds)
    dbs = ["sqlite", "postgres"] if args.db == "both" else [args.db]
    # One connection per client thread, as each trial has its own; MLflow's default pool is 10.
    os.environ["MLFLOW_HTTP_POOL_MAXSIZE"] = str(max(10, load.clients))
    logging.getLogger("mlflow").setLevel(logging.ERROR)
    logging.getLogger("urllib3").setLevel(logging.ERROR)

    print(f"metrics ingest: {load.clients} clients, {load.batch} reports x {load.metrics} metrics per request, "
          f"each client up to {load.batches * load.batch} reports or {load.seconds:g} s per round, "
          f"{args.rounds} rounds; {os.cpu_count()} CPUs shared by the servers, the database and this load "
          f"generator; load average at start {loadavg()}", flush=True)

    targets: list[Target] = []
    notes: list[str] = []
    base = temp_dir("metrics-ingest-")
    try:
        for db in dbs:
            targets += run_db(db, load, args, base, notes)
    finally:
        if args.keep:
            print(f"kept logs and databases in {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)

    print(f"\nload average at end {loadavg()}\n")
    headers = ["system", "db", "durability", "clients", "reports/s", "p50 ms", "p99 ms", "errors",
               "server CPU ms/100 reports", "db CPU ms/100", "client CPU %", "vs best MLflow",
               "CPU/report vs it"]
    rate = {id(t): statistics.median(r.rate for r in t.rounds) for t in targets}

    def cpu_per_report(t: Target) -> float:
        """Server + database CPU seconds per report: what the rate would be bound by on a
        machine of its own."""
        reports = sum(r.reports for r in t.rounds)
        return sum(r.server_cpu_s + (r.db_cpu_s or 0.0) for r in t.rounds) / reports if reports else float("nan")

    rows = []
    for t in targets:
        lat = sorted(x for r in t.rounds for x in r.latencies_ms)
        reports = sum(r.reports for r in t.rounds)
        seconds = sum(r.seconds for r in t.rounds)
        db_cpu = None if any(r.db_cpu_s is None for r in t.rounds) else sum(r.db_cpu_s or 0 for r in t.rounds)
        peers = [m for m in targets if m.system.startswith("mlflow") and m.db == t.db]
        best = max(peers, key=lambda m: rate[id(m)], default=None)
        ratio = cpu_ratio = "-"
        if best is not None and rate[id(best)] and t.system == "shipyard":
            ratio = f"{rate[id(t)] / rate[id(best)]:.2f}x"
            cpu_ratio = f"{cpu_per_report(best) / cpu_per_report(t):.2f}x less"
        rows.append([t.system, t.db, t.durability, load.clients,
                     f"{rate[id(t)]:,.0f}", f"{pct(lat, 0.5):.1f}", f"{pct(lat, 0.99):.1f}",
                     sum(r.errors for r in t.rounds), per_100(sum(r.server_cpu_s for r in t.rounds), reports),
                     per_100(db_cpu, reports), f"{sum(r.client_cpu_s for r in t.rounds) / seconds * 100:.0f}",
                     ratio, cpu_ratio])
    print_table(headers, rows, right=set(range(3, len(headers))))
    print()
    for t in targets:
        errs = [r.first_error for r in t.rounds if r.errors]
        if errs:
            print(f"errors in {t.system}/{t.db}: {sum(r.errors for r in t.rounds)}, first: {errs[0]}")
    for n in notes:
        print("note:", n)
    print("note: reports/s is the median over rounds, p50/p99 over every measured request (one request = "
          f"{load.batch} reports); target: >= 3x the best MLflow row on the same database; server CPU "
          "includes every worker process; client CPU % is this load generator's share of one core (200% = "
          "both cores); 'CPU/report vs it' compares server + database CPU per report with that MLflow row, "
          "which the other sessions' load on the machine moves much less than reports/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
