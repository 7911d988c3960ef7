"""`python -m harness.launch.torch_distributed [TORCHRUN_ARGS... --] script.py [ARGS...]`

The entrypoint of a trial that trains with torch.distributed. Every agent of the trial runs it
once (a trial of `slots_per_trial` larger than one agent is placed across whole agents, one
process group per agent). It asks the master for the trial's rendezvous
(`GET /api/v1/allocations/{id}/resources/{DET_RESOURCES_ID}/rendezvous`: the address of every
group, this group's rank, the slots of every group) and replaces itself with
`torch.distributed.run` (torchrun): `--nnodes` groups, this group's `--node_rank`, one process per
slot (`--nproc_per_node`), the chief group's address and the trial's port (`C10D_PORT`) for the
rendezvous store. The processes find their ranks in torchrun's variables; `harness.core.init()`
builds the collectives from them (NCCL on GPUs, gloo on CPUs: the same code path).

Arguments before `--` go to torchrun as they are (e.g. `--max_restarts=0`); without `--`, all are
the script and its arguments (`-m module` runs a module). Off the cluster (no DET_MASTER) it runs
torchrun standalone with one process per slot in DET_SLOT_IDS (or `--nproc_per_node`).

A failure of any process fails its torchrun, whose exit fails this part of the trial; the master
then stops the other groups and restarts the whole trial from its latest checkpoint.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from harness.core._session import APIError, Session, TransientAPIError

RENDEZVOUS_WAIT_S = 120.0


class LaunchError(Exception):
    """The launcher cannot start the trial (one readable line)."""


def split_args(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(torchrun's own arguments, the script and its arguments)."""
    argv = list(argv)
    if "--" in argv:
        i = argv.index("--")
        overrides, script = argv[:i], argv[i + 1:]
    else:
        overrides, script = [], argv
    if not script:
        raise LaunchError("usage: python -m harness.launch.torch_distributed [TORCHRUN_ARGS... --] script.py [ARGS...]")
    return overrides, script


def fetch_rendezvous(env: Mapping[str, str], *, wait_s: float = RENDEZVOUS_WAIT_S,
                     session: Session | None = None) -> dict[str, Any]:
    """The rendezvous of this process group, from the master (retried while it is unreachable)."""
    missing = [k for k in ("DET_MASTER", "DET_ALLOCATION_ID", "DET_RESOURCES_ID") if not env.get(k)]
    if missing:
        raise LaunchError(f"not on a cluster: {', '.join(missing)} not set")
    session = session or Session(env["DET_MASTER"], env.get("DET_SESSION_TOKEN"))
    path = f"/api/v1/allocations/{env['DET_ALLOCATION_ID']}/resources/{env['DET_RESOURCES_ID']}/rendezvous"
    deadline = time.monotonic() + wait_s
    while True:
        try:
            info = session.get(path)["rendezvousInfo"]
            break
        except TransientAPIError as e:
            if time.monotonic() > deadline:
                raise LaunchError(f"rendezvous: the master did not answer within {wait_s:.0f} s ({e})") from None
            time.sleep(1.0)
        except APIError as e:
            raise LaunchError(f"rendezvous refused by the master: {e}") from None
    addresses, rank, slots = list(info["addresses"]), int(info["rank"]), [int(n) for n in info["slots"]]
    if not addresses or len(addresses) != len(slots) or not 0 <= rank < len(addresses):
        raise LaunchError(f"rendezvous: malformed answer from the master: {info}")
    if len(set(slots)) != 1:
        raise LaunchError(f"rendezvous: every agent of the trial must run as many processes; slots are {slots}")
    return {"addresses": addresses, "rank": rank, "slots": slots}


def torchrun_argv(rendezvous: Mapping[str, Any], port: int, overrides: Sequence[str],
                  script: Sequence[str], python: str = sys.executable) -> list[str]:
    addresses, rank, slots = rendezvous["addresses"], rendezvous["rank"], rendezvous["slots"]
    argv = [python, "-m", "torch.distributed.run",
            f"--nnodes={len(addresses)}", f"--node_rank={rank}", f"--nproc_per_node={max(1, slots[rank])}",
            f"--master_addr={addresses[0]}", f"--master_port={port}", *overrides]
    return argv + _script(script)


def standalone_argv(env: Mapping[str, str], overrides: Sequence[str], script: Sequence[str],
                    python: str = sys.executable) -> list[str]:
    nproc = len(json.loads(env.get("DET_SLOT_IDS") or "[]")) or 1
    own = [] if any(a.startswith("--nproc_per_node") or a.startswith("--nproc-per-node") for a in overrides) \
        else [f"--nproc_per_node={nproc}"]
    return [python, "-m", "torch.distributed.run", "--standalone", "--nnodes=1", *own, *overrides] + _script(script)


def _script(script: Sequence[str]) -> list[str]:
    if script[0] == "-m":
        return ["--module", *script[1:]] if len(script) > 1 else ["--module"]
    return list(script)


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    env = dict(os.environ if env is None else env)
    try:
        overrides, script = split_args(sys.argv[1:] if argv is None else argv)
        if importlib.util.find_spec("torch") is None:
            raise LaunchError("torch is not installed in this environment (pip install 'shipyard[torch]')")
        if env.get("DET_MASTER") and env.get("DET_ALLOCATION_ID"):
            rdzv = fetch_rendezvous(env)
            port = int(env.get("C10D_PORT") or 29400)
            cmd = torchrun_argv(rdzv, port, overrides, script)
            env["DET_CHIEF_IP"] = rdzv["addresses"][0]
        else:
            cmd = standalone_argv(env, overrides, script)
    except LaunchError as e:
        print(f"harness.launch.torch_distributed: {e}", file=sys.stderr)
        return 2
    print("harness.launch.torch_distributed: " + " ".join(cmd[1:]), file=sys.stderr, flush=True)
    os.execvpe(cmd[0], cmd, env)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
