"""The web UI in a real browser (Debian's Chromium, headless, through playwright) against a real
master whose elastic local pool launches agents as processes: log in, watch a running experiment's
curves grow and its pool scale up, follow a trial's logs, pause / activate / kill from the page, the
refusals (unknown id, another user's kill, a revoked session), log out; the live parts that keep
focus and stop when the experiment is over, the actions each state allows, the layout at 360 and
800 px and the dark theme. Screenshots of every page
go to the test's tmp_path. SQLite only: the pages' queries run on both databases in
tests/ui/test_ui_http.py and tests/control_plane/services/test_dashboard.py."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from control_plane.ui.session import SESSION_COOKIE
from tests.integration.conftest import model_files
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
    assert ui_cluster.api
    r = ui_cluster.api.post("/api/v1/models", json={"name": "ui-model", "description": "first", "metadata": {"k": 1}})
    assert r.status_code == 200, r.text
    page.goto("/models")
    assert "Model registry" in page.inner_text("h1")
    page.screenshot(path=tmp_path / "models.png", full_page=True)
    # The model's page: edited by its owner (admin here) through the form, the change shown.
    page.click("a.model-link:text('ui-model')")
    page.click("#model-edit-open")
    page.fill("#edit-description", "digits, edited in the browser")
    page.fill("#edit-labels", "vision, cnn")
    submit(page, "#model-save")
    assert page.inner_text("#flash") == "Saved." and page.inner_text("#model-description") == "digits, edited in the browser"
    assert page.inner_text("#model-labels").split() == ["vision", "cnn"]
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
    # Hovering a curve names its trial and hyperparameters; the two trials have different colours.
    box = page.locator("#curves .u-over").bounding_box()
    for step in range(1, 20):
        page.mouse.move(box["x"] + box["width"] * step / 20, box["y"] + box["height"] / 2)
        if page.get_attribute("#curves", "data-tip"):
            break
    assert re.match(r"trial \d+( \(best\))? · .*lr=[0-9.e-]+.* · step \d+ · validation_loss ", page.get_attribute("#curves", "data-tip"))
    markers = page.eval_on_selector_all("#curves .u-legend .u-series:not(:first-child) .u-marker",
                                        "els => els.map(e => getComputedStyle(e).borderColor)")
    assert len(markers) == 2 and markers[0] != markers[1]
    # The log-sampled learning rate is on a log axis against the trials' best metric.
    page.wait_for_function("() => Number(document.querySelector('#hparams').dataset.points || 0) > 0")
    assert page.input_value("#hp-name") == "lr" and page.get_attribute("#hparams", "data-log-x") == "true"
    # Parallel coordinates: an axis per hyperparameter (lr on a log axis), the searcher metric last,
    # one line per trial that reported it, hovering a line names the trial.
    page.wait_for_function("() => document.querySelectorAll('#parallel polyline').length == 2", timeout=60_000)
    axes = page.eval_on_selector_all("#parallel .pc-axis", "els => els.map(e => [e.dataset.axis, e.dataset.kind])")
    assert axes[-1][0] == "validation_loss" and ["lr", "log"] in axes and len(axes) == 5
    lines = page.eval_on_selector_all("#parallel polyline", "els => els.map(e => e.dataset.trial)")
    shown = page.eval_on_selector_all("#trials-table tbody tr[data-trial]", "els => els.map(e => e.dataset.trial)")
    assert sorted(lines) == sorted(shown)
    page.dispatch_event(f"#parallel polyline[data-trial='{lines[0]}']", "mouseenter")
    assert re.match(rf"trial {lines[0]}( \(best\))? · .*lr=.* · validation_loss ", page.get_attribute("#parallel", "data-tip"))
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
    top = "s => document.querySelector(s).getBoundingClientRect().top"
    assert page.evaluate(top, "#trial-checkpoints") > page.evaluate(top, "#chart-validation")  # below the charts
    # It completes, and the page says so without a reload.
    page.wait_for_function("() => document.querySelector('#trial-state').textContent.includes('completed')")
    page.context.close()


def actions_shown(page: Any) -> set[str]:
    return set(page.eval_on_selector_all("[id^=action-]", "els => els.map(e => e.id.slice(7))"))


def no_sideways_scroll(page: Any, width: int) -> None:
    page.set_viewport_size({"width": width, "height": 900})
    page.wait_for_function("() => document.documentElement.scrollWidth <= window.innerWidth")
    assert page.evaluate("() => document.documentElement.scrollWidth") <= width


def refreshes(page: Any, selector: str) -> int:
    return int(page.get_attribute(selector, "data-refreshes") or 0)


def wait_refreshes(page: Any, selector: str, n: int) -> None:
    start = refreshes(page, selector)
    page.wait_for_function(f"() => Number(document.querySelector('{selector}').dataset.refreshes) >= {start + n}")


def test_live_page_actions_layout_and_polling(browser: Any, ui_cluster: UICluster, tmp_path: Path) -> None:
    """One running experiment, one page: the live refresh keeps focus, typing and a selection; the
    chart follows its box; no sideways scroll at 800 and 360 px; the actions follow the state and
    say what they did; a finished experiment's page stops polling."""
    exp = ui_cluster.submit("ui-kill", length=10_000, step_sleep=0.2)
    page = new_page(browser, ui_cluster)
    log_in(page, "admin", ui_cluster.password)
    assert page.goto(f"/experiments/{exp['id']}").status == 200
    assert actions_shown(page) == {"pause", "cancel", "kill"}

    # Focus and what is typed survive two refreshes of the part they are in: the same element.
    page.focus("#label-input")
    page.keyboard.type("half-typed")
    page.evaluate("() => { window.focusedBefore = document.activeElement; }")
    wait_refreshes(page, "#experiment-summary", 2)
    assert page.evaluate("() => document.activeElement === window.focusedBefore && document.activeElement.isConnected")
    assert page.input_value("#label-input") == "half-typed"
    # A text selection in the trials table survives a refresh of the table.
    page.evaluate("""() => { const r = document.createRange(); r.selectNodeContents(document.querySelector('#trials-table th'));
                             getSelection().removeAllRanges(); getSelection().addRange(r); }""")
    wait_refreshes(page, "#experiment-tables", 1)
    assert page.evaluate("() => getSelection().toString()") == "Trial"

    # The chart follows its card when the window narrows; nothing scrolls the page sideways.
    page.wait_for_function("() => Number(document.querySelector('#curves').dataset.points || 0) > 0")
    wide = page.evaluate("() => document.querySelector('#curves canvas').getBoundingClientRect().width")
    no_sideways_scroll(page, 800)
    page.wait_for_function("""() => { const c = document.querySelector('#curves'); const w = c.querySelector('canvas').getBoundingClientRect().width;
                                      return w <= c.clientWidth && w > c.clientWidth - 40; }""")
    assert page.evaluate("() => document.querySelector('#curves canvas').getBoundingClientRect().width") < wide
    no_sideways_scroll(page, 360)
    page.screenshot(path=tmp_path / "experiment-360.png", full_page=True)
    page.set_viewport_size({"width": 1280, "height": 900})

    submit(page, "#action-pause")
    assert page.inner_text("#flash") == f"Paused experiment {exp['id']} (now paused)."
    assert page.inner_text("#exp-state").lower() == "paused" and ui_cluster.state_of(exp["id"]) == "STATE_PAUSED"
    assert actions_shown(page) == {"activate", "cancel", "kill"}
    submit(page, "#action-activate")
    assert page.inner_text("#exp-state").lower() == "active"
    page.once("dialog", lambda d: d.accept())
    submit(page, "#action-kill")
    assert page.inner_text("#flash").startswith(f"Killing experiment {exp['id']}")
    # The live refresh brings the end, and the buttons that are left, without a reload.
    page.wait_for_function("() => document.querySelector('#exp-state').textContent.trim() === 'canceled'")
    assert ui_cluster.state_of(exp["id"]) == "STATE_CANCELED"
    page.wait_for_function("() => !document.querySelector('#action-kill') && !!document.querySelector('#action-archive')")
    page.screenshot(path=tmp_path / "killed.png", full_page=True)

    # A finished experiment's page loads its data once and then asks nothing more.
    page.reload()
    page.wait_for_function("() => document.querySelector('#curves').dataset.points !== undefined")
    page.wait_for_load_state("networkidle")
    asked: list[str] = []
    page.on("request", lambda r: asked.append(r.url))
    page.wait_for_timeout(10_000)
    assert asked == []
    submit(page, "#action-archive")
    assert page.inner_text("#flash") == f"Archived experiment {exp['id']} (now canceled)."
    assert actions_shown(page) == {"unarchive"}
    page.context.close()


