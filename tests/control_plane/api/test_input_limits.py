"""Input that cannot hurt the master: log search with RE2 and a per-user limit, integers checked
against their columns, bounded bodies and YAML, model registration of one's own checkpoints.
SQLite and PostgreSQL."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from control_plane.auth import Principal, TokenKind
from control_plane.db.models import User
from control_plane.services import logs as log_records
from control_plane.services.logs import LogFilter
from tests.control_plane.api.test_checkpoints import ckpt_body, report_ckpt
from tests.control_plane.api.test_experiments import allocation_headers, create_ok, make_user, only_trial


def slot_back(master: Any, key: str, within_s: float = 5.0) -> bool:
    """A streamed search gives its slot back when the server closes the stream, just after the
    client has read the last byte: wait (bounded) for the count to reach 0."""
    deadline = time.monotonic() + within_s
    while master.quotas.used(key) != 0:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _log_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line)["result"] for line in text.splitlines() if line]


# -- log search ------------------------------------------------------------------------------------
def test_catastrophic_regex_answers_with_re2_results(client, admin_headers, master) -> None:
    """`(a+)+$` over long runs of `a` ending in a non-match made Python's `re` backtrack for
    seconds per line (forever on longer ones); RE2 matches in linear time with the same answer."""
    eid = create_ok(client, admin_headers)["experiment"]["id"]
    trial = only_trial(master, eid)
    token = allocation_headers(master, trial)
    lines = ["a" * 27 + "!\n", "a" * 20_000 + "b\n", "x" + "a" * 5_000 + "\n", "plain\n"]
    body = {"logs": [{"taskId": trial.task_id, "log": line} for line in lines]}
    assert client.post("/api/v1/task/logs", headers=token, json=body).status_code == 200
    r = client.get(f"/api/v1/trials/{trial.id}/logs", headers=admin_headers,
                   params={"searchText": "(a+)+$", "enableRegex": "true"})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/x-ndjson")
    # only the line whose run of `a` reaches the end of the line (its newline is not part of it)
    assert [x["log"] for x in _log_lines(r.text)] == ["x" + "a" * 5_000 + "\n"]
    assert slot_back(master, f"log_search:user:{_admin_id(master)}")


def test_patterns_re2_cannot_take_are_400_naming_search_text(client, admin_headers, master) -> None:
    eid = create_ok(client, admin_headers)["experiment"]["id"]
    trial = only_trial(master, eid)
    # Python's `re` accepts these (backreference, lookahead); RE2 does not: they cannot be linear.
    for pattern in (r"(a)\1", "(?=a)a", "(", "a{2000}", "x" * (log_records.MAX_SEARCH_TEXT + 1)):
        r = client.get(f"/api/v1/trials/{trial.id}/logs", headers=admin_headers,
                       params={"searchText": pattern, "enableRegex": "true"})
        assert r.status_code == 400, (pattern, r.text)
        assert [d["field"] for d in r.json()["details"]] == ["searchText"]


def test_log_searches_are_limited_per_user(client, admin_headers, master) -> None:
    eid = create_ok(client, admin_headers)["experiment"]["id"]
    trial = only_trial(master, eid)
    admin = Principal(kind=TokenKind.USER, token_id=0, user_id=_admin_id(master), username="admin", admin=True)
    searching = LogFilter(search_text="x")
    held = [log_records.search_slot(master.quotas, admin, searching) for _ in range(log_records.MAX_SEARCHES_PER_USER)]
    try:
        url = f"/api/v1/trials/{trial.id}/logs"
        r = client.get(url, headers=admin_headers, params={"searchText": "line"})
        assert r.status_code == 429, r.text
        assert r.headers["retry-after"].isdigit()
        assert client.get(url, headers=admin_headers).status_code == 200  # reading without a search is not limited
    finally:
        for lease in held:
            lease.release()
            lease.release()  # idempotent: a lease frees one slot once
    assert client.get(url, headers=admin_headers, params={"searchText": "line"}).status_code == 200
    assert slot_back(master, f"log_search:user:{admin.user_id}")


def _admin_id(master) -> int:  # type: ignore[no-untyped-def]
    with master.sessions() as s:
        return s.scalar(select(User.id).where(User.username == "admin"))


# -- integers --------------------------------------------------------------------------------------
def _int_params(spec: dict[str, Any]) -> list[tuple[str, str, dict[str, Any], list[dict[str, Any]]]]:
    """(method, path, the integer parameter, all the operation's parameters) for every integer
    path or query parameter of every operation in the OpenAPI spec."""
    out = []
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            params = op.get("parameters", [])
            for prm in params:
                if prm["in"] in ("path", "query") and '"integer"' in json.dumps(prm["schema"]):
                    out.append((method, path, prm, params))
    return out


def test_out_of_range_integers_are_400_on_every_operation(client, admin_headers) -> None:
    """2**63 and -2**63-1 in any integer parameter: a 400 naming it, never a 500 (SQLite's driver
    cannot bind them; PostgreSQL refuses them for its Integer columns)."""
    cases = _int_params(client.get("/openapi.json").json())
    assert len(cases) >= 40  # the spec lists them all (ids, filters, offsets, limits, steps)
    for method, path, prm, params in cases:
        url = path
        for other in params:
            if other["in"] == "path" and other["name"] != prm["name"]:
                url = url.replace("{" + other["name"] + "}", "1" if '"integer"' in json.dumps(other["schema"]) else "x")
        for value in (2**63, -(2**63) - 1, 2**31 if prm["in"] == "path" else 2**64):
            query: dict[str, Any] = {}
            target = url
            if prm["in"] == "path":
                target = url.replace("{" + prm["name"] + "}", str(value))
            else:
                query[prm["name"]] = value
            r = client.request(method.upper(), target, headers=admin_headers, params=query)
            assert r.status_code == 400, (method, path, prm["name"], value, r.status_code, r.text)
            fields = [d["field"] for d in r.json()["details"]]
            assert any(f == prm["name"] or f.startswith(prm["name"] + "[") for f in fields), (path, prm["name"], fields)


def test_out_of_range_integers_in_bodies_are_400(client, admin_headers, master) -> None:
    eid = create_ok(client, admin_headers)["experiment"]["id"]
    trial = only_trial(master, eid)
    token = allocation_headers(master, trial)
    big = 2**63

    def refused(r, field: str) -> None:  # type: ignore[no-untyped-def]
        assert r.status_code == 400, r.text
        assert any(field in d["field"] for d in r.json()["details"]), (field, r.json())

    report = {"trialId": trial.id, "trialRunId": 1, "stepsCompleted": 1, "metrics": {"avgMetrics": {"loss": 1.0}}}
    for key, value in (("trialRunId", 2**31), ("stepsCompleted", big), ("trialId", big)):
        refused(client.post(f"/api/v1/trials/{trial.id}/metrics", headers=token,
                            json={"group": "training", "metrics": {**report, key: value}}), key)
    # Integer columns on PostgreSQL hold 2**31-1: a priority beyond is a 400 on both databases
    refused(client.patch(f"/api/v1/experiments/{eid}", headers=admin_headers,
                         json={"resources": {"priority": 2**31}}), "priority")
    refused(client.post("/api/v1/task/logs", headers=token,
                        json={"logs": [{"taskId": trial.task_id, "log": "x", "rankId": 2**31}]}), "rankId")
    ckpt = {"uuid": "6f1d3c52-2b7a-4c59-9d8e-0a1b2c3d4e5f", "resources": {"a": str(big)},
            "metadata": {"steps_completed": 1}, "training": {}, "taskId": trial.task_id}
    refused(client.post("/api/v1/checkpoints", headers=token, json=ckpt), "resources")
    ckpt = {**ckpt, "resources": {"a": 1}, "metadata": {"steps_completed": big}}
    refused(client.post("/api/v1/checkpoints", headers=token, json=ckpt), "steps_completed")
    refused(client.post(f"/api/v1/trials/{trial.id}/searcher/completed_operation", headers=token,
                        json={"op": {"length": big}}), "length")


# -- model registry --------------------------------------------------------------------------------
def test_only_a_checkpoints_owner_or_an_admin_registers_it(client, admin_headers, master) -> None:
    """A version keeps its checkpoint from deletion and GC: registering someone else's checkpoint
    in one's own model would take it from its owner."""
    bob = make_user(client, admin_headers, "bob")
    admins_trial = only_trial(master, create_ok(client, admin_headers)["experiment"]["id"])
    admins_ckpt = report_ckpt(client, allocation_headers(master, admins_trial), ckpt_body(admins_trial, 10))
    bobs_trial = only_trial(master, create_ok(client, bob)["experiment"]["id"])
    bobs_ckpt = report_ckpt(client, allocation_headers(master, bobs_trial), ckpt_body(bobs_trial, 10))
    assert client.post("/api/v1/models", headers=bob, json={"name": "bobs"}).status_code == 200

    def register(headers: dict[str, str], ckpt: str):  # type: ignore[no-untyped-def]
        return client.post("/api/v1/models/bobs/versions", headers=headers, json={"checkpointUuid": ckpt})

    r = register(bob, admins_ckpt)
    assert r.status_code == 403 and "another user" in r.json()["message"], r.text
    assert register(bob, bobs_ckpt).status_code == 200
    assert register(admin_headers, admins_ckpt).status_code == 200  # an admin may register any
    versions = client.get("/api/v1/models/bobs/versions", headers=bob).json()["modelVersions"]
    assert [v["checkpoint"]["uuid"] for v in versions] == [bobs_ckpt, admins_ckpt]
    # the refused registration held nothing: the admin can still delete a checkpoint bob tried to take
    other = report_ckpt(client, allocation_headers(master, admins_trial), ckpt_body(admins_trial, 20))
    assert register(bob, other).status_code == 403
    assert client.request("DELETE", "/api/v1/checkpoints", headers=admin_headers,
                          json={"checkpointUuids": [other]}).status_code == 200


# -- bodies and YAML -------------------------------------------------------------------------------
def test_bodies_over_the_limit_are_413_while_streaming(client, admin_headers, master) -> None:
    master.config.max_body_bytes = 64 * 1024
    master.config.max_request_bytes = 1024 * 1024
    url = "/api/v1/task/logs"
    big = b'{"logs": [' + b'{"taskId": "t", "log": "' + b"x" * 100_000 + b'"}]}'
    declared = client.post(url, headers={**admin_headers, "content-type": "application/json"}, content=big)
    assert declared.status_code == 413 and "65536 bytes" in declared.json()["message"]

    sent = 0

    def chunks():  # type: ignore[no-untyped-def]
        nonlocal sent
        yield b'{"logs": [{"taskId": "t", "log": "'
        for _ in range(200):  # 200 × 8 KiB = 1.6 MiB, far past the limit, without a Content-Length
            sent += 1
            yield b"x" * 8192
        yield b'"}]}'

    chunked = client.post(url, headers={**admin_headers, "content-type": "application/json"}, content=chunks())
    assert chunked.status_code == 413, chunked.text  # FastAPI alone answers a failed read with 400
    # under the limit, the same route reads the body as usual (the task does not exist: 404)
    small = client.post(url, headers=admin_headers, json={"logs": [{"taskId": "nope", "log": "x"}]})
    assert small.status_code == 404, small.text
    # creating an experiment carries the model definition: it gets the larger limit
    r = client.post("/api/v1/experiments", headers=admin_headers,
                    json={"config": "name: x\n# " + "y" * 100_000 + "\n", "modelDefinition": []})
    assert r.status_code == 400, r.text  # refused for its content, not for its size


def test_hostile_yaml_is_400_with_the_reason(client, admin_headers, master) -> None:
    def refused(config: str) -> str:
        r = client.post("/api/v1/experiments", headers=admin_headers, json={"config": config, "modelDefinition": []})
        assert r.status_code == 400, r.text
        return r.json()["message"]

    # 6 KB of nesting: the parser used to spend seconds before refusing it
    assert "nested more than 64 levels deep" in refused("entrypoint: x\ndata: " + "[" * 6000 + "\n")
    assert "nested more than 64 levels deep" in refused("entrypoint: x\ndata: " + "{a: " * 1500 + "\n")
    laughs = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    laughs += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    assert "after expanding aliases" in refused("\n".join(laughs) + "\nentrypoint: x\n")
    many = "entrypoint: x\nhyperparameters:\n" + "".join(f"  k{i}: [1, 2, 3, 4]\n" for i in range(5000))
    assert "config is too large" in refused(many)


def _peak_rss_kib(pid: int) -> int:
    """The master's peak RSS: its own and its API workers' (whichever one served the request)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    total = 0
    for p in [pid, *map(int, children)]:
        for line in open(f"/proc/{p}/status"):
            if line.startswith("VmHWM:"):
                total += int(line.split()[1])
    assert total, "no VmHWM"
    return total


def _post_raw(url: str, path: str, token: str, *, chunked_total: int = 0, declared: int | None = None) -> tuple[int, int]:
    """POST over a raw socket (an HTTP client would refuse to lie about a length): either
    `chunked_total` bytes in 1 MiB chunks, stopping as soon as the master answers, or only headers
    declaring `declared` bytes. Returns (status, bytes sent)."""
    import select
    import socket
    from urllib.parse import urlsplit

    host, port = urlsplit(url).hostname, urlsplit(url).port
    framing = f"Content-Length: {declared}" if declared is not None else "Transfer-Encoding: chunked"
    sock = socket.create_connection((host, port))
    sent = 0
    try:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n"
                     f"Content-Type: application/json\r\n{framing}\r\n\r\n".encode())
        chunk = b"x" * (1 << 20)
        while sent < chunked_total and not select.select([sock], [], [], 0)[0]:
            try:
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(chunk)
        head = b""
        while b"\r\n" not in head:
            part = sock.recv(4096)
            if not part:
                break
            head += part
        return int(head.split(b" ", 2)[1]), sent
    finally:
        sock.close()


@pytest.mark.integration
def test_a_real_master_refuses_big_bodies_without_buffering_them(live_master) -> None:
    """Through uvicorn: a chunked 200 MB upload is a 413 after about the limit (16 MiB by default),
    and the master's memory does not grow by the size of what was sent."""
    token = live_master.token()
    assert live_master.proc is not None
    before = _peak_rss_kib(live_master.proc.pid)
    status, sent = _post_raw(live_master.url, "/api/v1/task/logs", token, chunked_total=200 << 20)
    assert status == 413
    assert sent < 100 << 20  # the answer came long before the end of the upload
    # a declared 150 MB is refused before a byte of it is read
    assert _post_raw(live_master.url, "/api/v1/task/logs", token, declared=150 << 20)[0] == 413
    assert _peak_rss_kib(live_master.proc.pid) - before < 64 * 1024  # KiB: far below the 200 MB sent


def test_nul_in_the_url_is_400_naming_the_parameter(client, admin_headers) -> None:
    """PostgreSQL refuses NUL in text parameters; schemathesis found `GET /api/v1/agents` passing
    one through (a 500). Refused before any handler, for every operation."""
    r = client.get("/api/v1/agents", headers=admin_headers, params={"resourcePool": "a\x00b"})
    assert r.status_code == 400 and [d["field"] for d in r.json()["details"]] == ["resourcePool"], r.text
    r = client.get("/api/v1/agents/a%00b", headers=admin_headers)
    assert r.status_code == 400 and [d["field"] for d in r.json()["details"]] == ["path"], r.text
    assert client.get("/api/v1/agents", headers=admin_headers, params={"resourcePool": "a%00b"}).status_code == 200
