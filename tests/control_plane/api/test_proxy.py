"""The task proxy (api/proxy.py) in process, both databases, against a small HTTP server standing in
for a notebook's Jupyter: the caller's session by bearer token, Determined's `auth` cookie or the
web UI's session cookie; owner or admin only (another user 404, nobody 401); upstream gets the
task's Jupyter token and none of the caller's credentials; traffic marks the task's activity. A target is cached for TARGET_TTL_S (shortened here): a logged-out
session or a killed task stops getting through once it has passed; a cached GET takes the front
door's fast path (api/proxy.py ProxyFront), a POST the route."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from sqlalchemy import select

from control_plane.api import proxy
from control_plane.auth import UI_SESSION_COOKIE
from control_plane.db.engine import transaction
from control_plane.db.models import Allocation, Task
from control_plane.services.tasks import jupyter_token
from tests.conftest import login
from tests.control_plane.api.test_experiments import make_user

BIG = bytes(range(256)) * (3 * 4096)  # 3 MiB, not all alike


class _Echo(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as Jupyter's

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path.endswith("/big"):
            self.send_response(200)
            self.send_header("Content-Length", str(len(BIG)))
            self.end_headers()
            self.wfile.write(BIG)
            return
        self._answer(b"")

    def do_HEAD(self) -> None:  # noqa: N802
        self.send_response(200)
        self.send_header("Content-Length", "12345")
        self.end_headers()

    def do_POST(self) -> None:  # noqa: N802
        self._answer(self.rfile.read(int(self.headers.get("content-length") or 0)))

    def _answer(self, body: bytes) -> None:
        out = json.dumps({"path": self.path, "headers": dict(self.headers), "body": body.decode()}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def upstream() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def serving_notebook(client: Any, headers: dict[str, str], master: Any, address: str) -> str:
    nb = client.post("/api/v1/notebooks", headers=headers, json={"config": {"resources": {"slots": 0}}}).json()
    nb_id = nb["notebook"]["id"]
    with transaction(master.sessions) as s:  # as if placed, started and reporting its address
        s.scalar(select(Allocation).where(Allocation.task_id == nb_id)).state = "running"
        s.get(Task, nb_id).proxy_address = address
    return nb_id


def test_proxy_sessions_owner_only_and_upstream_credentials(client, admin_headers, master, upstream,  # type: ignore[no-untyped-def]
                                                            monkeypatch) -> None:
    monkeypatch.setattr(proxy, "TARGET_TTL_S", 0.3)
    nb_id = serving_notebook(client, admin_headers, master, upstream)
    token = admin_headers["Authorization"].removeprefix("Bearer ")
    for headers, cookie in ((admin_headers, None), ({}, "auth"), ({}, UI_SESSION_COOKIE)):
        client.cookies.clear()
        if cookie:
            client.cookies.set(cookie, token)
        r = client.post(f"/proxy/{nb_id}/api/kernels?x=1", content=b'{"name": "python3"}', headers=headers)
        assert r.status_code == 200, (cookie, r.text)
        seen = r.json()
        assert seen["path"] == f"/proxy/{nb_id}/api/kernels?x=1" and seen["body"] == '{"name": "python3"}'
        sent = {k.lower(): v for k, v in seen["headers"].items()}
        assert sent["authorization"] == f"token {jupyter_token(master, nb_id)}"
        assert "cookie" not in sent
    # Determined's task-token header is a credential too: never passed on to the task.
    r = client.get(f"/proxy/{nb_id}/api/status", headers={"grpc-metadata-x-allocation-token": admin_headers["Authorization"]})
    assert r.status_code == 200 and "grpc-metadata-x-allocation-token" not in {k.lower() for k in r.json()["headers"]}
    client.cookies.clear()
    with master.sessions() as s:
        assert s.get(Task, nb_id).last_activity_at is not None
    other = make_user(client, admin_headers, "mallory")
    assert client.get(f"/proxy/{nb_id}/api/status", headers=other).status_code == 404
    assert client.get(f"/proxy/{nb_id}/api/status").status_code == 401
    assert client.get("/proxy/no-such-task/api/status", headers=admin_headers).status_code == 404
    second = login(client)  # a second session, cached, then logged out: refused once the TTL has passed
    for _ in range(2):
        r = client.get(f"/proxy/{nb_id}/api/status?y=2", headers=second)
        assert r.status_code == 200 and r.json()["path"] == f"/proxy/{nb_id}/api/status?y=2", r.text
        sent = {k.lower(): v for k, v in r.json()["headers"].items()}
        assert sent["authorization"] == f"token {jupyter_token(master, nb_id)}", sent
    assert client.post("/api/v1/auth/logout", headers=second).status_code == 200
    time.sleep(proxy.TARGET_TTL_S)
    assert client.get(f"/proxy/{nb_id}/api/status", headers=second).status_code == 401
    assert client.get(f"/proxy/{nb_id}/api/status", headers=admin_headers).status_code == 200
    client.post(f"/api/v1/notebooks/{nb_id}/kill", headers=admin_headers)
    with transaction(master.sessions) as s:  # its agent reported the exit
        s.scalar(select(Allocation).where(Allocation.task_id == nb_id)).state = "terminated"
    time.sleep(proxy.TARGET_TTL_S)
    assert client.get(f"/proxy/{nb_id}/api/status", headers=admin_headers).status_code == 404


def test_proxy_streams_large_bodies_head_and_a_task_that_went_away(client, admin_headers, master, upstream) -> None:  # type: ignore[no-untyped-def]
    """api/upstream.py's paths: a large answer streamed back whole, a large upload streamed up (with
    its length), HEAD (headers, no body), and a 502 once the task is gone, then through again."""
    nb_id = serving_notebook(client, admin_headers, master, upstream)
    for _ in range(2):  # the route, then the cached fast path, on a kept-alive connection
        r = client.get(f"/proxy/{nb_id}/big", headers=admin_headers)
        assert r.status_code == 200 and r.content == BIG
    up = b"0123456789abcdef" * (2**17)  # 2 MiB, over WHOLE_BODY_BYTES: streamed
    r = client.post(f"/proxy/{nb_id}/upload", headers=admin_headers, content=up)
    assert r.status_code == 200 and r.json()["body"].encode() == up
    r = client.head(f"/proxy/{nb_id}/big", headers=admin_headers)
    assert r.status_code == 200 and r.headers["content-length"] == "12345" and r.content == b""
    with transaction(master.sessions) as s:  # the task went away (its address refuses connections)
        s.get(Task, nb_id).proxy_address = "127.0.0.1:9"
    proxy.target_cache(client.app.state).drop(proxy._cache_key(admin_headers["Authorization"][7:], False), nb_id)
    r = client.get(f"/proxy/{nb_id}/api/status", headers=admin_headers)
    assert r.status_code == 502 and "did not answer" in r.text
    with transaction(master.sessions) as s:  # back: the next request resolves it afresh
        s.get(Task, nb_id).proxy_address = upstream
    assert client.get(f"/proxy/{nb_id}/api/status", headers=admin_headers).status_code == 200
    # A cached target that no longer answers (the task moved): resolved afresh by the route, not a 502.
    cache = proxy.target_cache(client.app.state)
    key = proxy._cache_key(admin_headers["Authorization"][7:], False)
    cache.put(key, nb_id, "127.0.0.1:9", jupyter_token(master, nb_id))
    assert client.get(f"/proxy/{nb_id}/api/status", headers=admin_headers).status_code == 200
    assert cache.get(key, nb_id) == (upstream, jupyter_token(master, nb_id))


def test_an_answer_whose_headers_never_end_is_a_502_not_the_masters_memory(client, admin_headers, master) -> None:  # type: ignore[no-untyped-def]
    """A task's server that sends a status line and then headers without end: the proxy gives up at
    upstream.MAX_HEAD_BYTES (502) instead of buffering them."""
    import socket

    listener = socket.create_server(("127.0.0.1", 0))
    sent = []

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\n")
            try:
                for _ in range(4096):  # up to 16 MiB of headers
                    conn.sendall(b"X-Endless: " + b"a" * 4085 + b"\r\n")
                    sent.append(1)
            except OSError:
                pass  # the proxy hung up

    threading.Thread(target=serve, daemon=True).start()
    nb_id = serving_notebook(client, admin_headers, master, f"127.0.0.1:{listener.getsockname()[1]}")
    r = client.get(f"/proxy/{nb_id}/api/status", headers=admin_headers)
    assert r.status_code == 502, r.text
    listener.close()
    assert len(sent) < 4096  # it stopped reading long before the end


def test_a_browser_session_reaches_its_own_users_tasks_only_an_admins_too(client, admin_headers, master,  # type: ignore[no-untyped-def]
                                                                         upstream) -> None:
    """A task's pages share the master's origin: a page another user's task serves, opened in an
    admin's browser, must not act with the admin's session (services/tasks.py `proxy_target`)."""
    owner = make_user(client, admin_headers, "olivia")
    nb_id = serving_notebook(client, owner, master, upstream)
    admin_token = admin_headers["Authorization"].removeprefix("Bearer ")
    owner_token = owner["Authorization"].removeprefix("Bearer ")
    for cookie in ("auth", UI_SESSION_COOKIE):
        for _ in range(2):  # resolved, then from the fast path's cache (a header's entry is not a cookie's)
            client.cookies.clear()
            assert client.get(f"/proxy/{nb_id}/api/status", headers=admin_headers).status_code == 200
            client.cookies.set(cookie, admin_token)
            assert client.get(f"/proxy/{nb_id}/api/status").status_code == 404, cookie
            client.cookies.set(cookie, owner_token)
            assert client.get(f"/proxy/{nb_id}/api/status").status_code == 200, cookie
    client.cookies.clear()
