"""The environment section: container image and environment variables per device type (in
Determined's per-device form, from any of its shorthands), registry credentials, capabilities
and ports."""

import re
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field
from pydantic_core import PydanticCustomError

from control_plane.core.expconf.describe import show, yaml_type
from control_plane.core.expconf.models.base import ConfigModel

__all__ = ["DEVICE_TYPES", "DeviceImages", "DeviceVariables", "Environment", "RegistryAuth"]

DEVICE_TYPES: tuple[str, ...] = ("cpu", "cuda", "rocm")


def _per_device(value: Any, leaf_ok: Any) -> dict[str, Any] | None:
    """If ``value`` is Determined's per-device form ``{cpu:…, cuda:…, rocm:…}`` (``gpu`` is the
    pre-0.17.6 name of ``cuda``), return it keyed by cpu/cuda/rocm; otherwise None."""
    if not isinstance(value, dict) or not value:
        return None
    if not set(value) <= {"cpu", "cuda", "gpu", "rocm"} or not all(leaf_ok(v) for v in value.values()):
        return None
    if "gpu" in value and "cuda" in value:
        raise PydanticCustomError("device_map", "set only one of cuda and gpu (gpu is the old name of cuda)")
    out = dict(value)
    if "gpu" in out:
        out["cuda"] = out.pop("gpu")
    return out


_ENV_NAME = re.compile(r"^[^=\x00]+=", re.S)


def _env_entries(entries: list[Any], where: str) -> list[str]:
    for i, entry in enumerate(entries):
        if not isinstance(entry, str) or not _ENV_NAME.match(entry):
            raise PydanticCustomError(
                "env_entry",
                "{where}entry {i} ({entry}) must be a string NAME=VALUE",
                {"where": where, "i": i, "entry": show(entry)},
            )
    return list(entries)


def _env_scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _normalize_env_vars(value: Any) -> Any:
    """Accept a list of ``NAME=VALUE``, Determined's per-device map of such lists, or a plain
    ``{NAME: VALUE}`` mapping; store Determined's per-device form."""
    if isinstance(value, DeviceVariables):
        return value
    if value is None:
        return {}
    if isinstance(value, list):
        entries = _env_entries(value, "")
        return {d: entries for d in DEVICE_TYPES}
    per_device = _per_device(value, lambda v: v is None or isinstance(v, list))
    if per_device is not None:
        return {d: _env_entries(per_device.get(d) or [], f"{d}: ") for d in DEVICE_TYPES}
    if isinstance(value, dict):
        entries = []
        for name, val in value.items():
            if not name or "=" in name or val is None or isinstance(val, (dict, list)):
                raise PydanticCustomError(
                    "env_entry",
                    "{name}: a NAME: VALUE mapping needs a non-empty name without '=' and a scalar value",
                    {"name": show(name)},
                )
            entries.append(f"{name}={_env_scalar(val)}")
        return {d: entries for d in DEVICE_TYPES}
    raise PydanticCustomError(
        "env_type",
        "must be a list of NAME=VALUE strings or a mapping (got {got})",
        {"got": yaml_type(value)},
    )


class DeviceVariables(ConfigModel):
    """Environment variables per device type, as ``NAME=VALUE`` strings."""

    cpu: list[str] = []
    cuda: list[str] = []
    rocm: list[str] = []

    def as_dict(self, device: Literal["cpu", "cuda", "rocm"] = "cpu") -> dict[str, str]:
        return dict(entry.split("=", 1) for entry in getattr(self, device))  # type: ignore[misc]


def _normalize_image(value: Any) -> Any:
    if isinstance(value, DeviceImages):
        return value
    if value is None:
        return {}
    if isinstance(value, str):
        return {d: value for d in DEVICE_TYPES}
    per_device = _per_device(value, lambda v: v is None or isinstance(v, str))
    if per_device is not None:
        return per_device
    raise PydanticCustomError(
        "image_type",
        "must be an image name or a mapping with cpu, cuda and/or rocm (got {got})",
        {"got": yaml_type(value) if not isinstance(value, dict) else "mapping with other keys"},
    )


class DeviceImages(ConfigModel):
    """Container image per device type: agents whose runtime is docker run the trial in it; agents
    running processes refuse a task that sets one."""

    cpu: str | None = None
    cuda: str | None = None
    rocm: str | None = None


class RegistryAuth(ConfigModel):
    """Credentials for pulling `image` (Docker's names, as Determined takes them)."""

    username: str | None = None
    password: str | None = None
    auth: str | None = None
    email: str | None = None
    serveraddress: str | None = None
    identitytoken: str | None = None
    registrytoken: str | None = None


_CAPABILITY = re.compile(r"^(CAP_)?[A-Z][A-Z0-9_]*$")


def _capability(value: Any) -> Any:
    """A Linux capability as Docker names one (NET_ADMIN, CAP_NET_ADMIN, ALL)."""
    if isinstance(value, str) and not _CAPABILITY.match(value):
        raise PydanticCustomError("capability", "{reason}",
                                  {"reason": f"{value!r} is not a capability name (e.g. SYS_PTRACE, CAP_NET_ADMIN)"})
    return value


Capabilities = list[Annotated[str, BeforeValidator(_capability)]]


class Environment(ConfigModel):
    image: Annotated[DeviceImages, BeforeValidator(_normalize_image)] = DeviceImages()
    environment_variables: Annotated[DeviceVariables, BeforeValidator(_normalize_env_vars)] = (
        DeviceVariables()
    )
    force_pull_image: bool = False
    registry_auth: RegistryAuth | None = None
    pod_spec: dict[str, Any] | None = None
    add_capabilities: Capabilities = []
    drop_capabilities: Capabilities = []
    ports: dict[str, Annotated[int, Field(ge=1, le=65535)]] = {}
    proxy_ports: list[dict[str, Any]] = []
