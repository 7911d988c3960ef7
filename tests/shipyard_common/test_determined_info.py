"""The files Determined's `determined.core` reads on cluster, written per task by the agent, and the
shim that points the package at them. The shim is checked here against a stand-in `determined`
package with the same hooks (fixed default paths, a shared_fs container path); tests/compat runs
the real package (0.38.1) on a real agent."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

from agent_bootstrap.agent import determined_env
from shipyard_common.determined_info import INFO_DIR_ENV, INFO_FILES
from shipyard_common.task_env import TrialEnvironment


def trial_env(storage: str = "/data/ckpt") -> dict[str, str]:
    return TrialEnvironment(
        master_url="http://m:8080", cluster_id="c-1", agent_id="a-1", task_id="t-1", allocation_id="t-1.2",
        session_token="secret", trial_id=7, experiment_id=3, trial_seed=42, trial_run_id=2, slot_ids=["0", "1"],
        hparams={"lr": 0.1}, experiment_config={"checkpoint_storage": {"type": "shared_fs", "host_path": storage}},
        latest_checkpoint="ck", user="alice", steps_completed=40,
    ).to_env()


def test_prepare_writes_private_info_files(tmp_path: Path) -> None:
    env = determined_env.prepare({**trial_env(), "PYTHONPATH": "/x"}, tmp_path)
    info_dir = Path(env[INFO_DIR_ENV])
    assert info_dir.parent == tmp_path and stat.S_IMODE(info_dir.stat().st_mode) == 0o700
    assert sorted(p.name for p in info_dir.iterdir()) == sorted(INFO_FILES)
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in info_dir.iterdir())  # the token is in there
    cluster = json.loads((info_dir / "cluster.json").read_text())
    assert (cluster["session_token"], cluster["slot_ids"], cluster["latest_checkpoint"]) == ("secret", [0, 1], "ck")
    trial = json.loads((info_dir / "trial.json").read_text())
    assert (trial["trial_id"], trial["steps_completed"], trial["trial_run_id"], trial["hparams"]) == (7, 40, 2, {"lr": 0.1})
    assert json.loads((info_dir / "rendezvous.json").read_text())["container_slot_counts"] == [2]
    # The shim, then the package root (it holds the harness here as in the unpacked agent package).
    assert env["PYTHONPATH"] == os.pathsep.join([str(determined_env.SHIM_DIR), str(determined_env.PACKAGE_ROOT), "/x"])
    assert env["DET_USER"] == "alice"
    assert determined_env.prepare({"PATH": "/bin"}, tmp_path / "other") == {"PATH": "/bin"}  # not a trial


STAND_IN = {
    "determined/__init__.py": "from determined import _info\nfrom determined.common import constants\n",
    "determined/common/__init__.py": "",
    "determined/common/constants.py": 'SHARED_FS_CONTAINER_PATH = "/determined_shared_fs"\n',
    "determined/_info.py": textwrap.dedent("""
        import json, os
        DEFAULT_CLUSTER_INFO_PATH = "/run/determined/info/cluster.json"
        DEFAULT_TRIAL_INFO_PATH = "/run/determined/info/trial.json"
        class TrialInfo:
            @classmethod
            def _from_file(cls, path=DEFAULT_TRIAL_INFO_PATH):
                return json.load(open(path)) if os.path.exists(path) else None
        class ClusterInfo:
            @classmethod
            def _from_file(cls, path=DEFAULT_CLUSTER_INFO_PATH):
                if not os.path.exists(path):
                    return None
                return {**json.load(open(path)), "trial": TrialInfo._from_file()}
    """),
}


def test_the_shim_points_determined_at_the_task_files(tmp_path: Path) -> None:
    for rel, text in STAND_IN.items():
        (tmp_path / "pkgs" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "pkgs" / rel).write_text(text)
    # The environment's own sitecustomize still runs after the shim.
    (tmp_path / "own").mkdir()
    (tmp_path / "own" / "sitecustomize.py").write_text("import os\nos.environ['OWN_SITECUSTOMIZE'] = 'ran'\n")
    env = determined_env.prepare(trial_env("/data/ckpt"), tmp_path / "task")
    env["PYTHONPATH"] += os.pathsep + os.pathsep.join([str(tmp_path / "pkgs"), str(tmp_path / "own")])
    script = ("import json, os\nfrom determined import _info\nfrom determined.common import constants\n"
              "info = _info.ClusterInfo._from_file()\n"
              "print(json.dumps([info['task_id'], info['trial']['trial_id'], constants.SHARED_FS_CONTAINER_PATH,"
              " os.environ.get('OWN_SITECUSTOMIZE')]))")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == ["t-1", 7, "/data/ckpt", "ran"]
