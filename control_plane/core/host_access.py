"""What in an experiment config reaches the agent's host, refused unless the master config sets
`allow_task_host_access` (pure): host paths (`bind_mounts`), devices, capabilities, and a shared_fs
checkpoint storage anywhere but the cluster's own storage root.

A shared_fs storage is bind-mounted read-write into the trial's container at its `host_path` (and
made there by the agent when missing), and the process runtime writes checkpoints under it, so a
user's `host_path: /etc` would be a host path like any `bind_mounts` entry. The check runs on the
*merged* config (the user's storage over the workspace's over the master's), so a workspace's
storage is held to the same rule, and a config that names no host_path inherits the root."""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from typing import Any

from control_plane.core.expconf import ExperimentConfig, SharedFSStorage
from control_plane.errors import FieldProblem

SETTING = "allow_task_host_access"
_STORAGE_FIELD = "config.checkpoint_storage.host_path"


def host_access_refusal(cfg: ExperimentConfig, cluster_storage: Mapping[str, Any]) -> FieldProblem | None:
    """The first part of `cfg` that needs `allow_task_host_access`, or None. `cluster_storage` is
    the master's own checkpoint storage (MasterConfig.default_checkpoint_storage)."""
    return (host_parts_refusal(cfg.bind_mounts, cfg.resources.devices, cfg.environment.add_capabilities)
            or storage_refusal(cfg.checkpoint_storage, cluster_storage))


def host_parts_refusal(bind_mounts: Sequence[object], devices: Sequence[object],
                       add_capabilities: Sequence[str]) -> FieldProblem | None:
    """An experiment's or a task's (command, notebook, shell, TensorBoard) host paths, devices or
    added capabilities: each needs `allow_task_host_access`."""
    for field_name, asked in (("config.bind_mounts", bind_mounts), ("config.resources.devices", devices),
                              ("config.environment.add_capabilities", add_capabilities)):
        if asked:
            return FieldProblem(field_name, "refused: a task gets only its task directory and its checkpoint "
                                f"storage; host paths, devices and capabilities need {SETTING} in the master config")
    return None


def storage_refusal(storage: object, cluster_storage: Mapping[str, Any]) -> FieldProblem | None:
    """A shared_fs storage must sit on the cluster's root: `host_path` the master's own (a
    `storage_path` below it may still pick a subdirectory). Any other path, or any shared_fs storage
    when the cluster's is not shared_fs, is a host path."""
    if not isinstance(storage, SharedFSStorage):
        return None
    root = storage_root(cluster_storage)
    if root is None:
        kind = cluster_storage.get("type") or "not set"
        return FieldProblem(_STORAGE_FIELD, f"refused: this cluster's checkpoint storage is {kind}, and a shared_fs "
                            f"storage would bind a host path into the trial; that needs {SETTING} in the master config")
    if posixpath.normpath(storage.host_path) != posixpath.normpath(root):
        return FieldProblem(_STORAGE_FIELD, f"refused: a shared_fs checkpoint storage must use the cluster's storage "
                            f"root {root} (choose a subdirectory with storage_path); another host path needs "
                            f"{SETTING} in the master config")
    return None


def storage_root(cluster_storage: Mapping[str, Any]) -> str | None:
    """The cluster's shared_fs root (its `host_path`), or None when the cluster stores elsewhere."""
    root = cluster_storage.get("host_path") if cluster_storage.get("type") == "shared_fs" else None
    return root if isinstance(root, str) and root else None
