from __future__ import annotations

import httpx
import pytest

from control_plane.auth import client_hash
from tests.conftest import ADMIN_PASSWORD, LiveMaster, login


def test_master_info(client) -> None:
    for path in ("/info", "/api/v1/master"):
        body = client.get(path).json()
        assert body["clusterId"] and body["version"] and body["masterId"]
        # The Determined API version served (its client warns on any other), and Shipyard's own.
        assert body["version"] == "0.38.1" and body["shipyardVersion"] == __import__("control_plane").__version__


def test_login_plain_and_hashed(client) -> None:
    r = client.post("/api/v1/auth/login", json={"username": "admin", "password": ADMIN_PASSWORD})
    assert r.status_code == 200
    r2 = client.post("/api/v1/auth/login",
                     json={"username": "admin", "password": client_hash(ADMIN_PASSWORD), "isHashed": True})
    assert r2.status_code == 200
    assert r.json()["user"]["username"] == "admin" and r.json()["user"]["admin"] is True
    bad = client.post("/api/v1/auth/login", json={"username": "admin", "password": "wrong-password"})
    assert bad.status_code == 403 and bad.json()["error"]["error"] == "invalid credentials"
    unknown = client.post("/api/v1/auth/login", json={"username": "nobody", "password": "wrong-password"})
    assert unknown.status_code == 403 and unknown.json()["message"] == bad.json()["message"]


def test_me_requires_token_and_logout_revokes(client, admin_headers) -> None:
    assert client.get("/api/v1/me").status_code == 401
    assert client.get("/api/v1/me", headers={"Authorization": "Bearer nope"}).status_code == 401
    assert client.get("/api/v1/me", headers=admin_headers).json()["user"]["username"] == "admin"
    assert client.post("/api/v1/auth/logout", headers=admin_headers).status_code == 200
    assert client.get("/api/v1/me", headers=admin_headers).status_code == 401


def test_user_lifecycle(client, admin_headers) -> None:
    r = client.post("/api/v1/users", headers=admin_headers,
                    json={"user": {"username": "alice", "admin": False, "active": True}, "password": "alice-pw-123"})
    assert r.status_code == 200, r.text
    alice_id = r.json()["user"]["id"]
    assert client.post("/api/v1/users", headers=admin_headers,
                       json={"user": {"username": "alice"}, "password": "another-pw-1"}).status_code == 409
    users = client.get("/api/v1/users", headers=admin_headers).json()
    assert {u["username"] for u in users["users"]} == {"admin", "alice"}
    assert users["pagination"]["total"] == 2

    alice = login(client, "alice", "alice-pw-123")
    # a non-admin cannot create users or touch another user's password
    assert client.post("/api/v1/users", headers=alice,
                       json={"user": {"username": "bob"}, "password": "bob-pw-1234"}).status_code == 403
    assert client.post("/api/v1/users/1/password", headers=alice, json="new-admin-pw").status_code == 403
    # Determined's client sends the client-side hash as a bare JSON string
    r = client.post(f"/api/v1/users/{alice_id}/password", headers=alice, json=client_hash("alice-new-pw"))
    assert r.status_code == 200, r.text
    login(client, "alice", "alice-new-pw")

    r = client.patch(f"/api/v1/users/{alice_id}", headers=admin_headers, json={"active": False})
    assert r.status_code == 200 and r.json()["user"]["active"] is False
    assert client.post("/api/v1/auth/login", json={"username": "alice", "password": "alice-new-pw"}).status_code == 403


def test_no_account_without_password(client, admin_headers) -> None:
    for body, field in [
        ({"user": {"username": "nopw"}}, "password"),
        ({"user": {"username": "nopw"}, "password": ""}, "password"),
        ({"user": {"username": "nopw"}, "password": "short"}, "password"),
        ({"user": {"username": "nopw"}, "password": client_hash(""), "isHashed": True}, "password"),
    ]:
        r = client.post("/api/v1/users", headers=admin_headers, json=body)
        assert r.status_code == 400, r.text
        assert r.json()["details"][0]["field"] == field
    assert "nopw" not in {u["username"] for u in client.get("/api/v1/users", headers=admin_headers).json()["users"]}


