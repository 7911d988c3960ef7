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
    ap.add_argument("--max-agents", type=int, default=2, help="the elastic local pool's max_instances")
    ap.add_argument("--keep", action="store_true", help="leave the cluster running")
    ap.add_argument("--timeout", type=float, default=900)
    args = ap.parse_args()

    state = ROOT / ".state" / "demo"
    os.environ.setdefault("SHIPYARD_CLI_DIR", str(state / "cli"))
    deploy_local.down(state, quiet=True)
    port = free_port()
    state.mkdir(parents=True, exist_ok=True)
    master_yaml = state / "master.yaml"
    # An elastic local pool: agents are launched as processes when trials wait, and terminated
    # after 15 s idle, so the pool goes 0 -> N -> 0 with the demand.
    master_yaml.write_text(
        "resource_pools:\n"
        "  - name: default\n"
        "    description: elastic local pool (agents as processes)\n"
        "    provider:\n"
        "      type: local\n"
        "      min_instances: 0\n"
        f"      max_instances: {args.max_agents}\n"
        "      max_idle_agent_period: 15s\n"
        "      slots_per_instance: 1\n"
    )
    print(f"==> Starting a local cluster in {state}: master on 127.0.0.1:{port} (SQLite), "
          f"elastic local pool of 0..{args.max_agents} agents")
    t0 = time.monotonic()
    cluster = deploy_local.up(state, agents=0, port=port, db=None, slots=1, pool_config=master_yaml)
    url = cluster["master_url"]
    print(f"    up in {time.monotonic() - t0:.1f}s")
    print(f"==> Web UI: {url}/  (user admin, password in {state / 'admin-password'})")
    try:
        _, token = TokenStore().get(url, "admin")
        s = Session(url, token)
        example = ROOT / "examples" / "spirals"
        cfg = (example / args.config).read_text()
        exp = s.post("/api/v1/experiments", {"config": cfg, "modelDefinition": files_of(example)})["experiment"]
        print(f"==> Experiment {exp['id']} ({exp['name']}) submitted: {args.config}")
        last = ""
        deadline = time.monotonic() + args.timeout
        ended = False
        while time.monotonic() < deadline:
            e = s.get(f"/api/v1/experiments/{exp['id']}")["experiment"]
            trials = s.get(f"/api/v1/experiments/{exp['id']}/trials", params={"limit": 1000})["trials"]
            pool = s.get("/api/v1/resource-pools")["resourcePools"][0]
            counts: dict[str, int] = {}
            for t in trials:
                counts[t["state"].removeprefix("STATE_")] = counts.get(t["state"].removeprefix("STATE_"), 0) + 1
            agents = pool["numAgents"]
            line = (f"    [{time.monotonic() - t0:5.0f}s] experiment {e['state'].removeprefix('STATE_'):<10} "
                    f"progress {e.get('progress') or 0:4.0%}  trials {counts}  pool: {agents} agents, "
                    f"{len(pool['instances'])} instances")
            if line.split("] ", 1)[1] != last:
                print(line, flush=True)
                reasons = (pool.get("lastDecision") or {}).get("reasons") or []
                if reasons and not reasons[0].startswith("steady"):
                    print(f"             autoscaler: {'; '.join(reasons)}", flush=True)
                last = line.split("] ", 1)[1]
            ended = e["state"] in ("STATE_COMPLETED", "STATE_ERROR", "STATE_CANCELED")
            if ended and not pool["instances"]:
                break  # the experiment is over and the pool has scaled back to zero
            time.sleep(1)
        else:
            print("!!  timed out waiting for the experiment" if not ended else "!!  the pool did not scale to zero")
            return 1
        summarize(s, exp["id"], url)
        return 0 if e["state"] == "STATE_COMPLETED" else 1
    finally:
        if args.keep:
            print(f"==> Cluster left running: web UI {url}/ ; det -m {url} ... ; "
                  f"stop it with: det deploy local down --state-dir {state}")
        else:
            deploy_local.down(state, quiet=True)
            print("==> Local cluster stopped (logs kept in", state, ")")


def summarize(s: Session, exp_id: int, url: str) -> None:
    trials = s.get(f"/api/v1/experiments/{exp_id}/trials", params={"limit": 1000})["trials"]
    print(f"\n==> Experiment {exp_id}: {len(trials)} trials")
    print(f"    {'trial':>5}  {'state':<10} {'rung':>4} {'steps':>6} {'best val loss':>14}  hparams")
    best = None
    for t in trials:
        bv = t.get("searcherMetricValue")
        bv = float(bv) if isinstance(bv, int | float) else None
        shown = "-" if bv is None else f"{bv:.4f}"
        hp = {k: (round(v, 5) if isinstance(v, float) else v) for k, v in t["hparams"].items()}
        print(f"    {t['id']:>5}  {t['state'].removeprefix('STATE_'):<10} {t.get('rung', 0):>4} "
              f"{t.get('totalBatchesProcessed', 0):>6} {shown:>14}  {hp}")
        if bv is not None and (best is None or bv < best[0]):
            best = (bv, t)
    ckpts = s.get(f"/api/v1/experiments/{exp_id}/checkpoints")["checkpoints"]
    if best:
        ck = (best[1].get("bestCheckpoint") or {}).get("uuid")
        print(f"\n    best validation_loss {best[0]:.4f} from trial {best[1]['id']}"
              + (f", checkpoint {ck}" if ck else ""))
    live = [c for c in ckpts if c.get("state") != "STATE_DELETED"]
    print(f"    {len(live)} checkpoints kept after GC (policy: best and latest per trial)")
    print("\n==> Where to look next")
    print(f"    web UI: {url}/experiments/{exp_id}   (while the cluster runs: make demo DEMO_ARGS=--keep)")
    print(f"    det -m {url} experiment describe {exp_id}")
    print(f"    det -m {url} trial logs {best[1]['id'] if best else (trials[0]['id'] if trials else 1)}")
    print(f"    det -m {url} checkpoint list {exp_id}")
    print(f"    det -m {url} resource-pool describe default")
    print(f"    API docs: {url}/docs   (keep the cluster running with: make demo DEMO_ARGS=--keep)")
    print(f"    logs: {ROOT / '.state' / 'demo'} (master.log, local-instances/)")


if __name__ == "__main__":
    sys.exit(main())
