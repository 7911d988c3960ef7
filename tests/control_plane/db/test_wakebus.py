"""Wake-ups across master processes (db/wakebus.py): a commit in one engine wakes a WakeBus on
another engine (another process's view of the same database); a rolled-back change does not."""

from __future__ import annotations

import threading

from sqlalchemy import text

from control_plane.db.engine import make_engine, make_session_factory, transaction
from control_plane.db.models import ClusterInfo
from control_plane.db.wakebus import WakeBus


def test_a_commit_elsewhere_wakes_the_listener_and_a_rollback_does_not(master) -> None:  # type: ignore[no-untyped-def]
    other = make_engine(master.config.database_url)  # another process's engine
    woke = threading.Event()
    bus = WakeBus(other, "listener", woke.set, sqlite_poll_s=0.02)
    sender = WakeBus(master.engine, "sender", lambda: None)
    bus.start()
    try:
        assert woke.wait(5)  # the listener's first wake-up: whatever it may have missed before it listened
        woke.clear()
        sessions = make_session_factory(master.engine)
        try:
            with transaction(sessions) as s:
                s.add(ClusterInfo(key="rolled-back", value="x"))
                sender.publish_in(s)
                raise RuntimeError("abort")
        except RuntimeError:
            pass
        assert not woke.wait(0.5)
        with transaction(sessions) as s:
            s.add(ClusterInfo(key="committed", value="x"))
            sender.publish_in(s)
        assert woke.wait(5)
        # Our own notifications are not news to us (PostgreSQL carries the origin).
        if master.engine.dialect.name == "postgresql":
            woke.clear()
            with other.connect() as conn:
                conn.execute(text("SELECT pg_notify('shipyard_wake', 'listener')"))
                conn.commit()
            assert not woke.wait(0.5)
    finally:
        bus.stop()
        other.dispose()
