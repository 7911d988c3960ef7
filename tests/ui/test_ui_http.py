"""The web UI over HTTP, without a browser: sessions, CSRF, refusals and every page, on SQLite and
PostgreSQL (the `client` fixture). The browser tests (test_browser.py) drive the same pages in
Chromium against a real cluster."""

from __future__ import annotations

import re

from control_plane.ui.session import SESSION_COOKIE
from tests.conftest import ADMIN_PASSWORD, login
from tests.control_plane.api.test_experiments import create_ok


def ui_login(client, username: str = "admin", password: str = ADMIN_PASSWORD, next_: str = "/"):  # type: ignore[no-untyped-def]
    page = client.get("/login")
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)
    return client.post("/login", data={"username": username, "password": password, "csrf": csrf, "next": next_},
                       follow_redirects=False)


def page_csrf(client, path: str) -> str:  # type: ignore[no-untyped-def]
    r = client.get(path)
    assert r.status_code == 200, r.text
    return re.search(r'name="csrf" value="([^"]+)"', r.text).group(1)


def make_user(client, headers, name: str = "bob", password: str = "bob-password-1") -> None:  # type: ignore[no-untyped-def]
    r = client.post("/api/v1/users", headers=headers, json={"user": {"username": name}, "password": password})
    assert r.status_code == 200, r.text


