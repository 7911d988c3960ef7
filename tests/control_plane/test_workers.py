"""The master's processes (control_plane/workers.py): how many API workers, the supervisor that
restarts a worker that dies and stops them all, and the socket they share."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from control_plane import workers
from control_plane.config import AUTO_WORKERS_MAX, load_config
from shipyard_common.processes import pid_alive


def test_one_worker_per_core_by_default_capped(monkeypatch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cfg = load_config(env={}, state_dir=str(tmp_path))
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert cfg.worker_processes == 2
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert cfg.worker_processes == AUTO_WORKERS_MAX  # each worker has its own connection pool
    assert load_config(env={"SHIPYARD_API_WORKERS": "1"}, state_dir=str(tmp_path)).worker_processes == 1
    assert load_config(env={}, state_dir=str(tmp_path), api_workers=12).worker_processes == 12


def wait_for(predicate, timeout: float = 10.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (value := predicate()):
            return value
        time.sleep(0.05)
    raise AssertionError("timed out")


def test_the_supervisor_restarts_a_dead_worker_and_stops_them_all(tmp_path: Path) -> None:
    sock = workers.listen("127.0.0.1", 0)
    # A "worker" that serves the inherited socket: answers one line per connection with its pid.
    code = ("import os, socket, sys\n"
            "s = socket.socket(fileno=int(sys.argv[1]))\n"
            "while True:\n"
            "    c, _ = s.accept(); c.sendall(str(os.getpid()).encode()); c.close()\n")
    sup = workers.Supervisor([sys.executable, "-c", code, str(sock.fileno())], count=2, fd=sock.fileno(),
                             master_id="m-1")
    runner = threading.Thread(target=sup.run, daemon=True)
    runner.start()
    try:
        first = wait_for(lambda: [p.pid for p in sup.procs if p is not None] if all(sup.procs) else None)
        port = sock.getsockname()[1]
        answered = {int(socket.create_connection(("127.0.0.1", port)).recv(64)) for _ in range(20)}
        assert answered <= set(first) and answered  # the workers serve the control process's socket
        os.kill(first[0], signal.SIGKILL)
        wait_for(lambda: sup.procs[0] is not None and sup.procs[0].pid != first[0] and sup.procs[0].poll() is None)
        assert sup.restarts == [1, 0]
    finally:
        sup.stopping.set()  # what SIGTERM does to det-master: the loop ends, then the workers are stopped
        runner.join(5)
        sup.stop()
        sock.close()
    assert not any(pid_alive(p.pid) for p in sup.procs if p is not None)


def test_settle_heap_freezes_what_started_and_still_collects_cycles() -> None:
    """What the process loaded is out of the collector's sight; what it allocates afterwards is
    still collected, cycles included (the collector is tuned, not turned off)."""
    probe = """
import gc, json, weakref
from control_plane import workers
workers.settle_heap()
frozen = gc.get_freeze_count()
class Node: pass
a, b = Node(), Node()
a.peer, b.peer = b, a
gone = weakref.ref(a)
del a, b
gc.collect()
print(json.dumps({"frozen": frozen, "threshold": gc.get_threshold()[0], "enabled": gc.isenabled(),
                  "cycle_collected": gone() is None}))
"""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    seen = json.loads(out.stdout)
    assert seen["frozen"] > 1000
    assert seen["threshold"] == workers.GC_YOUNG_THRESHOLD
    assert seen["enabled"] and seen["cycle_collected"]


def test_the_api_serves_once_a_worker_answers_not_when_the_kernel_accepts() -> None:
    """The control process listens before its workers have imported the app: connections are
    accepted by the kernel but nobody answers. Only an HTTP answer marks the API serving (the
    agent-lost grace counts from then, loops/placement.py)."""
    from http.server import BaseHTTPRequestHandler, HTTPServer

    sock = workers.listen("127.0.0.1", 0)
    probe = workers.answers("http", "0.0.0.0", sock.getsockname()[1])  # a wildcard host: probed on loopback
    serving = threading.Event()
    stop = threading.Event()
    workers.when_serving(probe, serving.set, stop, interval_s=0.05)
    try:
        assert not probe()  # accepted, unanswered: times out
        assert not serving.is_set()

        class Health(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200 if self.path == "/health" else 404)
                self.end_headers()

            def log_message(self, *_args: object) -> None:
                pass

        server = HTTPServer(sock.getsockname(), Health, bind_and_activate=False)
        server.socket = sock
        threading.Thread(target=server.serve_forever, daemon=True).start()
        assert serving.wait(10) and probe()
        server.shutdown()
    finally:
        stop.set()
        sock.close()


def test_connections_to_the_shared_socket_are_nodelay() -> None:
    """The workers serve the control process's socket through uvicorn's `fd` (read as a Unix
    socket: no TCP_NODELAY from the event loop); connections accepted on it inherit the listener's
    TCP_NODELAY, so an answer written in two parts is not held for the client's delayed ACK."""
    sock = workers.listen("127.0.0.1", 0)
    try:
        client = socket.create_connection(sock.getsockname()[:2])
        accepted, _ = sock.accept()
        assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        accepted.close()
        client.close()
    finally:
        sock.close()
