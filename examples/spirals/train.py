"""A small PyTorch classifier on generated data (two interleaved spirals), trained through
Shipyard's Core API: training and validation metrics, a checkpoint at every validation, resume
from the latest checkpoint, and a clean exit when the master asks the trial to stop.

Runs on the cluster (`det experiment create const.yaml .`) or off-cluster for debugging
(`python train.py`). Data-parallel over several processes and agents with torch.distributed
(`det experiment create distributed.yaml .`: `python3 -m harness.launch.torch_distributed
train.py`, gloo on CPUs, NCCL on GPUs): every rank trains on its own batches, DDP averages the
gradients, and only the chief reports metrics and saves checkpoints."""

from __future__ import annotations

import json
import logging
import math
import pathlib

import torch
import torch.distributed as dist
from torch import nn

from harness import core

log = logging.getLogger("spirals")


def make_spirals(n: int, seed: int, noise: float = 0.25) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    t = torch.rand(n, generator=g) * 3 * math.pi + 0.5
    label = torch.randint(0, 2, (n,), generator=g)
    sign = label.float() * 2 - 1
    x = torch.stack([sign * t * torch.cos(t), sign * t * torch.sin(t)], dim=1) / 5
    x = x + noise * torch.randn(n, 2, generator=g) / 5
    return x, label


def build_model(hidden: int) -> nn.Module:
    return nn.Sequential(nn.Linear(2, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, 2))


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    model.eval()
    with torch.no_grad():
        logits = model(x)
        loss = nn.functional.cross_entropy(logits, y).item()
        acc = (logits.argmax(1) == y).float().mean().item()
    model.train()
    return {"validation_loss": loss, "accuracy": acc}


def main(ctx: core.Context) -> None:
    hp = ctx.info.hparams
    torch.manual_seed(ctx.info.trial_seed)
    x_train, y_train = make_spirals(4096, seed=0)
    x_val, y_val = make_spirals(1024, seed=1)
    model = build_model(int(hp.get("hidden", 64)))
    rank, size = ctx.distributed.rank, ctx.distributed.size
    if size > 1:
        # harness.core.init() started torch's process group from the launcher's environment.
        check = torch.tensor([float(rank + 1)])
        dist.all_reduce(check)
        log.info("rank %d of %d: all_reduce sum=%g", rank, size, check.item())
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(model.parameters(), lr=float(hp.get("lr", 0.01)))
    net = model.module if size > 1 else model
    batch_size = int(hp.get("batch_size", 64))
    validate_every = int(hp.get("validate_every", 100))

    steps = 0
    if ctx.info.latest_checkpoint:
        with ctx.checkpoint.restore_path(ctx.info.latest_checkpoint) as path:
            state = torch.load(pathlib.Path(path) / "state.pt", weights_only=True)
            net.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
            steps = json.loads((pathlib.Path(path) / "progress.json").read_text())["steps"]
        log.info("resumed from checkpoint %s at step %d", ctx.info.latest_checkpoint, steps)

    def save(metrics: dict[str, float]) -> None:
        if not ctx.distributed.is_chief:
            return  # the ranks hold the same weights: the chief saves them
        with ctx.checkpoint.store_path({"steps_completed": steps, **metrics}) as (path, _uuid):
            torch.save({"model": net.state_dict(), "opt": opt.state_dict()}, pathlib.Path(path) / "state.pt")
            (pathlib.Path(path) / "progress.json").write_text(json.dumps({"steps": steps}))

    g = torch.Generator().manual_seed(ctx.info.trial_seed + steps + 7919 * rank)  # each rank its own batches
    for op in ctx.searcher.operations():
        while steps < op.length:
            idx = torch.randint(0, len(x_train), (batch_size,), generator=g)
            loss = nn.functional.cross_entropy(model(x_train[idx]), y_train[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps += 1
            if steps % 25 == 0:
                ctx.train.report_training_metrics(steps, {"loss": loss.item()})
            if steps % validate_every == 0 or steps == op.length:
                metrics = evaluate(net, x_val, y_val)
                ctx.train.report_validation_metrics(steps, metrics)
                save(metrics)
                if ctx.distributed.is_chief:
                    op.report_progress(steps)
                if ctx.preempt.should_preempt():
                    log.info("preempted at step %d; checkpoint saved, exiting", steps)
                    return
        if ctx.distributed.is_chief:  # (resumed at the op's end, nothing was trained: evaluate now)
            op.report_completed(evaluate(net, x_val, y_val)["validation_loss"])


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    with core.init() as ctx:
        main(ctx)
