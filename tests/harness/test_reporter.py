"""The metrics reporter against a small real HTTP server standing in for the master."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.core import MetricsReporter, MetricsReportError, ReporterConfig, Session
from tests.harness.fake_master import FakeMaster

pytestmark = pytest.mark.integration

FAST = ReporterConfig(backoff_initial_s=0.01, backoff_max_s=0.1, flush_timeout_s=30)


def wait_until(cond: Callable[[], bool], timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)


@pytest.fixture
def make_reporter(fake_master: FakeMaster) -> Iterator[Callable[..., MetricsReporter]]:
    made: list[MetricsReporter] = []

    def make(config: ReporterConfig = FAST) -> MetricsReporter:
        r = MetricsReporter(Session(fake_master.url, "tok"), trial_id=7, trial_run_id=2, config=config)
        r.start()
        made.append(r)
        return r

    yield make
    for r in made:
        try:
            r.close(timeout=min(1.0, r.config.flush_timeout_s or 1.0))
        except MetricsReportError:
            pass


def delivered_steps(master: FakeMaster, group: str = "training") -> list[int]:
    """Steps in arrival order, de-duplicated by (group, steps) the way the master stores them."""
    seen: set[tuple[str, int]] = set()
    out = []
    for rep in master.metric_reports():
        key = (rep["group"], rep["metrics"]["stepsCompleted"])
        if rep["group"] == group and key not in seen:
            seen.add(key)
            out.append(key[1])
    return out


def test_reports_arrive_in_order_with_the_wire_shape(fake_master: FakeMaster,
                                                     make_reporter: Callable[..., MetricsReporter]) -> None:
    r = make_reporter()
    for step in range(1, 201):
        r.report("training", step, {"loss": 1.0 / step}, [{"loss": 1.0}, {"loss": 2.0}] if step == 1 else None)
    r.report("validation", 200, {"val_loss": 0.25})
    r.close()

    reports = fake_master.metric_reports()
    assert [x["metrics"]["stepsCompleted"] for x in reports if x["group"] == "training"] == list(range(1, 201))
    first = reports[0]
    assert first["group"] == "training"
    assert first["metrics"]["trialId"] == 7
    assert first["metrics"]["trialRunId"] == 2
    assert first["metrics"]["metrics"] == {"avgMetrics": {"loss": 1.0},
                                           "batchMetrics": [{"loss": 1.0}, {"loss": 2.0}]}
    assert first["metrics"]["reportTime"].endswith("Z")
    assert "batchMetrics" not in reports[1]["metrics"]["metrics"]
    assert reports[-1]["group"] == "validation"
    # Batched: far fewer requests than reports, all on the batch endpoint, all authenticated.
    posts = [q for q in fake_master.requests if q.method == "POST"]
    assert all(q.path == "/api/v1/trials/7/metrics/batch" for q in posts)
    assert len(posts) < 201
    assert all(q.headers["Authorization"] == "Bearer tok" for q in posts)
    assert r.stats.sent == 201 and r.stats.rejected == 0 and r.stats.lost == 0


def test_non_finite_floats_and_odd_values_are_strict_json(fake_master: FakeMaster,
                                                          make_reporter: Callable[..., MetricsReporter]) -> None:
    class Scalar:  # stands in for a numpy/torch scalar without importing either
        def item(self) -> float:
            return 0.5

    r = make_reporter()
    r.report("training", 1, {"nan": math.nan, "inf": math.inf, "ninf": -math.inf, "ok": 1.5, "flag": True,
                             "count": 3, "scalar": Scalar(), "pair": (1, math.nan), "nested": {"x": math.inf}})
    r.close()
    # The fake master parses with a hook that rejects NaN/Infinity tokens: reaching here means strict JSON.
    (rep,) = fake_master.metric_reports()
    assert rep["metrics"]["metrics"]["avgMetrics"] == {
        "nan": "NaN", "inf": "Infinity", "ninf": "-Infinity", "ok": 1.5, "flag": True, "count": 3,
        "scalar": 0.5, "pair": [1, "NaN"], "nested": {"x": "Infinity"},
    }


@pytest.mark.parametrize("outage", ["503", "refused"])
def test_outage_loses_nothing_and_keeps_order(outage: str, fake_master: FakeMaster,
                                              make_reporter: Callable[..., MetricsReporter]) -> None:
    r = make_reporter(ReporterConfig(max_batch=50, backoff_initial_s=0.01, backoff_max_s=0.1))
    for step in range(1, 101):
        r.report("training", step, {"loss": float(step)})
    assert r.flush(timeout=30)

    if outage == "503":
        fake_master.fail_with(503)
    else:
        fake_master.refuse()
    for step in range(101, 1101):
        r.report("training", step, {"loss": float(step)})
    # Let the sender hit the outage and retry a few times.
    wait_until(lambda: r.stats.retries >= 3)
    assert r.pending > 0
    fake_master.restore()
    for step in range(1101, 1201):
        r.report("training", step, {"loss": float(step)})
    r.close()

    assert delivered_steps(fake_master) == list(range(1, 1201))
    # Retried batches may arrive more than once (the master de-duplicates), never out of order.
    raw = [rep["metrics"]["stepsCompleted"] for rep in fake_master.metric_reports()]
    assert raw == sorted(raw)
    assert r.stats.lost == 0 and r.stats.rejected == 0


def test_batch_endpoint_missing_falls_back_to_one_request_per_report(
        fake_master: FakeMaster, make_reporter: Callable[..., MetricsReporter]) -> None:
    fake_master.batch_endpoint = False
    r = make_reporter()
    for step in range(1, 31):
        r.report("training", step, {"loss": 0.1})
    r.report("my_group", 30, {"custom": 1})
    r.close()
    assert delivered_steps(fake_master) == list(range(1, 31))
    singles = fake_master.bodies("POST", r"/api/v1/trials/7/metrics")
    assert len(singles) == 31
    assert singles[-1]["group"] == "my_group"
    assert r.stats.batch_endpoint is False


def _produce_in_thread(r: MetricsReporter, n: int) -> tuple[threading.Thread, list[int]]:
    """Report steps 1..n from a thread (a training loop that may block); `done[0]` counts them."""
    done = [0]

    def produce() -> None:
        for step in range(1, n + 1):
            r.report("training", step, {"loss": 0.0})
            done[0] += 1

    t = threading.Thread(target=produce, daemon=True)
    t.start()
    return t, done


def test_full_buffer_blocks_the_caller_instead_of_dropping(fake_master: FakeMaster,
                                                           make_reporter: Callable[..., MetricsReporter]) -> None:
    cfg = ReporterConfig(max_buffered=20, max_batch=5, backoff_initial_s=0.01, backoff_max_s=0.05)
    r = make_reporter(cfg)
    fake_master.fail_with(503)
    t, done = _produce_in_thread(r, 100)
    wait_until(lambda: r.pending >= cfg.max_buffered)
    time.sleep(0.3)  # give a non-blocking implementation every chance to run ahead
    assert t.is_alive()
    # Waiting: at most the buffer plus the one batch the sender is retrying.
    assert done[0] <= cfg.max_buffered + cfg.max_batch
    fake_master.restore()
    t.join(30)
    assert not t.is_alive()
    r.close()
    assert delivered_steps(fake_master) == list(range(1, 101))


def test_close_flushes_everything(fake_master: FakeMaster, make_reporter: Callable[..., MetricsReporter]) -> None:
    r = make_reporter()
    for step in range(1, 5001):
        r.report("training", step, {"loss": 0.0, "acc": 1.0})
        if step % 1000 == 0:
            r.report_progress(step / 5000)
    stats = r.close()
    assert delivered_steps(fake_master) == list(range(1, 5001))
    assert stats.sent == 5000
    progress = fake_master.bodies("POST", r"/api/v1/trials/7/progress")
    assert progress and progress[-1] == {"progress": 1.0, "isRaw": False}


def test_close_gives_up_at_the_deadline_and_says_so(fake_master: FakeMaster,
                                                    make_reporter: Callable[..., MetricsReporter]) -> None:
    r = make_reporter()
    fake_master.refuse()
    for step in range(1, 11):
        r.report("training", step, {"loss": 0.0})
    with pytest.raises(MetricsReportError, match="10 metrics reports were not delivered"):
        r.close(timeout=0.5)
    assert r.stats.lost == 10


def test_rejected_report_is_isolated_and_surfaces_on_next_call(
        fake_master: FakeMaster, make_reporter: Callable[..., MetricsReporter]) -> None:
    fake_master.reject_steps = {5}
    r = make_reporter()
    for step in range(1, 11):
        r.report("training", step, {"loss": 0.0})
    assert r.flush(timeout=30)
    # Neighbours of the bad report in its batch still arrive.
    assert delivered_steps(fake_master) == [1, 2, 3, 4, 6, 7, 8, 9, 10]
    with pytest.raises(MetricsReportError, match="steps_completed=5"):
        r.report("training", 11, {"loss": 0.0})
    r.report("training", 12, {"loss": 0.0})  # raised once; reporting continues
    r.close()
    assert r.stats.rejected == 1
    assert delivered_steps(fake_master)[-1] == 12


def test_report_never_touches_the_network(fake_master: FakeMaster,
                                          make_reporter: Callable[..., MetricsReporter],
                                          record_property: Callable[[str, Any], None]) -> None:
    """With the master gone, report() still returns at once: all I/O is on the sender thread.
    The per-call cost is recorded for information only (benchmarks/report_cost.py measures it)."""
    r = make_reporter(ReporterConfig(backoff_initial_s=0.01, backoff_max_s=0.05, flush_timeout_s=0.2))
    fake_master.refuse()
    metrics = {"loss": 0.5, "acc": 0.9, "lr": 1e-3}
    n = 20_000
    t0 = time.perf_counter_ns()
    for step in range(n):
        r.report("training", step, metrics)
    per_call_ns = (time.perf_counter_ns() - t0) / n
    record_property("report_ns_per_call", per_call_ns)
    assert r.pending > 0  # nothing was delivered, yet every call returned


# ---- the disk spool (issue 27: outages of any length) -------------------------------------------------

def _spool_files(d: Path) -> list[Path]:
    return sorted(d.glob(".shipyard-metrics-spool-*"))


@pytest.mark.parametrize("outage", ["503", "refused"])
def test_an_outage_spools_to_disk_not_memory_and_replays_in_order(
        outage: str, tmp_path: Path, fake_master: FakeMaster, make_reporter: Callable[..., MetricsReporter]) -> None:
    """While the master is away the reports move to the spool in the work dir, so the training
    loop never blocks although memory holds at most 50; when the master is back they arrive once
    each, oldest first, and the spool file is gone after close."""
    r = make_reporter(ReporterConfig(max_buffered=50, max_batch=40, backoff_initial_s=0.01, backoff_max_s=0.05,
                                     spool_dir=str(tmp_path)))
    r.report("training", 1, {"loss": 1.0})
    assert r.flush(timeout=30)
    assert _spool_files(tmp_path) == []  # no outage, no spool
    fake_master.fail_with(503) if outage == "503" else fake_master.refuse()
    most_in_memory = 0
    for step in range(2, 3002):
        r.report("training", step, {"loss": float(step), "text": "x" * 50})
        most_in_memory = max(most_in_memory, len(r._buf))
        if step % 500 == 0:
            time.sleep(0.1)  # let the sender retry (and spill) a few times
    # All but the batch in flight (at most 40, the oldest) went to disk.
    wait_until(lambda: r.stats.spooled >= 3000 - 40 and not r._buf)
    assert most_in_memory <= 50  # a blocking reporter would have stopped at 50: it never waited
    (spool,) = _spool_files(tmp_path)
    assert spool.stat().st_size > 2960 * 50
    fake_master.restore()
    r.close(timeout=60)
    assert delivered_steps(fake_master) == list(range(1, 3002))
    raw = [rep["metrics"]["stepsCompleted"] for rep in fake_master.metric_reports()]
    assert raw == sorted(raw)  # replayed oldest first, memory after the spool
    assert r.stats.lost == 0 and r.stats.sent >= 3001 and r.stats.spool_peak_bytes > 0
    assert _spool_files(tmp_path) == []


def test_a_full_spool_blocks_the_caller_and_loses_nothing(
        tmp_path: Path, fake_master: FakeMaster, make_reporter: Callable[..., MetricsReporter]) -> None:
    cfg = ReporterConfig(max_buffered=20, max_batch=5, backoff_initial_s=0.01, backoff_max_s=0.05,
                         spool_dir=str(tmp_path), spool_max_bytes=4000)
    r = make_reporter(cfg)
    fake_master.fail_with(503)
    t, done = _produce_in_thread(r, 300)
    wait_until(lambda: r.stats.spooled > 0 and r.pending >= cfg.max_buffered + r.stats.spooled)
    time.sleep(0.3)
    assert t.is_alive() and done[0] < 300  # bounded: the spool's bytes plus memory, then it waits
    (spool,) = _spool_files(tmp_path)
    assert spool.stat().st_size <= cfg.spool_max_bytes
    fake_master.restore()
    t.join(30)
    assert not t.is_alive()
    r.close(timeout=60)
    assert delivered_steps(fake_master) == list(range(1, 301))
    assert r.stats.lost == 0


def test_close_without_a_deadline_waits_for_the_master(
        tmp_path: Path, fake_master: FakeMaster, make_reporter: Callable[..., MetricsReporter]) -> None:
    """A trial's reporter (no flush deadline) waits for as long as the master is away."""
    r = make_reporter(ReporterConfig(backoff_initial_s=0.01, backoff_max_s=0.05, flush_timeout_s=None,
                                     spool_dir=str(tmp_path)))
    fake_master.refuse()
    for step in range(1, 101):
        r.report("training", step, {"loss": 0.0})
    closed = threading.Event()
    threading.Thread(target=lambda: (r.close(), closed.set()), daemon=True).start()
    assert not closed.wait(1.5)  # well past ten backoff caps: still trying
    fake_master.restore()
    assert closed.wait(30)
    assert delivered_steps(fake_master) == list(range(1, 101)) and r.stats.lost == 0


def test_the_trial_config_comes_from_the_environment(tmp_path: Path) -> None:
    cfg = ReporterConfig.for_trial({"SHIPYARD_RETRY_WAIT_MAX_S": "0.5", "SHIPYARD_METRICS_SPOOL_MAX_BYTES": "1000"},
                                   str(tmp_path))
    assert (cfg.backoff_max_s, cfg.flush_timeout_s, cfg.spool_dir, cfg.spool_max_bytes) == (
        0.5, None, str(tmp_path), 1000)
    cfg = ReporterConfig.for_trial({"SHIPYARD_METRICS_FLUSH_TIMEOUT_S": "60"}, str(tmp_path))
    assert (cfg.backoff_max_s, cfg.flush_timeout_s, cfg.spool_max_bytes) == (10.0, 60.0, 256 * 1024 * 1024)
