"""The trial environment as the master writes it is what the harness reads back."""

from __future__ import annotations

from harness.core._info import ClusterInfo
from shipyard_common.task_env import TRIAL_ENV_VARS, TrialEnvironment


def test_the_harness_reads_back_what_the_master_writes() -> None:
    written = TrialEnvironment(
        master_url="http://master:8080", cluster_id="c-1", agent_id="host-1", task_id="t-1", allocation_id="t-1.0",
        session_token="secret", trial_id=7, experiment_id=3, trial_seed=42, trial_run_id=2, slot_ids=["0", "1"],
        hparams={"lr": 0.1, "layers": [1, 2]}, experiment_config={"name": "x"}, latest_checkpoint="ck-uuid",
    )
    env = written.to_env()
    assert sorted(env) == sorted(TRIAL_ENV_VARS)
    assert all(isinstance(v, str) for v in env.values())
    assert "secret" not in repr(written)
    info = ClusterInfo.from_env(env)
    assert info.on_cluster
    assert (info.master_url, info.session_token, info.cluster_id, info.agent_id) == (
        "http://master:8080", "secret", "c-1", "host-1")
    assert (info.trial_id, info.experiment_id, info.allocation_id, info.task_id, info.task_type) == (
        7, 3, "t-1.0", "t-1", "TRIAL")
    assert (info.trial_seed, info.trial_run_id, info.slot_ids, info.latest_checkpoint) == (42, 2, [0, 1], "ck-uuid")
    assert info.hparams == {"lr": 0.1, "layers": [1, 2]} and info.experiment_config == {"name": "x"}


def test_no_checkpoint_yet_reads_as_none() -> None:
    env = TrialEnvironment(
        master_url="http://m", cluster_id="c", agent_id="a", task_id="t", allocation_id="t.0", session_token="s",
        trial_id=1, experiment_id=1, trial_seed=0, trial_run_id=0, slot_ids=[], hparams={}, experiment_config={},
    ).to_env()
    assert env["DET_LATEST_CHECKPOINT"] == ""
    assert ClusterInfo.from_env(env).latest_checkpoint is None
