"""A spot instance taken away mid-trial: what the interruption notice saves (issue 28, Spot done right).

A real master (SQLite) and two real agents, each with its own fake instance metadata
(tests/fakes/metadata.py: AWS IMDSv2's spot/instance-action, GCE's instance/preempted). A Core API
trial (tests/integration/test_spot_interruption.py's: one training report per step of `--step-s`,
a checkpoint every `--ckpt-every` steps) is interrupted on the agent it runs on, `--notice-at`
steps in (mid checkpoint interval). The instance goes `--warning-s` after the notice (AWS; GCE's
notice is always 30 s).

- shipyard: the agents watch the metadata; the trial is asked to stop at once, checkpoints and
  resumes on the other agent.
- peer (no notice handling, as Determined's agent: it does not read the metadata): at the
  deadline the instance dies (its agent and trial SIGKILLed); the master finds the agent lost
  after its heartbeat timeout and grace (defaults: 20 s + 15 s) and the trial resumes from its
  last periodic checkpoint.

Columns: seconds from the notice until run 1 stopped (its last checkpoint reported, or the kill)
and until run 2 started on the other agent, steps trained twice (lost work: run 1's last step less
the step run 2 resumed from), restarts counted, and the end state.

    .venv/bin/python benchmarks/spot_notice.py                     # aws and gcp, ~5 min
    .venv/bin/python benchmarks/spot_notice.py --clouds aws --warning-s 20
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from benchmarks._common import print_table  # noqa: E402
from tests.conftest import LiveMaster  # noqa: E402
from tests.integration.test_spot_interruption import start_spot  # noqa: E402


def _secs(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def run_once(tmp: Path, cloud: str, policy: str, args: argparse.Namespace) -> list[Any]:
    cfg = tmp / "master.yaml"
    tmp.mkdir(parents=True)
    cfg.write_text(yaml.safe_dump({"task_kill_grace_s": 3}))
    master = LiveMaster(f"sqlite:///{tmp / 'shipyard.db'}", tmp / "master-state", config_path=cfg)
    master.start(timeout=120)
    warning = args.warning_s if cloud == "aws" else 30.0
    spot = start_spot(master, tmp, cloud, warning, watch=policy == "shipyard")
    try:
        length = args.notice_at + int(warning / args.step_s) + 40
        exp_id = spot.submit(length, step_sleep=args.step_s, ckpt_every=args.ckpt_every)
        mine, other, trial_id = spot.interrupt_where_running(exp_id, min_steps=args.notice_at)
        noticed = time.monotonic()
        noticed_at = datetime.now(UTC)
        stopped, last = None, None
        if policy == "peer":  # nothing reads the notice: the instance dies at the deadline
            time.sleep(max(0.0, noticed + warning - time.monotonic()))
            spot.agents[mine].proc.kill()
            pid = re.search(rf"run 1 on agent spot-{mine} pid (\d+)", spot.logs(trial_id))
            if pid:  # the instance's processes go with it
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid.group(1)), signal.SIGKILL)
            stopped = time.monotonic() - noticed
            time.sleep(1.0)
            last = max(spot.steps(trial_id))  # what run 1 had trained (as far as the master knows)
        resumed = None
        deadline = noticed + 300
        while resumed is None and time.monotonic() < deadline:
            if f"run 2 on agent spot-{other}" in spot.logs(trial_id):
                resumed = time.monotonic() - noticed
            else:
                time.sleep(0.25)
        exp = spot.wait_done(exp_id)
        logs = spot.logs(trial_id)
        resumed_at = re.search(r"resumed at step (\d+)", logs)
        if policy == "shipyard":
            step = re.search(r"preempted at step (\d+)", logs)
            last = int(step.group(1)) if step else None
            ckpts = spot.get(f"/api/v1/trials/{trial_id}/checkpoints")["checkpoints"]
            at = [c for c in ckpts if step and c["metadata"].get("steps_completed") == int(step.group(1))]
            if at:
                reported = datetime.fromisoformat(at[0]["reportTime"].replace("Z", "+00:00"))
                stopped = (reported - noticed_at).total_seconds()
        trial = spot.get(f"/api/v1/trials/{trial_id}")["trial"]
        redone = "-" if last is None else last - (int(resumed_at.group(1)) if resumed_at else 0)
        return [cloud, policy, f"{warning:g}", _secs(stopped), _secs(resumed), redone,
                trial["restarts"], exp["state"].removeprefix("STATE_")]
    finally:
        spot.close()
        master.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clouds", default="aws,gcp")
    p.add_argument("--warning-s", type=float, default=15.0, help="AWS: the notice's lead (120 s in AWS)")
    p.add_argument("--step-s", type=float, default=0.1)
    p.add_argument("--ckpt-every", type=int, default=50)
    p.add_argument("--notice-at", type=int, default=75)
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="shipyard-spot-") as d:
        for cloud in args.clouds.split(","):
            for policy in ("shipyard", "peer"):
                rows.append(run_once(Path(d) / f"{cloud}-{policy}", cloud, policy, args))
                print(" ".join(str(c) for c in rows[-1]), flush=True)
    print()
    print_table(["cloud", "policy", "warning s", "run 1 stopped s", "run 2 started s", "steps redone",
                 "restarts", "state"], rows, right={2, 3, 4, 5, 6})
    return 0


if __name__ == "__main__":
    sys.exit(main())
