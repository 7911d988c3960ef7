"""Notebooks (issue 29): start → ready, and the master's proxy against a direct connection.

Targets (issue 29): notebook start → ready p50 under 5 s on the process runtime (a cached
environment: JupyterLab already installed in the agent's Python); the proxy adds under 2 ms to
the p50 latency of a small request and keeps a large download at ≥ 90% of the direct throughput.

A local cluster (`det deploy local up`: master on SQLite + 1 agent, process runtime). Measured:

- start → ready: `POST /api/v1/notebooks` until `GET /api/v1/tasks/{id}` says isReady (JupyterLab
  answering and its address reported), polled every 50 ms, for --starts notebooks one after another;
- latency: GET /api/status of one notebook, --requests times through `/proxy/<id>/` (with the
  user's bearer token) and as many straight to Jupyter's port (with the task's Jupyter token), one
  keep-alive client each, interleaved;
- throughput: a --mib MiB file the kernel wrote, downloaded through the proxy and directly, --rounds
  times each, interleaved, best of each (MiB/s), with the CPU each party spends per GiB (the master,
  the agent and its task, the client): on a machine with fewer cores than busy parties, the
  download through the master is bounded by the sum;
- the master's CPU time (its processes', /proc schedstat, Linux) per proxied request and per proxied
  GiB, beside /health's per request: on a shared machine the wall-clock figures swing with the
  load, these much less.

    .venv/bin/python benchmarks/notebook_proxy.py                 # ~1 min
    .venv/bin/python benchmarks/notebook_proxy.py --starts 5 --requests 500 --mib 256
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cli import deploy_local  # noqa: E402
from shipyard_common import private_files  # noqa: E402
from tests.pg import free_port  # noqa: E402


def _ready(client: httpx.Client, kind_path: str, task_key: str) -> tuple[str, float]:
    t0 = time.perf_counter()
    nb = client.post(kind_path, json={"config": {"resources": {"slots": 0}}}).json()[task_key]
    while True:
        task = client.get(f"/api/v1/tasks/{nb['id']}").json()["task"]
        if task["allocations"] and task["allocations"][0]["isReady"]:
            return nb["id"], time.perf_counter() - t0
        if task.get("endTime"):
            logs = client.get(f"/api/v1/tasks/{nb['id']}/logs").text
            raise SystemExit(f"notebook {nb['id']} ended before it was ready: {logs[-2000:]}")
        time.sleep(0.05)


def _direct(state: Path, nb_id: str) -> tuple[str, str]:
    """Jupyter's own address and token, as the master knows them (its database, its secret)."""
    from sqlalchemy import create_engine, text

    from control_plane import auth
    from control_plane.config import load_config
    from control_plane.master import Master

    engine = create_engine(f"sqlite:///{state / 'shipyard.db'}")
    with engine.connect() as c:
        address = c.execute(text("SELECT proxy_address FROM tasks WHERE id = :i"), {"i": nb_id}).scalar_one()
    master = Master(load_config(env={}, db_url=f"sqlite:///{state / 'shipyard.db'}", state_dir=str(state / "master")))
    master.token_secret = auth.load_token_key(master.config.token_secret_path)
    from control_plane.services.tasks import jupyter_token

    return f"http://{address}", jupyter_token(master, nb_id)


def _write_file(url: str, headers: dict[str, str], nb_id: str, mib: int) -> None:
    from websockets.sync.client import connect

    client = httpx.Client(base_url=url, headers=headers, timeout=60)
    kernel = client.post(f"/proxy/{nb_id}/api/kernels", json={"name": "python3"}).json()
    ws_url = url.replace("http://", "ws://") + f"/proxy/{nb_id}/api/kernels/{kernel['id']}/channels"
    msg_id = uuid.uuid4().hex
    with connect(ws_url, additional_headers=headers) as ws:
        ws.send(json.dumps({"header": {"msg_id": msg_id, "username": "b", "session": uuid.uuid4().hex,
                                       "msg_type": "execute_request", "version": "5.3"},
                            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
                            "content": {"code": f"open('big.bin', 'wb').write(b'x' * {mib} * 2**20)", "silent": False,
                                        "store_history": False, "user_expressions": {}, "allow_stdin": False}}))
        while True:
            msg = json.loads(ws.recv(timeout=120))
            if msg.get("parent_header", {}).get("msg_id") == msg_id and msg["msg_type"] == "execute_reply":
                break


