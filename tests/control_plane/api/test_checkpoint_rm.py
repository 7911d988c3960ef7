"""`POST /api/v1/checkpoints/rm` (Determined's CheckpointsRemoveFiles, `det checkpoint rm`): some
files removed from a checkpoint's storage and its resources shrunk, all of them through the GC
loop, none to re-read the resources. SQLite and PostgreSQL; the real 0.38.1 client is in
tests/compat/test_det_cli.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from control_plane.core import checkpoint_globs
from control_plane.db.engine import transaction
from control_plane.db.models import Model, ModelVersion
from control_plane.loops.checkpoint_gc import delete_pending
from tests.control_plane.api.test_checkpoints import ckpt_body, report_ckpt
from tests.control_plane.api.test_experiments import (
    CONFIG,
    allocation_headers,
    create_ok,
    make_user,
    only_trial,
)


def test_globs_match_pathlib_style() -> None:
    res = {"model.pt": 1, "opt/": 0, "opt/state.pt": 2, "opt/deep/x.bin": 3, "logs/a.txt": 4}
    assert checkpoint_globs.removed(res, ["opt"]) == {"opt/", "opt/state.pt", "opt/deep/x.bin"}
    assert checkpoint_globs.removed(res, ["*.pt"]) == {"model.pt"}  # one part only
    assert checkpoint_globs.removed(res, ["**/*.pt"]) == {"model.pt", "opt/state.pt"}
    assert checkpoint_globs.removed(res, ["opt/*/x.?in", "logs/**"]) == {"opt/deep/x.bin", "logs/a.txt"}
    assert checkpoint_globs.removed(res, ["**/*"]) == set(res)
    assert checkpoint_globs.removes_every_file(res, checkpoint_globs.removed(res, ["*"]))
    assert not checkpoint_globs.removes_every_file(res, checkpoint_globs.removed(res, ["opt"]))
    assert not checkpoint_globs.removes_every_file({}, set())
    assert [checkpoint_globs.glob_problem(g) is None for g in ("", "../x", "a/../b", "/etc", "a/*")] == [
        False, False, False, False, True]


def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()} if root.exists() else set()


def test_remove_files(client, admin_headers, master, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    tmp_path = tmp_path / "state" / "checkpoints"  # the cluster's storage root (master_config's state_dir)
    alice = make_user(client, admin_headers, "alice")
    bob = make_user(client, admin_headers, "bob")
    config = CONFIG + f"checkpoint_storage:\n  type: shared_fs\n  host_path: {tmp_path}\n"
    trial = only_trial(master, create_ok(client, alice, config)["experiment"]["id"])
    token = allocation_headers(master, trial)
    a, b, registered = (report_ckpt(client, token, ckpt_body(trial, n)) for n in (10, 20, 30))
    for u in (a, b, registered):
        (tmp_path / u / "opt").mkdir(parents=True)
        (tmp_path / u / "model.pt").write_bytes(b"m" * 1000)
        (tmp_path / u / "opt" / "state.pt").write_bytes(b"s" * 24)
    with transaction(master.sessions) as s:
        model = Model(name="m", owner_id=1)
        s.add(model)
        s.flush()
        s.add(ModelVersion(model_id=model.id, version=1, checkpoint_uuid=registered, owner_id=1))

    def rm(headers: dict[str, str], uuids: list[str], globs: list[str]) -> Any:
        return client.post("/api/v1/checkpoints/rm", headers=headers,
                           json={"checkpointUuids": uuids, "checkpointGlobs": globs})

    def ckpt(u: str) -> dict[str, Any]:
        return client.get(f"/api/v1/checkpoints/{u}", headers=alice).json()["checkpoint"]

    # refusals change nothing, in files or rows
    assert rm(bob, [a], ["opt"]).status_code == 403
    assert rm(alice, [a, "00000000-0000-4000-8000-000000000000"], ["opt"]).status_code == 404
    for bad in ("", "../x"):
        r = rm(alice, [a], ["model.pt", bad])
        assert r.status_code == 400 and r.json()["details"][0]["field"] == "checkpointGlobs[1]", r.text
    r = rm(alice, [a, registered], ["opt"])
    assert r.status_code == 400 and registered in r.json()["message"]
    assert _files(tmp_path / a) == {"model.pt", "opt/state.pt"} and ckpt(a)["state"] == "STATE_COMPLETED"

    # a directory's glob removes it and what is under it
    assert rm(alice, [a], ["opt"]).status_code == 200
    assert _files(tmp_path / a) == {"model.pt"} and not (tmp_path / a / "opt").exists()
    got = ckpt(a)
    assert got["state"] == "STATE_PARTIALLY_DELETED" and got["resources"] == {"model.pt": "1000"}
    assert got["sizeBytes"] == "1000"

    # no glob: the resources are read again from storage
    (tmp_path / b / "model.pt").unlink()
    assert rm(alice, [b], []).status_code == 200
    assert ckpt(b)["resources"] == {"opt/": "0", "opt/state.pt": "24"}

    # every file: deleted whole by the GC loop, as `det checkpoint delete`
    assert rm(alice, [a, b], ["**/*"]).status_code == 200
    assert ckpt(a)["state"] == ckpt(b)["state"] == "STATE_DELETED"
    assert delete_pending(master) == 2
    assert not (tmp_path / a).exists() and not (tmp_path / b).exists()
    assert _files(tmp_path / registered) == {"model.pt", "opt/state.pt"}
