"""The pure decision: which part of an experiment config needs allow_task_host_access. The API
side (every way a config is stored, both databases) is tests/control_plane/api/test_storage_host_access.py."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from control_plane.core.expconf import parse_experiment_config
from control_plane.core.expconf.defaults import merge_storage
from control_plane.core.host_access import host_access_refusal

ROOT = {"type": "shared_fs", "host_path": "/var/lib/shipyard/checkpoints"}
BASE = {"entrypoint": "python3 train.py", "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 1}}}


def _refusal(cluster: dict[str, Any], **extra: Any) -> str | None:
    cfg, _ = parse_experiment_config(yaml.safe_dump({**BASE, **extra}),
                                     default_checkpoint_storage=merge_storage(None, cluster))
    refused = host_access_refusal(cfg, cluster)
    return None if refused is None else refused.field


@pytest.mark.parametrize(("storage", "field"), [
    (None, None),
    ({"type": "shared_fs", "storage_path": "team"}, None),
    ({"type": "shared_fs", "host_path": "/var/lib/shipyard/checkpoints/", "storage_path": "a/b"}, None),
    ({"type": "shared_fs", "host_path": "/var/lib/shipyard/./checkpoints"}, None),
    ({"type": "s3", "bucket": "b"}, None),
    ({"type": "shared_fs", "host_path": "/etc"}, "config.checkpoint_storage.host_path"),
    ({"type": "shared_fs", "host_path": "/var/lib/shipyard/checkpoints/sub"}, "config.checkpoint_storage.host_path"),
    ({"type": "shared_fs", "host_path": "/var/lib/shipyard/checkpoints/../state"}, "config.checkpoint_storage.host_path"),
])
def test_a_shared_fs_storage_stays_on_the_clusters_root(storage: dict[str, Any] | None, field: str | None) -> None:
    assert _refusal(ROOT, **({} if storage is None else {"checkpoint_storage": storage})) == field


def test_any_shared_fs_storage_is_a_host_path_on_a_cluster_that_stores_elsewhere() -> None:
    s3 = {"type": "s3", "bucket": "ckpts"}
    assert _refusal(s3) is None
    assert _refusal(s3, checkpoint_storage={"type": "shared_fs", "host_path": "/mnt"}) \
        == "config.checkpoint_storage.host_path"


def test_bind_mounts_devices_and_capabilities_come_first() -> None:
    assert _refusal(ROOT, bind_mounts=[{"host_path": "/", "container_path": "/h"}]) == "config.bind_mounts"
    assert _refusal(ROOT, environment={"add_capabilities": ["SYS_ADMIN"]}) == "config.environment.add_capabilities"
