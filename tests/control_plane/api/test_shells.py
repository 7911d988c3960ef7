"""Shells over HTTP (api/ntsc.py → services/shells.py), both databases: Determined 0.38.1's v1Shell
with the task's key pair for its owner only (a working OpenSSH key whose public half the task gets),
another user's shell not found, the task spec (the launcher and the public key), the login account
from the address the task reports, no idle culling, and who a tunnel without a session reaches (shell_tunnel_auth)."""

from __future__ import annotations

from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from sqlalchemy import select
from starlette.requests import HTTPConnection

from control_plane.api import proxy
from control_plane.db.engine import transaction
from control_plane.db.models import Agent, Allocation
from control_plane.errors import DomainError, http_status
from control_plane.loops import placement
from control_plane.services import agents as agent_service
from control_plane.services import tasks
from tests.control_plane.api.test_experiments import make_user

V1_SHELL_REQUIRED = {"description", "id", "jobId", "resourcePool", "startTime", "state", "username", "workspaceId"}


def _public_of(private_pem: str) -> str:
    key = serialization.load_ssh_private_key(private_pem.encode(), password=None)
    return key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()


def test_shell_keys_owner_only_spec_and_address(client: Any, admin_headers: dict[str, str], master: Any) -> None:
    alice = make_user(client, admin_headers, "alice")
    r = client.post("/api/v1/shells", headers=alice, json={"config": {"resources": {"slots": 0}}})
    assert r.status_code == 200, r.text
    shell = r.json()["shell"]
    assert V1_SHELL_REQUIRED <= set(shell) and shell["state"] == "STATE_QUEUED" and shell["isReady"] is False
    assert shell["description"].startswith("Shell (") and shell["agentUserGroup"] == {"user": None}
    assert shell["publicKey"].startswith("ssh-ed25519 ") and shell["publicKey"].startswith(_public_of(shell["privateKey"]))
    again = client.get(f"/api/v1/shells/{shell['id']}", headers=alice).json()["shell"]
    assert again["publicKey"] == shell["publicKey"] and _public_of(again["privateKey"]) == _public_of(shell["privateKey"])
    other = client.post("/api/v1/shells", headers=alice, json={"config": {"resources": {"slots": 0}}}).json()["shell"]
    assert other["privateKey"] != shell["privateKey"]
    # Nobody else gets the key: another user reads the shell (reads are open) without it and may not
    # kill it, an admin sees it without the key, lists never carry it.
    bob = make_user(client, admin_headers, "bob")
    read = client.get(f"/api/v1/shells/{shell['id']}", headers=bob).json()["shell"]
    assert read["id"] == shell["id"] and "privateKey" not in read
    assert client.post(f"/api/v1/shells/{shell['id']}/kill", headers=bob).status_code == 403
    assert not any("privateKey" in s for s in client.get("/api/v1/shells", headers=bob).json()["shells"])
    seen = client.get(f"/api/v1/shells/{shell['id']}", headers=admin_headers).json()["shell"]
    assert "privateKey" not in seen and seen["id"] == shell["id"]
    listed = client.get("/api/v1/shells", headers=alice).json()["shells"]
    assert {s["id"] for s in listed} == {shell["id"], other["id"]} and not any("privateKey" in s for s in listed)
    # Placed: the launcher with the public key; the address it reports names the login account.
    with transaction(master.sessions) as s:
        s.add(Agent(id="a1", pool="default", session_id="s", slots=[], last_seen=master.clock(), addresses=["10.0.0.5"]))
    placement.tick(master)
    with transaction(master.sessions) as s:
        alloc = s.scalar(select(Allocation).where(Allocation.task_id == shell["id"]))
        spec = agent_service.task_spec(s, master, alloc, s.get(Agent, "a1"))
        alloc_id = alloc.id
    assert spec.argv[:2] == ["python3", "-c"] and "sshd" in spec.argv[2]
    assert spec.env["SHIPYARD_SSH_PUBLIC_KEY"] == shell["publicKey"] and spec.env["DET_TASK_TYPE"] == "SHELL"
    assert shell["privateKey"] not in str(spec.env)
    def report(address: str) -> Any:
        return client.post(f"/api/v1/allocations/{alloc_id}/proxy_address",
                           headers={"Authorization": f"Bearer {spec.token}"}, json={"proxyAddress": address})
    # Only an address of the agent running it: the master relays a shell's tunnel there as raw TCP,
    # so anything else would aim it at the metadata service or the master's database.
    for elsewhere in ("alice@169.254.169.254:80", "alice@127.0.0.1:5432", "10.0.0.5:2222"):
        r = report(elsewhere)
        assert r.status_code == 400 and r.json()["details"][0]["field"] == "proxyAddress", r.text
    assert "address of the agent running the task (10.0.0.5)" in report("alice@169.254.169.254:80").text
    r = report("alice@10.0.0.5:2222")
    assert r.status_code == 200, r.text
    assert client.get(f"/api/v1/shells/{shell['id']}", headers=alice).json()["shell"]["agentUserGroup"] == {"user": "alice"}
    # Once reported, the address stays: code in the shell (which holds the token) cannot point the
    # master's tunnel elsewhere; the launcher's retry of the same address is fine.
    moved = report("alice@10.0.0.5:5432")
    assert moved.status_code == 400 and "cannot move" in moved.text, moved.text
    assert report("alice@10.0.0.5:2222").status_code == 200
    with transaction(master.sessions) as s:  # running and serving: still never culled when idle
        s.get(Allocation, alloc_id).state = "running"
    with transaction(master.sessions) as s:
        assert shell["id"] not in {c.task_id for c in tasks.idle_candidates(s, master)}
    assert client.get(f"/api/v1/shells/{shell['id']}", headers=alice).json()["shell"]["isReady"] is True
    # A tunnel with no session (Determined 0.38.1's `det shell open` sends none): with the master's
    # shell_tunnel_auth ssh_key (the default) it reaches the shell's sshd, which admits only the
    # owner's key; never another kind of task, an unknown id, plain HTTP, or with `session`.
    notebook = client.post("/api/v1/notebooks", headers=alice, json={"config": {"resources": {"slots": 0}}})
    bare = HTTPConnection({"type": "websocket", "headers": []})
    assert proxy._target(master, bare, shell["id"], tunnel=True) == ("alice@10.0.0.5:2222", "")
    for task_id, tunnel in ((shell["id"], False), (notebook.json()["notebook"]["id"], True), ("no-such-task", True)):
        with pytest.raises(DomainError) as refused:
            proxy._target(master, bare, task_id, tunnel=tunnel)
        assert http_status(refused.value) == 401, task_id
    master.config = master.config.model_copy(update={"shell_tunnel_auth": "session"})
    with pytest.raises(DomainError) as refused:
        proxy._target(master, bare, shell["id"], tunnel=True)
    assert http_status(refused.value) == 401