def test_bad_input_is_400_with_field(client, admin_headers) -> None:
    r = client.post("/api/v1/users", headers=admin_headers, json={"user": {"username": 5}, "password": "x" * 10})
    assert r.status_code == 400 and r.json()["details"][0]["field"] == "user.username"
    r = client.post("/api/v1/users", headers=admin_headers, json={"user": {"username": "ok", "bogus": 1},
                                                                   "password": "x" * 10})
    assert r.status_code == 400 and r.json()["details"][0]["field"] == "user.bogus"
    r = client.post("/api/v1/auth/login", content=b"\xff\xfe not json", headers={"content-type": "application/json"})
    assert r.status_code == 400
    # det user link-with-agent-user: refused, saying why, not stored and ignored; a null one is absent.
    r = client.post("/api/v1/users", headers=admin_headers, json={"user": {"username": "linked", "agentUserGroup": {
        "agentUid": 1000, "agentGid": 1000, "agentUser": "alice", "agentGroup": "alice"}}, "password": "x" * 10})
    assert r.status_code == 400 and r.json()["details"][0]["field"] == "user.agentUserGroup", r.text
    assert client.get("/api/v1/users/1", headers=admin_headers).status_code == 200
    r = client.patch("/api/v1/users/1", headers=admin_headers, json={"agentUserGroup": {"agentUid": 0, "agentUser": "root"}})
    assert r.status_code == 400 and "not supported" in r.json()["message"], r.text
    assert client.patch("/api/v1/users/1", headers=admin_headers, json={"agentUserGroup": None}).status_code == 200


def test_oversized_body_is_413(client, master) -> None:
    limit = master.config.max_request_bytes
    r = client.post("/api/v1/auth/login", content=b"x" * (limit + 1), headers={"content-type": "application/json"})
    assert r.status_code == 413


# -- accounts an attacker cannot abuse (issue 9) ---------------------------------------------------

def _user(client, headers, name: str, *, admin: bool = False, active: bool = True) -> int:  # type: ignore[no-untyped-def]
    r = client.post("/api/v1/users", headers=headers, json={"user": {"username": name, "admin": admin, "active": active},
                                                            "password": f"{name}-pw-1234"})
    assert r.status_code == 200, r.text
    return r.json()["user"]["id"]


def _me(client, headers) -> int:  # type: ignore[no-untyped-def]
    return client.get("/api/v1/me", headers=headers).status_code


def test_the_last_active_admin_cannot_be_demoted_or_deactivated(client, admin_headers) -> None:
    admin_id = client.get("/api/v1/me", headers=admin_headers).json()["user"]["id"]
    # An inactive admin is no admin: "admin" is still the last active one.
    _user(client, admin_headers, "dormant", admin=True, active=False)
    for body in ({"admin": False}, {"admin": False, "displayName": "x"}, {"active": True, "admin": False}):
        r = client.patch(f"/api/v1/users/{admin_id}", headers=admin_headers, json=body)
        assert r.status_code == 409, r.text
        assert "last active admin" in r.json()["message"]
    assert client.get("/api/v1/me", headers=admin_headers).json()["user"]["admin"] is True

    carol_id = _user(client, admin_headers, "carol", admin=True)
    carol = login(client, "carol", "carol-pw-1234")
    # With another active admin, an admin may be deactivated...
    r = client.patch(f"/api/v1/users/{admin_id}", headers=carol, json={"active": False})
    assert r.status_code == 200, r.text
    # ... and then carol is the last one: she can neither demote herself nor be left without admins.
    r = client.patch(f"/api/v1/users/{carol_id}", headers=carol, json={"admin": False})
    assert r.status_code == 409 and "carol" in r.json()["message"]
    assert client.get("/api/v1/me", headers=carol).json()["user"]["admin"] is True
    # Reactivating the old admin makes room again.
    assert client.patch(f"/api/v1/users/{admin_id}", headers=carol, json={"active": True}).status_code == 200
    assert client.patch(f"/api/v1/users/{carol_id}", headers=carol, json={"admin": False}).status_code == 200


