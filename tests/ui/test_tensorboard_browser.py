"""A TensorBoard task in headless Chromium through the master (issue 29): a finished experiment's
TensorBoard, launched into the elastic local pool (its demand starts an agent), renders the trial's
scalars at /proxy/<id>/ for the logged-in browser with its session cookie alone."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tests.ui.conftest import UICluster, running
from tests.ui.test_browser import log_in, new_page


def test_tensorboard_renders_the_scalars_in_chromium_through_the_master(browser: Any, tmp_path: Path) -> None:
    with running(UICluster(tmp_path / "tb-cluster")) as c:
        assert c.api is not None
        exp = c.submit("tb-ui", length=8, step_sleep=0.0, validate_every=4)
        deadline = time.monotonic() + 180
        while c.state_of(exp["id"]) != "STATE_COMPLETED":
            assert time.monotonic() < deadline, "the experiment did not complete"
            time.sleep(0.5)
        r = c.api.post("/api/v1/tensorboards", json={"experimentIds": [exp["id"]],
                                                     "config": {"resources": {"slots": 0}}})
        assert r.status_code == 200, r.text
        tb = r.json()["tensorboard"]
        while not c.api.get(f"/api/v1/tasks/{tb['id']}").json()["task"]["allocations"][0]["isReady"]:
            assert time.monotonic() < deadline, "the TensorBoard never became ready"
            time.sleep(0.5)
        (trial,) = c.api.get(f"/api/v1/experiments/{exp['id']}/trials").json()["trials"]
        page = new_page(browser, c)
        log_in(page, "admin", c.password)
        page.goto(f"/proxy/{tb['id']}/#timeseries")
        # TensorBoard's own page, its data fetched through the master: the run and both scalar tags.
        page.get_by_text(f"exp{exp['id']}-trial{trial['id']}").first.wait_for()
        page.get_by_text("Determined/validation_loss").first.wait_for()
        page.get_by_text("Determined/loss", exact=True).first.wait_for()
        c.api.post(f"/api/v1/tensorboards/{tb['id']}/kill")
