"""The master's processes: a control process and its API workers.

`det-master` with `api_workers` > 1 (0 = one per core) binds the listening socket, runs the
control loops while it holds the leadership lease, and starts the API workers: each is
`python -m control_plane ... api-worker --fd N`, serving requests from the inherited socket (the
kernel spreads connections between them). The supervisor restarts a worker that dies, with a
backoff; a worker dies with its control process (PR_SET_PDEATHSIG), so no worker outlives it
holding the port.

Prometheus (control_plane/telemetry.py) counts per process: with several processes, every process
writes its samples to files in `<state_dir>/prometheus` (prometheus_client's multiprocess mode),
which /metrics aggregates whichever worker it reaches."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from shipyard_common.processes import pid_alive

log = logging.getLogger("shipyard.workers")

RESTART_BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0)
STOP_GRACE_S = 10.0
PR_SET_PDEATHSIG = 1
METRICS_ENV = "PROMETHEUS_MULTIPROC_DIR"
MASTER_ID_ENV = "SHIPYARD_MASTER_ID"


def listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit it. The workers serve this socket through uvicorn's `fd`, which
    # wraps it as a Unix socket, so the event loop never sets TCP_NODELAY on their connections:
    # every answer (headers, then body) waited ~40 ms for the client's delayed ACK.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def when_serving(probe: Callable[[], bool], then: Callable[[], None], stopping: threading.Event,
                 interval_s: float = 0.2) -> threading.Thread:
    """Call `then` once `probe()` says the API answers (from a daemon thread)."""

    def run() -> None:
        while not stopping.is_set():
            if probe():
                then()
                return
            stopping.wait(interval_s)

    thread = threading.Thread(target=run, name="api-serving-probe", daemon=True)
    thread.start()
    return thread


def answers(scheme: str, host: str, port: int) -> Callable[[], bool]:
    """Whether the API workers answer on the control process's socket (/health, from memory).
    The kernel accepts connections on the listening socket before any worker does, so only an
    HTTP answer says they serve."""
    import httpx

    host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)
    url = f"{scheme}://{'[' + host + ']' if ':' in host else host}:{port}/health"

    def probe() -> bool:
        try:
            # Its own certificate, maybe for another name: this is a liveness check, not trust.
            return httpx.get(url, timeout=2.0, verify=False).status_code == 200
        except httpx.HTTPError:
            return False

    return probe


def prepare_metrics_dir(state_dir: Path) -> Path:
    """A fresh directory for this run's per-process metric files (a previous run's would be summed in)."""
    root = state_dir / "prometheus"
    for old in root.glob("*") if root.is_dir() else []:  # runs that ended (masters sharing a state dir keep theirs)
        if not (old.name.isdigit() and pid_alive(int(old.name))):
            shutil.rmtree(old, ignore_errors=True)
    path = Path(os.environ.get(METRICS_ENV) or root / str(os.getpid()))
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True, mode=0o700)
    os.environ[METRICS_ENV] = str(path)
    return path


# Young collections every this many net allocations (CPython's default is 700): a request
# allocates thousands of short-lived objects (ORM rows, JSON, headers), and at 700 the collector
# ran hundreds of times a second on a busy worker.
GC_YOUNG_THRESHOLD = 20_000


def settle_heap() -> None:
    """Once the process has started (modules, app, routes, configuration: about 100,000 objects
    that live as long as it does): move them out of the collector's sight, and collect less often.
    A busy API worker otherwise spent about 4% of its time in the collector, in pauses of up to
    300 ms (each full collection walked every object it had ever loaded) that stopped every
    request it was serving."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)


def die_with_parent() -> None:
    """Linux: the kernel kills the worker when the control process dies, however it dies. At
    once: the det-master died (a clean stop sends SIGTERM to its workers itself and waits), and a
    worker lingering in a graceful shutdown would keep the port from a master restarted on it."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:  # the parent died before the prctl
        os.kill(os.getpid(), signal.SIGKILL)


class Supervisor:
    def __init__(self, cmd: list[str], *, count: int, fd: int, metrics_dir: Path | None = None,
                 master_id: str = "") -> None:
        self.cmd = cmd
        self.master_id = master_id
        self.count = count
        self.fd = fd
        self.metrics_dir = metrics_dir
        self.stopping = threading.Event()
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * count
        self.restarts = [0] * count
        self.next_start = [0.0] * count

    def _start(self, i: int) -> None:
        proc = subprocess.Popen(self.cmd, pass_fds=(self.fd,), env={**os.environ, "SHIPYARD_WORKER_INDEX": str(i),
                                                                       MASTER_ID_ENV: self.master_id})
        self.procs[i] = proc
        log.info("event=api_worker_started index=%d pid=%d", i, proc.pid)

    def run(self) -> None:
        for i in range(self.count):
            self._start(i)
        while not self.stopping.wait(0.5):
            now = time.monotonic()
            for i, proc in enumerate(self.procs):
                if proc is not None and proc.poll() is None:
                    continue
                if proc is not None:
                    self._reap(proc)
                    delay = RESTART_BACKOFF_S[min(self.restarts[i], len(RESTART_BACKOFF_S) - 1)]
                    self.restarts[i] += 1
                    self.next_start[i] = now + delay
                    self.procs[i] = None
                    log.error("event=api_worker_exited index=%d pid=%d code=%s restart_in_s=%.1f", i, proc.pid,
                              proc.returncode, delay)
                elif now >= self.next_start[i]:
                    self._start(i)

    def _reap(self, proc: subprocess.Popen[bytes]) -> None:
        if self.metrics_dir is None:
            return
        with contextlib.suppress(Exception):
            from prometheus_client import multiprocess

            multiprocess.mark_process_dead(proc.pid, str(self.metrics_dir))

    def stop(self) -> None:
        self.stopping.set()
        live = [p for p in self.procs if p is not None and p.poll() is None]
        for p in live:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for p in live:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
