"""Caps shared by the master's processes (db/quotas.py), against a real master with two API worker
processes: the per-user cap on open log searches holds whichever worker each search reaches (it was
counted per worker: a user got it once per process). Issue 27, item 8. SQLite and PostgreSQL."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import httpx
import pytest
import yaml

from control_plane.services.logs import MAX_SEARCHES_PER_USER
from tests.conftest import ADMIN_PASSWORD, LiveMaster
from tests.control_plane.api.test_experiments import CONFIG, v1file


@pytest.mark.integration
def test_open_log_searches_are_capped_across_api_workers(db_url: str, tmp_path: Path) -> None:
    config = tmp_path / "master.yaml"
    config.write_text(yaml.safe_dump({"api_workers": 2}))
    m = LiveMaster(db_url, tmp_path / "state", config_path=config)
    m.start(timeout=60)
    try:
        token = httpx.post(m.url + "/api/v1/auth/login",
                           json={"username": "admin", "password": ADMIN_PASSWORD}).json()["token"]
        auth = {"Authorization": f"Bearer {token}"}
        r = httpx.post(m.url + "/api/v1/experiments", headers=auth, timeout=30,
                       json={"config": CONFIG, "modelDefinition": [v1file("train.py")]})
        assert r.status_code == 200, r.text
        trial = r.json()["experiment"]["trialIds"][0]
        url = f"{m.url}/api/v1/trials/{trial}/logs"
        search = {"searchText": "loss", "follow": "true"}  # a following search stays open
        statuses = []
        with contextlib.ExitStack() as open_streams:
            for _ in range(3 * MAX_SEARCHES_PER_USER):  # each on a connection of its own: both workers get some
                client = open_streams.enter_context(httpx.Client(timeout=30))
                resp = open_streams.enter_context(client.stream("GET", url, headers=auth, params=search))
                statuses.append(resp.status_code)
            assert statuses.count(200) == MAX_SEARCHES_PER_USER, statuses
            assert statuses.count(429) == 2 * MAX_SEARCHES_PER_USER, statuses
            # reading without a search is not limited
            assert httpx.get(url, headers=auth, timeout=30).status_code == 200
        # the streams closed: their slots come back (given back by whichever worker held them)
        for _ in range(50):
            r = httpx.get(url, headers=auth, params={"searchText": "loss"}, timeout=30)
            if r.status_code == 200:
                break
            time.sleep(0.2)
        assert r.status_code == 200, r.text
    finally:
        m.stop()
