"""The same training code runs without a master: a tiny loop touching every sub-API."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

import harness.core
from harness.core import Unit


def train(ctx: harness.core.Context, start_step: int = 0) -> dict[str, Any]:
    """A toy 'model': w converges towards 3 by gradient steps on (w - 3)^2."""
    hp = ctx.info.hparams
    lr = hp.get("lr", 0.1)
    w, steps = 0.0, start_step
    if ctx.info.latest_checkpoint:
        with ctx.checkpoint.restore_path(ctx.info.latest_checkpoint) as path:
            state = json.loads((path / "state.json").read_text())
            w, steps = state["w"], state["steps"]
    last_ckpt = None
    for op in ctx.searcher.operations():
        while steps < op.length:
            w -= lr * 2 * (w - 3)
            steps += 1
            ctx.train.report_training_metrics(steps, {"loss": (w - 3) ** 2},
                                              batch_metrics=[{"loss": (w - 3) ** 2}])
            op.report_progress(steps)
            if ctx.preempt.should_preempt():
                break
        val = abs(w - 3)
        ctx.train.report_validation_metrics(steps, {"val_loss": val})
        ctx.train.report_metrics("evaluation", steps, {"w": w})
        if ctx.distributed.rank == 0:
            with ctx.checkpoint.store_path({"steps_completed": steps}) as (path, uuid):
                (path / "state.json").write_text(json.dumps({"w": w, "steps": steps}))
            last_ckpt = uuid
        op.report_completed(val)
    return {"w": w, "steps": steps, "checkpoint": last_ckpt}


def test_tiny_training_loop_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    for var in ("DET_MASTER", "DET_TRIAL_ID"):
        monkeypatch.delenv(var, raising=False)
    with harness.core.init(max_length=25, hparams={"lr": 0.2}) as ctx:
        assert ctx.off_cluster
        assert ctx.distributed.rank == 0 and ctx.distributed.size == 1
        assert ctx.info.trial_id is None and ctx.info.hparams == {"lr": 0.2}
        result = train(ctx)
        sink = ctx.train_sink
        assert sink is not None
        training = sink.by_group("training")
        assert [r.steps_completed for r in training] == list(range(1, 26))
        assert training[-1].batch_metrics == [{"loss": training[-1].metrics["loss"]}]
        (val,) = sink.by_group("validation")
        assert val.steps_completed == 25 and val.metrics["val_loss"] < 1e-3
        assert sink.by_group("evaluation")[0].metrics["w"] == pytest.approx(3, abs=1e-3)
        assert sink.progress == 1.0
        assert ctx.searcher_results == [(25, val.metrics["val_loss"])]
        assert ctx.train.get_experiment_best_validation() is None  # no searcher.metric configured
        assert ctx.preempt.should_preempt() is False

        uuid = result["checkpoint"]
        assert ctx.checkpoint.get_metadata(uuid) == {"steps_completed": 25}
        assert json.loads((tmp_path / "checkpoints" / uuid / "state.json").read_text())["steps"] == 25

        # upload / download / delete of a plain directory
        src = tmp_path / "extra"
        (src / "sub").mkdir(parents=True)
        (src / "sub" / "f.txt").write_text("hello")
        other = ctx.checkpoint.upload(src, {"steps_completed": 0, "kind": "extra"})
        assert not (src / "metadata.json").exists()  # the caller's directory is left alone
        ctx.checkpoint.download(other, tmp_path / "dl")
        assert (tmp_path / "dl" / "sub" / "f.txt").read_text() == "hello"
        assert json.loads((tmp_path / "dl" / "metadata.json").read_text())["kind"] == "extra"
        ctx.checkpoint.delete(other)
        assert not (tmp_path / "checkpoints" / other).exists()

    printed = capsys.readouterr().out
    assert "[harness] training steps_completed=25 loss=" in printed
    assert "[harness] validation steps_completed=25 val_loss=" in printed

    # A "restarted" run picks up from the latest checkpoint, as a resumed trial would.
    monkeypatch.setenv("DET_LATEST_CHECKPOINT", uuid)
    with harness.core.init(max_length=30, print_metrics=False) as ctx2:
        assert ctx2.info.latest_checkpoint == uuid
        resumed = train(ctx2)
        steps = [r.steps_completed for r in ctx2.train_sink.by_group("training")]  # type: ignore[union-attr]
        assert steps == list(range(26, 31))
        assert resumed["steps"] == 30


def test_off_cluster_reads_searcher_and_storage_from_a_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = {
        "checkpoint_storage": {"type": "shared_fs", "host_path": str(tmp_path / "store")},
        "searcher": {"name": "single", "metric": "val_loss", "smaller_is_better": False,
                     "max_length": {"epochs": 3}},
    }
    env = {"DET_EXPERIMENT_CONFIG": json.dumps(config), "DET_HPARAMS": '{"lr": 0.5}'}
    with harness.core.init(env=env, print_metrics=False) as ctx:
        assert ctx.off_cluster
        assert ctx.info.hparams == {"lr": 0.5}
        assert ctx.searcher.get_configured_units() is Unit.EPOCHS
        (op,) = list(_complete_each(ctx, metric=0.7))
        assert op == 3
        ctx.train.report_validation_metrics(1, {"val_loss": 0.2})
        ctx.train.report_validation_metrics(2, {"val_loss": 0.9})
        ctx.train.report_validation_metrics(3, {"val_loss": math.nan})
        assert ctx.train.get_experiment_best_validation() == 0.9  # larger is better here
        with ctx.checkpoint.store_path({"steps_completed": 3}) as (path, uuid):
            (path / "w").write_text("1")
        assert (tmp_path / "store" / uuid / "w").exists()


def _complete_each(ctx: harness.core.Context, metric: float) -> list[int]:
    lengths = []
    for op in ctx.searcher.operations():
        lengths.append(op.length)
        op.report_completed(metric)
    return lengths


def test_misuse_is_reported_clearly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with harness.core.init(off_cluster=True, print_metrics=False) as ctx:
        with pytest.raises(ValueError, match="without '.'"):
            ctx.train.report_metrics("a.b", 1, {"x": 1})
        with pytest.raises(ValueError, match="steps_completed must be >= 0"):
            ctx.train.report_training_metrics(-1, {"x": 1})
        with pytest.raises(TypeError, match="steps_completed must be an integer"):
            ctx.train.report_training_metrics(1.5, {"x": 1})  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="is None"):
            ctx.train.report_validation_metrics(1, {"x": None})
        with pytest.raises(ValueError, match="between 0 and 1"):
            ctx.train.report_progress(1.5)
        with pytest.raises(RuntimeError, match="report_completed"):
            for _op in ctx.searcher.operations():
                pass
        # A failing block uploads nothing.
        with pytest.raises(KeyError):
            with ctx.checkpoint.store_path({"steps_completed": 1}) as (path, uuid):
                (path / "partial").write_text("x")
                raise KeyError("boom")
        assert not (tmp_path / "checkpoints" / uuid).exists()


def test_cluster_mode_needs_the_environment() -> None:
    with pytest.raises(RuntimeError, match="DET_MASTER and DET_TRIAL_ID"):
        harness.core.init(off_cluster=False, env={})


def test_bad_environment_values_name_the_variable() -> None:
    with pytest.raises(harness.core.ClusterInfoError, match="DET_HPARAMS is not valid JSON"):
        harness.core.init(env={"DET_HPARAMS": "{nope"})
    with pytest.raises(harness.core.ClusterInfoError, match="DET_TRIAL_ID must be an integer"):
        harness.core.init(env={"DET_TRIAL_ID": "seven"})


def test_distributed_from_launcher_env() -> None:
    d = harness.core.DistributedContext.from_env(
        {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1"})
    assert (d.rank, d.size, d.local_rank, d.local_size, d.cross_rank, d.cross_size) == (3, 4, 1, 2, 1, 2)
    assert not d.is_chief
    with pytest.raises(RuntimeError, match="collectives backend"):
        d.broadcast(1)
    single = harness.core.DistributedContext.from_env({})
    assert (single.rank, single.size, single.broadcast("x"), single.allgather(5)) == (0, 1, "x", [5])


@pytest.mark.integration
def test_importing_the_core_api_pulls_in_no_ml_or_cloud_library(tmp_path: Path) -> None:
    """torch is optional (examples only) and cloud SDKs load only for the storage in use."""
    import subprocess
    import sys

    code = (
        "import sys, harness.core\n"
        "ctx = harness.core.init(off_cluster=True, print_metrics=False)\n"
        "ctx.train.report_training_metrics(1, {'loss': 1.0}); ctx.close()\n"
        "print(sorted(m for m in ('torch', 'numpy', 'boto3', 'google.cloud.storage') if m in sys.modules))\n"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})
    assert out.stdout.strip() == "[]"
