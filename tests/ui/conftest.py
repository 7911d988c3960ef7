"""Browser-test fixtures: Debian's Chromium driven headless by playwright (its own browser download
does not work here, so `executable_path` points at the system one; tests/system_deps.sh installs it),
and a real local cluster: a master process with an elastic local pool whose agents the autoscaler
launches as processes when trials wait. One cluster and one browser per module."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.integration.conftest import model_files
from tests.pg import free_port, missing_part

CHROMIUM = os.environ.get("SHIPYARD_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        missing_part(f"Chromium not found at {CHROMIUM} (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing_part("the playwright package is not installed (pip install -e '.[dev]')")
    with sync_playwright() as p:
        # A fresh profile: playwright launches every browser with a new temporary user-data-dir.
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


class UICluster:
    def __init__(self, state: Path, db: str | None = None) -> None:
        self.state = state
        self.db = db  # None: deploy_local's SQLite file
        self.data: dict[str, Any] = {}
        self.url = ""
        self.password = ""
        self.api: httpx.Client | None = None

    def up(self) -> None:
        from cli import deploy_local

        cfg = self.state / "master.yaml"
        self.state.mkdir(parents=True, exist_ok=True)
        cfg.write_text(yaml.safe_dump({
            "agent_heartbeat_timeout_s": 8, "task_kill_grace_s": 3,
            "resource_pools": [{"name": "default", "description": "elastic local pool", "provider": {
                "type": "local", "min_instances": 0, "max_instances": 2, "max_idle_agent_period": "60s",
                "slots_per_instance": 1}}]}))
        self.data = deploy_local.up(self.state, agents=0, port=free_port(), db=self.db, slots=1, pool_config=cfg)
        self.url = self.data["master_url"]
        self.password = (self.state / "admin-password").read_text().strip()
        token = httpx.post(self.url + "/api/v1/auth/login",
                           json={"username": "admin", "password": self.password}).json()["token"]
        self.api = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=30)

    def down(self) -> None:
        from cli import deploy_local

        if self.api:
            self.api.close()
        deploy_local.down(self.state, quiet=True)

    def submit(self, name: str, *, length: int, step_sleep: float, validate_every: int = 5,
               trials: int = 1) -> dict[str, Any]:
        """`trials` > 1: a random search over the learning rate."""
        assert self.api
        searcher: dict[str, Any] = {"name": "single", "metric": "validation_loss", "max_length": {"batches": length}}
        lr: Any = 0.1
        if trials > 1:
            searcher = {**searcher, "name": "random", "max_trials": trials, "max_concurrent_trials": trials}
            lr = {"type": "log", "base": 10, "minval": -1.5, "maxval": -0.5}
        config = {
            "name": name, "entrypoint": "python3 train.py", "labels": ["ui-test"],
            "hyperparameters": {"lr": lr, "step_sleep": step_sleep, "crash_at": -1, "validate_every": validate_every},
            "searcher": searcher,
            "max_restarts": 0,
        }
        r = self.api.post("/api/v1/experiments", json={"config": yaml.safe_dump(config), "modelDefinition": model_files()})
        assert r.status_code == 200, r.text
        return r.json()["experiment"]

    def state_of(self, exp_id: int) -> str:
        assert self.api
        return self.api.get(f"/api/v1/experiments/{exp_id}").json()["experiment"]["state"]

    def log_tail(self) -> str:
        return Path(self.data["master_log"]).read_text(errors="replace")[-3000:]


# The pages the current test opened (tests/ui/test_browser.py new_page), shown when it fails.
OPEN_PAGES: list[Any] = []
CLUSTERS: list[UICluster] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed browser test says what each of its pages showed (address, text) and the master's
    log tail: a timeout waiting for an element says nothing of the page it waited on."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call":
        return
    if report.failed:
        for i, page in enumerate(OPEN_PAGES):
            try:
                text = page.evaluate("() => document.body ? document.body.innerText : document.documentElement.outerHTML")
                report.sections.append((f"page {i}: {page.url}", str(text)[:2500]))
            except Exception as e:  # a closed page or a dead browser: say so
                report.sections.append((f"page {i}", f"unreadable: {e!r}"))
        for c in CLUSTERS:
            report.sections.append(("master log tail", c.log_tail()))
    # A page left open keeps polling the master (every 3 s per live part) for the rest of the
    # module, slowing the tests after it on a small machine: each test's pages end with it.
    for page in OPEN_PAGES:
        try:
            page.context.close()
        except Exception:  # already closed by the test, or the browser is gone
            pass
    OPEN_PAGES.clear()


@contextlib.contextmanager
def running(c: UICluster) -> Iterator[UICluster]:
    """The cluster up for the block, registered for the failure report, then down."""
    try:
        c.up()
        CLUSTERS.append(c)
        yield c
    finally:
        if c in CLUSTERS:
            CLUSTERS.remove(c)
        c.down()


@pytest.fixture(scope="module")
def ui_cluster(tmp_path_factory: pytest.TempPathFactory, browser: Any) -> Iterator[UICluster]:
    root = tmp_path_factory.mktemp("ui-cluster")
    old = os.environ.get("SHIPYARD_CLI_DIR")
    os.environ["SHIPYARD_CLI_DIR"] = str(root / "cli")
    try:
        with running(UICluster(root / "cluster")) as c:
            yield c
    finally:
        if old is None:
            os.environ.pop("SHIPYARD_CLI_DIR", None)
        else:
            os.environ["SHIPYARD_CLI_DIR"] = old
