"""Checkpoint storage round trips on every backend, against real servers for the clouds."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import harness.core
from harness.storage import (
    CheckpointNotFound,
    CheckpointStorage,
    StorageConfigError,
    StorageNotWritable,
    from_config,
    list_resources,
)
from harness.storage.base import PROBE_PREFIX


def make_tree(root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / "model.bin").write_bytes(os.urandom(200_000))
    (root / "empty.txt").write_bytes(b"")
    (root / "nested" / "deeper" / "deepest").mkdir(parents=True)
    (root / "nested" / "a.json").write_text('{"a": 1}')
    (root / "nested" / "deeper" / "b.txt").write_text("b" * 1000)
    (root / "nested" / "deeper" / "deepest" / "empty.bin").write_bytes(b"")
    (root / "empty_dir" / "inner_empty").mkdir(parents=True)
    (root / "name with spaces.txt").write_text("spaces survive")


def snapshot(root: Path) -> dict[str, bytes | None]:
    """relpath -> bytes for files, None for directories."""
    out: dict[str, bytes | None] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath)
        for d in dirnames:
            out[(base / d).relative_to(root).as_posix() + "/"] = None
        for f in filenames:
            out[(base / f).relative_to(root).as_posix()] = (base / f).read_bytes()
    return out


@pytest.fixture(params=["shared_fs", "s3", "gcs"])
def storage_config(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    if request.param == "shared_fs":
        return {"type": "shared_fs", "host_path": str(tmp_path / "shared"), "storage_path": "ckpts"}
    if request.param == "s3":
        return request.getfixturevalue("s3_bucket")
    return request.getfixturevalue("gcs_bucket")


@pytest.mark.integration
def test_round_trip_is_byte_identical_and_delete_removes_it(storage_config: dict[str, Any], tmp_path: Path) -> None:
    storage = from_config(storage_config)
    storage.check_writable()
    src = tmp_path / "src"
    make_tree(src)

    storage.upload(src, "ckpt-1")
    dst = tmp_path / "dst"
    storage.download("ckpt-1", dst)
    assert snapshot(dst) == snapshot(src)

    # A second checkpoint is independent of the first.
    other = tmp_path / "other"
    other.mkdir()
    (other / "x").write_text("x")
    storage.upload(other, "ckpt-2")

    storage.delete("ckpt-1")
    with pytest.raises(CheckpointNotFound):
        storage.download("ckpt-1", tmp_path / "gone")
    storage.delete("ckpt-1")  # deleting again is fine
    storage.download("ckpt-2", tmp_path / "still-there")
    assert snapshot(tmp_path / "still-there") == {"x": b"x"}


@pytest.mark.integration
def test_probe_leaves_nothing_behind(storage_config: dict[str, Any], tmp_path: Path) -> None:
    storage = from_config(storage_config)
    storage.check_writable()
    if storage_config["type"] == "shared_fs":
        leftovers = [p.name for p in (tmp_path / "shared" / "ckpts").iterdir()]
    elif storage_config["type"] == "s3":
        resp = storage._client.list_objects_v2(Bucket=storage_config["bucket"])  # type: ignore[attr-defined]
        leftovers = [o["Key"] for o in resp.get("Contents", [])]
    else:
        leftovers = [b.name for b in storage._client.list_blobs(storage_config["bucket"])]  # type: ignore[attr-defined]
    assert not [name for name in leftovers if PROBE_PREFIX in name]


@pytest.mark.integration
def test_checkpoint_context_store_and_restore(storage_config: dict[str, Any], tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with harness.core.init(off_cluster=True, checkpoint_storage=storage_config, print_metrics=False) as ctx:
        with ctx.checkpoint.store_path({"steps_completed": 5, "note": "hi"}) as (path, uuid):
            make_tree(path)
            expected = snapshot(path)
        with ctx.checkpoint.restore_path(uuid) as restored:
            got = snapshot(restored)
        # metadata.json is added to every checkpoint.
        assert got.pop("metadata.json") is not None
        assert got == expected
        assert ctx.checkpoint.get_metadata(uuid) == {"steps_completed": 5, "note": "hi"}

        ctx.checkpoint.delete(uuid)
        with pytest.raises(CheckpointNotFound):
            with ctx.checkpoint.restore_path(uuid):
                pass


def test_list_resources_lists_files_and_directories(tmp_path: Path) -> None:
    make_tree(tmp_path / "t")
    res = list_resources(tmp_path / "t")
    assert res["model.bin"] == 200_000
    assert res["empty.txt"] == 0
    assert res["nested/deeper/b.txt"] == 1000
    assert res["empty_dir/inner_empty/"] == 0
    assert res["nested/"] == 0


def test_shared_fs_upload_into_itself_is_a_no_op(tmp_path: Path) -> None:
    storage = from_config({"type": "shared_fs", "host_path": str(tmp_path)})
    direct = storage.direct_path("abc")
    assert direct == tmp_path / "abc"
    direct.mkdir()
    (direct / "f").write_text("1")
    storage.upload(direct, "abc")
    assert (tmp_path / "abc" / "f").read_text() == "1"


def test_unsafe_ids_are_refused(tmp_path: Path) -> None:
    storage = from_config({"type": "shared_fs", "host_path": str(tmp_path)})
    for bad in ["../x", "a/b", "", ".."]:
        with pytest.raises(ValueError):
            storage.delete(bad)


@pytest.mark.parametrize(
    "config, message",
    [
        ({"type": "azure"}, "unsupported value 'azure'"),
        ({"type": "s3"}, "checkpoint_storage.bucket is required"),
        ({"type": "shared_fs"}, "host_path is required"),
        ({"type": "shared_fs", "host_path": "relative/dir"}, "must be absolute"),
        ({"type": "shared_fs", "host_path": "/mnt/a", "storage_path": "/elsewhere"}, "must be inside host_path"),
    ],
)
def test_bad_configs_say_what_is_wrong(config: dict[str, Any], message: str) -> None:
    with pytest.raises(StorageConfigError, match=message):
        from_config(config)


def test_string_specs(tmp_path: Path) -> None:
    s = from_config(str(tmp_path / "dir"))
    assert s.kind == "shared_fs"
    assert s.describe() == f"shared_fs:{tmp_path / 'dir'}"


# ---- unwritable storage fails at init, before training -------------------------------------------


def _init_with(storage: dict[str, Any] | CheckpointStorage, tmp_path: Path) -> None:
    harness.core.init(off_cluster=True, checkpoint_storage=storage, print_metrics=False)


def test_shared_fs_under_a_file_fails_at_init(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the storage directory should be")
    with pytest.raises(StorageNotWritable, match=r"shared_fs:.*not-a-dir.* is not writable"):
        _init_with({"type": "shared_fs", "host_path": str(blocker / "ckpts")}, tmp_path)


def test_read_only_shared_fs_fails_at_init() -> None:
    # Root writes into read-only directories: as root, the check runs with the effective user
    # `nobody` (in a directory nobody can reach), as a trial's unprivileged user would.
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="shipyard-ro-"))
    ro = base / "ro"
    base.chmod(0o755)
    ro.mkdir()
    ro.chmod(0o555)
    as_root = os.geteuid() == 0
    try:
        if as_root:
            import pwd

            os.seteuid(pwd.getpwnam("nobody").pw_uid)
        with pytest.raises(StorageNotWritable, match="is not writable"):
            _init_with({"type": "shared_fs", "host_path": str(ro)}, base)
    finally:
        if as_root:
            os.seteuid(0)
        ro.chmod(0o755)
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.integration
def test_missing_s3_bucket_fails_at_init(s3_bucket: dict[str, Any], tmp_path: Path) -> None:
    config = dict(s3_bucket, bucket="no-such-bucket-here")
    with pytest.raises(StorageNotWritable, match=r"s3://no-such-bucket-here/.*NoSuchBucket"):
        _init_with(config, tmp_path)


@pytest.mark.integration
def test_missing_gcs_bucket_fails_at_init(gcs_bucket: dict[str, Any], tmp_path: Path) -> None:
    config = dict(gcs_bucket, bucket="no-such-bucket-here")
    with pytest.raises(StorageNotWritable, match=r"gs://no-such-bucket-here/.* is not writable: 404"):
        _init_with(config, tmp_path)
