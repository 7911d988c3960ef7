"""The metrics spool on its own: order, bound, compaction, removal."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.core._spool import MetricsSpool


def test_records_come_back_oldest_first_and_the_file_goes_with_close(tmp_path: Path) -> None:
    s = MetricsSpool(tmp_path, max_bytes=10_000)
    assert s.append([b'{"a":1}', b'{"a":2}', b'{"a":3}']) == 3
    assert s.peek(2) == [b'{"a":1}', b'{"a":2}']
    s.pop(s.peek(2))
    assert s.append([b'{"a":4}']) == 1
    assert s.peek(10) == [b'{"a":3}', b'{"a":4}'] and s.count == 2
    s.pop(s.peek(10))
    assert s.count == 0 and s.path.stat().st_size == 0  # emptied: truncated
    s.close()
    assert not s.path.exists()


def test_the_bound_takes_a_prefix_and_compaction_reuses_the_read_part(tmp_path: Path) -> None:
    rec = b"x" * 99  # 100 bytes with its newline
    s = MetricsSpool(tmp_path, max_bytes=1000)
    assert s.append([rec] * 12) == 10  # only what fits, in order
    assert s.append([rec]) == 0
    s.pop(s.peek(4))
    assert s.append([b"y" * 99] * 5) == 4  # compacted: the 6 live records moved to the front
    assert s.path.stat().st_size <= 1000
    got = s.peek(100)
    assert got == [rec] * 6 + [b"y" * 99] * 4
    s.close()


def test_a_truncated_file_is_an_error_not_a_short_read(tmp_path: Path) -> None:
    s = MetricsSpool(tmp_path, max_bytes=1000)
    s.append([b"abc", b"def"])
    with open(s.path, "r+b") as f:
        f.truncate(5)
    with pytest.raises(OSError, match="truncated"):
        s.peek(2)
    s.close()
