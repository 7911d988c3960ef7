"""TensorBoard's event file format, written by hand: no TensorFlow, torch or `tensorboard` needed.

A tfevents file is a sequence of TFRecords, each

    uint64 length (little-endian) | uint32 masked crc32c(length) | data | uint32 masked crc32c(data)

where `data` is a serialized `tensorflow.Event` protobuf. The first record carries
`file_version: "brain.Event:2"`; each later one a wall time, a step and a `Summary` of
`Value {tag, simple_value}` scalars (what TensorFlow's `tf.compat.v1.Summary` writer and
Determined's TFWriter produce, read by TensorBoard's scalars dashboard).

The protobuf fields used (tensorflow/core/util/event.proto, framework/summary.proto):

    Event:   double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5;
    Summary: repeated Value value = 1;
    Value:   string tag = 1; float simple_value = 2;

Everything here is pure: bytes in, bytes out. `scalars_for_report` is Determined's rule for which
reported metrics become which TensorBoard tags (its `BatchMetricWriter`).
"""

from __future__ import annotations

import math
import numbers
import struct
from collections.abc import Iterable, Mapping
from typing import Any, Optional

FILE_VERSION = "brain.Event:2"

# (tag, value, step)
Scalar = tuple[str, float, int]

_CRC32C_POLY = 0x82F63B78  # Castagnoli, reflected
_MASK_DELTA = 0xA282EAD8
_FLOAT32_MAX = 3.4028234663852886e38


def _crc_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ _CRC32C_POLY if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc_table()


def crc32c_pure(data: bytes) -> int:
    """CRC-32C (Castagnoli) of `data`, table-driven in pure Python."""
    crc = 0xFFFFFFFF
    table = _TABLE
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _fast_crc32c() -> Any:
    """google-crc32c's C implementation where the interpreter happens to have it (the harness does
    not depend on it: trial environments without it use the pure one)."""
    try:
        import google_crc32c  # type: ignore[import-untyped]
    except ImportError:
        return None
    if getattr(google_crc32c, "implementation", "") != "c":
        return None
    return google_crc32c.value


crc32c = _fast_crc32c() or crc32c_pure


def masked_crc32c(data: bytes) -> int:
    """TFRecord's mask: rotate right by 15 and add a constant (so CRCs of CRCs stay useful)."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def frame(data: bytes) -> bytes:
    """One TFRecord around `data`."""
    header = struct.pack("<Q", len(data))
    return header + struct.pack("<I", masked_crc32c(header)) + data + struct.pack("<I", masked_crc32c(data))


def _varint(n: int) -> bytes:
    if n < 0:
        n &= 0xFFFFFFFFFFFFFFFF  # int64 two's complement: ten bytes on the wire
    out = bytearray()
    while True:
        low = n & 0x7F
        n >>= 7
        if n:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _length_delimited(field_tag: int, payload: bytes) -> bytes:
    return bytes((field_tag,)) + _varint(len(payload)) + payload


def to_float32(value: float) -> float:
    """What a protobuf `float` field keeps of `value`: out-of-range values become infinities."""
    if math.isfinite(value) and abs(value) > _FLOAT32_MAX:
        value = math.copysign(math.inf, value)
    return struct.unpack("<f", struct.pack("<f", value))[0]


def encode_value(tag: str, value: float) -> bytes:
    """A Summary.Value with `simple_value`."""
    v = float(value)
    if math.isfinite(v) and abs(v) > _FLOAT32_MAX:
        v = math.copysign(math.inf, v)
    return _length_delimited(0x0A, tag.encode("utf-8")) + b"\x15" + struct.pack("<f", v)


def encode_event(wall_time: float, step: Optional[int] = None, *, file_version: Optional[str] = None,
                 scalars: Iterable[tuple[str, float]] = ()) -> bytes:
    """A serialized Event: its wall time, step, file version and/or a Summary of scalars."""
    out = b"\x09" + struct.pack("<d", float(wall_time))
    if step:
        out += b"\x10" + _varint(int(step))
    if file_version is not None:
        out += _length_delimited(0x1A, file_version.encode("utf-8"))
    summary = b"".join(_length_delimited(0x0A, encode_value(tag, value)) for tag, value in scalars)
    if summary:
        out += _length_delimited(0x2A, summary)
    return out


def file_version_record(wall_time: float) -> bytes:
    """The record every event file starts with."""
    return frame(encode_event(wall_time, file_version=FILE_VERSION))


def scalar_record(tag: str, value: float, step: int, wall_time: float) -> bytes:
    """One scalar as one framed event (TFWriter writes one Summary value per event too)."""
    return frame(encode_event(wall_time, step, scalars=((tag, value),)))


def as_scalar(value: Any) -> Optional[float]:
    """The float TensorBoard gets for a reported value, or None when it is not a numerical scalar
    (Determined's `is_numerical_scalar`: Python and NumPy numbers, 0-d numeric arrays; bools are
    ints there too)."""
    if isinstance(value, numbers.Real):
        return float(value)
    if getattr(value, "ndim", None) == 0 and getattr(getattr(value, "dtype", None), "kind", "") in "biuf":
        try:
            return float(value.item())
        except (TypeError, ValueError, AttributeError):
            return None
    return None


def _tagged(name: str, value: Any, step: int, out: list[Scalar]) -> None:
    scalar = as_scalar(value)
    if scalar is not None:
        out.append(("Determined/" + name, scalar, step))


def scalars_for_report(group: str, steps_completed: int, metrics: Mapping[str, Any],
                       batch_metrics: Optional[list[Mapping[str, Any]]] = None) -> list[Scalar]:
    """The (tag, value, step) scalars Determined's BatchMetricWriter writes for one report.

    training: each batch's metrics at its own step (`steps_completed - len(batches) + i`), then
    the report's metrics not seen in a batch, at `steps_completed`, as `Determined/<name>`.
    validation: `Determined/val_<name>` (names already starting with "val" kept as they are).
    Any other group: nothing (Determined 0.38 writes only these two).
    """
    out: list[Scalar] = []
    if group == "training":
        seen = set()
        for i, batch in enumerate(batch_metrics or ()):
            step = steps_completed - len(batch_metrics or ()) + i
            for name, value in batch.items():
                _tagged(name, value, step, out)
                seen.add(name)
        for name, value in metrics.items():
            if name not in seen:
                _tagged(name, value, steps_completed, out)
    elif group == "validation":
        for name, value in metrics.items():
            _tagged(name if name.startswith("val") else "val_" + name, value, steps_completed, out)
    return out
