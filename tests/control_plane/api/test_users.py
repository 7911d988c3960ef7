from __future__ import annotations

from control_plane.auth import client_hash
from tests.conftest import ADMIN_PASSWORD, login


def test_master_info(client) -> None:
    for path in ("/info", "/api/v1/master"):
        body = client.get(path).json()
        assert body["clusterId"] and body["version"] and body["masterId"]


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


def test_oversized_body_is_413(client, master) -> None:
    limit = master.config.max_request_bytes
    r = client.post("/api/v1/auth/login", content=b"x" * (limit + 1), headers={"content-type": "application/json"})
    assert r.status_code == 413