def team_pages(c: UICluster) -> dict[str, Any]:
    """A workspace with a project holding a paused experiment, and a killed command (nothing for the
    autoscaler to start): the pages of workspaces, projects and tasks have rows. Made once a module."""
    assert c.api
    if "team" not in c.data:
        ws = c.api.post("/api/v1/workspaces", json={"name": "team-ui"}).json()["workspace"]
        project = c.api.post(f"/api/v1/workspaces/{ws['id']}/projects",
                             json={"name": "vision", "workspaceId": ws["id"], "description": "cats"}).json()["project"]
        config = {"name": "in-vision", "entrypoint": "python3 train.py", "hyperparameters": {"lr": 0.1},
                  "searcher": {"name": "single", "metric": "validation_loss", "max_length": {"batches": 5}}}
        r = c.api.post("/api/v1/experiments", json={"config": yaml.safe_dump(config), "modelDefinition": model_files(),
                                                    "activate": False, "projectId": project["id"]})
        assert r.status_code == 200, r.text
        cmd = c.api.post("/api/v1/commands", json={"config": {"entrypoint": ["sleep", "60"],
                                                              "resources": {"slots": 0}}}).json()["command"]
        c.api.post(f"/api/v1/commands/{cmd['id']}/kill")
        c.data["team"] = {"ws": ws["id"], "project": project["id"], "exp": r.json()["experiment"]["id"], "cmd": cmd["id"]}
    return dict(c.data["team"])


