"""A notebook launched into an elastic pool is demand like a trial: its pending allocation goes
through the same queue, so the autoscaler launches an instance for it (in-memory cloud, both
databases)."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from control_plane.auth import Principal, TokenKind
from control_plane.db.engine import transaction
from control_plane.db.models import User
from control_plane.master import Master
from control_plane.services import tasks
from tests.control_plane.loops.conftest import ELASTIC, FakeClock, FakeCloud
from tests.control_plane.loops.test_autoscaler import instance_rows, scaler_for


@pytest.fixture
def cloud(clock: FakeClock) -> FakeCloud:
    return FakeCloud(clock)


def test_a_zero_slot_notebook_makes_an_elastic_pool_launch(loop_master: Master, cloud: FakeCloud) -> None:
    scaler = scaler_for(loop_master, cloud)
    scaler.tick()
    assert cloud.launches == [] and instance_rows(loop_master) == []
    with transaction(loop_master.sessions) as s:
        admin = s.scalar(select(User).where(User.username == "admin"))
        assert admin is not None
        p = Principal(kind=TokenKind.USER, token_id=0, user_id=admin.id, username="admin", admin=True)
        tasks.launch(s, loop_master, p, "notebook", {"resources": {"slots": 0, "resource_pool": ELASTIC}})
    scaler.tick()
    assert len(cloud.launches) == 1
    [row] = instance_rows(loop_master)
    assert row.pool == ELASTIC