def test_every_password_change_ends_the_users_other_sessions(client, admin_headers) -> None:
    dave_id = _user(client, admin_headers, "dave")
    first, second = login(client, "dave", "dave-pw-1234"), login(client, "dave", "dave-pw-1234")
    # Through PATCH, by dave himself: his other session ends, the one he used survives.
    r = client.patch(f"/api/v1/users/{dave_id}", headers=first, json={"password": "dave-new-pw-1"})
    assert r.status_code == 200, r.text
    assert (_me(client, first), _me(client, second)) == (200, 401)
    # Through PATCH, by an admin: all of dave's sessions end, the admin's does not.
    other = login(client, "dave", "dave-new-pw-1")
    r = client.patch(f"/api/v1/users/{dave_id}", headers=admin_headers, json={"password": "dave-new-pw-2"})
    assert r.status_code == 200, r.text
    assert (_me(client, first), _me(client, other), _me(client, admin_headers)) == (401, 401, 200)
    # Through the password endpoint, by an admin: the same.
    third = login(client, "dave", "dave-new-pw-2")
    r = client.post(f"/api/v1/users/{dave_id}/password", headers=admin_headers, json=client_hash("dave-new-pw-3"))
    assert r.status_code == 200, r.text
    assert (_me(client, third), _me(client, admin_headers)) == (401, 200)
    login(client, "dave", "dave-new-pw-3")


def _login_status(client, username: str, password: str) -> tuple[int, dict]:  # type: ignore[no-untyped-def]
    r = client.post("/api/v1/auth/login", json={"username": username, "password": password})
    return r.status_code, r


def test_logins_are_throttled_per_user(client, master, admin_headers) -> None:
    limit = master.config.login_max_failures_per_user
    _user(client, admin_headers, "erin")
    for _ in range(limit - 1):
        assert _login_status(client, "erin", "guess-guess")[0] == 403
    assert _login_status(client, "erin", "erin-pw-1234")[0] == 200  # a success clears the failures
    for _ in range(limit):
        assert _login_status(client, "erin", "guess-guess")[0] == 403
    # Now even the right password is refused (no oracle for the attacker), with a clear 429.
    status, r = _login_status(client, "erin", "erin-pw-1234")
    assert status == 429
    assert "too many failed logins" in r.json()["message"]
    retry_after = int(r.headers["Retry-After"])
    assert 0 < retry_after <= master.config.login_failure_window_s
    # The same answer for a username that does not exist (no enumeration through the throttle).
    for _ in range(limit):
        assert _login_status(client, "no-such-user", "guess-guess")[0] == 403
    assert _login_status(client, "no-such-user", "guess-guess")[0] == 429
    # Other users are not locked out.
    assert _login_status(client, "admin", ADMIN_PASSWORD)[0] == 200


