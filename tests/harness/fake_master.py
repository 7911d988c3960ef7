"""A minimal stand-in for the master's trial-facing HTTP API (our own contract, docs/PROTOCOL.md).

It records every request, answers the few paths the harness uses, and can be told to fail:
`fail_with(503)` answers every request with that status, `refuse()` closes the listening socket
so connections are refused, `restore()` brings it back on the same port. The real master is
tested against the harness separately.
"""

from __future__ import annotations

import json
import re
import socket
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Connections we cut on purpose (refuse()) end in broken pipes; that is not a test failure.
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handle_error(request, client_address)


def _no_constants(token: str) -> Any:
    raise ValueError(f"non-standard JSON token {token} on the wire")


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: Any
    accepted: bool = False


@dataclass
class FakeMaster:
    host: str = "127.0.0.1"
    port: int = 0
    batch_endpoint: bool = True
    requests: list[Recorded] = field(default_factory=list)
    # Scripted answers of GET …/searcher/operation, consumed in order; the last one repeats.
    searcher_ops: list[dict[str, Any]] = field(default_factory=lambda: [{"op": None, "completed": True}])
    reject_steps: set[int] = field(default_factory=set)  # metrics at these steps get a 400
    checkpoints: dict[str, dict[str, Any]] = field(default_factory=dict)
    best_validation: float | None = None
    long_poll_cap_s: float = 2.0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._fail_status: int | None = None
        self._preempt = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._conns: set[socket.socket] = set()
        self._thread: threading.Thread | None = None

    # ---- control --------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> FakeMaster:
        master = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # One write per response and no Nagle: otherwise every keep-alive request waits out
            # a 40 ms delayed ACK.
            disable_nagle_algorithm = True
            wbufsize = 64 * 1024

            def log_message(self, *args: Any) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                with master._lock:
                    master._conns.add(self.connection)

            def finish(self) -> None:
                with master._lock:
                    master._conns.discard(self.connection)
                super().finish()

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                status, body = master._dispatch(self.command, self.path, dict(self.headers), raw)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = _handle

        self._server = _Server((self.host, self.port), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        # Keep-alive connections would otherwise go on being served by their handler threads.
        with self._lock:
            conns, self._conns = list(self._conns), set()
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def refuse(self) -> None:
        """Close the listening socket: new connections are refused until restore()."""
        self.stop()

    def restore(self) -> None:
        self._fail_status = None
        if self._server is None:
            self.start()

    def fail_with(self, status: int) -> None:
        self._fail_status = status

    def preempt(self) -> None:
        self._preempt.set()

    def bodies(self, method: str, pattern: str) -> list[Any]:
        with self._lock:
            return [r.body for r in self.requests if r.method == method and re.fullmatch(pattern, r.path)]

    def metric_reports(self) -> list[dict[str, Any]]:
        """Every report the master accepted, flattened out of batch and single requests."""
        out: list[dict[str, Any]] = []
        with self._lock:
            for r in self.requests:
                if r.accepted:
                    out.extend(r.body["reports"] if r.path.endswith("/metrics/batch") else [r.body])
        return out

    # ---- serving --------------------------------------------------------------------------------

    def _dispatch(self, method: str, target: str, headers: dict[str, str], raw: bytes) -> tuple[int, Any]:
        url = urlparse(target)
        path = url.path
        body = json.loads(raw, parse_constant=_no_constants) if raw else None
        rec = Recorded(method, path, parse_qs(url.query), headers, body)
        with self._lock:
            self.requests.append(rec)
        if self._fail_status is not None:
            return self._fail_status, {"message": "injected failure"}

        m = re.fullmatch(r"/api/v1/trials/(\d+)/metrics(/batch)?", path)
        if m and method == "POST":
            if m.group(2) and not self.batch_endpoint:
                return 404, {"detail": "Not Found"}
            reports = body["reports"] if m.group(2) else [body]
            bad = [r for r in reports if r["metrics"]["stepsCompleted"] in self.reject_steps]
            if bad:
                return 400, {"message": f"bad report at steps {bad[0]['metrics']['stepsCompleted']}"}
            rec.accepted = True
            return 200, {}
        if re.fullmatch(r"/api/v1/trials/\d+/searcher/operation", path):
            with self._lock:
                answer = self.searcher_ops[0] if len(self.searcher_ops) == 1 else self.searcher_ops.pop(0)
            return 200, answer
        m = re.fullmatch(r"/api/v1/allocations/[^/]+/signals/preemption", path)
        if m:
            timeout = float(rec.query.get("timeoutSeconds", ["0"])[0])
            self._preempt.wait(min(timeout, self.long_poll_cap_s))
            return 200, {"preempt": self._preempt.is_set()}
        if path == "/api/v1/checkpoints" and method == "POST":
            self.checkpoints[body["uuid"]] = body
            return 200, {}
        m = re.fullmatch(r"/api/v1/checkpoints/([^/]+)", path)
        if m and method == "GET":
            ckpt = self.checkpoints.get(m.group(1))
            return (200, {"checkpoint": ckpt}) if ckpt else (404, {"message": "checkpoint not found"})
        if re.fullmatch(r"/api/v1/experiments/\d+/searcher/best_searcher_validation_metric", path):
            if self.best_validation is None:
                return 404, {"message": "no validation metrics yet"}
            return 200, {"metric": self.best_validation}
        if method in ("POST", "PATCH"):
            return 200, {}  # progress, completed_operation, early_exit, ack_preemption, patch checkpoints
        return 404, {"detail": "Not Found"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
