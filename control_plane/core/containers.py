"""What a task's container is made of, from its experiment config (pure): the image for the
agent's device type, pull policy and credentials, /dev/shm and memory sizes, and the host paths
to bind (shared_fs checkpoint storage at its own path, then `bind_mounts`)."""

from __future__ import annotations

from pathlib import PurePosixPath

from control_plane.core.expconf import ExperimentConfig, SharedFSStorage, byte_size
from shipyard_common.agent_protocol import ContainerMount, ContainerSpec


def container_spec(cfg: ExperimentConfig, device: str) -> ContainerSpec:
    env = cfg.environment
    auth = None
    if env.registry_auth is not None:
        auth = {k: v for k, v in env.registry_auth.model_dump().items() if v is not None}
    mounts: list[ContainerMount] = []
    checkpoint_path = None
    storage = cfg.checkpoint_storage
    if isinstance(storage, SharedFSStorage):
        # At the same path inside: the harness resolves host_path/storage_path as on the host.
        mounts.append(ContainerMount(host_path=storage.host_path, container_path=storage.host_path))
        checkpoint_path = str(PurePosixPath(storage.host_path) / (storage.storage_path or ""))
    for bm in cfg.bind_mounts:
        mounts.append(ContainerMount(host_path=bm.host_path, container_path=bm.container_path,
                                     read_only=bm.read_only))
    return ContainerSpec(
        image=getattr(env.image, device, None) or None,
        force_pull=env.force_pull_image,
        registry_auth=auth or None,
        shm_size_bytes=byte_size(cfg.resources.shm_size),
        memory_bytes=byte_size(cfg.resources.memory),
        mounts=mounts,
        checkpoint_path=checkpoint_path,
    )