def team_paths(c: UICluster) -> list[str]:
    t = team_pages(c)
    return ["/tasks", f"/tasks/{t['cmd']}", "/workspaces", f"/workspaces/{t['ws']}",
            f"/?workspace={t['ws']}&project={t['project']}"]


def test_workspace_project_experiment_navigation(browser: Any, ui_cluster: UICluster) -> None:
    """Workspaces → a workspace → its project → the experiments list filtered to it → the experiment,
    whose breadcrumb leads back; the filter's selects narrow the list; the tasks page lists the command."""
    t = team_pages(ui_cluster)
    page = new_page(browser, ui_cluster)
    log_in(page, "admin", ui_cluster.password)
    submit(page, "nav a[href='/workspaces']")
    submit(page, f"tr[data-workspace-id='{t['ws']}'] a")
    submit(page, f"tr[data-project-id='{t['project']}'] a")
    page.wait_for_selector("#experiments-table")
    listed = page.eval_on_selector_all("#experiments-table a[href^='/experiments/']",
                                       "els => [...new Set(els.map(e => e.getAttribute('href')))]")
    assert listed == [f"/experiments/{t['exp']}"], listed
    assert "team-ui" in page.inner_text("#crumbs") and "in project vision" in page.inner_text("h1")
    submit(page, f"#experiments-table a[href='/experiments/{t['exp']}']")
    assert page.inner_text("#crumbs").split() == ["team-ui", "›", "vision"]
    # The filter: Uncategorized (workspace 1) does not hold it.
    page.goto("/")
    page.select_option("#filter-workspace", "1")
    submit(page, "#filters button[type=submit]")
    assert f"/experiments/{t['exp']}" not in page.inner_html("#experiments-table")
    page.goto("/tasks")
    row = page.wait_for_selector(f"tr.task[data-task-id='{t['cmd']}']")
    assert row.get_attribute("data-kind") == "command" and "terminated" in row.inner_text()
    page.context.close()


