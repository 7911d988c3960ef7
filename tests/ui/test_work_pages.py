"""The web UI's pages for tasks, workspaces and projects, and the cluster page's interruption notices
and consolidation savings, over HTTP on SQLite and PostgreSQL (the `client` fixture): what each
user sees and may do, through the same services as the API. The browser tests drive them in
Chromium (test_browser.py, test_notebook_browser.py)."""

from __future__ import annotations

import re
from datetime import timedelta

from sqlalchemy import select

from control_plane.core import states as st
from control_plane.db.engine import transaction
from control_plane.db.models import Agent, Allocation, ConsolidationMove, Task
from tests.control_plane.api.test_experiments import create_ok, make_user
from tests.control_plane.api.test_ntsc import launch
from tests.ui.test_ui_http import page_csrf, ui_login


def _rows(html: str, cls: str) -> list[str]:
    return re.findall(rf'<tr class="{cls}"[^>]*data-{cls}-id="([^"]+)"', html)


def test_tasks_page_lists_tasks_with_open_and_kill_for_who_may(client, admin_headers, master) -> None:  # type: ignore[no-untyped-def]
    bob = make_user(client, admin_headers, "bob")
    make_user(client, admin_headers, "eve")
    cmd = launch(client, bob, entrypoint=["sleep", "600"], resources={"slots": 0},
                 environment={"registry_auth": {"username": "bob", "password": "registry-pass"}})["command"]
    nb = launch(client, bob, "notebooks", resources={"slots": 0})["notebook"]
    ui_login(client, "bob", "bob-password-1")
    html = client.get("/tasks").text
    assert set(_rows(html, "task")) == {cmd["id"], nb["id"]}
    assert 'data-kind="command"' in html and 'data-kind="notebook"' in html and "pending" in html
    assert f'/proxy/{nb["id"]}/' not in html  # not serving yet: no Open
    # Running, with its address reported: the owner gets Open for the notebook only.
    with transaction(master.sessions) as s:
        for a in s.scalars(select(Allocation).where(Allocation.task_id.in_([cmd["id"], nb["id"]]))):
            a.state, a.started_at = st.AllocationState.RUNNING, master.clock()
        s.get(Task, nb["id"]).proxy_address = "127.0.0.1:1"
    html = client.get("/tasks").text
    assert html.count('class="button open"') == 1 and f'href="/proxy/{nb["id"]}/"' in html
    assert html.count('class="kill"') == 2
    page = client.get(f"/tasks/{cmd['id']}")
    assert page.status_code == 200 and 'id="task-kill"' in page.text and "sleep" in page.text
    assert "registry-pass" not in page.text  # the config as the API shows it: secrets redacted
    assert page.headers["X-Shipyard-Final"] == "0"
    logs = client.get(f"/ui/data/tasks/{cmd['id']}/logs").json()
    assert logs["lines"] == [] and logs["over"] is False
    # Another user's list holds their own tasks only; the task's page and logs are readable (reads
    # are open, as experiments'), but it may not kill it (a role in its workspace would be needed).
    ui_login(client, "eve", "eve-password-1")
    html = client.get("/tasks").text
    assert _rows(html, "task") == [] and "/proxy/" not in html
    assert client.get(f"/tasks/{nb['id']}").status_code == 200
    assert client.get(f"/ui/data/tasks/{nb['id']}/logs").status_code == 200
    csrf = page_csrf(client, "/tasks")
    assert client.post(f"/tasks/{cmd['id']}/kill", data={"csrf": csrf}, follow_redirects=False).status_code == 403
    assert client.get("/tasks/..%2Fx").status_code in (400, 404)
    # An admin sees both; the owner's kill goes through the service and says so.
    ui_login(client)
    html = client.get("/tasks").text
    assert set(_rows(html, "task")) == {cmd["id"], nb["id"]}
    assert "/proxy/" not in html  # no Open: a browser reaches its own user's tasks only (api/proxy.py)
    ui_login(client, "bob", "bob-password-1")
    csrf = page_csrf(client, "/tasks")
    r = client.post(f"/tasks/{cmd['id']}/kill", data={"csrf": csrf}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"].endswith("?done=kill")
    assert client.get(r.headers["location"]).text.count("Killing the task") == 1
    with transaction(master.sessions) as s:
        assert s.scalar(select(Allocation.kill_requested).where(Allocation.task_id == cmd["id"])) is True
    assert client.post(f"/tasks/{cmd['id']}/kill", data={}, follow_redirects=False).status_code == 403  # CSRF


def test_workspace_project_experiment_navigation_filter_and_actions(client, admin_headers) -> None:  # type: ignore[no-untyped-def]
    bob = make_user(client, admin_headers, "bob")
    make_user(client, admin_headers, "eve")
    ui_login(client, "bob", "bob-password-1")
    csrf = page_csrf(client, "/workspaces")
    r = client.post("/workspaces", data={"csrf": csrf, "name": "team-a"}, follow_redirects=False)
    assert r.status_code == 303, r.text
    ws_page = r.headers["location"]
    ws_id = int(ws_page.rsplit("/", 1)[1])
    r = client.post(f"/workspaces/{ws_id}/projects", data={"csrf": csrf, "name": "vision", "description": "cats"},
                    follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == ws_page
    html = client.get(ws_page).text
    (pid,) = _rows(html, "project")
    assert "vision" in html and "cats" in html and "Archive workspace" in html
    inside = create_ok(client, bob, projectId=int(pid))["experiment"]["id"]
    outside = create_ok(client, bob)["experiment"]["id"]
    # Workspaces list → workspace → project → its experiments (and the experiment's breadcrumb).
    assert str(ws_id) in _rows(client.get("/workspaces").text, "workspace")
    r = client.get(f"/projects/{pid}", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == f"/?workspace={ws_id}&project={pid}"
    listed = client.get(r.headers["location"]).text
    assert f"/experiments/{inside}" in listed and f"/experiments/{outside}" not in listed
    assert 'id="crumbs"' in listed and "in project vision" in listed
    ws_only = client.get(f"/?workspace={ws_id}").text
    assert f"/experiments/{inside}" in ws_only and f"/experiments/{outside}" not in ws_only
    default = client.get("/?workspace=1").text
    assert f"/experiments/{outside}" in default and f"/experiments/{inside}" not in default
    exp_page = client.get(f"/experiments/{inside}").text
    assert re.search(rf'id="crumbs"><a href="/workspaces/{ws_id}">team-a</a> › <a href="[^"]*project={pid}">vision', exp_page)
    assert client.get("/?project=x").status_code == 400 and "project" in client.get("/?project=x").text
    # Another user may look but not archive; the owner archives the project.
    ui_login(client, "eve", "eve-password-1")
    html = client.get(ws_page).text
    assert "Archive workspace" not in html and 'aria-label="archive project' not in html
    csrf = page_csrf(client, ws_page)
    r = client.post(f"/projects/{pid}/archive", data={"csrf": csrf, "archived": "1"})
    assert r.status_code == 403 and 'id="action-error"' in r.text
    ui_login(client, "bob", "bob-password-1")
    csrf = page_csrf(client, ws_page)
    r = client.post(f"/projects/{pid}/archive", data={"csrf": csrf, "archived": "1"}, follow_redirects=False)
    assert r.status_code == 303
    assert client.get(f"/api/v1/projects/{pid}", headers=bob).json()["project"]["archived"] is True
    r = client.post("/workspaces", data={"csrf": csrf, "name": "team-a"})  # taken: the service's 409, on the page
    assert r.status_code == 409 and "already exists" in r.text
    assert client.get("/workspaces/999").status_code == 404


def test_cluster_page_shows_interruption_notices_and_consolidation_savings(client, master) -> None:  # type: ignore[no-untyped-def]
    now = master.clock()
    with transaction(master.sessions) as s:
        s.add(Agent(id="spot-1", pool="default", session_id="s", slots=[], instance_id="i-0abc", last_seen=now,
                    interruption_at=now, interruption_action="terminate",
                    interruption_deadline=now + timedelta(minutes=2)))
        s.add(ConsolidationMove(pool="default", at=now, launch_id="l-1", instance_id="i-0def", agent_id="a2",
                                allocation_id="t.1", trial_id=None, reason="emptied to terminate", saving=0.42,
                                saving_unit="USD/h"))
    ui_login(client)
    html = client.get("/cluster").text
    assert "Interruption notices" in html and "i-0abc" in html and "spot interruption notice (terminate" in html
    assert "Estimated saving" in html and "0.42 USD/h" in html and "emptied to terminate" in html
