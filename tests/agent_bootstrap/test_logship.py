"""Line assembly (binary-safe, long lines chunked) and batching with a sink that fails, then recovers."""

from __future__ import annotations

import threading

import pytest

from agent_bootstrap.agent.logship import (
    MAX_LINE_BYTES,
    LineAssembler,
    LogLine,
    LogShipper,
    SinkRefused,
    SinkUnavailable,
    split_utf8,
)


def assemble(chunks: list[bytes], max_bytes: int = MAX_LINE_BYTES) -> list[str]:
    a = LineAssembler(max_bytes)
    out: list[str] = []
    for c in chunks:
        out += a.feed(c)
    return out + a.finish()


def test_lines_keep_their_newline_and_the_last_partial_line_survives() -> None:
    assert assemble([b"one\ntw", b"o\nthree"]) == ["one\n", "two\n", "three"]
    assert assemble([b""]) == []


def test_invalid_utf8_is_replaced_not_fatal() -> None:
    lines = assemble([b"ok \xff\xfe\x00 bytes\n", "héllo\n".encode()])
    assert lines == ["ok \ufffd\ufffd\x00 bytes\n", "héllo\n"]


def test_long_line_is_split_into_chunks_at_most_max_bytes() -> None:
    line = ("é" * 40 + "x") * 10  # multi-byte characters straddle the chunk edges
    raw = line.encode() + b"\n"
    chunks = assemble([raw[i:i + 7] for i in range(0, len(raw), 7)], max_bytes=64)
    assert "".join(chunks) == line + "\n"
    assert all(len(c.encode()) <= 64 for c in chunks)
    assert "\ufffd" not in "".join(chunks)  # no character was cut in half


def test_garbage_that_grows_when_decoded_still_fits() -> None:
    chunks = assemble([b"\xff" * 1000 + b"\n"], max_bytes=64)  # each byte becomes a 3-byte U+FFFD
    assert all(len(c.encode()) <= 64 for c in chunks)
    assert "".join(chunks) == "\ufffd" * 1000 + "\n"


def test_split_utf8() -> None:
    assert split_utf8("abc", 2) == ["ab", "c"]
    assert split_utf8("ééé", 4) == ["éé", "é"]


class FlakySink:
    """Fails the first `failures` sends (the master is down), then takes everything."""

    def __init__(self, failures: int, refuse: set[str] | None = None) -> None:
        self.failures = failures
        self.refuse = refuse or set()
        self.received: list[LogLine] = []
        self.batches: list[list[LogLine]] = []
        self.attempts = 0
        self.lock = threading.Lock()

    def send(self, batch: list[LogLine]) -> None:
        with self.lock:
            self.attempts += 1
            assert len({line.allocation_id for line in batch}) == 1, "a batch holds one allocation"
            if self.attempts <= self.failures:
                raise SinkUnavailable("master down")
            if batch[0].allocation_id in self.refuse:
                raise SinkRefused("token revoked")
            self.batches.append(list(batch))
            self.received.extend(batch)


def line(alloc: str, i: int) -> LogLine:
    return LogLine(allocation_id=alloc, task_id=f"task-{alloc}", text=f"{alloc} line {i}\n", token=f"tok-{alloc}")


def test_failing_sink_loses_nothing_and_keeps_order_synchronously() -> None:
    sink = FlakySink(failures=3)
    shipper = LogShipper(sink, batch_lines=10)
    for i in range(25):
        shipper.add(line("a", i))
    assert [shipper.ship_once() for _ in range(3)] == [False, False, False]
    assert shipper.pending() == 25  # the failed batch is kept in flight, not dropped
    assert shipper.flush()
    assert [ln.text for ln in sink.received] == [f"a line {i}\n" for i in range(25)]
    assert [len(b) for b in sink.batches] == [10, 10, 5]


def test_shipper_thread_with_outage_ships_everything_in_order() -> None:
    sink = FlakySink(failures=5)
    shipper = LogShipper(sink, flush_interval=0.01, batch_lines=50, retry_base=0.01, retry_cap=0.05).start()
    for i in range(1000):
        shipper.add(line("a", i))
        shipper.add(line("b", i))
    assert shipper.drain("a", timeout=30)
    assert shipper.close(timeout=30)
    for alloc in ("a", "b"):
        got = [ln.text for ln in sink.received if ln.allocation_id == alloc]
        assert got == [f"{alloc} line {i}\n" for i in range(1000)]
    assert sink.attempts > 5 and shipper.dropped_lines == 0


def test_refused_batch_is_dropped_without_blocking_others() -> None:
    sink = FlakySink(failures=0, refuse={"gone"})
    shipper = LogShipper(sink, batch_lines=10)
    for i in range(3):
        shipper.add(line("gone", i))
    for i in range(3):
        shipper.add(line("live", i))
    assert shipper.flush()
    assert [ln.text for ln in sink.received] == [f"live line {i}\n" for i in range(3)]


def test_bounded_buffer_drops_oldest_and_says_so() -> None:
    sink = FlakySink(failures=0)

    def fixed(i: int) -> LogLine:  # all lines the same size
        return LogLine(allocation_id="a", task_id="t", text=f"line {i:04d}\n")

    shipper = LogShipper(sink, batch_lines=1000, max_buffer_bytes=fixed(0).size * 10)
    for i in range(25):
        shipper.add(fixed(i))  # never blocks, even with nobody shipping
    assert shipper.dropped_lines == 15
    assert shipper.flush()
    texts = [ln.text for ln in sink.received]
    assert "15 log lines dropped" in texts[0] and sink.received[0].source == "agent"
    assert texts[1:] == [f"line {i:04d}\n" for i in range(15, 25)]


def test_drain_waits_for_one_allocation() -> None:
    sink = FlakySink(failures=0)
    shipper = LogShipper(sink, flush_interval=60, batch_lines=10_000).start()  # only a drain triggers a flush
    shipper.add(line("a", 0))
    assert shipper.drain("a", timeout=10)
    assert [ln.text for ln in sink.received] == ["a line 0\n"]
    assert shipper.close(timeout=5)


@pytest.mark.parametrize("failures", [0, 2])
def test_close_flushes_the_rest(failures: int) -> None:
    sink = FlakySink(failures=failures)
    shipper = LogShipper(sink, flush_interval=60, batch_lines=10_000, retry_base=0.01, retry_cap=0.02).start()
    for i in range(7):
        shipper.add(line("a", i))
    assert shipper.close(timeout=10)
    assert len(sink.received) == 7
