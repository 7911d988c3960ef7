"""The front door (frontdoor/admission.py's AdmissionControl) as a plain ASGI callable, with an
application behind it that records what reaches it: health is answered from memory while the lanes
are full, a refusal is a complete 503 (Retry-After, Content-Length, the error body) of which nothing
reaches the application, and what is admitted passes through and gives its slot back. No server,
no database, no clock: the lanes are filled by construction."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from control_plane.frontdoor.admission import TICKET_KEY, Admission, AdmissionControl

HEALTH = frozenset({"/health", "/info"})


class Behind:
    """The application behind the door: answers 200 and records the paths that reached it."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.seen.append(scope["path"])
        assert scope[TICKET_KEY].held
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


def door(behind: Behind, *, users_limit: int = 1, cluster_limit: int = 1) -> AdmissionControl:
    users = Admission(limit=users_limit, queue=0, wait_s=0, retry_after_s=2)
    cluster = Admission(limit=cluster_limit, queue=0, wait_s=0, retry_after_s=2)
    return AdmissionControl(behind, admission=users, cluster=cluster, exempt=HEALTH, threads=8,
                            health={"/info": lambda: {"clusterId": "c-1"}, "/health": lambda: {"status": "ok"}})


def call(app: AdmissionControl, method: str, path: str, body: bytes = b"",
         headers: list[tuple[bytes, bytes]] | None = None) -> tuple[int, dict[bytes, bytes], bytes]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(msg: dict[str, Any]) -> None:
        sent.append(msg)

    scope = {"type": "http", "method": method, "path": path, "headers": headers or []}
    asyncio.run(app(scope, receive, send))
    start, body_msg = sent
    return start["status"], dict(start["headers"]), body_msg["body"]


def test_health_answers_from_memory_while_both_lanes_are_full() -> None:
    behind = Behind()
    app = door(behind)
    app.admission.active, app.cluster.active = 1, 1  # every slot held, no queue
    status, headers, body = call(app, "GET", "/info")
    assert status == 200 and json.loads(body) == {"clusterId": "c-1"}
    assert headers[b"content-type"] == b"application/json" and int(headers[b"content-length"]) == len(body)
    assert call(app, "GET", "/health")[0] == 200
    assert behind.seen == []  # nothing of the application ran
    assert (app.admission.active, app.cluster.active) == (1, 1)  # and no slot was taken


def test_a_refusal_is_a_complete_503_that_never_reaches_the_application() -> None:
    behind = Behind()
    app = door(behind)
    app.admission.active = 1
    for method, body in (("GET", b""), ("POST", b'{"x": 1}')):
        status, headers, text = call(app, method, "/api/v1/experiments", body)
        assert status == 503
        assert int(headers[b"retry-after"]) >= 2  # the lane's floor
        assert int(headers[b"content-length"]) == len(text)
        assert b"connection" not in headers  # the small body was read: the connection stays usable
        assert json.loads(text)["code"] == 503 and json.loads(text)["error"]["code"] == 503
    assert behind.seen == []
    # The users' lane being full does not refuse the cluster's requests.
    assert call(app, "POST", "/api/v1/trials/7/metrics")[0] == 200
    assert behind.seen == ["/api/v1/trials/7/metrics"] and app.cluster.active == 0


BROWSER = [(b"accept", b"text/html,application/xhtml+xml,*/*;q=0.8")]


def test_a_browser_refused_a_page_gets_a_page_that_loads_itself_again() -> None:
    behind = Behind()
    app = door(behind)
    app.admission.active = 1
    status, headers, text = call(app, "GET", "/experiments/3", headers=BROWSER)
    assert status == 503 and headers[b"content-type"].startswith(b"text/html")
    seconds = int(headers[b"retry-after"])
    assert f'http-equiv="refresh" content="{seconds}"'.encode() in text and b"The master is busy" in text
    assert int(headers[b"content-length"]) == len(text) and headers[b"cache-control"] == b"no-store"
    # A form is refused with a page too, one that does not send it again by itself.
    status, headers, text = call(app, "POST", "/experiments/3/actions/kill", b"csrf=x", headers=BROWSER)
    assert status == 503 and headers[b"content-type"].startswith(b"text/html")
    assert b"refresh" not in text and b"send the form again" in text
    # The API, the UI's fragments and data, and htmx's requests keep the JSON refusal.
    for method, path, extra in (("GET", "/api/v1/experiments", []), ("GET", "/ui/fragments/cluster", []),
                                ("GET", "/experiments/3", [(b"hx-request", b"true")]),
                                ("POST", "/api/v1/experiments/3/kill", [])):
        status, headers, text = call(app, method, path, headers=BROWSER + extra)
        assert status == 503 and headers[b"content-type"] == b"application/json", path
        assert json.loads(text)["code"] == 503
    assert behind.seen == []


def test_admitted_requests_and_other_methods_on_health_paths_reach_the_application() -> None:
    behind = Behind()
    app = door(behind)
    assert call(app, "GET", "/api/v1/experiments")[0] == 200
    # Only GET is answered at the door; anything else on a health path is the router's to answer
    # (405), and is exempt from admission as before.
    app.admission.active = 1
    behind_exempt: list[str] = []

    async def no_ticket(scope: dict[str, Any], receive: Any, send: Any) -> None:
        behind_exempt.append(scope["path"])
        assert TICKET_KEY not in scope
        await send({"type": "http.response.start", "status": 405, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    app.app = no_ticket
    assert call(app, "POST", "/info")[0] == 405
    assert behind.seen == ["/api/v1/experiments"] and behind_exempt == ["/info"]
