"""TensorBoard files in a shared_fs storage with two task users (agent/tensorboard_dirs.py,
harness/tensorboard/serve.py): the first writer no longer owns the tree. Run as root; the users'
writes run in subprocesses under their own uids (the system's python3, the repository on
PYTHONPATH), as /tmp/review11/tb_squat.py did."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_bootstrap.agent import identity, tensorboard_dirs
from agent_bootstrap.agent.runtime.base import RunAs
from harness.tensorboard.serve import SOURCES_ENV, sources_from_env
from harness.tensorboard.sync import sync_path

ALICE, BOB = RunAs(200001, 200001), RunAs(200002, 200002)
REPO = Path(__file__).resolve().parents[2]
PYTHON = shutil.which("python3", path="/usr/bin:/usr/local/bin") or sys.executable

pytestmark = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0 or identity.unreachable_ancestor(REPO / "harness") is not None,
    reason="switches uids: needs root and a repository other users can read")

UPLOAD = r'''
import sys, tempfile
from pathlib import Path
from harness.storage.shared_fs import SharedFSStorage
from harness.tensorboard.sync import sync_path
src = tempfile.NamedTemporaryFile(delete=False); src.write(b"events"); src.close()
key = sync_path("c", int(sys.argv[2]), int(sys.argv[3])) + "/events.out.tfevents.1"
try:
    SharedFSStorage(Path(sys.argv[1])).upload_file(Path(src.name), key)
    print("wrote")
except OSError as e:
    print("refused", type(e).__name__)
'''


def as_user(who: RunAs, code: str, *args: str) -> str:
    out = subprocess.run([PYTHON, "-c", code, *args], user=who.uid, group=who.gid, extra_groups=[], cwd="/tmp",
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.fixture
def storage() -> Iterator[Path]:
    top = Path(tempfile.mkdtemp(prefix="tb-dirs-", dir="/tmp"))  # pytest's tmp_path is 0700: not for others
    top.chmod(0o755)
    base = top / "ckpts"
    identity.shared_checkpoint_dir(str(base), [str(top)])  # 1777, as the agent makes it
    yield base
    shutil.rmtree(top)


def test_no_user_owns_the_tree_or_claims_another_experiment(storage: Path) -> None:
    # Bob claims the cluster's tree through the sticky base before anyone wrote, planting event
    # files for experiment 1 (Alice's, not started yet).
    planted = f"import os; os.makedirs('{storage}/{sync_path('c', 1, 1)}'); open('{storage}/{sync_path('c', 1, 1)}/x', 'w')"
    as_user(BOB, planted)
    tensorboard_dirs.prepare(str(storage), "c", "2", "2", BOB)  # Bob's trial 2 of experiment 2
    tensorboard_dirs.prepare(str(storage), "c", "1", "1", ALICE)  # Alice's trial 1 of experiment 1
    shared = storage / "c" / "tensorboard" / "experiment"
    for level in (storage / "c", storage / "c" / "tensorboard", shared):
        st = level.lstat()
        assert (st.st_uid, oct(st.st_mode & 0o7777)) == (0, "0o755"), level  # the agent's again
    exp1 = shared / "1"
    assert (exp1.stat().st_uid, (exp1 / "trial").stat().st_uid, (exp1 / "trial" / "1").stat().st_uid) == (ALICE.uid,) * 3
    assert list((exp1 / "trial" / "1").iterdir()) == []  # Bob's plant was set aside, not adopted
    assert [p.name.startswith(".aside-1-") for p in (exp1 / "trial").iterdir() if p.name != "1"] == [True]
    # Both users write their own trials' files; Bob can neither claim experiment 3 nor write in Alice's.
    assert as_user(ALICE, UPLOAD, str(storage), "1", "1") == "wrote"
    assert as_user(BOB, UPLOAD, str(storage), "2", "2") == "wrote"
    assert as_user(BOB, UPLOAD, str(storage), "3", "3") == "refused PermissionError"
    assert as_user(BOB, UPLOAD, str(storage), "1", "4") == "refused PermissionError"
    # A link where a level belongs is set aside, never followed.
    (shared / "5").symlink_to("/etc")
    tensorboard_dirs.prepare(str(storage), "c", "5", "1", ALICE)
    assert (shared / "5").is_dir() and not (shared / "5").is_symlink() and (shared / "5").stat().st_uid == ALICE.uid


def test_the_reader_leaves_out_a_trial_directory_its_experiment_owner_does_not_own(
        storage: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tensorboard_dirs.prepare(str(storage), "c", "1", "1", ALICE)
    foreign = storage / sync_path("c", 1, 2)
    foreign.mkdir()
    os.chown(foreign, BOB.uid, BOB.gid)  # from before the agent made these levels
    cfg = {"type": "shared_fs", "host_path": str(storage)}
    listed = [{"name": f"exp1-trial{t}", "storage": cfg, "path": sync_path("c", 1, t), "owner": 1} for t in (1, 2, 3)]
    # the agent adds the uid the owner's trials run as
    env = {SOURCES_ENV: tensorboard_dirs.with_owner_uids(json.dumps(listed), lambda user: RunAs(200000 + user, 0))}
    assert [s.get("uid") for s in json.loads(env[SOURCES_ENV])] == [ALICE.uid] * 3
    scratch = storage.parent / "scratch"
    scratch.mkdir()
    sources = sources_from_env(env, scratch)
    assert sorted(p.name for p in scratch.iterdir()) == ["exp1-trial1", "exp1-trial3"]  # 3: not written yet
    assert f"exp1-trial2 is left out: its event directory {foreign} belongs to uid {BOB.uid}" in capsys.readouterr().out
    # trial 3's directory appears, someone else's: the next pass drops its link
    (storage / sync_path("c", 1, 3)).mkdir()
    os.chown(storage / sync_path("c", 1, 3), BOB.uid, BOB.gid)
    for s in sources:
        s.sync()
    assert sorted(p.name for p in scratch.iterdir()) == ["exp1-trial1"]