def test_login_required_everywhere(client) -> None:  # type: ignore[no-untyped-def]
    for path in ("/", "/cluster", "/models", "/experiments/1", "/trials/1", "/tasks", "/tasks/x", "/workspaces",
                 "/workspaces/1", "/projects/1"):
        r = client.get(path, follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"].startswith("/login?next="), path
    r = client.get("/ui/fragments/experiments", headers={"HX-Request": "true"})
    assert r.status_code == 401 and r.headers["HX-Redirect"] == "/login"
    assert client.get("/ui/data/experiments/1/metrics").status_code == 401
    assert client.get("/ui/data/tasks/x/logs").status_code == 401
    assert client.post("/workspaces", follow_redirects=False).status_code == 303
    assert client.post("/experiments/1/actions/kill", follow_redirects=False).status_code == 303
    assert client.get("/ui/static/app.js").status_code == 200  # static files need no session


def test_login_logout_and_cookie(client) -> None:  # type: ignore[no-untyped-def]
    r = ui_login(client, password="wrong-password")
    assert r.status_code == 403 and "invalid credentials" in r.text
    page = client.get("/login")
    r = client.post("/login", data={"username": "admin", "password": ADMIN_PASSWORD, "csrf": "forged"})
    assert r.status_code == 403 and "login form expired" in r.text
    r = ui_login(client, next_="//evil.example/x")
    assert r.status_code == 303 and r.headers["location"] == "/"  # no open redirect
    cookie = r.headers["set-cookie"]
    assert SESSION_COOKIE in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
    token = client.cookies.get(SESSION_COOKIE)
    # The UI's cookie is not a credential for the JSON API.
    assert client.get("/api/v1/me").status_code == 401
    assert client.get("/").status_code == 200
    # Logging out needs the CSRF token, revokes the session and clears the cookie.
    assert client.post("/logout", follow_redirects=False).status_code == 403
    csrf = page_csrf(client, "/")
    r = client.post("/logout", data={"csrf": csrf}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/login?out=1"
    assert client.get("/", follow_redirects=False).status_code == 303
    client.cookies.set(SESSION_COOKIE, token)  # the old cookie, replayed
    r = client.get("/", follow_redirects=False)
    assert r.status_code == 401 and "expired or was revoked" in r.text
    assert client.get("/api/v1/me", headers={"Authorization": f"Bearer {token}"}).status_code == 401
    del page


def test_a_login_no_database_can_store_is_400_not_500(client) -> None:  # type: ignore[no-untyped-def]
    for username, password in (("ad\x00min", ADMIN_PASSWORD), ("admin", "pass\x00word")):
        r = ui_login(client, username=username, password=password)
        assert r.status_code == 400 and "not allowed" in r.text, r.text


def test_revoked_session_goes_back_to_login(client, admin_headers) -> None:  # type: ignore[no-untyped-def]
    ui_login(client)
    token = client.cookies.get(SESSION_COOKIE)
    assert client.post("/api/v1/auth/logout", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    r = client.get("/")
    assert r.status_code == 401 and "expired or was revoked" in r.text and "Traceback" not in r.text
    assert not client.cookies.get(SESSION_COOKIE)  # cleared
    client.cookies.set(SESSION_COOKIE, token)
    r = client.get("/ui/fragments/experiments", headers={"HX-Request": "true"})
    assert r.status_code == 401 and r.headers["HX-Redirect"] == "/login?expired=1"


def test_pages_and_data(client, admin_headers) -> None:  # type: ignore[no-untyped-def]
    exp = create_ok(client, admin_headers)["experiment"]
    ui_login(client)
    r = client.get("/")
    assert r.status_code == 200 and f'href="/experiments/{exp["id"]}"' in r.text and "mnist-test" in r.text
    assert r.headers["X-Frame-Options"] == "DENY" and "frame-ancestors 'none'" in r.headers["Content-Security-Policy"]
    assert "1–1 of 1" in client.get("/?label=a&state=STATE_ACTIVE&owner=admin&name=MNIST&sort=name").text
    assert "of 0" in client.get("/?label=zzz").text
    assert client.get("/?state=bogus").status_code == 400
    assert client.get("/?limit=7").status_code == 400
    r = client.get(f"/experiments/{exp['id']}")
    assert r.status_code == 200 and "Learning curves" in r.text and "searcher:" in r.text
    trial_id = exp["trialIds"][0]
    assert client.get(f"/trials/{trial_id}").status_code == 200
    for path in (f"/ui/fragments/experiments/{exp['id']}?part=tables", f"/ui/fragments/experiments/{exp['id']}",
                 f"/ui/fragments/trials/{trial_id}", f"/ui/fragments/trials/{trial_id}?part=checkpoints",
                 "/ui/fragments/cluster", "/cluster", "/models"):
        assert client.get(path).status_code == 200, path
    assert client.get(f"/ui/fragments/experiments/{exp['id']}?part=nope").status_code == 400
    assert client.get(f"/ui/data/experiments/{exp['id']}/metrics").json() == {"groups": {}, "searcherMetric": "val_loss"}
    curves = client.get(f"/ui/data/experiments/{exp['id']}/curves", params={"group": "validation", "metric": "val_loss"})
    assert curves.json()["series"] == [{"trialId": trial_id, "x": [], "y": [], "total": 0}]
    assert curves.json()["bestTrialId"] is None  # nothing validated yet
    assert client.get(f"/ui/fragments/trials/{trial_id}?part=nope").status_code == 400
    assert client.get(f"/ui/data/experiments/{exp['id']}/curves").status_code == 400  # no metric named
    assert client.get(f"/ui/data/trials/{trial_id}/metrics").json() == {"groups": {}}
    logs = client.get(f"/ui/data/trials/{trial_id}/logs", params={"search": "x"}).json()
    assert logs["lines"] == [] and logs["over"] is False
    assert client.get(f"/ui/data/trials/{trial_id}/logs", params={"after": "x"}).status_code == 400
    assert client.get("/ui/data/pools/default/history").json()["provisioned"]["y"][-1] == 0
    assert client.get("/ui/data/pools/nope/history").status_code == 404


def test_bad_ids_are_clear_pages(client, admin_headers) -> None:  # type: ignore[no-untyped-def]
    ui_login(client)
    for path, status in (("/experiments/999999", 404), ("/experiments/abc", 400), ("/experiments/99999999999", 400),
                         ("/trials/424242", 404), ("/ui/data/trials/424242/metrics", 404)):
        r = client.get(path)
        assert r.status_code == status and "Traceback" not in r.text, path
        if path.startswith("/ui/data/"):
            assert r.json()["code"] == 404
            continue
        assert 'id="error-message"' in r.text
        if status == 404:
            api = client.get("/api/v1" + path, headers=admin_headers)
            assert api.status_code == 404 and api.json()["message"] in r.text


def test_actions_need_csrf_and_rights(client, admin_headers) -> None:  # type: ignore[no-untyped-def]
    exp_id = create_ok(client, admin_headers)["experiment"]["id"]
    ui_login(client)
    csrf = page_csrf(client, f"/experiments/{exp_id}")
    # No token, or another session's: refused, nothing changes.
    assert client.post(f"/experiments/{exp_id}/actions/pause", follow_redirects=False).status_code == 403
    assert client.post(f"/experiments/{exp_id}/actions/pause", data={"csrf": "0" * 64}).status_code == 403
    assert client.get(f"/api/v1/experiments/{exp_id}", headers=admin_headers).json()["experiment"]["state"] == "STATE_ACTIVE"
    r = client.post(f"/experiments/{exp_id}/actions/pause", data={"csrf": csrf}, follow_redirects=False)
    assert r.status_code == 303
    assert client.get(f"/api/v1/experiments/{exp_id}", headers=admin_headers).json()["experiment"]["state"] == "STATE_PAUSED"
    # htmx sends the token in a header.
    r = client.post(f"/experiments/{exp_id}/actions/activate", headers={"X-CSRF-Token": csrf}, follow_redirects=False)
    assert r.status_code == 303
    r = client.post(f"/experiments/{exp_id}/actions/archive", data={"csrf": csrf})
    assert r.status_code == 409 and "only a finished experiment can be archived" in r.text
    assert client.post(f"/experiments/{exp_id}/actions/explode", data={"csrf": csrf}).status_code == 400
    r = client.post(f"/experiments/{exp_id}/labels", data={"csrf": csrf, "add": "new-label"}, follow_redirects=False)
    assert r.status_code == 303
    assert "new-label" in client.get(f"/api/v1/experiments/{exp_id}", headers=admin_headers).json()["experiment"]["labels"]
    assert client.post(f"/experiments/{exp_id}/labels", data={"csrf": csrf, "add": " "}).status_code == 400
    client.post(f"/experiments/{exp_id}/labels", data={"csrf": csrf, "remove": "new-label"})
    assert "new-label" not in client.get(f"/api/v1/experiments/{exp_id}", headers=admin_headers).json()["experiment"]["labels"]

    # Another user pressing kill: the API's 403, as a page.
    make_user(client, admin_headers)
    bob_api = login(client, "bob", "bob-password-1")
    api = client.post(f"/api/v1/experiments/{exp_id}/kill", headers=bob_api)
    client.cookies.clear()
    ui_login(client, "bob", "bob-password-1")
    bob_csrf = page_csrf(client, f"/experiments/{exp_id}")
    r = client.post(f"/experiments/{exp_id}/actions/kill", data={"csrf": bob_csrf})
    assert r.status_code == api.status_code == 403
    assert api.json()["message"] in r.text and "Traceback" not in r.text
    assert client.get(f"/api/v1/experiments/{exp_id}", headers=admin_headers).json()["experiment"]["state"] == "STATE_ACTIVE"
    assert client.post("/experiments/999999/actions/kill", data={"csrf": bob_csrf}).status_code == 404


def test_unknown_path_is_a_page_for_a_browser_and_json_for_the_api(client, admin_headers) -> None:  # type: ignore[no-untyped-def]
    html = {"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}
    r = client.get("/no/such/page", headers=html)
    assert r.status_code == 404 and r.headers["content-type"].startswith("text/html")
    assert "There is no page at /no/such/page" in r.text and 'id="home-link" href="/"' in r.text.replace(
        'href="/" id="home-link"', 'id="home-link" href="/"')
    assert 'href="/cluster"' not in r.text  # no session: no navigation
    for path, headers in (("/no/such/page", {}), ("/no/such/page", {"Accept": "application/json"}),
                          ("/api/v1/nothing-here", html), ("/api/v1/nothing-here", admin_headers)):
        r = client.get(path, headers=headers)
        assert r.status_code == 404 and r.json()["code"] == 404, (path, headers)  # Determined's error body
    assert client.post("/no/such/page", headers=html).json()["code"] == 404
    ui_login(client)
    r = client.get("/experimentz", headers=html)
    assert r.status_code == 404 and 'href="/cluster"' in r.text  # logged in: the navigation too
    # A favicon, linked from every page and at the path browsers try.
    assert 'rel="icon" href="/ui/static/favicon.svg"' in client.get("/").text
    icon = client.get("/favicon.ico")
    assert icon.status_code == 200 and icon.headers["content-type"].startswith("image/svg+xml")


def test_login_returns_to_the_page_and_refuses_other_sites(client) -> None:  # type: ignore[no-untyped-def]
    r = client.get("/cluster?x=1", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/login?next=%2Fcluster%3Fx%3D1"
    assert 'name="next" value="/cluster?x=1"' in client.get(r.headers["location"]).text
    r = ui_login(client, next_="/cluster?x=1")
    assert r.status_code == 303 and r.headers["location"] == "/cluster?x=1"
    for evil in ("//evil.example", "//evil.example/x", "https://evil.example/", "http:/evil.example",
                 "/\\evil.example", "/\t/evil.example", "javascript:alert(1)", "evil.example", "/\n/evil.example"):
        assert client.get("/login", params={"next": evil}).text.count('name="next" value="/"') == 1, evil
        r = ui_login(client, next_=evil)
        assert r.status_code == 303 and r.headers["location"] == "/", evil
    # A session that expires on a page: re-login comes back to it (the page itself, and its live parts).
    token = client.cookies.get(SESSION_COOKIE)
    assert client.post("/api/v1/auth/logout", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    client.cookies.set(SESSION_COOKIE, token)
    r = client.get("/models")
    assert r.status_code == 401 and 'name="next" value="/models"' in r.text
    client.cookies.set(SESSION_COOKIE, token)
    r = client.get("/ui/fragments/cluster", headers={"HX-Request": "true", "HX-Current-URL": "http://testserver/cluster"})
    assert r.status_code == 401 and r.headers["HX-Redirect"] == "/login?expired=1&next=%2Fcluster"
    client.cookies.set(SESSION_COOKIE, token)
    r = client.get("/ui/fragments/cluster", headers={"HX-Request": "true", "HX-Current-URL": "https://evil.example/x"})
    assert r.headers["HX-Redirect"] == "/login?expired=1"  # another site's page is not one to return to


def test_actions_follow_the_state_and_the_role(client, admin_headers) -> None:  # type: ignore[no-untyped-def]
    exp_id = create_ok(client, admin_headers)["experiment"]["id"]
    ui_login(client)

    def buttons(text: str) -> set[str]:
        return set(re.findall(r'id="action-(\w+)"', text))

    page = client.get(f"/experiments/{exp_id}")
    assert buttons(page.text) == {"pause", "cancel", "kill"} and 'id="label-input"' in page.text
    fragment = client.get(f"/ui/fragments/experiments/{exp_id}?part=summary")
    assert buttons(fragment.text) == {"pause", "cancel", "kill"} and fragment.headers["X-Shipyard-Final"] == "0"
    csrf = page_csrf(client, f"/experiments/{exp_id}")
    r = client.post(f"/experiments/{exp_id}/actions/pause", data={"csrf": csrf})
    assert r.status_code == 200 and f"Paused experiment {exp_id} (now paused)." in r.text
    assert buttons(r.text) == {"activate", "cancel", "kill"}
    r = client.post(f"/experiments/{exp_id}/actions/kill", data={"csrf": csrf})
    # Paused with nothing running, it is over at once: only archiving is left, and polling stops.
    assert r.status_code == 200 and f"Killing experiment {exp_id}" in r.text and buttons(r.text) == {"archive"}
    assert 'data-final="true"' in r.text
    assert client.get(f"/ui/fragments/experiments/{exp_id}?part=tables").headers["X-Shipyard-Final"] == "1"
    # Killing it again does nothing, and the page says so (it used to say "kill: done").
    r = client.post(f"/experiments/{exp_id}/actions/kill", data={"csrf": csrf})
    assert r.status_code == 200 and f"Nothing to kill: experiment {exp_id} is" in r.text and "done" not in r.text
    # A page's address cannot put its own words on the page.
    assert "hello" not in client.get(f"/experiments/{exp_id}?msg=hello&done=hello").text
    # The API's refusal is shown on the experiment's page, with its status.
    r = client.post(f"/experiments/{exp_id}/actions/activate", data={"csrf": csrf})
    api = client.post(f"/api/v1/experiments/{exp_id}/activate", headers=admin_headers)
    assert r.status_code == api.status_code == 409 and 'id="action-error"' in r.text
    assert "activate: " + api.json()["message"] in r.text.replace("&#39;", "'")

    # Another user (not an admin) sees none of the changing actions, nor the label forms.
    make_user(client, admin_headers)
    client.cookies.clear()
    ui_login(client, "bob", "bob-password-1")
    page = client.get(f"/experiments/{exp_id}")
    assert page.status_code == 200 and not buttons(page.text) and 'id="label-input"' not in page.text
    assert 'name="remove"' not in page.text


def test_an_action_waiting_for_a_lock_leaves_the_other_requests_served(client, admin_headers, master) -> None:  # type: ignore[no-untyped-def]
    """The action's write waits off the event loop: while another transaction holds the experiment
    (SQLite's write lock, PostgreSQL's row lock), the worker still answers other requests. It
    used to block the loop, and with it the request holding the lock whenever that one's commit
    needed the loop: every request of the worker stalled until the busy timeout, then a 500."""
    import threading

    from control_plane.services import access

    exp_id = create_ok(client, admin_headers)["experiment"]["id"]
    ui_login(client)
    csrf = page_csrf(client, f"/experiments/{exp_id}")
    held, served, done = threading.Event(), threading.Event(), threading.Event()
    outcome: dict[str, object] = {}

    def hold() -> None:
        with master.sessions() as s, s.begin():
            access.get_experiment(s, exp_id, for_update=True)
            held.set()
            outcome["served_while_held"] = served.wait(10)

    def act() -> None:
        outcome["action"] = client.post(f"/experiments/{exp_id}/actions/pause", data={"csrf": csrf},
                                        follow_redirects=False).status_code
        done.set()

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(10)
    actor = threading.Thread(target=act)
    actor.start()
    assert not done.wait(0.5)  # the action waits for the lock
    assert client.get("/ui/static/app.css").status_code == 200
    served.set()
    holder.join(15)
    actor.join(15)
    assert outcome == {"served_while_held": True, "action": 303}


def test_model_page_shows_versions_with_metrics_and_is_edited_by_its_owner(client, admin_headers, master) -> None:  # type: ignore[no-untyped-def]
    from tests.control_plane.api.test_checkpoints import ckpt_body, report_ckpt
    from tests.control_plane.api.test_experiments import allocation_headers, only_trial
    from tests.control_plane.api.test_experiments import make_user as api_user
    from tests.control_plane.api.test_trials import report

    alice = api_user(client, admin_headers, "alice")
    api_user(client, admin_headers, "bob")
    trial = only_trial(master, create_ok(client, alice)["experiment"]["id"])
    token = allocation_headers(master, trial)
    for step, loss in ((50, 0.5), (100, 0.25)):
        r = client.post(f"/api/v1/trials/{trial.id}/metrics", headers=token,
                        json=report(trial.id, step, {"val_loss": loss}, group="validation"))
        assert r.status_code == 200, r.text
    uid = report_ckpt(client, token, ckpt_body(trial, 100))
    r = client.post("/api/v1/models", headers=alice, json={"name": "mnist cnn", "description": "digits",
                                                           "metadata": {"dataset": "mnist"}, "labels": ["vision"]})
    assert r.status_code == 200, r.text
    assert client.post("/api/v1/models/mnist cnn/versions", headers=alice, json={"checkpointUuid": uid}).status_code == 200

    r = ui_login(client, "bob", "bob-password-1")
    assert r.status_code == 303, r.text
    listing = client.get("/models")
    assert listing.status_code == 200 and 'href="/models/mnist%20cnn"' in listing.text and "val_loss 0.25" in listing.text
    page = client.get("/models/mnist cnn")
    assert page.status_code == 200, page.text
    # The version's metrics are the trial's validation at the checkpoint's step (0.25, not 0.5).
    assert "val_loss 0.25" in page.text and "val_loss 0.5" not in page.text
    assert f'href="/trials/{trial.id}#ckpt-{uid}"' in page.text and "digits" in page.text and "&#34;dataset&#34;: &#34;mnist&#34;" in page.text
    assert 'class="who">bob' in page.text, re.findall(r'class="who">[^<]*', page.text)
    assert 'id="model-edit"' not in page.text and "Only the model's owner (alice)" in page.text
    csrf = re.search(r'name="csrf" value="([^"]+)"', client.get("/").text).group(1)
    r = client.post("/models/mnist cnn/edit", data={"csrf": csrf, "description": "mine now", "labels": "x"})
    assert r.status_code == 403 and "edit: model &#39;mnist cnn&#39; belongs to another user" in r.text, r.text
    assert "changing it needs Editor" in r.text  # the authorization service's answer (services/authz.py)
    assert client.get("/api/v1/models/mnist cnn", headers=alice).json()["model"]["description"] == "digits"
    assert client.post("/models/mnist cnn/edit", data={"description": "no csrf"}).status_code == 403
    assert client.get("/models/nope").status_code == 404
    # ClusterAdmin by role (no admin flag): offered the edit, as the service admits it.
    from tests.control_plane.api.test_rbac import CLUSTER_ADMIN, _assign, _ids
    assert _assign(client, admin_headers, CLUSTER_ADMIN, user=_ids(client, admin_headers)["bob"]).status_code == 200
    assert 'id="model-edit"' in client.get("/models/mnist cnn").text
    assert _assign(client, admin_headers, CLUSTER_ADMIN, user=_ids(client, admin_headers)["bob"],
                   remove=True).status_code == 200

    client.cookies.clear()
    ui_login(client, "alice", "alice-password-1")
    csrf = page_csrf(client, "/models/mnist cnn")
    r = client.post("/models/mnist cnn/edit", data={"csrf": csrf, "description": "handwritten digits",
                                                     "labels": "vision, cnn, vision"}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/models/mnist%20cnn?saved=1"
    m = client.get("/api/v1/models/mnist cnn", headers=alice).json()["model"]
    assert m["description"] == "handwritten digits" and m["labels"] == ["vision", "cnn"]
    r = client.post("/models/mnist cnn/edit", data={"csrf": csrf, "description": "handwritten digits", "labels": "cnn",
                                                     "metadata": '{"dataset": "mnist", "layers": 4}', "notes": "# v2"},
                    follow_redirects=False)
    assert r.status_code == 303
    m = client.get("/api/v1/models/mnist cnn", headers=alice).json()["model"]
    assert (m["metadata"], m["notes"], m["labels"]) == ({"dataset": "mnist", "layers": 4}, "# v2", ["cnn"])
    assert 'id="model-notes"># v2</pre>' in client.get("/models/mnist cnn").text
    for bad in ("[1]", "{oops"):
        r = client.post("/models/mnist cnn/edit", data={"csrf": csrf, "metadata": bad})
        assert r.status_code == 400 and "metadata" in r.text, r.text
    assert client.get("/api/v1/models/mnist cnn", headers=alice).json()["model"]["metadata"]["layers"] == 4
    r = client.post("/models/mnist cnn/edit", data={"csrf": csrf, "description": "d", "labels": "x" * 300})
    assert r.status_code == 400 and "at most 255 characters" in r.text, r.text
