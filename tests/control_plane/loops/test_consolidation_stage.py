"""The consolidation stage inside the autoscaler's tick (in-memory cloud at the edge, both databases):
a failure in it never stops the pool from scaling."""

from __future__ import annotations

from pathlib import Path

import pytest

from control_plane.core.scaling import consolidation
from control_plane.loops.autoscaler import Autoscaler
from tests.control_plane.loops.conftest import (
    ELASTIC_PROVIDER,
    FakeClock,
    FakeCloud,
    add_allocation,
    make_master,
)


def test_a_failing_consolidation_leaves_the_launches_to_go_on(
        db_url: str, tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    master = make_master(db_url, tmp_path / "state", clock,
                         {**ELASTIC_PROVIDER, "consolidation": {"enabled": True}})
    try:
        def broken(*_a: object, **_k: object) -> None:
            raise RuntimeError("consolidation bug")

        monkeypatch.setattr(consolidation, "decide", broken)
        cloud = FakeCloud(clock)
        add_allocation(master, "a1")
        Autoscaler(master, wrap_provider=lambda _pool, _p: cloud).tick()
        assert len(cloud.instances) == 1  # launched for the demand all the same
        assert "event=consolidation_error" in caplog.text
    finally:
        master.stop()
