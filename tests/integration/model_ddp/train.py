"""A data-parallel trial for the distributed end-to-end tests: fits w to a target by SGD, each rank
on its own noisy samples, gradients all-reduced with torch.distributed (gloo), through the real Core
API (only the chief reports and checkpoints). Knobs (hyperparameters): crash_rank and crash_at
(that rank exits 3 at that step on the first run only), validate_every, step_sleep."""

import json
import os
import pathlib
import sys
import time

import torch
import torch.distributed as dist

from harness import core


def main(ctx: core.Context) -> None:
    hp = ctx.info.hparams
    rank, size = ctx.distributed.rank, ctx.distributed.size
    crash_rank, crash_at = int(hp.get("crash_rank", -1)), int(hp.get("crash_at", -1))
    validate_every, sleep = int(hp.get("validate_every", 10)), float(hp.get("step_sleep", 0.0))
    print(f"rank {rank} of {size} trial {ctx.info.trial_id} run {ctx.info.trial_run_id} pid {os.getpid()}",
          flush=True)
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    print(f"rank {rank}: all_reduce sum={total.item():g}", flush=True)
    w, steps = torch.zeros(1), 0
    if ctx.info.latest_checkpoint:
        with ctx.checkpoint.restore_path(ctx.info.latest_checkpoint) as path:
            state = json.loads((pathlib.Path(path) / "state.json").read_text())
        w, steps = torch.tensor([state["w"]]), state["steps"]
        print(f"rank {rank}: resumed from {ctx.info.latest_checkpoint} at step {steps}", flush=True)
    g = torch.Generator().manual_seed(1000 * rank + steps)
    for op in ctx.searcher.operations():
        while steps < op.length:
            target = 3.0 + 0.1 * torch.randn(1, generator=g)
            grad = 2 * (w - target)
            dist.all_reduce(grad)  # the mean gradient over the ranks
            w -= 0.1 * grad / size
            steps += 1
            if sleep:
                time.sleep(sleep)
            if rank == crash_rank and steps == crash_at and ctx.info.trial_run_id == 1:
                print(f"rank {rank}: crashing on purpose at step {steps}", flush=True)
                sys.exit(3)
            loss = float((w - 3.0) ** 2)
            ctx.train.report_training_metrics(steps, {"loss": loss, "rank": rank})
            if steps % validate_every == 0 or steps == op.length:
                ctx.train.report_validation_metrics(steps, {"validation_loss": loss})
                if ctx.distributed.is_chief:
                    with ctx.checkpoint.store_path({"steps_completed": steps}) as (path, _):
                        (pathlib.Path(path) / "state.json").write_text(json.dumps({"w": w.item(), "steps": steps}))
                if ctx.preempt.should_preempt():
                    return
        if ctx.distributed.is_chief:
            op.report_completed(float((w - 3.0) ** 2))


if __name__ == "__main__":
    with core.init() as ctx:
        main(ctx)