def _tree(pid: int) -> list[int]:
    """A process and its descendants (the master's API workers: api_workers, one per core)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            parents[int(stat.parent.name)] = int(stat.read_text().rpartition(")")[2].split()[1])
    tree = [pid]
    for p in tree:
        tree += [child for child, parent in parents.items() if parent == p]
    return tree


def _cpu_s(pids: list[int]) -> float:
    """CPU time of these processes' threads so far (Linux schedstat, nanoseconds); 0 without /proc."""
    total = 0
    for pid in pids:
        for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                total += int(stat.read_text().split()[0])
    return total / 1e9


def _latency(client: httpx.Client, path: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        r = client.get(path)
        out.append(time.perf_counter() - t0)
        assert r.status_code == 200, r.text
    return out


def _download(client: httpx.Client, path: str, mib: int) -> float:
    """One download of the file, read as it arrives; MiB/s."""
    t0 = time.perf_counter()
    size = 0
    with client.stream("GET", path) as r:
        assert r.status_code == 200, r.status_code
        for chunk in r.iter_raw():
            size += len(chunk)
    assert size == mib * 2**20, size
    return mib / (time.perf_counter() - t0)


def _throughput(clients: dict[str, tuple[httpx.Client, str]], mib: int, rounds: int,
                parties: dict[str, list[int]]) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """Each way's best MiB/s over `rounds` downloads, the ways interleaved (a load that comes and
    goes hits both), and each party's CPU seconds per GiB on each way (`parties`: name -> pids;
    "client" is this process)."""
    best = dict.fromkeys(clients, 0.0)
    cpu: dict[str, dict[str, float]] = {way: dict.fromkeys([*parties, "client"], 0.0) for way in clients}
    for _ in range(rounds):
        for way, (client, path) in clients.items():
            before = {name: _cpu_s(pids) for name, pids in parties.items()}
            c0 = time.process_time()
            best[way] = max(best[way], _download(client, path, mib))
            cpu[way]["client"] += time.process_time() - c0
            for name, pids in parties.items():
                cpu[way][name] += _cpu_s(pids) - before[name]
    gib = rounds * mib / 1024
    return best, {way: {name: s / gib for name, s in row.items()} for way, row in cpu.items()}


@contextlib.contextmanager
def local_cluster() -> Iterator[tuple[Path, str, str, httpx.Client]]:
    """A `det deploy local` cluster (one agent, SQLite) in a temporary directory, and the admin's
    (state dir, URL, token, client); taken down at the end. Under a private directory (mkdtemp's
    0700), as in the tests: the agent runs tasks as its own user (agent_bootstrap/agent/identity.py),
    who can run this virtualenv's python3, where JupyterLab is (a per-user task uid could not reach
    an interpreter under /root)."""
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        private_files.private_dir(state)
        private_files.write_private(state / "admin-password", b"Bench-password-1")
        cfg = state / "master.yaml"
        cfg.write_text("task_kill_grace_s: 3\n")
        data = deploy_local.up(state, agents=1, port=free_port(), db=f"sqlite:///{state / 'shipyard.db'}", slots=1,
                               pool_config=cfg)
        url = data["master_url"]
        try:
            token = httpx.post(url + "/api/v1/auth/login", json={"username": "admin",
                                                                 "password": "Bench-password-1"}).json()["token"]
            with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as client:
                yield state, url, token, client
        finally:
            deploy_local.down(state, quiet=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--starts", type=int, default=3)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--mib", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3, help="downloads each way, interleaved")
    args = ap.parse_args()
    # The agent runs the notebook's `python3` from PATH: this virtualenv's, where JupyterLab is.
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    with local_cluster() as (state, url, token, client):
        auth = {"Authorization": f"Bearer {token}"}
        starts, ids = [], []
        for _ in range(args.starts):
            nb_id, took = _ready(client, "/api/v1/notebooks", "notebook")
            ids.append(nb_id)
            starts.append(took)
        for nb_id in ids[1:]:
            client.post(f"/api/v1/notebooks/{nb_id}/kill")
        nb_id = ids[0]
        direct_url, jtoken = _direct(state, nb_id)
        direct = httpx.Client(base_url=direct_url, headers={"Authorization": f"token {jtoken}"}, timeout=60)
        path = f"/proxy/{nb_id}/api/status"
        proxied_t, direct_t, master_t, health_t = [], [], [], []
        pid = _tree(deploy_local.status(state)["master_pid"])
        cpu = {"proxy": 0.0, "health": 0.0}
        for _ in range(args.requests // 50):  # interleaved, 50 at a time
            c0 = _cpu_s(pid)
            proxied_t += _latency(client, path, 50)
            c1 = _cpu_s(pid)
            direct_t += _latency(direct, path, 50)
            master_t += _latency(client, "/api/v1/me", 50)
            c2 = _cpu_s(pid)
            health_t += _latency(client, "/health", 50)
            cpu["proxy"] += c1 - c0
            cpu["health"] += _cpu_s(pid) - c2
        _write_file(url, auth, nb_id, args.mib)
        file_path = f"/proxy/{nb_id}/files/big.bin"
        agents = [p for a in deploy_local.status(state)["agents"] for p in _tree(a["pid"])]
        mb, per_gib = _throughput({"proxy": (client, file_path), "direct": (direct, file_path)}, args.mib,
                                  args.rounds, {"master": pid, "agent and task": agents})
    p50 = statistics.median
    print(f"{'measure':<40} {'through the master':>20} {'direct':>12} {'target':>22}")
    print(f"{'notebook start -> ready p50 (s)':<40} {p50(starts):>20.2f} {'':>12} {'< 5 s':>22}")
    print(f"{'  (each start, s)':<40} {', '.join(f'{x:.2f}' for x in starts):>20}")
    print(f"{'GET api/status p50 (ms)':<40} {p50(proxied_t) * 1e3:>20.2f} {p50(direct_t) * 1e3:>12.2f}"
          f" {'added < 2 ms':>22}")
    print(f"{'  GET /api/v1/me p50 (ms), the master alone':<40} {p50(master_t) * 1e3:>20.2f}")
    print(f"{'  GET /health p50 (ms), from memory':<40} {p50(health_t) * 1e3:>20.2f}")
    print(f"{'  added p50 (ms)':<40} {(p50(proxied_t) - p50(direct_t)) * 1e3:>20.2f}")
    n = len(proxied_t)
    print(f"{'  master CPU per request (ms): proxy':<40} {cpu['proxy'] / n * 1e3:>20.2f}")
    print(f"{'  master CPU per request (ms): /health':<40} {cpu['health'] / n * 1e3:>20.2f}")
    print(f"{f'download {args.mib} MiB (MiB/s, best of {args.rounds})':<40} {mb['proxy']:>20.0f}"
          f" {mb['direct']:>12.0f} {'>= 90% of direct':>22}")
    print(f"{'  ratio':<40} {mb['proxy'] / mb['direct']:>20.0%}")
    for name in per_gib["proxy"]:
        print(f"{f'  CPU s per GiB: {name}':<40} {per_gib['proxy'][name]:>20.2f} {per_gib['direct'][name]:>12.2f}")
    total = {way: sum(row.values()) for way, row in per_gib.items()}
    print(f"{'  CPU s per GiB: all three':<40} {total['proxy']:>20.2f} {total['direct']:>12.2f}")
    print(f"{'  cores here':<40} {os.cpu_count():>20}")


if __name__ == "__main__":
    main()
