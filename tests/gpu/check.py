"""The GPU checks of tests/gpu/check.sh (which has made sure nvidia-smi lists a GPU): a local cluster
from this checkout (`det deploy local up` on a throwaway state directory and port), trials through
the REST API, one PASS/FAIL/SKIP line per check. Exit status: 0 when nothing failed, else 1."""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import yaml

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = float(os.environ.get("GPU_CHECK_TIMEOUT_S", "600"))
MARK = "gpu-check "

# What a trial reports of its GPUs: CUDA_VISIBLE_DEVICES, what torch sees, and a matmul on the GPU.
PROBE_PY = f"""\
import json, os
from harness import core

out = {{"cvd": os.environ.get("CUDA_VISIBLE_DEVICES"), "torch": None}}
try:
    import torch
    x = torch.randn(256, 256, device="cuda")
    out["torch"] = {{"count": torch.cuda.device_count(), "sum_ok": bool(torch.isfinite((x @ x).sum()).item()),
                    "name": torch.cuda.get_device_name(0)}}
except Exception as e:
    out["error"] = f"{{type(e).__name__}}: {{e}}"
print({MARK!r} + json.dumps(out), flush=True)
with core.init() as ctx:
    for op in ctx.searcher.operations():
        ctx.train.report_validation_metrics(op.length, {{"loss": 0.5}})
        op.report_completed(0.5)
"""

# Two processes, one GPU each: an all_reduce over NCCL, then a few DDP steps.
NCCL_PY = f"""\
import json
import torch
import torch.distributed as dist
from torch import nn
from harness import core

with core.init() as ctx:
    rank = ctx.distributed.rank
    device = torch.device("cuda", ctx.distributed.local_rank if torch.cuda.device_count() > 1 else 0)
    t = torch.tensor([float(rank + 1)], device=device)
    dist.all_reduce(t)
    net = nn.parallel.DistributedDataParallel(nn.Linear(8, 1).to(device), device_ids=[device.index])
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for _ in range(20):
        loss = net(torch.randn(32, 8, device=device)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    print({MARK!r} + json.dumps({{"rank": rank, "size": ctx.distributed.size, "backend": dist.get_backend(),
                                 "sum": t.item()}}), flush=True)
    for op in ctx.searcher.operations():
        if ctx.distributed.is_chief:
            ctx.train.report_validation_metrics(op.length, {{"loss": float(loss)}})
            op.report_completed(float(loss))
"""

failed = False


def report(status: str, check: str, detail: str = "") -> None:
    global failed
    failed = failed or status == "FAIL"
    print(f"{status} {check}" + (f": {detail}" if detail else ""), flush=True)


def gpus() -> list[str]:
    out = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def det(*args: str) -> subprocess.CompletedProcess[str]:
    # The trials' `python3` is this interpreter (its directory first on PATH), torch included.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run([sys.executable, "-m", "cli.main", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600, check=False)


class Cluster:
    def __init__(self, url: str, state: Path) -> None:
        password = (state / "admin-password").read_text().strip()
        r = httpx.post(url + "/api/v1/auth/login", json={"username": "admin", "password": password}, timeout=30)
        r.raise_for_status()
        self.url, self.headers = url, {"Authorization": f"Bearer {r.json()['token']}"}

    def get(self, path: str) -> Any:
        r = httpx.get(self.url + path, headers=self.headers, timeout=30)
        r.raise_for_status()
        return r.json()

    def run(self, train_py: str, slots: int = 1, entrypoint: str = "python3 train.py") -> tuple[str, list[dict[str, Any]], str]:
        """Submit a one-trial experiment and wait for it: (final state, its gpu-check records, log tail)."""
        config = {"name": "gpu-check", "entrypoint": entrypoint, "max_restarts": 0,
                  "searcher": {"name": "single", "metric": "loss", "smaller_is_better": True,
                               "max_length": {"batches": 1}},
                  "resources": {"slots_per_trial": slots}}
        files = [{"path": "train.py", "type": 48, "content": base64.b64encode(train_py.encode()).decode(),
                  "mode": 0o644, "mtime": "0", "uid": 0, "gid": 0}]
        r = httpx.post(self.url + "/api/v1/experiments", headers=self.headers, timeout=30,
                       json={"config": yaml.safe_dump(config), "modelDefinition": files, "activate": True})
        r.raise_for_status()
        trial_id = r.json()["experiment"]["trialIds"][0]
        deadline = time.monotonic() + TIMEOUT_S
        state = ""
        while time.monotonic() < deadline:
            state = self.get(f"/api/v1/trials/{trial_id}")["trial"]["state"]
            if state in ("STATE_COMPLETED", "STATE_ERROR", "STATE_CANCELED"):
                break
            time.sleep(1)
        r = httpx.get(f"{self.url}/api/v1/trials/{trial_id}/logs", headers=self.headers, timeout=30)
        lines = [json.loads(x)["result"]["log"] for x in r.text.splitlines() if x.strip()]
        records = [json.loads(line.split(MARK, 1)[1]) for line in lines if MARK in line]
        return state, records, "".join(lines)[-800:].replace("\n", " | ")


