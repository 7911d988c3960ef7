"""Who this process is among the workers of a trial.

Ranks come from the variables launchers set (torchrun: RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, GROUP_RANK; Horovod/MPI-style: CROSS_RANK, CROSS_SIZE). A single process is
rank 0 of 1 and every collective is trivial.

Collectives (broadcast, allgather, gather, barrier) for size > 1 go through a `Collectives`
backend. `TorchCollectives` is torch.distributed's object collectives on a gloo group (its own
group when the training uses NCCL, so Python objects never go through GPU memory);
`DistributedContext.from_torch_distributed()` builds the context from torch's process group (and
starts it from the launcher's environment when the training code has not). `harness.core.init()`
does that by itself when the trial runs several processes (`python -m
harness.launch.torch_distributed`). Without a backend, a multi-process collective raises instead
of silently doing the wrong thing. torch is imported only when it is used.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from typing import Any, Protocol


class Collectives(Protocol):
    def broadcast(self, obj: Any, root: int = 0) -> Any: ...
    def allgather(self, obj: Any) -> list[Any]: ...
    def gather(self, obj: Any, root: int = 0) -> list[Any] | None: ...
    def barrier(self) -> None: ...
    def close(self) -> None: ...


def _env_int(env: Mapping[str, str], *names: str, default: int) -> int:
    for name in names:
        raw = env.get(name)
        if raw not in (None, ""):
            try:
                return int(raw)
            except ValueError:
                raise ValueError(f"{name} must be an integer, got {raw!r}") from None
    return default


class TorchCollectives:
    """Object collectives over torch.distributed (gloo): objects are pickled into byte tensors by
    hand (torch's own `*_object` collectives need NumPy, which a trial need not have).
    `owns_process_group`: this object started the default process group, so it ends it on close
    (one the training code started is left alone)."""

    def __init__(self, *, owns_process_group: bool = False) -> None:
        import torch
        import torch.distributed as tdist

        self._torch = torch
        self._tdist = tdist
        self._owns = owns_process_group
        # Bytes travel as CPU tensors, with gloo. A training process group on NCCL gets a gloo
        # group beside it (every rank creates it, in the same order).
        self._group = None if tdist.get_backend() == "gloo" else tdist.new_group(backend="gloo")
        self._size = tdist.get_world_size()
        self._rank = tdist.get_rank()

    def _encode(self, obj: Any) -> Any:
        data = pickle.dumps(obj)
        return self._torch.frombuffer(bytearray(data), dtype=self._torch.uint8) if data else \
            self._torch.empty(0, dtype=self._torch.uint8)

    @staticmethod
    def _decode(tensor: Any, size: int) -> Any:
        return pickle.loads(bytes(tensor[:size].tolist()))

    def broadcast(self, obj: Any, root: int = 0) -> Any:
        torch, tdist = self._torch, self._tdist
        payload = self._encode(obj) if self._rank == root else None
        size = torch.tensor([payload.numel() if payload is not None else 0], dtype=torch.int64)
        tdist.broadcast(size, src=root, group=self._group)
        if payload is None:
            payload = torch.empty(int(size.item()), dtype=torch.uint8)
        tdist.broadcast(payload, src=root, group=self._group)
        return obj if self._rank == root else self._decode(payload, int(size.item()))

    def allgather(self, obj: Any) -> list[Any]:
        torch, tdist = self._torch, self._tdist
        payload = self._encode(obj)
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self._size)]
        tdist.all_gather(sizes, torch.tensor([payload.numel()], dtype=torch.int64), group=self._group)
        longest = max(int(n.item()) for n in sizes)
        padded = torch.zeros(longest, dtype=torch.uint8)
        padded[: payload.numel()] = payload
        out = [torch.empty(longest, dtype=torch.uint8) for _ in range(self._size)]
        tdist.all_gather(out, padded, group=self._group)
        return [self._decode(t, int(n.item())) for t, n in zip(out, sizes)]

    def gather(self, obj: Any, root: int = 0) -> list[Any] | None:
        everyone = self.allgather(obj)  # small objects: one all-gather is simpler than gather + sizes
        return everyone if self._rank == root else None

    def barrier(self) -> None:
        self._tdist.barrier(group=self._group)

    def close(self) -> None:
        if self._owns and self._tdist.is_initialized():
            self._tdist.destroy_process_group()
            self._owns = False


class DistributedContext:
    def __init__(
        self,
        *,
        rank: int = 0,
        size: int = 1,
        local_rank: int = 0,
        local_size: int = 1,
        cross_rank: int = 0,
        cross_size: int = 1,
        collectives: Collectives | None = None,
    ) -> None:
        if size < 1 or not 0 <= rank < size:
            raise ValueError(f"invalid rank {rank} for size {size}")
        if local_size < 1 or not 0 <= local_rank < local_size:
            raise ValueError(f"invalid local_rank {local_rank} for local_size {local_size}")
        if cross_size < 1 or not 0 <= cross_rank < cross_size:
            raise ValueError(f"invalid cross_rank {cross_rank} for cross_size {cross_size}")
        self.rank = rank
        self.size = size
        self.local_rank = local_rank
        self.local_size = local_size
        self.cross_rank = cross_rank
        self.cross_size = cross_size
        self._collectives = collectives

    @classmethod
    def from_env(cls, env: Mapping[str, str], collectives: Collectives | None = None) -> DistributedContext:
        size = _env_int(env, "WORLD_SIZE", "SIZE", default=1)
        local_size = _env_int(env, "LOCAL_WORLD_SIZE", "LOCAL_SIZE", default=size)
        cross_size = _env_int(env, "CROSS_SIZE", default=max(1, size // max(1, local_size)))
        return cls(
            rank=_env_int(env, "RANK", default=0),
            size=size,
            local_rank=_env_int(env, "LOCAL_RANK", default=0),
            local_size=local_size,
            cross_rank=_env_int(env, "CROSS_RANK", "GROUP_RANK", "NODE_RANK", default=0),
            cross_size=cross_size,
            collectives=collectives,
        )

    @classmethod
    def from_torch_distributed(cls, env: Mapping[str, str] | None = None) -> DistributedContext:
        """The context of a process started by torch.distributed's launcher (RANK, WORLD_SIZE,
        LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR/PORT): collectives over torch's
        default process group, which is started here (NCCL when this process has a GPU, else gloo)
        unless the training code started it already."""
        import os

        import torch
        import torch.distributed as tdist

        env = os.environ if env is None else env
        owns = False
        if not tdist.is_initialized():
            backend = "nccl" if torch.cuda.is_available() and tdist.is_nccl_available() else "gloo"
            if backend == "nccl":
                torch.cuda.set_device(_env_int(env, "LOCAL_RANK", default=0))
            tdist.init_process_group(backend=backend)
            owns = True
        size = tdist.get_world_size()
        local_size = _env_int(env, "LOCAL_WORLD_SIZE", default=size)
        return cls(
            rank=tdist.get_rank(),
            size=size,
            local_rank=_env_int(env, "LOCAL_RANK", default=0),
            local_size=local_size,
            cross_rank=_env_int(env, "GROUP_RANK", "CROSS_RANK", "NODE_RANK", default=0),
            cross_size=_env_int(env, "CROSS_SIZE", default=max(1, size // max(1, local_size))),
            collectives=TorchCollectives(owns_process_group=owns),
        )

    def __repr__(self) -> str:
        return (f"DistributedContext(rank={self.rank}, size={self.size}, local_rank={self.local_rank}, "
                f"local_size={self.local_size}, cross_rank={self.cross_rank}, cross_size={self.cross_size})")

    @property
    def is_chief(self) -> bool:
        return self.rank == 0

    @property
    def is_local_chief(self) -> bool:
        return self.local_rank == 0

    # Determined's accessor names.
    def get_rank(self) -> int:
        return self.rank

    def get_local_rank(self) -> int:
        return self.local_rank

    def get_size(self) -> int:
        return self.size

    def get_num_agents(self) -> int:
        return self.cross_size

    def _backend(self, what: str) -> Collectives:
        if self._collectives is None:
            raise RuntimeError(
                f"{what}() across {self.size} processes needs a collectives backend; "
                "pass DistributedContext(collectives=...) to harness.core.init()"
            )
        return self._collectives

    def broadcast(self, obj: Any = None, root: int = 0) -> Any:
        if self.size == 1:
            return obj
        return self._backend("broadcast").broadcast(obj, root)

    def allgather(self, obj: Any) -> list[Any]:
        if self.size == 1:
            return [obj]
        return self._backend("allgather").allgather(obj)

    def gather(self, obj: Any, root: int = 0) -> list[Any] | None:
        if self.size == 1:
            return [obj]
        return self._backend("gather").gather(obj, root)

    def barrier(self) -> None:
        if self.size > 1:
            self._backend("barrier").barrier()

    def close(self) -> None:
        if self._collectives is not None:
            self._collectives.close()
