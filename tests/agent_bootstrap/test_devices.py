"""Device discovery: a fake `nvidia-smi` on PATH is the hardware edge."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from agent_bootstrap.agent.devices import (
    DeviceError,
    Slot,
    cuda_visible_devices,
    discover_slots,
    parse_nvidia_smi,
)


def fake_nvidia_smi(bin_dir: Path, stdout: str, exit_code: int = 0) -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "nvidia-smi"
    (bin_dir / "out.txt").write_text(stdout)
    # Record the arguments so the test can check the query the agent makes.
    script.write_text(f"#!/bin/sh\necho \"$@\" > '{bin_dir}/args.txt'\ncat '{bin_dir}/out.txt'\nexit {exit_code}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return bin_dir


@pytest.fixture
def only_bin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """PATH holds just this directory (plus /bin for `sh` and `cat` of the fake scripts)."""
    d = tmp_path / "bin"
    d.mkdir()
    monkeypatch.setenv("PATH", f"{d}:/bin:/usr/bin")
    return d


TWO_GPUS = "0, GPU-11111111-aaaa, NVIDIA A10G, 23028\n1, GPU-22222222-bbbb, NVIDIA A10G, 23028\n"


def test_two_gpus_from_nvidia_smi(only_bin: Path) -> None:
    fake_nvidia_smi(only_bin, TWO_GPUS)
    slots = discover_slots("auto", cpu_count=4)
    assert slots == [
        Slot(id="0", type="cuda", brand="NVIDIA A10G", uuid="GPU-11111111-aaaa", index=0, memory_mb=23028),
        Slot(id="1", type="cuda", brand="NVIDIA A10G", uuid="GPU-22222222-bbbb", index=1, memory_mb=23028),
    ]
    args = (only_bin / "args.txt").read_text()
    assert "--query-gpu=index,uuid,name,memory.total" in args and "--format=csv,noheader,nounits" in args
    assert slots[0].to_wire() == {"id": "0", "type": "cuda", "uuid": "GPU-11111111-aaaa", "brand": "NVIDIA A10G",
                                  "memoryMb": 23028}


def test_garbage_output_falls_back_to_cpu_slots(only_bin: Path) -> None:
    fake_nvidia_smi(only_bin, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver\n\x00\xff")
    assert discover_slots("auto", cpu_count=2) == [Slot(id="0", type="cpu", brand="cpu"),
                                                   Slot(id="1", type="cpu", brand="cpu")]
    with pytest.raises(DeviceError):
        discover_slots("cuda")


def test_failing_nvidia_smi_falls_back_to_cpu(only_bin: Path) -> None:
    fake_nvidia_smi(only_bin, TWO_GPUS, exit_code=9)  # output ignored when the tool says it failed
    assert [s.type for s in discover_slots("auto")] == ["cpu"]


def test_missing_nvidia_smi_gives_one_cpu_slot_by_default(only_bin: Path) -> None:
    assert discover_slots("auto") == [Slot(id="0", type="cpu", brand="cpu")]
    assert len(discover_slots("auto", cpu_count=3)) == 3


def test_cpu_slot_type_ignores_gpus(only_bin: Path) -> None:
    fake_nvidia_smi(only_bin, TWO_GPUS)
    assert [s.type for s in discover_slots("cpu", cpu_count=2)] == ["cpu", "cpu"]


def test_parse_skips_bad_lines_and_keeps_good_ones() -> None:
    out = (
        "WARNING: infoROM is corrupted at gpu 0000:00:1E.0\n"
        "0, GPU-aaa, Tesla T4, 15360\n"
        "x, GPU-bad, Tesla T4, 15360\n"           # bad index
        "0, GPU-dup, Tesla T4, 15360\n"           # duplicate index
        "2, GPU-ccc, NVIDIA H100 80GB HBM3, Inc, [N/A]\n"  # comma in name, unknown memory
        "\n"
    )
    slots = parse_nvidia_smi(out)
    assert [(s.id, s.uuid, s.brand, s.memory_mb) for s in slots] == [
        ("0", "GPU-aaa", "Tesla T4", 15360),
        ("2", "GPU-ccc", "NVIDIA H100 80GB HBM3, Inc", None),
    ]


def test_cuda_visible_devices_uses_uuids_and_is_empty_for_cpu() -> None:
    gpus = parse_nvidia_smi(TWO_GPUS)
    assert cuda_visible_devices(gpus) == "GPU-11111111-aaaa,GPU-22222222-bbbb"
    assert cuda_visible_devices([gpus[1]]) == "GPU-22222222-bbbb"
    assert cuda_visible_devices([Slot(id="0", type="cpu", brand="cpu")]) == ""
    assert cuda_visible_devices([]) == ""
