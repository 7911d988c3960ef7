"""What this host offers: GPUs found by nvidia-smi, else CPU slots.

nvidia-smi is the hardware edge; its output is parsed line by line and a line that does not parse is
skipped with a warning, so one odd GPU (or a driver printing an error banner) never takes the agent
down. With no usable GPU the agent offers CPU slots (1 unless configured).
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from dataclasses import dataclass
from typing import Literal

from shipyard_common.agent_protocol import SlotInfo

log = logging.getLogger("shipyard.agent.devices")

NVIDIA_SMI_QUERY = ["--query-gpu=index,uuid,name,memory.total", "--format=csv,noheader,nounits"]


class DeviceError(Exception):
    """The requested slot type cannot be offered (e.g. cuda on a host without GPUs)."""


@dataclass(frozen=True)
class Slot:
    id: str
    type: Literal["cuda", "cpu"]
    brand: str
    uuid: str | None = None
    index: int | None = None
    memory_mb: int | None = None

    def info(self) -> SlotInfo:
        """The slot as the agent registers it."""
        return SlotInfo(id=self.id, type=self.type, uuid=self.uuid, brand=self.brand, memory_mb=self.memory_mb)

    def to_wire(self) -> dict[str, object]:
        return self.info().to_wire()


def parse_nvidia_smi(output: str) -> list[Slot]:
    """GPUs from `nvidia-smi --query-gpu=index,uuid,name,memory.total --format=csv,noheader,nounits`.

    Each good line is `0, GPU-8f2c…, NVIDIA A10G, 23028`. The name is everything between the uuid
    and the last field, so a name with a comma survives; memory may be `[N/A]`."""
    gpus: list[Slot] = []
    seen_index: set[int] = set()
    for raw in output.splitlines():
        line = raw.strip()
        if not line:
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 4:
            log.warning("event=nvidia_smi_line_skipped reason=too_few_fields line=%r", line[:200])
            continue
        index_s, uuid, memory_s = fields[0], fields[1], fields[-1]
        name = ", ".join(fields[2:-1])
        try:
            index = int(index_s)
        except ValueError:
            log.warning("event=nvidia_smi_line_skipped reason=bad_index line=%r", line[:200])
            continue
        if index < 0 or index in seen_index or not uuid or " " in uuid:
            log.warning("event=nvidia_smi_line_skipped reason=bad_index_or_uuid line=%r", line[:200])
            continue
        try:
            memory_mb: int | None = int(float(memory_s))
        except ValueError:
            memory_mb = None  # "[N/A]" on some boards; the GPU is still usable
        seen_index.add(index)
        gpus.append(Slot(id=str(index), type="cuda", brand=name or "NVIDIA GPU", uuid=uuid, index=index,
                         memory_mb=memory_mb))
    return sorted(gpus, key=lambda s: s.index or 0)


def query_gpus(nvidia_smi: str = "nvidia-smi", timeout: float = 20.0) -> list[Slot]:
    """GPUs on this host; [] where nvidia-smi is missing, fails, hangs or prints nothing usable."""
    exe = shutil.which(nvidia_smi)
    if exe is None:
        log.info("event=no_nvidia_smi detail=%r", "nvidia-smi not on PATH; offering CPU slots")
        return []
    try:
        proc = subprocess.run([exe, *NVIDIA_SMI_QUERY], capture_output=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        log.warning("event=nvidia_smi_failed error=%r", str(e))
        return []
    if proc.returncode != 0:
        log.warning("event=nvidia_smi_failed exit_code=%d stderr=%r", proc.returncode,
                    proc.stderr.decode(errors="replace")[-300:])
        return []
    return parse_nvidia_smi(proc.stdout.decode(errors="replace"))


def cpu_slots(count: int) -> list[Slot]:
    return [Slot(id=str(i), type="cpu", brand="cpu") for i in range(count)]


def discover_slots(slot_type: Literal["auto", "cpu", "cuda"] = "auto", cpu_count: int | None = None,
                   nvidia_smi: str = "nvidia-smi") -> list[Slot]:
    """The slots to register: GPUs for cuda (an error without any), CPU slots for cpu, and for auto
    GPUs when there are some, else CPU slots (`cpu_count`, default 1)."""
    if slot_type == "cpu":
        return cpu_slots(cpu_count or 1)
    gpus = query_gpus(nvidia_smi)
    if gpus:
        return gpus
    if slot_type == "cuda":
        raise DeviceError("slot_type is cuda but nvidia-smi reports no usable GPU")
    return cpu_slots(cpu_count or 1)


def cuda_visible_devices(slots: list[Slot]) -> str:
    """CUDA_VISIBLE_DEVICES for a task's slots: GPU uuids (stable whatever CUDA_DEVICE_ORDER is),
    the index where the uuid is unknown, and the empty string for CPU slots (no GPU visible)."""
    ids = [s.uuid or str(s.index) for s in slots if s.type == "cuda"]
    return ",".join(ids)
