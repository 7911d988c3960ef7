"""A data-parallel trial written against Determined's own API (0.38.1), started by Determined's
own launcher (`python3 -m determined.launch.torch_distributed python3 train.py`): torch's gloo
process group on CPU, `core.DistributedContext.from_torch_distributed()`, `core.init(distributed=...)`.

Each rank fits w towards its own target (2 + 2·rank); the gradients are averaged with
`dist.all_reduce`, so w goes to their mean (3 for two ranks). The chief reports the metrics and
completes the searcher operation; every rank writes its shard of each checkpoint (Determined's
broadcast/allgather over ZMQ); a resumed run restores w from every rank's shard."""

import json
import os
import sys

import determined as det
import torch
import torch.distributed as dist
from determined import core


def main() -> None:
    dist.init_process_group("gloo")
    distributed = core.DistributedContext.from_torch_distributed()
    with core.init(distributed=distributed, tensorboard_mode=core.TensorboardMode.MANUAL) as ctx:
        info = det.get_cluster_info()
        if info is None:
            print("OFF-CLUSTER: no cluster info", flush=True)
            sys.exit(3)
        rank, size = distributed.get_rank(), distributed.get_size()
        print(f"rank {rank} of {size}: agent {info.agent_id} cross_rank {distributed.cross_rank} "
              f"of {distributed.get_num_agents()} chief_ip {os.environ.get('DET_CHIEF_IP')} "
              f"zmq ports {distributed._pub_port}/{distributed._pull_port}", flush=True)
        agents = distributed.allgather(info.agent_id)  # Determined's ZMQ collective
        if rank == 0:
            print(f"agents: {sorted(agents)}", flush=True)
        w, steps = torch.zeros(1), 0
        if info.latest_checkpoint:
            with ctx.checkpoint.restore_path(info.latest_checkpoint) as path:
                state = json.loads((path / f"rank{rank}.json").read_text())
            w, steps = torch.tensor([state["w"]]), state["steps"]
            print(f"rank {rank} restored {info.latest_checkpoint} at step {steps}", flush=True)
        lr = float(info.trial.hparams["lr"])
        target = 2.0 + 2.0 * rank
        for op in ctx.searcher.operations():
            while steps < op.length:
                steps += 1
                grad = 2 * (w - target)
                dist.all_reduce(grad)
                w -= lr * grad / size
                loss = float((w - 3.0) ** 2)
                if rank == 0:
                    ctx.train.report_training_metrics(steps_completed=steps, metrics={"loss": loss})
                if steps % 5 == 0 or steps == op.length:
                    if rank == 0:
                        ctx.train.report_validation_metrics(steps_completed=steps,
                                                            metrics={"validation_loss": loss})
                    with ctx.checkpoint.store_path({"steps_completed": steps}, shard=True) as (path, _):
                        (path / f"rank{rank}.json").write_text(json.dumps({"w": float(w), "steps": steps}))
                    if ctx.preempt.should_preempt():
                        print(f"rank {rank} preempted at step {steps}", flush=True)
                        return
            if rank == 0:
                op.report_completed(float((w - 3.0) ** 2))
        print(f"rank {rank} done: w={float(w):.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
