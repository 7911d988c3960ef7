"""`make demo`: a local cluster runs the example experiment end to end, then prints a summary and
where to look next. Everything lives under .state/demo; the cluster is taken down at the end
unless --keep is given."""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cli import deploy_local  # noqa: E402
from cli.session import Session, TokenStore  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def files_of(folder: Path) -> list[dict]:
    import base64

    out = []
    for p in sorted(folder.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            out.append({"path": str(p.relative_to(folder)), "type": 48, "content": base64.b64encode(p.read_bytes()).decode(),
                        "mode": 0o644, "mtime": int(p.stat().st_mtime), "uid": 0, "gid": 0})
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="adaptive.yaml", help="experiment config in examples/spirals")
    ap.add_argument("--agents", type=int, default=2)
    ap.add_argument("--keep", action="store_true", help="leave the cluster running")
    ap.add_argument("--timeout", type=float, default=900)
    args = ap.parse_args()

    state = ROOT / ".state" / "demo"
    os.environ.setdefault("SHIPYARD_CLI_DIR", str(state / "cli"))
    deploy_local.down(state, quiet=True)
    port = free_port()
    print(f"==> Starting a local cluster (master on 127.0.0.1:{port}, {args.agents} agents, SQLite) in {state}")
    t0 = time.monotonic()
    cluster = deploy_local.up(state, agents=args.agents, port=port, db=None, slots=1, pool_config=None)
    url = cluster["master_url"]
    print(f"    up in {time.monotonic() - t0:.1f}s")
    try:
        _, token = TokenStore().get(url, "admin")
        s = Session(url, token)
        example = ROOT / "examples" / "spirals"
        cfg = (example / args.config).read_text()
        exp = s.post("/api/v1/experiments", {"config": cfg, "modelDefinition": files_of(example)})["experiment"]
        print(f"==> Experiment {exp['id']} ({exp['name']}) submitted: {args.config}")
        last = ""
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            e = s.get(f"/api/v1/experiments/{exp['id']}")["experiment"]
            trials = s.get(f"/api/v1/experiments/{exp['id']}/trials", params={"limit": 1000})["trials"]
            counts: dict[str, int] = {}
            for t in trials:
                counts[t["state"].removeprefix("STATE_")] = counts.get(t["state"].removeprefix("STATE_"), 0) + 1
            line = f"    {e['state'].removeprefix('STATE_'):<10} progress {e.get('progress') or 0:.0%}  trials {counts}"
            if line != last:
                print(line, flush=True)
                last = line
            if e["state"] in ("STATE_COMPLETED", "STATE_ERROR", "STATE_CANCELED"):
                break
            time.sleep(1)
        else:
            print("!!  timed out waiting for the experiment")
            return 1
        summarize(s, exp["id"], url)
        return 0 if e["state"] == "STATE_COMPLETED" else 1
    finally:
        if args.keep:
            print(f"==> Cluster left running: det -m {url} ... ; stop it with: det deploy local down --state-dir {state}")
        else:
            deploy_local.down(state, quiet=True)
            print("==> Local cluster stopped (logs kept in", state, ")")


def summarize(s: Session, exp_id: int, url: str) -> None:
    trials = s.get(f"/api/v1/experiments/{exp_id}/trials", params={"limit": 1000})["trials"]
    print(f"\n==> Experiment {exp_id}: {len(trials)} trials")
    print(f"    {'trial':>5}  {'state':<10} {'steps':>6} {'best val loss':>14}  hparams")
    best = None
    for t in trials:
        bv = (t.get("bestValidation") or {}).get("metrics", {}).get("validation_loss") if isinstance(t.get("bestValidation"), dict) else None
        steps = t.get("totalBatchesProcessed")
        print(f"    {t['id']:>5}  {t['state'].removeprefix('STATE_'):<10} {steps!s:>6} {bv if bv is None else f'{bv:.4f}':>14}  {t['hparams']}")
        if isinstance(bv, float) and (best is None or bv < best[0]):
            best = (bv, t)
    ckpts = s.get(f"/api/v1/experiments/{exp_id}/checkpoints")["checkpoints"]
    if best:
        print(f"\n    best validation_loss {best[0]:.4f} from trial {best[1]['id']}")
    if ckpts:
        c = ckpts[0]
        print(f"    {len(ckpts)} checkpoints kept; e.g. {c['uuid']} (steps {c.get('metadata', {}).get('steps_completed')})")
    print("\n==> Where to look next")
    print(f"    det -m {url} experiment describe {exp_id}")
    print(f"    det -m {url} trial logs {trials[0]['id'] if trials else 1}")
    print(f"    det -m {url} checkpoint list {exp_id}")
    print(f"    API docs: {url}/docs   (while the cluster runs: make demo DEMO_ARGS=--keep)")


if __name__ == "__main__":
    sys.exit(main())
