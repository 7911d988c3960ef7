"""Request-body memory: concurrent 150 MB bodies against a real master, with and without budgets.

Issue 27 (item 5): six concurrent 150 MB bodies from a non-admin took the master from 714 MB to
2.4 GB. The master now spools a body over `body_spool_bytes` to disk as it arrives and counts it
against its caller's budget (`body_budget_per_caller_bytes`, 192 MiB) and the host's
(`body_budget_bytes`, 320 MiB, every master process together), refusing what does not fit before
reading it: 429 (the caller's own bodies fill its budget) or 503 (the host's), with Retry-After
(frontdoor/body_budget.py).

Each phase starts a fresh master (`python -m control_plane`, SQLite, `api_workers` 2: two API worker
processes and the control process, RSS summed over the whole tree every 20 ms), logs in, and sends
`--bodies` bodies of `--mb` MB at once to `POST /api/v1/experiments` (the route with the largest limit,
`max_request_bytes` 160 MiB; its model definition travels base64 in the JSON; `model_def_max_bytes` is
raised so that the master does the whole job: decode, archive, store) over raw sockets (a refused
body is not sent on):

- `budget, one user`: all from one non-admin user (the issue's attack);
- `budget, N users`: one from each of N non-admin users (only the host's budget holds them back);
- `no budget (old)`: `body_budget_bytes: 0`, the previous behaviour (no spooling, no budget), one
  user, `--old-bodies` bodies (6 by default, the issue's figure: 20 would take about 9 GB).

Then one declared 150 MB body to each of the other large-body routes (checkpoints, task logs,
metric batches), which take at most `max_body_bytes` (16 MiB): a 413 before a byte is read.

Columns: RSS before (MB), peak RSS (MB), peak minus before, answers by status, the slowest
answer's time. The bound (docs/PERFORMANCE.md): peak ≤ before + 5 × body_budget_bytes.

    .venv/bin/python benchmarks/body_memory.py            # 20 × 150 MB, and the old behaviour with 6
    .venv/bin/python benchmarks/body_memory.py --bodies 8 --mb 40 --old-bodies 4
"""

from __future__ import annotations

import argparse
import base64
import collections
import json
import os
import select
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402

from benchmarks._common import MasterProcess, print_table, temp_dir, tree_rss_bytes  # noqa: E402

MB = 1_000_000
MIB = 1024 * 1024
CONFIG = """name: body-memory
entrypoint: python3 train.py
searcher: {name: single, metric: loss, max_length: {batches: 1}}
resources: {slots_per_trial: 1}
"""
# What creating an experiment holds per byte of its body at its peak: the body, its JSON string, the
# base64 text re-encoded and decoded, the packed archive and its copy, the database's bound blob.
BOUND_FACTOR = 5
OTHER_ROUTES = ("/api/v1/checkpoints", "/api/v1/task/logs", "/api/v1/trials/1/metrics/batch")


class RssSampler(threading.Thread):
    def __init__(self, pid: int, every_s: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.every_s = every_s
        self.peak = 0
        self.stop_flag = threading.Event()

    def run(self) -> None:
        while not self.stop_flag.is_set():
            self.peak = max(self.peak, tree_rss_bytes(self.pid)[0])
            time.sleep(self.every_s)


def post_raw(url: str, path: str, token: str, body: bytes) -> tuple[int, str, str, float]:
    """POST `body` with its Content-Length over a raw socket, stopping as soon as the master answers
    (a refused body is not read: it says so by closing). Returns (status, Retry-After, message, s)."""
    host, port = url.split("//", 1)[1].split(":")
    t0 = time.monotonic()
    sock = socket.create_connection((host, int(port)))
    try:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n"
                     f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode())
        view = memoryview(body)
        for at in range(0, len(body), MIB):
            if select.select([sock], [], [], 0)[0]:
                break  # answered early
            try:
                sock.sendall(view[at:at + MIB])
            except (BrokenPipeError, ConnectionResetError):
                break
        raw = b""
        while b"\r\n\r\n" not in raw:
            part = sock.recv(65536)
            if not part:
                break
            raw += part
        head, _, rest = raw.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1]) if lines[0] else 0
        headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
        length = int(headers.get("content-length", "0"))
        while len(rest) < length:
            part = sock.recv(65536)
            if not part:
                break
            rest += part
        try:
            message = str(json.loads(rest).get("message", ""))
        except ValueError:
            message = rest[:200].decode("latin-1")
        return status, headers.get("retry-after", ""), message, time.monotonic() - t0
    except OSError as e:
        return 0, "", f"{type(e).__name__}: {e}", time.monotonic() - t0
    finally:
        sock.close()


