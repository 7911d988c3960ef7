"""A trial written against Determined's own Core API (`determined.core`, 0.38.1), not Shipyard's
harness: fits w to 3 by SGD; metrics, validations, checkpoints (saved and restored), preemption;
with `stop_at`, exits 0 at that step (0.38.1's "just exit 0"); with `report_progress`, reports it.
TensorboardMode.MANUAL: the compat environment has neither torch nor tensorflow (AUTO needs one)."""

import json
import sys
import time

import determined as det
from determined import core


def main(ctx: core.Context) -> None:
    info = det.get_cluster_info()
    if info is None:
        print("OFF-CLUSTER: no cluster info", flush=True)
        sys.exit(3)
    print(f"on cluster: trial {info.trial.trial_id} run {info.trial._trial_run_id} "
          f"allocation {info.allocation_id}", flush=True)
    w, steps = 0.0, 0
    if info.latest_checkpoint:
        with ctx.checkpoint.restore_path(info.latest_checkpoint) as path:
            state = json.loads((path / "state.json").read_text())
        w, steps = state["w"], state["steps"]
        print(f"restored {info.latest_checkpoint} at step {steps}", flush=True)
    lr = float(info.trial.hparams["lr"])
    sleep = float(info.trial.hparams.get("step_sleep", 0))
    stop_at = info.trial.hparams.get("stop_at")  # exit 0 there: no validation at max_length, no report_completed
    for op in ctx.searcher.operations():
        while steps < op.length:
            steps += 1
            w -= lr * 2 * (w - 3.0)
            time.sleep(sleep)
            ctx.train.report_training_metrics(steps_completed=steps, metrics={"loss": (w - 3.0) ** 2})
            if info.trial.hparams.get("report_progress"):
                ctx.train.report_progress(steps / op.length)
            if steps == stop_at:
                print(f"stopping at step {steps} of {op.length}", flush=True)
                return
            if steps % 5 == 0 or steps == op.length:
                ctx.train.report_validation_metrics(steps_completed=steps, metrics={"validation_loss": (w - 3.0) ** 2})
                with ctx.checkpoint.store_path({"steps_completed": steps}) as (path, uuid):
                    (path / "state.json").write_text(json.dumps({"w": w, "steps": steps}))
                if info.trial.hparams.get("check_restore"):  # read it back from the storage at once
                    with ctx.checkpoint.restore_path(uuid) as path:
                        back = json.loads((path / "state.json").read_text())
                    print(f"read back {uuid} at step {back['steps']} from {path}", flush=True)
                if ctx.preempt.should_preempt():
                    print(f"preempted at step {steps}", flush=True)
                    return
        op.report_completed((w - 3.0) ** 2)
    print("done", flush=True)


if __name__ == "__main__":
    with core.init(tensorboard_mode=core.TensorboardMode.MANUAL) as ctx:
        main(ctx)
