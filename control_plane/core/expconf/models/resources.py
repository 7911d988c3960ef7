"""The resources section: slots, scheduling weight and priority, pool, container sizes."""

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field, FiniteFloat
from pydantic_core import PydanticCustomError

from control_plane.core.expconf.models.base import ConfigModel, Int32, NonEmptyStr

__all__ = ["ByteSize", "Device", "Devices", "Resources", "byte_size"]

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


class Device(ConfigModel):
    """A host device in the task's container (Docker's --device): needs allow_task_host_access."""

    host_path: NonEmptyStr
    container_path: NonEmptyStr
    mode: str = "mrw"


_DEVICE_MODE = re.compile(r"^[rwm]{1,3}$")


def _device(value: Any) -> Any:
    """Determined's two spellings: ``host[:container[:mode]]`` or a mapping; both absolute paths,
    mode of r, w and m (default mrw)."""
    if isinstance(value, str):
        parts = value.split(":")
        if len(parts) > 3 or not parts[0]:
            raise PydanticCustomError("device", "{reason}", {"reason": f"{value!r} is not host_path[:container_path[:mode]]"})
        value = {"host_path": parts[0], "container_path": parts[1] if len(parts) > 1 and parts[1] else parts[0],
                 **({"mode": parts[2]} if len(parts) > 2 else {})}
    if isinstance(value, dict):
        for key in ("host_path", "container_path"):
            path = value.get(key)
            if isinstance(path, str) and not path.startswith("/"):
                raise PydanticCustomError("device", "{reason}",
                                          {"reason": f"{key} must be an absolute path, got {path!r}"})
        mode = value.get("mode")
        if isinstance(mode, str) and not _DEVICE_MODE.match(mode):
            raise PydanticCustomError("device", "{reason}", {"reason": f"mode must be made of r, w and m, got {mode!r}"})
    return value


Devices = list[Annotated[Device, BeforeValidator(_device)]]


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
    devices: Devices = []
    # Deprecated in Determined, accepted so old configs still load.
    agent_label: str = ""
    native_parallel: bool = False