def test_dark_theme_and_narrow_list(browser: Any, ui_cluster: UICluster, tmp_path: Path) -> None:
    page = new_page(browser, ui_cluster)
    log_in(page, "admin", ui_cluster.password)
    page.wait_for_selector("#experiments-table")
    no_sideways_scroll(page, 800)
    no_sideways_scroll(page, 360)
    for path in team_paths(ui_cluster):  # the tasks, workspaces and projects pages too
        page.set_viewport_size({"width": 1280, "height": 900})
        page.goto(path)
        no_sideways_scroll(page, 800)
        no_sideways_scroll(page, 360)
    page.goto("/")
    page.screenshot(path=tmp_path / "experiments-360.png", full_page=True)
    background = "() => getComputedStyle(document.body).backgroundColor"
    assert page.evaluate(background) == "rgb(246, 247, 249)"
    page.emulate_media(color_scheme="dark")  # the system's choice, until the user picks one
    page.reload()
    assert page.evaluate(background) == "rgb(13, 17, 23)"
    page.screenshot(path=tmp_path / "experiments-dark.png", full_page=True)
    page.click("#theme-toggle")  # light, kept across pages
    assert page.evaluate(background) == "rgb(246, 247, 249)"
    page.goto("/cluster")
    assert page.evaluate(background) == "rgb(246, 247, 249)"
    page.click("#theme-toggle")
    page.goto("/models")
    assert page.evaluate(background) == "rgb(13, 17, 23)"
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
    assert actions_shown(other) == set() and other.locator("#label-input").count() == 0
    # A kill sent anyway (a page left open from before): the API's refusal, on the page.
    with other.expect_navigation() as nav:
        other.evaluate("""id => { const f = document.createElement('form'); f.method = 'post';
            f.action = `/experiments/${id}/actions/kill`; f.append(document.querySelector('.logout input[name=csrf]').cloneNode());
            document.body.append(f); f.submit(); }""", exp["id"])
    assert nav.value.status == 403
    assert "kill: experiment" in other.inner_text("#action-error") and "belongs to another user" in other.inner_text("#action-error")
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


def test_charts_draw_one_point_label_each_metric_and_name_what_is_hovered(browser: Any, ui_cluster: UICluster) -> None:
    """The chart code itself on a served page (app.js and uPlot, as every page loads them)."""
    page = new_page(browser, ui_cluster)
    page.goto("/login")
    page.wait_for_function("() => window.Shipyard && window.uPlot")
    got = page.evaluate("""async () => {
      const frame = () => new Promise(r => requestAnimationFrame(() => setTimeout(r, 0)));
      const el = document.createElement('div'); el.style.width = '600px'; document.body.append(el);
      const chart = new Shipyard.LineChart(el, 'steps');
      chart.draw([{ label: 'loss', x: [10], y: [0.5] }, { label: 'accuracy', x: [10, 20], y: [70, 90] }], { axes: 'each' });
      await frame();  // uPlot draws on its next turn
      const u = chart.plot, canvas = el.querySelector('canvas');
      const b = u.bbox;  // the plotting area only (the loss axis's labels share the colour)
      const px = canvas.getContext('2d').getImageData(b.left, b.top, b.width, b.height).data;
      let dot = 0;  // pixels of the first colour (#4e79a7): the lone point of 'loss'
      for (let i = 0; i < px.length; i += 4) if (Math.abs(px[i] - 78) < 12 && Math.abs(px[i + 1] - 121) < 12 && Math.abs(px[i + 2] - 167) < 12) dot++;
      u.setCursor({ left: u.valToPos(10, 'x'), top: u.valToPos(0.5, 'loss') });
      await frame();
      return { dot, axes: u.axes.map(a => a.label), scales: u.series.slice(1).map(s => s.scale), tip: el.dataset.tip };
    }""")
    assert got["dot"] > 20, got
    assert got["axes"] == ["steps", "loss", "accuracy"] and got["scales"] == ["loss", "accuracy"], got
    assert got["tip"] == "loss · steps 10 · 0.5", got


