"""Shells (issue 29): start → ready, and `det shell open`'s tunnel through the master against ssh
straight to the task's sshd (the peer: what a user with a network path to the agent would get).

A local cluster (`det deploy local up`: master on SQLite + 1 agent, process runtime). Measured:

- start → ready: `POST /api/v1/shells` until `GET /api/v1/tasks/{id}` says isReady (sshd listening
  and its address reported), for --starts shells one after another;
- connect + command: `ssh ... -- true` (a new SSH connection, key exchange, one command), --runs
  times through the tunnel (`python -m cli.tunnel` as ProxyCommand: WebSocket to the master, relayed
  to sshd) and as many straight to sshd's port, interleaved; p50 and p90;
- throughput: `ssh ... -- head -c N /dev/zero` read to the end, through the tunnel and directly,
  3 times each, best of each (MiB/s).

    .venv/bin/python benchmarks/shell_tunnel.py                 # ~1 min
    .venv/bin/python benchmarks/shell_tunnel.py --runs 50 --mib 512
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import pct, print_table  # noqa: E402
from benchmarks.notebook_proxy import _ready, local_cluster  # noqa: E402
from cli.commands.shell import ssh_argv  # noqa: E402
from cli.tunnel import TOKEN_ENV  # noqa: E402
from control_plane.services.shells import split_address  # noqa: E402
from shipyard_common import private_files  # noqa: E402


def _direct(argv: list[str], address: str) -> list[str]:
    """The same ssh command line straight to sshd: no ProxyCommand, its host and port."""
    user, hostport = split_address(address)
    host, _, port = hostport.rpartition(":")
    i = argv.index(next(a for a in argv if a.startswith("ProxyCommand=")))
    out = argv[: i - 1] + argv[i + 1:]
    target = next(a for a in out if "@" in a and not a.startswith("-"))
    out[out.index(target)] = f"{user}@{host}"
    return [*out[:1], "-p", port, *out[1:]]


def _timed(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def _throughput(argv: list[str], env: dict[str, str], mib: int) -> float:
    best = 0.0
    for _ in range(3):
        t0 = time.perf_counter()
        with subprocess.Popen(argv, env=env, stdout=subprocess.PIPE) as p:
            assert p.stdout is not None
            size = sum(len(chunk) for chunk in iter(lambda: p.stdout.read(1 << 20), b""))  # type: ignore[union-attr]
        assert p.returncode == 0 and size == mib * 2**20, (p.returncode, size)
        best = max(best, mib / (time.perf_counter() - t0))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--starts", type=int, default=3)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--mib", type=int, default=256)
    args = ap.parse_args()
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    with local_cluster() as (state, url, token, client):
        tmp = state.parent
        starts, ids = [], []
        for _ in range(args.starts):
            shell_id, took = _ready(client, "/api/v1/shells", "shell")
            ids.append(shell_id)
            starts.append(took)
        for shell_id in ids[1:]:
            client.post(f"/api/v1/shells/{shell_id}/kill")
        shell = client.get(f"/api/v1/shells/{ids[0]}").json()["shell"]
        from sqlalchemy import create_engine, text

        with create_engine(f"sqlite:///{state / 'shipyard.db'}").connect() as c:
            address = c.execute(text("SELECT proxy_address FROM tasks WHERE id = :i"), {"i": ids[0]}).scalar_one()
        key = Path(tmp) / "key"
        private_files.write_private(key, shell["privateKey"].encode())
        env = {**os.environ, TOKEN_ENV: token}
        tunnel = ssh_argv(url, shell, str(key), [], ["true"], interactive=False)
        direct = _direct(tunnel, address)
        tunnel_t, direct_t = [], []
        for _ in range(args.runs):
            tunnel_t.append(_timed(tunnel, env))
            direct_t.append(_timed(direct, env))
        bulk = ["head", "-c", str(args.mib * 2**20), "/dev/zero"]
        tunnel_mb = _throughput([*tunnel[:-1], *bulk], env, args.mib)
        direct_mb = _throughput([*direct[:-1], *bulk], env, args.mib)
    tunnel_t.sort()
    direct_t.sort()
    ms = 1e3
    print_table(["measure", "through the master", "direct to sshd", "added"], [
        ["shell start -> ready p50 (s)", f"{statistics.median(starts):.2f}", "", ""],
        ["ssh connect + `true` p50 (ms)", f"{pct(tunnel_t, 0.5) * ms:.0f}", f"{pct(direct_t, 0.5) * ms:.0f}",
         f"{(pct(tunnel_t, 0.5) - pct(direct_t, 0.5)) * ms:.0f}"],
        ["ssh connect + `true` p90 (ms)", f"{pct(tunnel_t, 0.9) * ms:.0f}", f"{pct(direct_t, 0.9) * ms:.0f}",
         f"{(pct(tunnel_t, 0.9) - pct(direct_t, 0.9)) * ms:.0f}"],
        [f"read {args.mib} MiB over ssh (MiB/s, best of 3)", f"{tunnel_mb:.0f}", f"{direct_mb:.0f}",
         f"{tunnel_mb / direct_mb:.0%} of direct"],
    ], right={1, 2, 3})


if __name__ == "__main__":
    main()