def experiment_body(mb: int) -> bytes:
    """A create-experiment body of about `mb` MB: one file of random bytes, base64 in the JSON."""
    content = base64.b64encode(os.urandom(mb * MB * 3 // 4)).decode()
    files = [{"path": "train.py", "type": 48, "content": base64.b64encode(b"print(1)\n").decode(), "mode": 420,
              "mtime": "0", "uid": 0, "gid": 0},
             {"path": "data.bin", "type": 48, "content": content, "mode": 420, "mtime": "0", "uid": 0, "gid": 0}]
    return json.dumps({"config": CONFIG, "modelDefinition": files}).encode()


def users(master: MasterProcess, count: int) -> list[str]:
    """`count` non-admin users' tokens."""
    admin = {"Authorization": f"Bearer {master.token()}"}
    tokens = []
    for i in range(count):
        name, pw = f"user{i}", f"user{i}-password-1"
        r = httpx.post(master.url + "/api/v1/users", headers=admin, json={"user": {"username": name}, "password": pw})
        r.raise_for_status()
        r = httpx.post(master.url + "/api/v1/auth/login", json={"username": name, "password": pw})
        r.raise_for_status()
        tokens.append(str(r.json()["token"]))
    return tokens


def phase(name: str, base: Path, body: bytes, bodies: int, callers: int, settings: dict[str, Any],
          others: bool = False) -> list[Any]:
    state = base / name.replace(" ", "-").replace(",", "")
    state.mkdir(parents=True)
    config = state / "master.yaml"
    config.write_text(json.dumps({"api_workers": 2, "model_def_max_bytes": 160 * MIB, **settings}))
    os.environ["SHIPYARD_CONFIG"] = str(config)
    master = MasterProcess(f"sqlite:///{state / 'db.sqlite'}", state)
    master.start()
    try:
        assert master.proc is not None
        tokens = users(master, callers)
        time.sleep(1.0)
        before = tree_rss_bytes(master.proc.pid)[0]
        sampler = RssSampler(master.proc.pid)
        sampler.start()
        answers: list[tuple[int, str, str, float]] = []
        lock = threading.Lock()

        def send(i: int) -> None:
            a = post_raw(master.url, "/api/v1/experiments", tokens[i % callers], body)
            with lock:
                answers.append(a)

        threads = [threading.Thread(target=send, args=(i,)) for i in range(bodies)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        other = [post_raw(master.url, path, tokens[0], body) for path in OTHER_ROUTES] if others else []
        time.sleep(0.5)
        sampler.stop_flag.set()
        sampler.join()
        after = tree_rss_bytes(master.proc.pid)[0]
        statuses = collections.Counter(a[0] for a in answers)
        for a in sorted({(a[0], a[2][:150], a[1]) for a in answers}):
            print(f"  [{name}] {a[0]} Retry-After={a[2] or '-'}: {a[1]}")
        for path, a in zip(OTHER_ROUTES[:len(other)], other, strict=True):
            print(f"  [{name}] {path}: {a[0]}: {a[2][:150]}")
        return [name, bodies, callers, round(before / MB), round(sampler.peak / MB), round((sampler.peak - before) / MB),
                round(after / MB), " ".join(f"{s}×{n}" for s, n in sorted(statuses.items())),
                f"{max(a[3] for a in answers):.1f}"]
    finally:
        master.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bodies", type=int, default=20)
    ap.add_argument("--mb", type=int, default=150)
    ap.add_argument("--old-bodies", type=int, default=6, help="bodies for the old behaviour (0: skip it)")
    args = ap.parse_args()
    base = temp_dir("body-memory-")
    body = experiment_body(args.mb)
    print(f"{args.bodies} concurrent bodies of {len(body) / MB:.0f} MB to POST /api/v1/experiments; "
          f"master: SQLite, api_workers 2; RSS summed over the master's processes")
    rows = [phase("budget, one user", base, body, args.bodies, 1, {}, others=True),
            phase(f"budget, {args.bodies} users", base, body, args.bodies, args.bodies, {})]
    if args.old_bodies:
        rows.append(phase("no budget (old)", base, body, args.old_bodies, 1, {"body_budget_bytes": 0}))
    print()
    print_table(["phase", "bodies", "users", "RSS before MB", "peak MB", "peak-before MB", "after MB", "answers",
                 "slowest s"], rows, right={1, 2, 3, 4, 5, 6, 8})
    bound = BOUND_FACTOR * 320 * MIB / MB
    over = [r[0] for r in rows if "old" not in r[0] and r[5] > bound]
    print(f"\nbound: peak - before <= {BOUND_FACTOR} x body_budget_bytes = {bound:.0f} MB: "
          f"{'held' if not over else 'EXCEEDED in ' + ', '.join(over)}")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