def test_polling_backs_off_in_a_hidden_tab_and_stops_when_final(browser: Any, ui_cluster: UICluster) -> None:
    """app.js's live machinery on a served page. The morph: the nodes that stay are the same nodes
    (an opened <details> stays open), changed text and rows follow the new copy. The poller, at a
    50 ms pace: a hidden tab is asked ever less often, a shown one at the pace again; a page that
    turns final is looked at once more, then never."""
    page = new_page(browser, ui_cluster)
    page.goto("/login")
    page.wait_for_function("() => window.Shipyard")
    morphed = page.evaluate("""() => {
      const el = document.createElement('div'); document.body.append(el);
      el.innerHTML = '<details><summary>s</summary><p id="n">1</p></details><table><tbody><tr><td>a</td></tr></tbody></table>';
      const details = el.querySelector('details'), cell = el.querySelector('td'); details.open = true;
      Shipyard.morphHTML(el, '<details><summary>s</summary><p id="n">2</p></details><table><tbody><tr><td>b</td></tr><tr><td>c</td></tr></tbody></table>');
      return { same: el.querySelector('details') === details && el.querySelector('td') === cell, open: details.open,
               text: el.textContent };
    }""")
    assert morphed == {"same": True, "open": True, "text": "s2bc"}, morphed
    got = page.evaluate("""async () => {
      const sleep = ms => new Promise(r => setTimeout(r, ms));
      let hidden = false, calls = 0;
      Object.defineProperty(document, 'hidden', { configurable: true, get: () => hidden });
      Shipyard.poll(50, async () => { calls++; });
      await sleep(1000); const shown = calls;
      hidden = true; document.dispatchEvent(new Event('visibilitychange'));
      calls = 0; await sleep(1000); const whileHidden = calls;
      hidden = false; document.dispatchEvent(new Event('visibilitychange'));
      calls = 0; await sleep(500); const again = calls;
      document.body.dataset.final = 'true';
      await sleep(300); calls = 0; await sleep(500);
      return { shown, whileHidden, again, afterFinal: calls };
    }""")
    assert got["shown"] >= 8 and got["whileHidden"] <= 5 and got["again"] >= 4 and got["afterFinal"] == 0, got


AXE = Path(__file__).parent / "vendor" / "axe.min.js"  # ui/package.json's axe-core, copied by ui/build.sh
AXE_RUN = """async () => {
  const r = await axe.run(document, { resultTypes: ["violations"] });
  if (!r.passes.length) return ["axe checked nothing"];
  return r.violations.filter(v => v.impact === "serious" || v.impact === "critical")
    .map(v => `${v.id} (${v.impact}): ${v.help} -- ${v.nodes.slice(0, 3).map(n => n.target.join(" ")).join(" | ")}`);
}"""


def test_every_page_passes_axe_in_light_and_dark(browser: Any, ui_cluster: UICluster) -> None:
    """axe-core over every page, both themes: no violation of impact serious or critical."""
    assert ui_cluster.api
    exp = ui_cluster.submit("ui-axe", length=10, step_sleep=0.01)
    trial_id = ui_cluster.api.get(f"/api/v1/experiments/{exp['id']}/trials").json()["trials"][0]["id"]
    if ui_cluster.api.get("/api/v1/models/ui-axe-model").status_code == 404:
        assert ui_cluster.api.post("/api/v1/models", json={"name": "ui-axe-model", "labels": ["a"],
                                                           "metadata": {"k": 1}}).status_code == 200
    pages = ["/", f"/experiments/{exp['id']}", f"/trials/{trial_id}", "/cluster", "/models", "/models/ui-axe-model",
             "/no/such/page", *team_paths(ui_cluster)]
    found: dict[str, list[str]] = {}
    # axe sees what the page shows: a low-contrast note would be reported.
    page = new_page(browser, ui_cluster)
    page.set_content('<html lang="en"><title>t</title><main><p style="color:#ddd;background:#fff">faint</p></main></html>')
    page.add_script_tag(path=str(AXE))
    assert any(x.startswith("color-contrast (serious)") for x in page.evaluate(AXE_RUN))
    page.context.close()
    for scheme in ("light", "dark"):
        page = new_page(browser, ui_cluster)
        page.emulate_media(color_scheme=scheme)
        page.goto("/login")
        page.add_script_tag(path=str(AXE))
        found[f"{scheme} /login"] = page.evaluate(AXE_RUN)
        log_in(page, "admin", ui_cluster.password)
        for path in pages:
            page.goto(path)
            page.wait_for_load_state("load")
            page.wait_for_timeout(300)  # the charts' first draw
            page.add_script_tag(path=str(AXE))
            found[f"{scheme} {path}"] = page.evaluate(AXE_RUN)
        page.context.close()
    bad = {k: v for k, v in found.items() if v}
    assert not bad, "\n".join(f"{k}: {x}" for k, v in bad.items() for x in v)
