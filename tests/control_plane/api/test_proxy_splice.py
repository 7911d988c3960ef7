"""Zero-copy bodies of the task proxy (api/splice.py): `relay` between real sockets, and the master
served as `det-master` serves it (uvicorn with SpliceHttpToolsProtocol) proxying a large answer:
byte for byte, both keep-alive connections still usable after it, a caller or a task that leaves in
the middle, and never under TLS."""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from control_plane.__main__ import _uvicorn_config
from control_plane.api import splice
from control_plane.api.app import create_app
from control_plane.config import load_config
from control_plane.master import Master
from tests.conftest import ADMIN_PASSWORD, TEST_PASSWORD_HASHING
from tests.control_plane.api.test_proxy import serving_notebook
from tests.pg import free_port
from tests.tls_certs import self_signed

BIG = bytes(range(251)) * (12 * 4096)  # ~12 MiB, a prime period: a shifted or dropped byte shows


def _pair() -> tuple[socket.socket, socket.socket]:
    """A connected pair of loopback TCP sockets (relay takes TCP, as the master's are)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        a = socket.create_connection(listener.getsockname())
        b, _ = listener.accept()
    return a, b


def _read_all(sock: socket.socket, out: list[bytes]) -> None:
    while chunk := sock.recv(1 << 20):
        out.append(chunk)


def test_relay_moves_exactly_count_bytes_and_leaves_what_follows() -> None:
    src_w, src = _pair()
    dst, dst_r = _pair()
    got: list[bytes] = []
    reader = threading.Thread(target=_read_all, args=(dst_r, got))
    reader.start()
    writer = threading.Thread(target=lambda: src_w.sendall(BIG + b"NEXT REQUEST"))
    writer.start()
    src.setblocking(False)
    dst.setblocking(False)
    assert asyncio.run(splice.relay(src.fileno(), dst.fileno(), len(BIG))) == len(BIG)
    writer.join()
    dst.close()
    reader.join()
    assert b"".join(got) == BIG
    src.setblocking(True)
    assert src.recv(100) == b"NEXT REQUEST"  # the next answer on a kept-alive connection is untouched
    for s in (src_w, src, dst_r):
        s.close()


def test_relay_is_short_when_the_source_ends_early_the_caller_leaves_or_it_is_stopped() -> None:
    # The task closes before its Content-Length.
    src_w, src = _pair()
    dst, dst_r = _pair()
    src_w.sendall(b"x" * 1000)
    src_w.close()
    src.setblocking(False)
    dst.setblocking(False)
    assert asyncio.run(splice.relay(src.fileno(), dst.fileno(), 5000)) == 1000
    assert dst_r.recv(2000) == b"x" * 1000
    for s in (src, dst, dst_r):
        s.close()

    # The caller goes away while the task keeps sending.
    src_w, src = _pair()
    dst, dst_r = _pair()
    src.setblocking(False)
    dst.setblocking(False)
    feeding = threading.Event()

    def feed() -> None:
        feeding.set()
        try:
            while True:
                src_w.sendall(b"y" * (1 << 20))
        except OSError:
            pass

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    feeding.wait()
    dst_r.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # close = RST
    dst_r.close()
    t0 = time.monotonic()
    moved = asyncio.run(splice.relay(src.fileno(), dst.fileno(), 1 << 34))
    assert moved < 1 << 34 and time.monotonic() - t0 < 10
    src.close()  # the feeder's sendall fails, and it ends before its socket's number can be reused
    feeder.join(timeout=10)
    assert not feeder.is_alive()
    for s in (src_w, dst):
        s.close()

    # A task that stalls: the relay waits until it is stopped (the caller left), then returns.
    src_w, src = _pair()
    dst, dst_r = _pair()
    src.setblocking(False)
    dst.setblocking(False)

    async def stopped_after(delay: float) -> int:
        stop = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(delay, stop.set_result, None)
        return await splice.relay(src.fileno(), dst.fileno(), 100, stop=stop)

    t0 = time.monotonic()
    assert asyncio.run(stopped_after(0.3)) == 0
    assert 0.25 < time.monotonic() - t0 < 5
    for s in (src_w, src, dst, dst_r):
        s.close()


class _Task(BaseHTTPRequestHandler):
    """A task's server (HTTP/1.1, keep-alive, as Jupyter's), counting the connections it accepted."""

    protocol_version = "HTTP/1.1"
    connections: list[tuple[str, int]] = []

    def setup(self) -> None:
        super().setup()
        _Task.connections.append(self.client_address)

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path.endswith("/big") or self.path.endswith("/cut"):
            self.send_response(200)
            self.send_header("Content-Length", str(len(BIG)))
            self.end_headers()
            if self.path.endswith("/cut"):  # half of it, then the task dies
                self.wfile.write(BIG[: len(BIG) // 2])
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            self.wfile.write(BIG)
            return
        body = b"small"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_HEAD(self) -> None:  # noqa: N802
        self.send_response(200)
        self.send_header("Content-Length", str(len(BIG)))
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def task_server() -> Iterator[str]:
    _Task.connections = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Task)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def relays(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """(count asked, bytes moved) of every relay the master ran."""
    seen: list[tuple[int, int]] = []
    real = splice.relay

    async def counting(src_fd: int, dst_fd: int, count: int, **kw: Any) -> int:
        moved = await real(src_fd, dst_fd, count, **kw)
        seen.append((count, moved))
        return moved

    monkeypatch.setattr(splice, "relay", counting)
    return seen


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Callable[..., tuple[Master, str, dict[str, str]]]]:
    """A master served by uvicorn as det-master configures it (control_plane/__main__.py)."""
    started: list[tuple[uvicorn.Server, threading.Thread, Master]] = []

    def start(**settings: Any) -> tuple[Master, str, dict[str, str]]:
        config = load_config(env={}, db_url=f"sqlite:///{tmp_path / 'db.sqlite'}", state_dir=str(tmp_path / "state"),
                             admin_password=ADMIN_PASSWORD, **TEST_PASSWORD_HASHING, **settings)
        master = Master(config)
        master.prepare()
        server = uvicorn.Server(_uvicorn_config(create_app(master), config, host="127.0.0.1", port=free_port()))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        started.append((server, thread, master))
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.started
        url = f"{config.scheme}://127.0.0.1:{server.config.port}"
        verify: Any = ssl.create_default_context(cafile=str(config.security.tls.cert)) if config.tls else True
        r = httpx.post(url + "/api/v1/auth/login", json={"username": "admin", "password": ADMIN_PASSWORD},
                       verify=verify)
        assert r.status_code == 200, r.text
        return master, url, {"Authorization": f"Bearer {r.json()['token']}"}

    yield start
    for server, thread, master in started:
        server.should_exit = True
        thread.join(timeout=30)
        master.stop()


def test_a_large_answer_moves_in_the_kernel_and_both_connections_stay_usable(
        served: Any, task_server: str, relays: list[tuple[int, int]]) -> None:
    master, url, headers = served()
    with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
        nb_id = serving_notebook(client, headers, master, task_server)
        for _ in range(2):  # the route, then the cached fast path; the same connection each way
            r = client.get(f"/proxy/{nb_id}/big")
            assert r.status_code == 200 and r.content == BIG
            small = client.get(f"/proxy/{nb_id}/api/status")  # after it, on the same caller connection
            assert small.status_code == 200 and small.content == b"small"
        r = client.head(f"/proxy/{nb_id}/big")  # no body to move
        assert r.status_code == 200 and r.headers["content-length"] == str(len(BIG)) and r.content == b""
        assert client.get(f"/proxy/{nb_id}/api/status").content == b"small"
    assert len(relays) == 2 and all(moved == asked and asked > len(BIG) - upstream_read_bound() for asked, moved in relays)
    # The task's kept-alive connection served the answers after each splice: one connection for all five.
    assert len(_Task.connections) == 1, _Task.connections


def upstream_read_bound() -> int:
    """What the master may have read of a body before it decides to splice the rest (api/upstream.py)."""
    from control_plane.api import upstream

    return upstream.PAUSE_BYTES + (1 << 20)


def test_a_task_that_dies_mid_answer_and_a_caller_that_leaves(served: Any, task_server: str,
                                                             relays: list[tuple[int, int]]) -> None:
    master, url, headers = served()
    with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
        nb_id = serving_notebook(client, headers, master, task_server)
        with pytest.raises(httpx.RemoteProtocolError):  # the caller sees a short answer, not a complete one
            client.get(f"/proxy/{nb_id}/cut")
        assert relays and relays[-1][1] < relays[-1][0]
        assert client.get(f"/proxy/{nb_id}/api/status").content == b"small"  # a new connection each way
        # A caller who reads a little and leaves: the relay ends and the master serves on.
        with client.stream("GET", f"/proxy/{nb_id}/big") as r:
            next(r.iter_raw(1 << 16))
        deadline = time.monotonic() + 10
        while len(relays) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(relays) == 2 and relays[-1][1] < relays[-1][0]
        r = client.get(f"/proxy/{nb_id}/big")
        assert r.status_code == 200 and r.content == BIG


def test_under_tls_the_body_goes_through_tls_not_around_it(served: Any, task_server: str, tmp_path: Path,
                                                          relays: list[tuple[int, int]]) -> None:
    cert, key = self_signed(tmp_path / "tls")
    master, url, headers = served(security={"tls": {"cert": str(cert), "key": str(key)}})
    assert url.startswith("https://")
    with httpx.Client(base_url=url, headers=headers, timeout=30, verify=ssl.create_default_context(cafile=str(cert))) as client:
        nb_id = serving_notebook(client, headers, master, task_server)
        r = client.get(f"/proxy/{nb_id}/big")
        assert r.status_code == 200 and r.content == BIG
    assert relays == []



def test_a_caller_that_stops_reading_is_waited_for_with_few_wakeups_and_given_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the proxy sent through `send` must leave before the splice: a caller that never reads
    is polled with a backing-off delay (not a busy loop) and given up after IDLE_TIMEOUT_S."""

    class Stuck:
        polls = 0

        def get_write_buffer_size(self) -> int:
            Stuck.polls += 1
            return 1 << 20

        def is_closing(self) -> bool:
            return False

    monkeypatch.setattr(splice, "IDLE_TIMEOUT_S", 0.5)
    t0 = time.monotonic()
    assert asyncio.run(splice._flushed(Stuck(), None)) is False
    assert 0.4 < time.monotonic() - t0 < 5 and Stuck.polls < 30, Stuck.polls
