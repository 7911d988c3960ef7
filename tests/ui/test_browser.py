"""The web UI in a real browser (Debian's Chromium, headless, through playwright) against a real
master whose elastic local pool launches agents as processes: log in, watch a running experiment's
curves grow and its pool scale up, follow a trial's logs, pause / activate / kill from the page, the
refusals (unknown id, another user's kill, a revoked session), log out. Screenshots of every page
go to the test's tmp_path. SQLite only: the pages' queries run on both databases in
tests/ui/test_ui_http.py and tests/control_plane/services/test_dashboard.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from control_plane.ui.session import SESSION_COOKIE
from tests.ui.conftest import OPEN_PAGES, UICluster

pytestmark = pytest.mark.integration

WAIT_MS = 90_000


def new_page(browser: Any, ui_cluster: UICluster) -> Any:
    ctx = browser.new_context(base_url=ui_cluster.url, viewport={"width": 1280, "height": 900})
    ctx.set_default_timeout(WAIT_MS)
    page = ctx.new_page()
    OPEN_PAGES.append(page)
    return page


def log_in(page: Any, username: str, password: str) -> None:
    page.goto("/login")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    submit(page, "button[type=submit]")


def submit(page: Any, selector: str) -> Any:
    """Click a button that sends a form and wait for the page it leads to: the next step must not
    start a navigation of its own that would cancel this one (a login whose answer, the session
    cookie, had not arrived yet — argon2 on a loaded machine — left the next page on /login)."""
    with page.expect_navigation() as nav:
        page.click(selector)
    return nav.value


def points(page: Any, selector: str) -> int:
    return int(page.get_attribute(selector, "data-points") or 0)


def test_login_and_the_experiments_page(browser: Any, ui_cluster: UICluster, tmp_path: Path) -> None:
    page = new_page(browser, ui_cluster)
    page.goto("/")
    assert "/login" in page.url  # no page without a session
    log_in(page, "admin", "not-the-password")
    assert "invalid credentials" in page.inner_text("#login-message")
    page.screenshot(path=tmp_path / "login.png")
    log_in(page, "admin", ui_cluster.password)
    page.wait_for_selector("#experiments-table")
    assert page.inner_text("h1") == "Experiments"
    page.screenshot(path=tmp_path / "experiments.png", full_page=True)
    page.goto("/models")
    assert "Model registry" in page.inner_text("h1")
    page.screenshot(path=tmp_path / "models.png", full_page=True)
    page.context.close()


def test_running_experiment_curves_logs_and_scale_up(browser: Any, ui_cluster: UICluster, tmp_path: Path) -> None:
    exp = ui_cluster.submit("ui-curves", length=160, step_sleep=0.05, trials=2)
    trial_id = exp["trialIds"][0] if exp.get("trialIds") else None
    page = new_page(browser, ui_cluster)
    log_in(page, "admin", ui_cluster.password)

    # The pool scales up from zero for the waiting trial: an instance and its agent appear.
    page.goto("/cluster")
    page.wait_for_selector("#pool-default tr.instance")
    page.wait_for_function("() => Number(document.querySelector('#pool-default .slot-total').dataset.total) >= 1")
    page.screenshot(path=tmp_path / "cluster.png", full_page=True)

    # The experiment's learning curve grows while the trial trains (the chart polls every 3 s).
    page.goto(f"/experiments/{exp['id']}")
    page.wait_for_function("() => Number(document.querySelector('#curves').dataset.points || 0) > 0")
    first = points(page, "#curves")
    page.wait_for_function(f"() => Number(document.querySelector('#curves').dataset.points || 0) > {first}")
    page.wait_for_function("() => document.querySelectorAll('#trials-table tbody tr[data-trial]').length == 2")
    page.screenshot(path=tmp_path / "experiment.png", full_page=True)
    page.screenshot(path=tmp_path / "experiment-view.png")  # the first screen (docs/ui-experiment.png)

    # The trial's page: charts, its allocation on the launched agent, and the logs, followed.
    trial_id = trial_id or int(page.get_attribute("#trials-table tbody tr", "data-trial"))
    page.goto(f"/trials/{trial_id}")
    page.wait_for_function("() => document.querySelector('#logs').textContent.includes('pid')")
    page.wait_for_function("() => Number(document.querySelector('#chart-training').dataset.points || 0) > 0")
    assert "local" in page.inner_text("#allocations-table").lower() or page.locator("#allocations-table tbody tr").count()
    before = len(page.inner_text("#logs"))
    page.fill("#log-search", "validation")  # a search shows only the matching lines, marked
    page.wait_for_function("() => document.querySelector('#log-info').textContent.includes('matching')")
    text = page.inner_text("#logs")
    assert all("validation" in line.lower() for line in text.splitlines() if line.strip())
    page.fill("#log-search", "")
    page.wait_for_function(f"() => document.querySelector('#logs').textContent.length >= {before}")
    page.screenshot(path=tmp_path / "trial.png", full_page=True)
    # It completes, and the page says so without a reload.
    page.wait_for_function("() => document.querySelector('#trial-state').textContent.includes('completed')")
    page.context.close()


def test_pause_activate_and_kill_from_the_page(browser: Any, ui_cluster: UICluster, tmp_path: Path) -> None:
    exp = ui_cluster.submit("ui-kill", length=10_000, step_sleep=0.2)
    page = new_page(browser, ui_cluster)
    log_in(page, "admin", ui_cluster.password)
    assert page.goto(f"/experiments/{exp['id']}").status == 200
    submit(page, "#action-pause")
    assert page.inner_text("#flash") == "pause: done"
    assert page.inner_text("#exp-state").lower() == "paused"
    assert ui_cluster.state_of(exp["id"]) == "STATE_PAUSED"
    submit(page, "#action-activate")
    assert page.inner_text("#exp-state").lower() == "active"
    page.once("dialog", lambda d: d.accept())
    submit(page, "#action-kill")
    assert page.inner_text("#flash") == "kill: done"
    # htmx polling brings the end without a reload.
    page.wait_for_function("() => document.querySelector('#exp-state').textContent.trim() === 'canceled'")
    assert ui_cluster.state_of(exp["id"]) == "STATE_CANCELED"
    page.screenshot(path=tmp_path / "killed.png", full_page=True)
    page.context.close()


def test_refusals_are_clear_pages(browser: Any, ui_cluster: UICluster, tmp_path: Path) -> None:
    assert ui_cluster.api
    page = new_page(browser, ui_cluster)
    log_in(page, "admin", ui_cluster.password)
    r = page.goto("/experiments/987654")
    assert r.status == 404 and "experiment 987654 not found" in page.inner_text("#error-message")
    page.screenshot(path=tmp_path / "not-found.png")

    # Another user pressing kill on admin's experiment: the API's 403, shown, nothing killed.
    exp = ui_cluster.submit("ui-not-yours", length=10_000, step_sleep=0.2)
    r = ui_cluster.api.post("/api/v1/users", json={"user": {"username": "carol"}, "password": "carol-password-1"})
    assert r.status_code == 200, r.text
    other = new_page(browser, ui_cluster)
    log_in(other, "carol", "carol-password-1")
    assert other.goto(f"/experiments/{exp['id']}").status == 200
    other.once("dialog", lambda d: d.accept())
    with other.expect_navigation() as nav:
        other.click("#action-kill")
    assert nav.value.status == 403
    assert "belongs to another user" in other.inner_text("#error-message")
    assert "Traceback" not in other.content()
    other.screenshot(path=tmp_path / "forbidden.png")
    assert ui_cluster.state_of(exp["id"]) == "STATE_ACTIVE"
    ui_cluster.api.post(f"/api/v1/experiments/{exp['id']}/kill")

    # A session revoked elsewhere (its token logged out through the API): back to the login page.
    token = next(c["value"] for c in other.context.cookies() if c["name"] == SESSION_COOKIE)
    import httpx

    assert httpx.post(ui_cluster.url + "/api/v1/auth/logout", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    r = other.goto("/")
    assert r.status == 401 and "expired or was revoked" in other.inner_text("#login-message")
    other.screenshot(path=tmp_path / "expired.png")
    other.context.close()
    page.context.close()


def test_log_out_and_be_refused(browser: Any, ui_cluster: UICluster, tmp_path: Path) -> None:
    page = new_page(browser, ui_cluster)
    log_in(page, "admin", ui_cluster.password)
    page.wait_for_selector("#logout")
    token = next(c["value"] for c in page.context.cookies() if c["name"] == SESSION_COOKIE)
    submit(page, "#logout")
    assert "You are logged out." in page.inner_text("#login-message")
    page.goto("/cluster")
    assert "/login" in page.url
    page.screenshot(path=tmp_path / "logged-out.png")
    # The old session cookie, put back, is refused too: the session was revoked, not just forgotten.
    page.context.add_cookies([{"name": SESSION_COOKIE, "value": token, "url": ui_cluster.url}])
    r = page.goto("/")
    assert r.status == 401 and "expired or was revoked" in page.inner_text("#login-message")
    page.context.close()
