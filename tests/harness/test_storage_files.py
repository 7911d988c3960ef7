"""Listing and removing some of a checkpoint's files (`det checkpoint rm --glob`) on every backend,
against real servers for the clouds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.storage import from_config
from tests.harness.test_storage import make_tree, snapshot, storage_config  # noqa: F401 (fixture)


@pytest.mark.integration
def test_list_and_delete_some_files(storage_config: dict[str, Any], tmp_path: Path) -> None:  # noqa: F811
    storage = from_config(storage_config)
    src = tmp_path / "src"
    make_tree(src)
    storage.upload(src, "ckpt-1")
    storage.upload(src, "ckpt-2")
    listed = storage.list_files("ckpt-1")
    files = {k: v for k, v in listed.items() if not k.endswith("/")}
    assert files == {"model.bin": 200_000, "empty.txt": 0, "nested/a.json": 8, "nested/deeper/b.txt": 1000,
                     "nested/deeper/deepest/empty.bin": 0, "name with spaces.txt": 14}
    assert "empty_dir/inner_empty/" in listed  # an empty directory survives as a marker

    storage.delete_files("ckpt-1", ["nested/deeper/", "model.bin", "not-there.txt"])
    left = storage.list_files("ckpt-1")
    assert {k for k in left if not k.endswith("/")} == {"empty.txt", "nested/a.json", "name with spaces.txt"}
    storage.download("ckpt-1", tmp_path / "dst")
    assert snapshot(tmp_path / "dst")["nested/a.json"] == b'{"a": 1}'
    assert storage.list_files("ckpt-2") == listed  # another checkpoint is untouched
    assert storage.list_files("ckpt-absent") == {}
