"""Load shedding end to end: a real master whose admission limit is tiny (one request at a time, a
short queue) is hammered by many clients while two trials run on two agents. The master sheds the
excess with 503 + Retry-After, never a 500; the agents and the harness treat those 503s as
transient, so the trials finish without a restart and every metric is stored exactly once.
SQLite and PostgreSQL."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import httpx
import pytest

from tests.integration.conftest import trial_config

pytestmark = pytest.mark.integration

LENGTH = 40
HAMMERS = 16


def test_trials_finish_exactly_once_while_the_master_sheds_load(cluster_factory: Any) -> None:
    c = cluster_factory(agents=2, master_yaml={
        "max_concurrent_requests": 1, "cluster_concurrent_requests": 1, "db_pool_size": 3, "request_queue": 2,
        "request_queue_wait_s": 0.2,
    })
    searcher = {"name": "random", "metric": "validation_loss", "max_length": {"batches": LENGTH}, "max_trials": 2,
                "max_concurrent_trials": 2}
    exp_id = c.submit(trial_config(searcher=searcher, hparams={"lr": {"type": "double", "minval": 0.05, "maxval": 0.3},
                                                                "step_sleep": 0.05}))
    assert c.client is not None
    headers = dict(c.client.headers)
    statuses: Counter[int] = Counter()
    missing_retry_after = 0
    lock = threading.Lock()
    stop = threading.Event()

    def hammer() -> None:
        nonlocal missing_retry_after
        with httpx.Client(base_url=c.url, headers=headers, timeout=60) as http:
            while not stop.is_set():
                r = http.get("/api/v1/experiments")
                with lock:
                    statuses[r.status_code] += 1
                    missing_retry_after += int(r.status_code == 503 and "retry-after" not in r.headers)
                if r.status_code == 200:
                    exp = next((e for e in r.json()["experiments"] if e["id"] == exp_id), None)
                    if exp and exp["state"] in ("STATE_COMPLETED", "STATE_CANCELED", "STATE_ERROR"):
                        stop.set()

    threads = [threading.Thread(target=hammer, daemon=True) for _ in range(HAMMERS)]
    for t in threads:
        t.start()
    stop.wait(240)
    stop.set()
    for t in threads:
        t.join(60)

    assert statuses[503] > 0, statuses  # the limit was really exceeded...
    assert set(statuses) <= {200, 503}, statuses  # ...and shed, never failed
    assert missing_retry_after == 0
    c.wait_experiment(exp_id, timeout=120)
    trials = c.trials(exp_id)
    assert len(trials) == 2
    for t in trials:
        assert t["state"] == "STATE_COMPLETED"
        assert t["restarts"] == 0
        assert [m["stepsCompleted"] for m in c.metrics(t["id"], "training")] == list(range(1, LENGTH + 1))
        assert [m["stepsCompleted"] for m in c.metrics(t["id"], "validation")] == [10, 20, 30, 40]
