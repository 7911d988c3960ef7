"""`GET /api/v1/master/config` (`det master config`): the effective config, admins only, secrets
hidden (the admin password, a database URL's password, storage and provider secrets)."""

from __future__ import annotations

from pathlib import Path

import pytest

from control_plane.config import load_config
from control_plane.services.master_config import shown_config
from tests.conftest import ADMIN_PASSWORD
from tests.control_plane.api.test_experiments import make_user

STORAGE = {"type": "s3", "bucket": "ckpts", "access_key": "AKIAEXAMPLE", "secret_key": "s3cr3t-value"}


@pytest.fixture
def master_config(db_url: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    return load_config(env={}, db_url=db_url, state_dir=str(tmp_path / "state"), admin_password=ADMIN_PASSWORD,
                       checkpoint_storage=STORAGE)


def test_admin_sees_the_config_without_secrets(client, admin_headers) -> None:  # type: ignore[no-untyped-def]
    r = client.get("/api/v1/master/config", headers=admin_headers)
    assert r.status_code == 200, r.text
    cfg = r.json()["config"]
    assert (cfg["checkpoint_storage"]["bucket"], cfg["resource_pools"][0]["name"]) == ("ckpts", "default")
    assert cfg["checkpoint_storage"]["secret_key"] == cfg["checkpoint_storage"]["access_key"] == "********"
    assert cfg["admin_password"] == "********" and cfg["token_ttl_hours"] == 168
    for secret in (ADMIN_PASSWORD, "s3cr3t-value", "AKIAEXAMPLE"):
        assert secret not in r.text
    user = make_user(client, admin_headers, "cfg-reader")
    assert client.get("/api/v1/master/config", headers=user).status_code == 403


def test_database_password_hidden_rest_of_url_kept(tmp_path: Path) -> None:
    cfg = load_config(env={}, db_url="postgresql+psycopg://ship:hunter2@db.internal:5432/shipyard",
                      state_dir=str(tmp_path), admin_password="pw-123456789", default_resource_pool="gpu",
                      resource_pools=[{"name": "gpu", "provider": {"type": "aws", "secret_access_key": "x-secret"}}])
    shown = shown_config(cfg)
    assert shown["db_url"] == "postgresql+psycopg://ship:********@db.internal:5432/shipyard"
    assert shown["resource_pools"][0]["provider"] == {"type": "aws", "secret_access_key": "********"}
    assert shown["token_secret_file"] is None or "****" not in str(shown["token_secret_file"])
