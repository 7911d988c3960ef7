"""What a task's container is made of, from its experiment config (pure): the image for the
agent's device type, pull policy and credentials, /dev/shm and memory sizes, the host paths to
bind (shared_fs checkpoint storage at its own path, then `bind_mounts`), capabilities added and
dropped, and host devices."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import PurePosixPath

from control_plane.core.expconf import (
    BindMount,
    Device,
    Environment,
    ExperimentConfig,
    SharedFSStorage,
    byte_size,
)
from control_plane.core.task_config import TaskConfig
from shipyard_common.agent_protocol import ContainerDevice, ContainerMount, ContainerSpec


def task_container_spec(cfg: TaskConfig, device: str, read_only_paths: Sequence[str] = ()) -> ContainerSpec:
    """A command's or notebook's container: the same sections as an experiment's, no checkpoints;
    `read_only_paths` bound read-only at their own paths, each left out where the agent lacks it
    (a TensorBoard's trials' event directories in shared_fs storages)."""
    spec = _spec(cfg.environment, cfg.bind_mounts, device, cfg.resources.shm_size, cfg.resources.memory,
                 devices=cfg.resources.devices)
    taken = {m.container_path for m in spec.mounts}
    extra = [ContainerMount(host_path=p, container_path=p, read_only=True, optional=True)
             for p in dict.fromkeys(read_only_paths) if p not in taken]
    return spec.model_copy(update={"mounts": [*extra, *spec.mounts]}) if extra else spec


def container_spec(cfg: ExperimentConfig, device: str, storage_root: str | None = None) -> ContainerSpec:
    """A trial's container; `storage_root` is the cluster's own shared_fs root (core/host_access.py),
    the only place besides its work dir where the agent makes a missing directory for it."""
    spec = _spec(cfg.environment, cfg.bind_mounts, device, cfg.resources.shm_size, cfg.resources.memory,
                 cfg.checkpoint_storage, devices=cfg.resources.devices)
    return spec.model_copy(update={"storage_root": storage_root}) if storage_root else spec


def _spec(env: Environment, bind_mounts: Sequence[BindMount], device: str, shm_size: int | str | None,
          memory: int | str | None, storage: object = None, *, devices: Sequence[Device] = ()) -> ContainerSpec:
    auth = None
    if env.registry_auth is not None:
        auth = {k: v for k, v in env.registry_auth.model_dump().items() if v is not None}
    mounts: list[ContainerMount] = []
    checkpoint_path = None
    if isinstance(storage, SharedFSStorage):
        # At the same path inside: the harness resolves host_path/storage_path as on the host.
        mounts.append(ContainerMount(host_path=storage.host_path, container_path=storage.host_path))
        checkpoint_path = str(PurePosixPath(storage.host_path) / (storage.storage_path or ""))
    for bm in bind_mounts:
        mounts.append(ContainerMount(host_path=bm.host_path, container_path=bm.container_path,
                                     read_only=bm.read_only))
    return ContainerSpec(
        image=getattr(env.image, device, None) or None,
        force_pull=env.force_pull_image,
        registry_auth=auth or None,
        shm_size_bytes=byte_size(shm_size),
        memory_bytes=byte_size(memory),
        mounts=mounts,
        checkpoint_path=checkpoint_path,
        cap_add=list(env.add_capabilities),
        cap_drop=list(env.drop_capabilities),
        devices=[ContainerDevice(host_path=d.host_path, container_path=d.container_path, mode=d.mode) for d in devices],
    )
