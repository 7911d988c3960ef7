"""`python -m harness.launch.torch_distributed` (argument handling, the torchrun command it builds
from the master's rendezvous) and the torch.distributed collectives of the Core API, run for real
over two processes on gloo."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.launch import torch_distributed as launch

ROOT = Path(__file__).resolve().parents[2]


def test_arguments_before_the_separator_go_to_torchrun() -> None:
    assert launch.split_args(["train.py", "--lr", "1"]) == ([], ["train.py", "--lr", "1"])
    assert launch.split_args(["--max_restarts=0", "--", "train.py"]) == (["--max_restarts=0"], ["train.py"])
    with pytest.raises(launch.LaunchError, match="usage"):
        launch.split_args(["--max_restarts=0", "--"])


def test_the_torchrun_command_follows_the_rendezvous() -> None:
    rdzv = {"addresses": ["10.0.0.1", "10.0.0.2"], "rank": 1, "slots": [4, 4]}
    argv = launch.torchrun_argv(rdzv, 29555, ["--max_restarts=0"], ["-m", "pkg.train", "--x"], python="py")
    assert argv == ["py", "-m", "torch.distributed.run", "--nnodes=2", "--node_rank=1", "--nproc_per_node=4",
                    "--master_addr=10.0.0.1", "--master_port=29555", "--max_restarts=0", "--module", "pkg.train", "--x"]
    off = launch.standalone_argv({"DET_SLOT_IDS": '["0", "1", "2"]'}, [], ["train.py"], python="py")
    assert off == ["py", "-m", "torch.distributed.run", "--standalone", "--nnodes=1", "--nproc_per_node=3", "train.py"]


def test_off_the_cluster_the_rendezvous_says_what_is_missing() -> None:
    with pytest.raises(launch.LaunchError, match="DET_ALLOCATION_ID, DET_RESOURCES_ID not set"):
        launch.fetch_rendezvous({"DET_MASTER": "http://127.0.0.1:1"})


class _Answer:
    def __init__(self, info: dict) -> None:  # type: ignore[type-arg]
        self.info = info

    def get(self, path: str) -> dict:  # type: ignore[type-arg]
        return {"rendezvousInfo": self.info}


def test_a_malformed_or_uneven_rendezvous_is_refused() -> None:
    env = {"DET_MASTER": "http://m", "DET_ALLOCATION_ID": "a", "DET_RESOURCES_ID": "r"}
    with pytest.raises(launch.LaunchError, match="malformed"):
        launch.fetch_rendezvous(env, session=_Answer({"addresses": ["a"], "rank": 1, "slots": [1]}))  # type: ignore[arg-type]
    with pytest.raises(launch.LaunchError, match="as many processes"):
        launch.fetch_rendezvous(env, session=_Answer({"addresses": ["a", "b"], "rank": 0, "slots": [2, 1]}))  # type: ignore[arg-type]


SCRIPT = textwrap.dedent('''
    from harness import core

    with core.init(off_cluster=True, max_length=7, checkpoint_storage="{storage}", print_metrics=False) as ctx:
        d = ctx.distributed
        assert d.broadcast({{"op": 60}} if d.is_chief else None) == {{"op": 60}}
        assert d.allgather(("r", d.rank, "x" * d.rank)) == [("r", 0, ""), ("r", 1, "x")]
        gathered = d.gather(d.rank * 10)
        assert gathered == ([0, 10] if d.is_chief else None), gathered
        d.barrier()
        ops = []
        for op in ctx.searcher.operations():  # the chief's operations, broadcast to the worker
            ops.append(op.length)
            if d.is_chief:
                op.report_completed(1.0)
        assert ops == [7], ops
        print(f"rank {{d.rank}} of {{d.size}} ok", flush=True)
''')


def test_core_collectives_over_two_real_processes(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    script = tmp_path / "t.py"
    script.write_text(SCRIPT.format(storage=tmp_path / "ckpts"))
    out = subprocess.run(
        [sys.executable, "-m", "harness.launch.torch_distributed", "--nproc_per_node=2", "--", str(script)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-3000:]
    assert "rank 0 of 2 ok" in out.stdout and "rank 1 of 2 ok" in out.stdout
