"""Request-body memory (frontdoor/body_budget.py): bodies over body_spool_bytes are spooled to disk
and counted against the caller's and the host's budgets; a body over its route's limit is a 413
naming the setting. In process, SQLite and PostgreSQL."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from control_plane.api.app import create_app
from control_plane.frontdoor import body_budget
from tests.control_plane.api.test_experiments import CONFIG, login, make_user, v1file

KIB = 1024


@pytest.fixture
def budgeted(master) -> Iterator[TestClient]:  # type: ignore[no-untyped-def]
    """An app whose budgets are small: spooled past 64 KiB, 1 MiB per caller, 2 MiB for the host."""
    cfg = master.config
    cfg.body_spool_bytes = 64 * KIB
    cfg.max_request_bytes = 1024 * KIB
    cfg.max_body_bytes = 256 * KIB
    cfg.body_budget_per_caller_bytes = 1024 * KIB
    cfg.body_budget_bytes = 2048 * KIB
    with TestClient(create_app(master)) as c:
        yield c


def _experiment(size: int) -> dict[str, Any]:
    """An experiment whose model definition makes the body about `size` bytes."""
    return {"config": CONFIG, "modelDefinition": [v1file("train.py"), v1file("data.bin", os.urandom(size * 3 // 4))]}


def _admin(c: TestClient) -> dict[str, str]:
    from tests.conftest import ADMIN_PASSWORD

    return login(c, "admin", ADMIN_PASSWORD)


def test_413_names_the_limit_and_its_setting(budgeted: TestClient) -> None:
    bob = make_user(budgeted, _admin(budgeted), "bob")
    r = budgeted.post("/api/v1/experiments", headers=bob, json=_experiment(1100 * KIB))
    assert r.status_code == 413, r.text
    assert r.json()["message"] == f"request body larger than {1024 * KIB} bytes (max_request_bytes)"
    r = budgeted.post("/api/v1/task/logs", headers=bob, json={"logs": [{"taskId": "t", "log": "x" * 300 * KIB}]})
    assert r.status_code == 413 and "(max_body_bytes)" in r.json()["message"], r.text


def test_a_large_body_is_spooled_to_disk_and_its_share_given_back(budgeted: TestClient, master,  # type: ignore[no-untyped-def]
                                                                  monkeypatch) -> None:
    bob = make_user(budgeted, _admin(budgeted), "bob")
    spools: list[Any] = []
    real = body_budget.BodyBudget.spool_file

    def spy(self):  # type: ignore[no-untyped-def]
        f = real(self)
        spools.append(f)
        return f

    monkeypatch.setattr(body_budget.BodyBudget, "spool_file", spy)
    rolled: list[bool] = []
    read_all = body_budget._read_all
    monkeypatch.setattr(body_budget, "_read_all", lambda f: (rolled.append(f._rolled), read_all(f))[1])
    r = budgeted.post("/api/v1/experiments", headers=bob, json=_experiment(600 * KIB))
    assert r.status_code == 200, r.text
    assert rolled == [True]  # past body_spool_bytes the body went to a file, not memory
    assert spools[0].closed and not os.listdir(master.config.state_dir / "request-bodies")  # and is gone
    host = body_budget.BodyBudget(master)
    assert master.quotas.used(f"body:{host.host}:all") == 0  # the share came back with the answer
    # a small body takes the usual path
    assert budgeted.post("/api/v1/experiments", headers=bob, json=_experiment(1 * KIB)).status_code == 200
    assert len(spools) == 1


def test_a_caller_over_its_budget_gets_429_and_the_host_over_its_budget_503(budgeted: TestClient, master) -> None:  # type: ignore[no-untyped-def]
    admin = _admin(budgeted)
    bob, carol = make_user(budgeted, admin, "bob"), make_user(budgeted, admin, "carol")
    budget = body_budget.BodyBudget(master)
    bob_id = budgeted.get("/api/v1/me", headers=bob).json()["user"]["id"]
    # bob already has 700 KiB of bodies in flight (in this or another master process)
    held = master.quotas.take(budget.claims(f"user:{bob_id}"), 700 * KIB)
    r = budgeted.post("/api/v1/experiments", headers=bob, json=_experiment(500 * KIB))
    assert r.status_code == 429, r.text
    assert "body_budget_per_caller_bytes" in r.json()["message"] and r.headers["retry-after"].isdigit()
    assert r.headers["connection"] == "close"  # the body was not read
    # another token of bob's is the same caller; carol is not affected
    again = login(budgeted, "bob", "bob-password-1")
    assert budgeted.post("/api/v1/experiments", headers=again, json=_experiment(500 * KIB)).status_code == 429
    assert budgeted.post("/api/v1/experiments", headers=carol, json=_experiment(500 * KIB)).status_code == 200
    # the host's budget: 2 MiB, of which bob's 700 KiB and others' 1,200 KiB are held
    others = [master.quotas.take(budget.claims(f"addr:10.0.0.{i}"), 600 * KIB) for i in (8, 9)]
    r = budgeted.post("/api/v1/experiments", headers=carol, json=_experiment(500 * KIB))
    assert r.status_code == 503, r.text
    assert "body_budget_bytes" in r.json()["message"] and r.headers["retry-after"].isdigit()
    for lease in [held, *others]:
        lease.give_back()
    assert budgeted.post("/api/v1/experiments", headers=bob, json=_experiment(500 * KIB)).status_code == 200
    assert master.quotas.used(f"body:{budget.host}:all") == 0


def test_a_chunked_body_grows_its_share_and_is_refused_past_the_budget(budgeted: TestClient, master) -> None:  # type: ignore[no-untyped-def]
    bob = make_user(budgeted, _admin(budgeted), "bob")
    budget = body_budget.BodyBudget(master)
    bob_id = budgeted.get("/api/v1/me", headers=bob).json()["user"]["id"]
    held = master.quotas.take(budget.claims(f"user:{bob_id}"), 600 * KIB)

    def chunks() -> Iterator[bytes]:
        for _ in range(100):  # 800 KiB without a Content-Length: more than bob's 424 KiB left
            yield b"x" * 8 * KIB

    r = budgeted.post("/api/v1/experiments", headers={**bob, "content-type": "application/json"}, content=chunks())
    assert r.status_code == 429, r.text
    held.give_back()
    r = budgeted.post("/api/v1/experiments", headers={**bob, "content-type": "application/json"}, content=chunks())
    assert r.status_code == 400, r.text  # read whole (not JSON): refused for its content, not its size
    assert master.quotas.used(f"body:{budget.host}:all") == 0


def test_without_a_valid_credential_the_budget_is_the_addresss(budgeted: TestClient, master) -> None:  # type: ignore[no-untyped-def]
    budget = body_budget.BodyBudget(master)
    held = master.quotas.take(budget.claims("addr:testclient"), 1024 * KIB)
    r = budgeted.post("/api/v1/experiments", headers={"Authorization": "Bearer nonsense"}, json=_experiment(200 * KIB))
    assert r.status_code == 429, r.text
    held.give_back()
    r = budgeted.post("/api/v1/experiments", headers={"Authorization": "Bearer nonsense"}, json=_experiment(200 * KIB))
    assert r.status_code == 401, r.text


def test_budget_settings_are_checked() -> None:
    from control_plane.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="body_budget_per_caller_bytes"):
        load_config(env={}, body_budget_per_caller_bytes=1024)
    with pytest.raises(ConfigError, match="body_budget_per_caller_bytes"):
        load_config(env={}, body_budget_bytes=170 << 20, body_budget_per_caller_bytes=180 << 20)
    assert load_config(env={"SHIPYARD_BODY_BUDGET_BYTES": "0"}, body_budget_per_caller_bytes=1024).body_budget_bytes == 0
