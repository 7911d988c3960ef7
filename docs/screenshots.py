"""Screenshots of every page of the web UI, light and dark, into docs/screenshots/ (listed in
docs/UI.md). Brings up a small real cluster (tests/ui/conftest.py's: a master with an elastic local
pool whose agents the autoscaler launches as processes), runs a three-trial random search to its end,
registers its best checkpoint in a model, and photographs each page at 1280x800 in headless Chromium
(playwright, as the browser tests). PNGs are reduced to a 256-colour palette (Pillow) to stay small.

    .venv/bin/python docs/screenshots.py [--out docs/screenshots]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.ui.conftest import CHROMIUM, CHROMIUM_ARGS, UICluster, running  # noqa: E402

SIZE = {"width": 1280, "height": 800}


def shrink(path: Path) -> None:
    """A palette PNG: a page of flat colours loses nothing visible and most of its bytes."""
    try:
        from PIL import Image
    except ImportError:
        return
    with Image.open(path) as img:
        small = img.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    small.save(path, optimize=True)


def prepare(c: UICluster) -> dict[str, str]:
    """An experiment run to its end, its best checkpoint registered as a model's version; the pages."""
    assert c.api
    exp = c.submit("mnist-lr-search", length=60, step_sleep=0.03, validate_every=10, trials=3)
    deadline = time.monotonic() + 300
    while c.state_of(exp["id"]) not in ("STATE_COMPLETED", "STATE_ERROR", "STATE_CANCELED"):
        if time.monotonic() > deadline:
            raise SystemExit(f"experiment {exp['id']} did not finish: {c.state_of(exp['id'])}")
        time.sleep(1)
    trials = c.api.get(f"/api/v1/experiments/{exp['id']}/trials").json()["trials"]
    ckpts = [k for t in trials for k in c.api.get(f"/api/v1/trials/{t['id']}/checkpoints").json()["checkpoints"]
             if k["training"].get("searcherMetric") is not None and k["state"] == "STATE_COMPLETED"]
    best_ckpt = min(ckpts, key=lambda k: k["training"]["searcherMetric"], default=None)
    best_trial = best_ckpt["training"]["trialId"] if best_ckpt else trials[0]["id"]
    r = c.api.post("/api/v1/models", json={"name": "mnist-cnn", "description": "Digit classifier from the lr search.",
                                           "labels": ["vision", "production"], "metadata": {"dataset": "mnist", "owner_team": "ml"}})
    assert r.status_code == 200, r.text
    if best_ckpt:
        r = c.api.post("/api/v1/models/mnist-cnn/versions", json={"checkpointUuid": best_ckpt["uuid"], "name": "best of the search"})
        assert r.status_code == 200, r.text
    team = _team(c, exp["id"])
    return {"experiments": "/", "experiment": f"/experiments/{exp['id']}",
            "experiment-hparams": f"/experiments/{exp['id']}#parallel", "trial": f"/trials/{best_trial}",
            "cluster": "/cluster", "models": "/models", "model": "/models/mnist-cnn", "not-found": "/no/such/page",
            "workspaces": "/workspaces", "workspace": f"/workspaces/{team['ws']}",
            "project": f"/?workspace={team['ws']}&project={team['project']}",
            "tasks": "/tasks", "task": f"/tasks/{team['cmd']}"}


def _team(c: UICluster, exp_id: int) -> dict[str, str]:
    """A workspace with two projects, the search moved into one of them, and a running command
    with a few log lines (0 slots: it shares the agent the search left)."""
    assert c.api
    ws = c.api.post("/api/v1/workspaces", json={"name": "research"}).json()["workspace"]["id"]
    projects = [c.api.post(f"/api/v1/workspaces/{ws}/projects", json={"name": name, "workspaceId": ws,
                                                                      "description": about}).json()["project"]["id"]
                for name, about in (("vision", "Image classifiers"), ("nlp", "Text models"))]
    r = c.api.post(f"/api/v1/experiments/{exp_id}/move", json={"destinationProjectId": projects[0]})
    assert r.status_code == 200, r.text
    script = "for i in 1 2 3; do echo preparing shard $i of 3; done; echo data ready; sleep 600"
    cmd = c.api.post("/api/v1/commands", json={"config": {"entrypoint": ["sh", "-c", script], "description": "prepare-data",
                                                          "resources": {"slots": 0}}}).json()["command"]["id"]
    deadline = time.monotonic() + 120
    while c.api.get(f"/api/v1/commands/{cmd}").json()["command"]["state"] != "STATE_RUNNING":
        if time.monotonic() > deadline:
            raise SystemExit(f"command {cmd} did not start")
        time.sleep(1)
    time.sleep(2)  # its first lines shipped
    return {"ws": str(ws), "project": str(projects[0]), "cmd": cmd}


def shoot(c: UICluster, pages: dict[str, str], out: Path) -> list[Path]:
    from playwright.sync_api import sync_playwright

    made = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        for scheme in ("light", "dark"):
            ctx = browser.new_context(base_url=c.url, viewport=SIZE, color_scheme=scheme)
            page = ctx.new_page()
            page.goto("/login")
            made.append(out / f"login-{scheme}.png")
            page.screenshot(path=made[-1])
            page.fill("input[name=username]", "admin")
            page.fill("input[name=password]", c.password)
            with page.expect_navigation():
                page.click("button[type=submit]")
            for name, path in pages.items():
                page.goto(path)
                page.wait_for_load_state("networkidle")
                page.wait_for_timeout(800)  # the charts' first draw
                if "#" in path:  # the part below the first screen
                    page.locator("#" + path.split("#", 1)[1]).evaluate("e => e.closest('section').scrollIntoView()")
                made.append(out / f"{name}-{scheme}.png")
                page.screenshot(path=made[-1])
            ctx.close()
        browser.close()
    for f in made:
        shrink(f)
    return made


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["SHIPYARD_CLI_DIR"] = str(Path(tmp) / "cli")
        with running(UICluster(Path(tmp) / "cluster")) as c:
            made = shoot(c, prepare(c), args.out)
    for f in made:
        print(f"{f.relative_to(ROOT) if f.is_relative_to(ROOT) else f}  {f.stat().st_size // 1024} KiB")


if __name__ == "__main__":
    main()
