"""A trial no instance of its pool can host: refused at submission (400 naming the pool and its
largest instance), and, when the pool shrinks after submission, the queued trial says why on the
trial and the experiment (issue 10, item 5). Both databases, over HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from control_plane.api.app import create_app
from control_plane.config import load_config
from control_plane.db.engine import transaction
from control_plane.db.models import Agent
from control_plane.master import Master
from tests.conftest import ADMIN_PASSWORD, TEST_PASSWORD_HASHING, login
from tests.control_plane.api.test_experiments import CONFIG, create, create_ok, only_trial

POOLS: list[dict[str, Any]] = [
    {"name": "default"},
    {"name": "gpu8", "provider": {"type": "local", "slots_per_instance": 8, "max_instances": 2}},
]


@pytest.fixture
def pool_master(db_url: str, tmp_path: Path) -> Iterator[Master]:
    config = load_config(env={}, db_url=db_url, state_dir=str(tmp_path / "state"), admin_password=ADMIN_PASSWORD, **TEST_PASSWORD_HASHING,
                         resource_pools=POOLS)
    m = Master(config)
    m.prepare()
    yield m
    m.stop()


@pytest.fixture
def api(pool_master: Master) -> Iterator[tuple[TestClient, dict[str, str]]]:
    with TestClient(create_app(pool_master)) as c:
        yield c, login(c)


def _config(slots: int, pool: str) -> str:
    return CONFIG.replace("slots_per_trial: 1", f"slots_per_trial: {slots}\n  resource_pool: {pool}")


def test_a_shape_larger_than_any_instance_is_refused_naming_the_pool(api: tuple[TestClient, dict[str, str]]) -> None:
    client, headers = api
    r = create(client, headers, _config(12, "gpu8"))  # across instances, a trial takes whole ones
    assert r.status_code == 400, r.text
    body = r.text
    assert "config.resources.slots_per_trial" in body
    assert "'gpu8'" in body and "8 slots each" in body and "12 is not a multiple of 8" in body
    r = create(client, headers, _config(24, "gpu8"))  # more than max_instances (2) can bring
    assert r.status_code == 400 and "at most 16 slots across its agents" in r.text
    create_ok(client, headers, _config(8, "gpu8"))  # the largest instance is enough
    create_ok(client, headers, _config(16, "gpu8"))  # two whole instances


def test_a_pool_without_provider_is_judged_by_its_largest_connected_agent(
        api: tuple[TestClient, dict[str, str]], pool_master: Master) -> None:
    client, headers = api
    create_ok(client, headers, _config(4, "default"))  # no agent yet: no verdict, the trial waits
    now = pool_master.clock()
    with transaction(pool_master.sessions) as s:
        s.add(Agent(id="a2", pool="default", state="connected", slots=[{"id": "0", "type": "cpu"},
                    {"id": "1", "type": "cpu"}], session_id="s-a2", registered_at=now, last_seen=now))
    r = create(client, headers, _config(4, "default"))
    assert r.status_code == 400 and "largest connected agent" in r.text and "2 slots" in r.text


def test_a_pool_shrunk_after_submission_shows_why_on_the_trial_and_the_experiment(
        api: tuple[TestClient, dict[str, str]], pool_master: Master) -> None:
    client, headers = api
    exp = create_ok(client, headers, _config(8, "gpu8"))["experiment"]
    trial = only_trial(pool_master, exp["id"])
    assert client.get(f"/api/v1/trials/{trial.id}", headers=headers).json()["trial"]["pendingReason"] is None

    # The pool is reconfigured to smaller instances (a master restart with a new config).
    pool = pool_master.config.pool("gpu8")
    assert pool is not None and pool.provider is not None
    pool.provider["slots_per_instance"] = 3

    got = client.get(f"/api/v1/trials/{trial.id}", headers=headers).json()["trial"]
    assert "8 slots per trial cannot be served by pool 'gpu8'" in got["pendingReason"]
    assert "3 slots each" in got["pendingReason"]
    listed = client.get(f"/api/v1/experiments/{exp['id']}/trials", headers=headers).json()["trials"]
    assert listed[0]["pendingReason"] == got["pendingReason"]
    described = client.get(f"/api/v1/experiments/{exp['id']}", headers=headers).json()["experiment"]
    assert described["pendingReason"] == got["pendingReason"]

    pool.provider["slots_per_instance"] = 8  # level-triggered: the reason goes with its cause
    assert client.get(f"/api/v1/trials/{trial.id}", headers=headers).json()["trial"]["pendingReason"] is None


def test_an_aws_pool_without_instance_slots_refuses_before_its_first_tick(db_url: str, tmp_path: Path) -> None:
    """Issue 28: the slots of an AWS instance were known only once the autoscaler had asked the cloud
    (its first tick), so a trial wider than max_instances whole instances was accepted before it. A
    type the catalogue lists (p3.8xlarge: 4 GPUs) is known at once."""
    aws = {"type": "aws", "region": "us-east-1", "image_id": "ami-12345678", "instance_type": "p3.8xlarge",
           "max_instances": 2}
    config = load_config(env={}, db_url=db_url, state_dir=str(tmp_path / "state"), admin_password=ADMIN_PASSWORD, **TEST_PASSWORD_HASHING,
                         resource_pools=[{"name": "default"}, {"name": "aws4", "provider": aws}])
    m = Master(config)
    m.prepare()
    try:
        with TestClient(create_app(m)) as client:
            headers = login(client)
            r = create(client, headers, _config(12, "aws4"))  # more than max_instances (2) x 4 GPUs
            assert r.status_code == 400 and "at most 8 slots across its agents" in r.text, r.text
            r = create(client, headers, _config(6, "aws4"))
            assert r.status_code == 400 and "6 is not a multiple of 4" in r.text, r.text
            create_ok(client, headers, _config(8, "aws4"))  # two whole instances
    finally:
        m.stop()
