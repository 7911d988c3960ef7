"""Who this process is among the workers of a trial.

Ranks come from the variables launchers set (torchrun: RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, GROUP_RANK; Horovod/MPI-style: CROSS_RANK, CROSS_SIZE). A single process is
rank 0 of 1 and every collective is trivial.

Collectives (broadcast, allgather, gather, barrier) for size > 1 go through a `Collectives`
backend: that is the seam where a torch.distributed (or TCP) implementation plugs in later. Without
one, a multi-process collective raises instead of silently doing the wrong thing.
"""

from __future__ import annotations

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
