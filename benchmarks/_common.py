"""Shared pieces of the benchmarks that start real servers: a Shipyard master process, an MLflow
tracking server, a throwaway PostgreSQL (tests/pg.py's, with fsync configurable), CPU accounting
of a process tree from /proc, percentiles and a plain-text table."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from shipyard_common import processes  # noqa: E402
from tests.pg import PostgresServer, find_pg_bin, free_port  # noqa: E402

VENV_BIN = Path(sys.executable).parent
ADMIN_PASSWORD = "bench-admin-pw-1"
CLK_TCK = os.sysconf("SC_CLK_TCK")

# Runs the master with SQLite's synchronous=FULL instead of the product's NORMAL, so its durability
# can be put on the same footing as a server that keeps SQLite's default (FULL). The pragma is
# added on every new connection after the product's own pragmas, so it overrides NORMAL only.
_FULL_SYNC_LAUNCHER = """
import sys
from sqlalchemy import event
import control_plane.db.engine as engine_mod
import control_plane.master as master_mod
_orig = engine_mod.make_engine
def make_engine(url, **kwargs):
    engine = _orig(url, **kwargs)
    if url.startswith("sqlite"):
        @event.listens_for(engine, "connect")
        def _full(dbapi_conn, _record):
            dbapi_conn.execute("PRAGMA synchronous=FULL")
    return engine
engine_mod.make_engine = make_engine
master_mod.make_engine = make_engine
from control_plane.__main__ import main
sys.exit(main(sys.argv[1:]))
"""


# ---- processes ----------------------------------------------------------------------------------
def wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited during start-up:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{what} did not answer at {url} within {timeout:.0f}s; see {log}")


def stop_process_group(proc: subprocess.Popen[bytes] | None, grace: float = 15) -> None:
    """SIGTERM the group we started (start_new_session=True), then SIGKILL what is left; reap it."""
    if proc is None or proc.poll() is not None:
        return
    processes.stop_process_group(proc.pid, grace)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


class MasterProcess:
    """`python -m control_plane` (single uvicorn process, the product as shipped) on a free port."""

    def __init__(self, db_url: str, state_dir: Path, sqlite_synchronous_full: bool = False) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.db_url = db_url
        self.state_dir = state_dir
        self.log = state_dir / "master.log"
        self.full_sync = sqlite_synchronous_full
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        args = ["--port", str(self.port), "--db", self.db_url, "--state-dir", str(self.state_dir / "state")]
        cmd = [sys.executable, "-c", _FULL_SYNC_LAUNCHER, *args] if self.full_sync else \
            [sys.executable, "-m", "control_plane", *args]
        env = dict(os.environ, SHIPYARD_ADMIN_PASSWORD=ADMIN_PASSWORD)
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                         start_new_session=True)
        wait_http(self.url + "/info", self.proc, self.log, timeout, "the master")

    def token(self) -> str:
        r = httpx.post(self.url + "/api/v1/auth/login", json={"username": "admin", "password": ADMIN_PASSWORD})
        r.raise_for_status()
        return str(r.json()["token"])

    def stop(self) -> None:
        stop_process_group(self.proc)


class MlflowServer:
    """`mlflow server` with a database backend store, as a subprocess on a free port."""

    def __init__(self, backend_uri: str, workdir: Path, workers: int, pool_size: int = 0) -> None:
        self.pool_size = pool_size
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.backend_uri = backend_uri
        self.workdir = workdir
        self.workers = workers
        self.log = workdir / "mlflow.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 180) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        cmd = [str(VENV_BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(self.port),
               "--backend-store-uri", self.backend_uri,
               "--default-artifact-root", (self.workdir / "artifacts").as_uri(),
               "--workers", str(self.workers)]
        env = dict(os.environ, PATH=f"{VENV_BIN}:{os.environ.get('PATH', '')}")
        # The job runner (huey consumers for GenAI jobs and periodic tasks) is no part of tracking
        # and its idle polling takes most of a core, which on 2 cores would slow whatever is measured.
        env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
        if self.pool_size:
            # MLflow's default pool (5 + 10 overflow per worker) times out under more concurrent
            # requests than that; sized like the load, so the peer is not failed by its defaults.
            env["MLFLOW_SQLALCHEMYSTORE_POOL_SIZE"] = str(self.pool_size)
            env["MLFLOW_SQLALCHEMYSTORE_MAX_OVERFLOW"] = "10"
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=self.workdir,
                                         start_new_session=True)
        wait_http(self.url + "/health", self.proc, self.log, timeout, "mlflow server")

    def stop(self) -> None:
        stop_process_group(self.proc)


class BenchPostgres(PostgresServer):
    """tests/pg.py's throwaway server; fsync stays on unless asked (the tests turn it off for speed,
    a durability comparison must not)."""

    def __init__(self, fsync: bool) -> None:
        bin_dir = find_pg_bin()
        if bin_dir is None:
            raise RuntimeError("no PostgreSQL binaries (initdb, pg_ctl) found; set PG_BIN or install postgresql")
        super().__init__(bin_dir)
        self.fsync = fsync

    def start(self) -> None:
        self._run(str(self.bin / "initdb"), "-D", str(self.data), "-U", self.user, "-A", "trust", "-E", "UTF8")
        opts = (f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c max_connections=300 "
                f"-c fsync={'on' if self.fsync else 'off'} -c synchronous_commit=on")
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-o", opts, "-l", str(self.dir / "log"), "-w",
                  "start")


def temp_dir(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))


# ---- measurement helpers ------------------------------------------------------------------------
def _proc_children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    return children


def tree_pids(root_pid: int) -> Iterator[int]:
    """A process and all its live descendants (from /proc, children before grandchildren)."""
    children = _proc_children()
    stack = [root_pid]
    while stack:
        pid = stack.pop()
        yield pid
        stack.extend(children.get(pid, []))


def tree_cpu_seconds(root_pid: int) -> float:
    """user+system CPU of a process and all its live descendants (and the children they reaped)."""
    total = 0.0
    for pid in tree_pids(root_pid):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            # fields[11..14] = utime stime cutime cstime (stat fields 14..17)
            total += sum(int(x) for x in fields[11:15]) / CLK_TCK
        except (OSError, IndexError, ValueError):
            continue
    return total


def pct(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def print_table(headers: list[str], rows: list[list[Any]], right: set[int] | None = None) -> None:
    right = right if right is not None else set(range(1, len(headers)))
    cells = [[str(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]

    def fmt(values: list[str]) -> str:
        return "  ".join(v.rjust(w) if i in right else v.ljust(w) for i, (v, w) in enumerate(zip(values, widths, strict=True)))

    print(fmt(headers))
    print("  ".join("-" * w for w in widths))
    for r in cells:
        print(fmt(r))


def tree_rss_bytes(root_pid: int) -> tuple[int, int]:
    """Resident memory of a process and all its live descendants (bytes; shared pages are counted
    once per process, as `ps` does), and how many processes that is."""
    page = os.sysconf("SC_PAGE_SIZE")
    total, count = 0, 0
    for pid in tree_pids(root_pid):
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * page
            count += 1
        except (OSError, IndexError, ValueError):
            continue
    return total, count


def tree_run_wait_seconds(root_pid: int) -> float:
    """Time the threads of a process tree spent runnable but waiting for a CPU (/proc/*/schedstat,
    live threads only): over a window, divided by its length, the average number of threads the
    machine kept waiting. Large when the cores are oversubscribed, whoever uses them."""
    total = 0
    for pid in tree_pids(root_pid):
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[1])
            except (OSError, IndexError, ValueError):
                continue
    return total / 1e9
