"""The leadership lease over a real database (services/leadership.py), on SQLite and PostgreSQL:
one leader, takeover at expiry or at once when the holder's liveness lock is free, and the fence
that refuses a deposed leader's writes inside its own transaction."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from sqlalchemy import func, select

from control_plane.db.engine import transaction
from control_plane.db.models import ClusterInfo, LeaderLease
from control_plane.errors import NotLeader
from control_plane.master import _loop_thread
from control_plane.services.leadership import Leadership, current_leader


def pair(master):  # type: ignore[no-untyped-def]
    a = Leadership(master.sessions, master.engine, "a", ttl_s=10, address="host-a")
    b = Leadership(master.sessions, master.engine, "b", ttl_s=10, address="host-b")
    return a, b


def test_one_leader_and_a_takeover_when_its_lease_expires(master) -> None:  # type: ignore[no-untyped-def]
    a, b = pair(master)
    now = master.clock()
    assert a.step(now) == 1
    assert b.step(now) is None and "a leads (token 1)" in b.last_reason
    assert a.step(now + timedelta(seconds=5)) == 1  # renewed
    # a is paused (its liveness lock stays held): b waits for the expiry, then takes over.
    assert b.step(now + timedelta(seconds=14)) is None
    assert b.step(now + timedelta(seconds=16)) == 2
    with master.read_sessions() as s:
        lead = current_leader(s)
    assert lead is not None and (lead.holder, lead.token, lead.address) == ("b", 2, "host-b")
    # a wakes up: its renewal finds b's lease, so it steps down and lets its lock go.
    assert a.step(now + timedelta(seconds=17)) is None
    assert a.token is None and (a.lock is None or not a.lock.held)
    # b picks up the lock a let go, so b's own death can again be noticed at once.
    assert b.step(now + timedelta(seconds=18)) == 2 and b.lock is not None and b.lock.held
    with master.read_sessions() as s:
        assert s.scalar(select(LeaderLease.holder_locked))


def test_a_dead_leader_is_replaced_at_once(master) -> None:  # type: ignore[no-untyped-def]
    a, b = pair(master)
    now = master.clock()
    assert a.step(now) == 1
    assert b.step(now) is None
    a.lock.release()  # what the server (advisory lock) or the kernel (flock) does when a dies
    assert b.step(now + timedelta(seconds=1)) == 2  # long before a's lease would expire
    assert "gone" in b.last_reason


def test_a_deposed_leaders_loop_write_is_refused_and_nothing_is_written(master) -> None:  # type: ignore[no-untyped-def]
    a, b = pair(master)
    master.leadership = a
    now = master.clock()
    assert a.step(now) == 1

    def loop_write(key: str) -> BaseException | None:
        """A write committed from a loop thread, as Master.add_loop runs them."""
        out: list[BaseException | None] = [None]

        def run() -> None:
            _loop_thread.name = "test-loop"
            try:
                with transaction(master.sessions) as s:
                    s.add(ClusterInfo(key=key, value="x"))
            except BaseException as e:  # noqa: BLE001
                out[0] = e

        t = threading.Thread(target=run)
        t.start()
        t.join()
        return out[0]

    assert loop_write("while-leading") is None
    # a pauses past its lease; b takes over; a resumes still believing it leads (token 1).
    assert b.step(now + timedelta(seconds=11)) == 2
    assert a.token == 1
    err = loop_write("after-takeover")
    assert isinstance(err, NotLeader) and "b (token 2)" in str(err)
    with master.read_sessions() as s:
        keys = set(s.scalars(select(ClusterInfo.key)))
        assert "while-leading" in keys and "after-takeover" not in keys
        assert s.scalar(select(func.count()).select_from(LeaderLease)) == 1
    # API requests (not loop threads) are not fenced: any master process serves them.
    with transaction(master.sessions) as s:
        s.add(ClusterInfo(key="from-a-request", value="x"))


def test_resign_hands_over_at_once(master) -> None:  # type: ignore[no-untyped-def]
    a, b = pair(master)
    now = master.clock()
    assert a.step(now) == 1
    a.resign(now)
    assert b.step(now) == 2


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_sqlite_liveness_lock_is_one_per_host(master) -> None:  # type: ignore[no-untyped-def]
    a, b = pair(master)
    assert a.lock is not None and a.lock.try_acquire()
    assert not b.lock.try_acquire()
    a.lock.release()
    assert b.lock.try_acquire()
    b.lock.release()
