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


def test_an_instance_is_priced_by_the_pools_offer_for_its_type_and_capacity() -> None:
    """What emptying an instance saves (and which one goes first): the region's price of its type in
    its capacity, a GCP machine's attached GPUs included; a spot instance without an offer is not
    priced at the on-demand list price."""
    from control_plane.db.models import Instance
    from control_plane.loops.autoscaler.consolidate import price_of
    from provisioners.base import InstanceOffer

    offers = (InstanceOffer("g5.xlarge", 1, False, 1.2), InstanceOffer("g5.xlarge", 1, True, 0.4),
              InstanceOffer("n1-standard-8 + 2x nvidia-tesla-t4", 2, False, 1.08))
    assert price_of(Instance(instance_type="g5.xlarge", capacity="on-demand"), offers) == 1.2
    assert price_of(Instance(instance_type="g5.xlarge", capacity="spot"), offers) == 0.4
    assert price_of(Instance(instance_type="n1-standard-8", capacity=""), offers) == 1.08  # the cloud's name
    assert price_of(Instance(instance_type="g5.xlarge", capacity="on-demand"), ()) == 1.006  # the list price
    assert price_of(Instance(instance_type="g5.xlarge", capacity="spot"), ()) is None
    assert price_of(Instance(instance_type="", capacity=""), offers) is None
