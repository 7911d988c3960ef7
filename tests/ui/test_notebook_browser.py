"""A notebook in headless Chromium through the master (issue 29): logged in to the web UI, the
browser reaches JupyterLab's API at /proxy/<id>/ with its session cookie alone, opens a kernel and
runs `1+1` over the kernel WebSocket through the master; another user's browser gets 404. The
notebook is launched into the elastic local pool with no agent: its demand starts one."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tests.pg import missing_part
from tests.ui.conftest import UICluster, running
from tests.ui.test_browser import log_in, new_page

RUN_CELL = """async ([base, code]) => {
    const kernel = await (await fetch(base + "api/kernels", {method: "POST", body: JSON.stringify({name: "python3"}),
                                                             headers: {"Content-Type": "application/json"}})).json();
    const ws = new WebSocket(location.origin.replace("http", "ws") + base + "api/kernels/" + kernel.id + "/channels");
    const msgId = "m" + Math.random();
    return await new Promise((resolve, reject) => {
        setTimeout(() => reject(new Error("no execute_result")), 60000);
        ws.onerror = () => reject(new Error("websocket error"));
        ws.onopen = () => ws.send(JSON.stringify({
            header: {msg_id: msgId, username: "b", session: "s" + Math.random(), msg_type: "execute_request",
                     version: "5.3"},
            parent_header: {}, metadata: {}, channel: "shell", buffers: [],
            content: {code: code, silent: false, store_history: false, user_expressions: {}, allow_stdin: false}}));
        ws.onmessage = (e) => {
            const m = JSON.parse(e.data);
            if (m.msg_type === "execute_result" && m.parent_header.msg_id === msgId) {
                ws.close();
                resolve(m.content.data["text/plain"]);
            }
        };
    });
}"""


def test_a_cell_runs_from_chromium_through_the_master(browser: Any, tmp_path: Path) -> None:
    try:
        import jupyterlab  # noqa: F401
    except ImportError:
        missing_part("jupyterlab is not installed (pip install -e '.[dev]')")
    with running(UICluster(tmp_path / "nb-cluster")) as c:
        assert c.api is not None
        nb = c.api.post("/api/v1/notebooks", json={"config": {"resources": {"slots": 0}}}).json()["notebook"]
        deadline = time.monotonic() + 120
        while not c.api.get(f"/api/v1/tasks/{nb['id']}").json()["task"]["allocations"][0]["isReady"]:
            assert time.monotonic() < deadline, "the notebook never became ready"
            time.sleep(0.5)
        base = f"/proxy/{nb['id']}/"
        page = new_page(browser, c)
        log_in(page, "admin", c.password)
        page.goto(base + "api/status")
        assert "last_activity" in page.inner_text("body")
        page.goto("/")  # a page of the master's (Jupyter's API answers forbid scripts to connect anywhere)
        assert page.evaluate(RUN_CELL, [base, "1+1"]) == "2"
        c.api.post("/api/v1/users", json={"user": {"username": "trudy"}, "password": "trudy-password-1"})
        other = new_page(browser, c)
        log_in(other, "trudy", "trudy-password-1")
        assert other.goto(base + "api/status").status == 404
        _the_tasks_page(c, page, other, nb["id"])
        c.api.post(f"/api/v1/notebooks/{nb['id']}/kill")


def _the_tasks_page(c: UICluster, page: Any, other: Any, nb_id: str) -> None:
    """The tasks page: a running command and the notebook, Open only for the notebook and only for
    who may open it (its owner, here the admin; another user sees neither task); Kill from the page."""
    assert c.api is not None
    cmd = c.api.post("/api/v1/commands", json={"config": {"entrypoint": ["sleep", "300"],
                                                          "resources": {"slots": 0}}}).json()["command"]
    deadline = time.monotonic() + 120
    while c.api.get(f"/api/v1/commands/{cmd['id']}").json()["command"]["state"] != "STATE_RUNNING":
        assert time.monotonic() < deadline, "the command never ran"
        time.sleep(0.5)
    page.goto("/tasks")
    row = page.wait_for_selector(f"tr.task[data-task-id='{cmd['id']}'][data-state='running']")
    assert row.query_selector("a.open") is None and row.query_selector("button.kill") is not None
    nb_row = page.wait_for_selector(f"tr.task[data-task-id='{nb_id}']")
    assert nb_row.get_attribute("data-state") == "running"
    assert nb_row.eval_on_selector("a.open", "a => a.getAttribute('href')") == f"/proxy/{nb_id}/"
    other.goto("/tasks")
    assert other.query_selector("tr.task") is None and other.query_selector("a.open") is None
    page.on("dialog", lambda d: d.accept())  # the Kill button asks first
    with page.expect_navigation():
        row.query_selector("button.kill").click()
    assert "Killing the task" in page.inner_text("#flash")
    deadline = time.monotonic() + 60
    while c.api.get(f"/api/v1/commands/{cmd['id']}").json()["command"]["state"] != "STATE_TERMINATED":
        assert time.monotonic() < deadline, "the command was not killed"
        time.sleep(0.5)
