"""A dependency-free trial for integration tests: fits w to a target by SGD on a quadratic, through
the real Core API. Knobs (hyperparameters): lr, step_sleep (seconds per step), crash_at (exit 1 at
that step on the first run only), validate_every."""

import json
import os
import pathlib
import sys
import time

from harness import core


def main(ctx: core.Context) -> None:
    hp = ctx.info.hparams
    lr = float(hp.get("lr", 0.1))
    sleep = float(hp.get("step_sleep", 0.0))
    crash_at = int(hp.get("crash_at", -1))
    validate_every = int(hp.get("validate_every", 10))
    print(f"trial {ctx.info.trial_id} run {ctx.info.trial_run_id} pid {os.getpid()}", flush=True)
    w, steps = 0.0, 0
    if ctx.info.latest_checkpoint:
        with ctx.checkpoint.restore_path(ctx.info.latest_checkpoint) as path:
            state = json.loads((pathlib.Path(path) / "state.json").read_text())
        w, steps = state["w"], state["steps"]
        print(f"resumed from {ctx.info.latest_checkpoint} at step {steps}", flush=True)
    target = 3.0
    for op in ctx.searcher.operations():
        while steps < op.length:
            w -= lr * 2 * (w - target)
            steps += 1
            if sleep:
                time.sleep(sleep)
            if steps == crash_at and ctx.info.trial_run_id == 1:
                print(f"crashing on purpose at step {steps}", flush=True)
                sys.exit(1)
            ctx.train.report_training_metrics(steps, {"loss": (w - target) ** 2})
            if steps % validate_every == 0 or steps == op.length:
                val = (w - target) ** 2 + 0.01 / lr
                ctx.train.report_validation_metrics(steps, {"validation_loss": val})
                with ctx.checkpoint.store_path({"steps_completed": steps}) as (path, _):
                    (pathlib.Path(path) / "state.json").write_text(json.dumps({"w": w, "steps": steps}))
                if ctx.preempt.should_preempt():
                    print(f"preempted at step {steps}", flush=True)
                    return
        op.report_completed((w - target) ** 2 + 0.01 / lr)


if __name__ == "__main__":
    with core.init() as ctx:
        main(ctx)