def test_unknown_and_known_users_cost_the_same_argon2_verification(client, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from control_plane import auth
    from tests.control_plane.test_auth import CountingHasher

    hasher = CountingHasher()
    monkeypatch.setattr(auth, "_hasher", hasher)
    monkeypatch.setattr(auth, "_dummy_hash", None)
    assert _login_status(client, "admin", "wrong-password")[0] == 403
    known = hasher.verified
    assert _login_status(client, "nobody-at-all", "wrong-password")[0] == 403
    assert known == 1 and hasher.verified == 2


class _Peer:
    """The app as reached from `address` (the TCP peer a server would see), changeable between
    requests: the login throttle counts per address."""

    def __init__(self, app, address: str) -> None:  # type: ignore[no-untyped-def]
        self.app, self.address = app, address

    async def __call__(self, scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        if scope["type"] == "http":
            scope["client"] = (self.address, 40000)
        await self.app(scope, receive, send)


def _peer_client(master, address: str, trusted_proxies: list[str] | None = None):  # type: ignore[no-untyped-def]
    from fastapi.testclient import TestClient

    from control_plane.api.app import create_app

    master.config.trusted_proxies = trusted_proxies or []
    peer = _Peer(create_app(master), address)
    return peer, TestClient(peer)


def test_guessing_admins_password_from_one_address_never_locks_admin_out_from_another(master) -> None:  # type: ignore[no-untyped-def]
    limit = master.config.login_max_failures_per_user
    peer, client = _peer_client(master, "10.0.0.66")
    with client:
        for _ in range(limit):
            assert _login_status(client, "admin", "guess-guess")[0] == 403
        assert _login_status(client, "admin", ADMIN_PASSWORD)[0] == 429  # the guesser's own window
        # A new X-Forwarded-For per guess is no new address: no proxy is trusted.
        for i in range(3):
            r = client.post("/api/v1/auth/login", headers={"X-Forwarded-For": f"192.0.2.{i}"},
                            json={"username": "admin", "password": ADMIN_PASSWORD})
            assert r.status_code == 429, r.text
        for address in ("10.0.0.7", "192.0.2.1"):  # the owner, from anywhere else
            peer.address = address
            assert _login_status(client, "admin", ADMIN_PASSWORD)[0] == 200


def test_x_forwarded_for_is_believed_from_trusted_proxies_only(master) -> None:  # type: ignore[no-untyped-def]
    limit = master.config.login_max_failures_per_user
    peer, client = _peer_client(master, "10.1.0.5", trusted_proxies=["10.1.0.0/16"])

    def via_proxy(client_address: str, password: str) -> int:  # type: ignore[no-untyped-def]
        # the proxy appends the address it saw to what the client sent (here a forged first entry)
        r = client.post("/api/v1/auth/login", headers={"X-Forwarded-For": f"198.51.100.1, {client_address}"},
                        json={"username": "admin", "password": password})
        return r.status_code

    with client:
        for _ in range(limit):
            assert via_proxy("203.0.113.9", "guess-guess") == 403
        assert via_proxy("203.0.113.9", ADMIN_PASSWORD) == 429  # counted for the forwarded address...
        assert via_proxy("203.0.113.10", ADMIN_PASSWORD) == 200  # ...not for the proxy, nor the forged entry
        peer.address = "10.2.0.5"  # not a trusted proxy: its header is ignored, the peer is the client
        for _ in range(limit):
            assert via_proxy("203.0.113.11", "guess-guess") == 403
        assert via_proxy("203.0.113.12", ADMIN_PASSWORD) == 429


def test_a_newline_in_a_username_cannot_forge_a_log_line(client) -> None:  # type: ignore[no-untyped-def]
    import io
    import logging

    from control_plane.logs import setup_logging

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    out = io.StringIO()
    setup_logging("info", stream=out)
    try:
        forged = "nobody\nts=2026-01-01 level=INFO logger=shipyard.users event=login username=admin\r\x1b[2K"
        r = client.post("/api/v1/auth/login", json={"username": forged, "password": "wrong-password"})
        assert r.status_code == 403, r.text
    finally:
        root.handlers[:], root.level = handlers, level
    lines = out.getvalue().splitlines()
    assert lines and not any(line.startswith("ts=2026-01-01") for line in lines), lines  # no forged line
    (failed,) = [line for line in lines if "event=login_failed" in line]  # the failure, on its one line
    assert "username=nobody\\nts=2026-01-01" in failed and "\\r\\x1b[2K" in failed


@pytest.mark.integration
def test_a_real_master_believes_no_forwarded_address_and_logs_one_line_per_event(db_url, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Through uvicorn, from loopback (which uvicorn itself would trust): X-Forwarded-For gives a
    guesser no fresh address, and master.log gets no forged line."""
    config = tmp_path / "master.yaml"
    config.write_text("login_max_failures_per_address: 3\n")
    m = LiveMaster(db_url, tmp_path / "state", config_path=config)
    m.start()
    forged = "\nts=2026-01-01 level=INFO logger=shipyard.users event=login username=admin"
    try:
        for i in range(3):
            r = httpx.post(m.url + "/api/v1/auth/login", headers={"X-Forwarded-For": f"192.0.2.{i}"},
                           json={"username": f"guess{i}{forged}", "password": "wrong-password"})
            assert r.status_code == 403, r.text
        r = httpx.post(m.url + "/api/v1/auth/login", headers={"X-Forwarded-For": "192.0.2.99"},
                       json={"username": "admin", "password": ADMIN_PASSWORD})
        assert r.status_code == 429 and "this address" in r.json()["message"], r.text
    finally:
        m.stop()
    lines = m.log_path.read_text().splitlines()
    assert not any(line.startswith("ts=2026-01-01") for line in lines)
    assert any("event=login_failed username=guess0\\nts=2026-01-01" in line for line in lines)
