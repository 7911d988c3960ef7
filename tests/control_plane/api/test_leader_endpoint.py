"""GET /api/v1/master/leader: who runs the loops (the lease), and whether it is the master answering."""

from __future__ import annotations

from control_plane.services.leadership import Leadership


def test_leader_endpoint_follows_the_lease(master, client, admin_headers) -> None:  # type: ignore[no-untyped-def]
    assert client.get("/api/v1/master/leader").status_code == 401
    r = client.get("/api/v1/master/leader", headers=admin_headers)
    assert r.status_code == 200 and r.json() == {"masterId": master.master_id, "leading": False, "leader": None}
    ours = Leadership(master.sessions, master.engine, master.master_id, ttl_s=10, address="http://m1:8080")
    assert ours.step(master.clock()) == 1
    body = client.get("/api/v1/master/leader", headers=admin_headers).json()
    assert body["leading"] is True
    assert {k: body["leader"][k] for k in ("masterId", "token", "address")} == {
        "masterId": master.master_id, "token": 1, "address": "http://m1:8080"}
    ours.resign(master.clock())
    other = Leadership(master.sessions, master.engine, "another-master", ttl_s=10)
    assert other.step(master.clock()) == 2
    body = client.get("/api/v1/master/leader", headers=admin_headers).json()
    assert body["leading"] is False and body["leader"]["masterId"] == "another-master"
    other.resign(master.clock())