@contextmanager
def cluster(*runtime: str) -> Iterator[Cluster | None]:
    state = Path(tempfile.mkdtemp(prefix="shipyard-gpu-check-"))
    port = free_port()
    up = det("deploy", "local", "up", "--state-dir", str(state), "--port", str(port), "--agents", "1", *runtime)
    try:
        if up.returncode != 0:
            report("FAIL", f"det deploy local up {' '.join(runtime)}".strip(), (up.stdout + up.stderr)[-600:])
            yield None
        else:
            yield Cluster(f"http://127.0.0.1:{port}", state)
    finally:
        det("deploy", "local", "down", "--state-dir", str(state))
        shutil.rmtree(state, ignore_errors=True)


def check_probe(c: Cluster, uuids: list[str], where: str) -> None:
    state, records, tail = c.run(PROBE_PY)
    if state != "STATE_COMPLETED" or not records:
        report("FAIL", f"torch.cuda in {where}", f"trial {state}; log: {tail}")
        return
    rec = records[0]
    if where == "the process runtime":
        ok = rec["cvd"] is not None and rec["cvd"] in uuids
        report("PASS" if ok else "FAIL", "a trial sees exactly its CUDA_VISIBLE_DEVICES",
               f"CUDA_VISIBLE_DEVICES={rec['cvd']} (agent's GPUs: {','.join(uuids)})")
    t = rec.get("torch")
    ok = bool(t) and t["count"] == 1 and t["sum_ok"]
    report("PASS" if ok else "FAIL", f"torch.cuda in {where}",
           f"{t['count']} device(s) visible, {t['name']}" if t else rec.get("error", "no torch"))


def main() -> int:
    uuids = gpus()
    print(f"GPUs: {len(uuids)} ({', '.join(uuids)})", flush=True)
    with cluster() as c:
        if c is not None:
            agents = c.get("/api/v1/agents")["agents"]
            slots = [s["device"] for a in agents for s in a["slots"].values()]
            ok = (len(agents) == 1 and all(d["type"] == "TYPE_CUDA" for d in slots)
                  and sorted(d["uuid"] for d in slots) == sorted(uuids))
            report("PASS" if ok else "FAIL", "the agent finds the GPUs as cuda slots",
                   f"slots {[(d['type'], d['uuid']) for d in slots]}")
            check_probe(c, uuids, "the process runtime")
            if len(uuids) < 2:
                report("SKIP", "2-process NCCL training", "one GPU here; it needs two")
            else:
                state, records, tail = c.run(NCCL_PY, slots=2,
                                             entrypoint="python3 -m harness.launch.torch_distributed train.py")
                ok = (state == "STATE_COMPLETED" and len(records) == 2
                      and all(r["backend"] == "nccl" and r["sum"] == 3.0 for r in records))
                report("PASS" if ok else "FAIL", "2-process NCCL training", f"trial {state}; ranks {records or tail}")
    image = os.environ.get("GPU_ENV_IMAGE")
    with cluster("--runtime", "docker", *(["--env-image", image] if image else [])) as c:
        if c is not None:
            check_probe(c, uuids, "a Docker container with a device request")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
