"""The autoscaler's history read from the database by every API worker: a real master with two API
workers (and its control process running the autoscaler) whose elastic local pool scales up for a
waiting trial. The launch is in the history whichever worker answers (many fresh connections, the
same rows every time), in `det resource-pool describe`, and on the pool page in Chromium. On SQLite
and PostgreSQL (the browser part on SQLite)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.ui.conftest import UICluster, running
from tests.ui.test_browser import new_page, submit

pytestmark = pytest.mark.integration

FETCHES = 12


@pytest.fixture
def two_workers(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[UICluster]:
    monkeypatch.setenv("SHIPYARD_API_WORKERS", "2")
    monkeypatch.setenv("SHIPYARD_CLI_DIR", str(tmp_path / "cli"))
    with running(UICluster(tmp_path / "cluster", db=db_url)) as c:
        yield c


def _history(c: UICluster) -> list[dict[str, Any]]:
    # A fresh connection each time: the shared socket hands it to either worker.
    r = httpx.get(c.url + "/api/v1/resource-pools/default/scaling-history", headers=c.api.headers, timeout=30)  # type: ignore[union-attr]
    assert r.status_code == 200, r.text
    return r.json()["events"]


def _launch_row(c: UICluster, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        launches = [e for e in _history(c) if e["kind"] in ("launch", "scale")]
        if launches:
            return launches[-1]  # the first launch (newest first)
        time.sleep(0.3)
    raise AssertionError(f"no launch in the history: {_history(c)}")


def test_a_scale_up_is_in_the_history_from_every_worker(two_workers: UICluster, capsys: pytest.CaptureFixture[str],
                                                        request: pytest.FixtureRequest, tmp_path: Path) -> None:
    c = two_workers
    exp = c.submit("history", length=5, step_sleep=0.01)
    launch = _launch_row(c)
    assert launch["launch"] == 1 and launch["reasons"], launch
    # The rows up to the launch never change again: every answer, from either worker, has them exactly.
    answers = [[e for e in _history(c) if e["id"] <= launch["id"]] for _ in range(FETCHES)]
    assert all(a == answers[0] for a in answers) and launch in answers[0]
    pool = c.api.get("/api/v1/resource-pools/default").json()["resourcePool"]  # type: ignore[union-attr]
    assert launch["id"] in [e["id"] for e in pool["scalingHistory"]]

    from cli.main import main

    capsys.readouterr()
    assert main(["-m", c.url, "user", "login", "admin", "--password", c.password]) == 0
    assert main(["-m", c.url, "resource-pool", "describe", "default"]) == 0
    out = capsys.readouterr().out
    assert "Scaling history" in out and "launch 1" in out, out
    assert main(["-m", c.url, "resource-pool", "describe", "default", "--json"]) == 0
    assert launch["id"] in [e["id"] for e in json.loads(capsys.readouterr().out)["scalingHistory"]]
    if c.db and c.db.startswith("sqlite"):  # the page once: its queries run on both databases elsewhere
        _the_pool_page_shows_the_launch(c, request.getfixturevalue("browser"), launch, tmp_path)
    c.api.post(f"/api/v1/experiments/{exp['id']}/kill")  # type: ignore[union-attr]


def _the_pool_page_shows_the_launch(c: UICluster, browser: Any, launch: dict[str, Any], tmp_path: Path) -> None:
    """In Chromium: the launch row on the pool page (whichever worker renders it), the login that
    comes back to the page, and the 404 page's way home."""
    page = new_page(browser, c)
    page.goto("/cluster")
    assert "/login?next=%2Fcluster" in page.url
    page.fill("input[name=username]", "admin")
    page.fill("input[name=password]", c.password)
    submit(page, "button[type=submit]")
    assert page.url.endswith("/cluster")  # back to the page after the login
    row = page.wait_for_selector(f"#pool-default tr.event[data-event-id='{launch['id']}']")
    assert "launch" in row.inner_text()
    page.screenshot(path=tmp_path / "cluster-history.png", full_page=True)
    page.goto("/no/such/page")
    assert "There is no page at /no/such/page" in page.inner_text("#error-message")
    page.click("#home-link")
    page.wait_for_selector("#experiments-table")
