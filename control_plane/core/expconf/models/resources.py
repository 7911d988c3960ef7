"""The resources section: slots, scheduling weight and priority, pool, container sizes."""

import re
from typing import Annotated, Any

from pydantic import AfterValidator, Field, FiniteFloat
from pydantic_core import PydanticCustomError

from control_plane.core.expconf.models.base import ConfigModel, Int32, NonEmptyStr

__all__ = ["ByteSize", "Resources", "byte_size"]

_BYTE_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(i?b)?\s*$", re.I)
_BYTE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}


def byte_size(value: int | str | None) -> int | None:
    """Bytes from a size as Docker reads one: an integer, or text like ``512m``, ``4G``, ``1.5GiB``
    (binary units); None stays None. Raises ValueError on anything else."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    m = _BYTE_SIZE.match(str(value))
    if not m:
        raise ValueError(f"{value!r} is not a size (bytes, or a number with k, m, g or t, e.g. 4G)")
    return int(float(m.group(1)) * _BYTE_UNITS[m.group(2).lower()])


def _check_byte_size(value: Any) -> Any:
    try:
        byte_size(value)
    except ValueError as e:
        raise PydanticCustomError("byte_size", "{reason}", {"reason": str(e)}) from None
    return value


ByteSize = Annotated[Annotated[int, Field(ge=0)] | NonEmptyStr | None, AfterValidator(_check_byte_size)]


class Resources(ConfigModel):
    slots_per_trial: Int32 = Field(default=1, ge=1)
    max_slots: Int32 | None = Field(default=None, ge=1)
    weight: FiniteFloat = Field(default=1.0, gt=0)
    priority: int | None = Field(default=None, ge=1, le=99)
    # Empty means "the master's default pool"; parse_experiment_config fills in the name.
    resource_pool: str = ""
    # Size of the container's /dev/shm (PyTorch data loaders need more than Docker's 64 MiB).
    shm_size: ByteSize = None
    # Shipyard: the container's memory limit (a trial over it is OOM-killed and says so).
    memory: ByteSize = None
    is_single_node: bool = False
    # Shipyard: false keeps the trial where it runs: the scheduler never preempts it for other work
    # and consolidation never moves it.
    preemptible: bool = True
    devices: list[Any] = []
    # Deprecated in Determined, accepted so old configs still load.
    agent_label: str = ""
    native_parallel: bool = False
