"""The login throttle (control_plane/auth.py LoginThrottle) over a real database, on SQLite and
PostgreSQL: per (user, address), per address, never per user alone, sliding window, a success
clears, bursts get exactly the limit, and every master process sharing the database counts the
same failures."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import select

from control_plane import auth
from control_plane.db.models import LoginFailure


def test_throttle_refuses_a_user_from_an_address_until_the_window_passes(master) -> None:  # type: ignore[no-untyped-def]
    t = auth.LoginThrottle(master.sessions, per_user=3, per_address=100, window_s=60)
    for i in range(3):
        t.attempt("bob", "10.0.0.1", now=100.0 + i)  # three failed guesses from one address
    with pytest.raises(auth.LoginThrottled) as err:
        t.attempt("bob", "10.0.0.1", now=110.0)
    assert err.value.scope == "user" and err.value.retry_after_s == 50  # the first failure leaves at 160
    t.attempt("alice", "10.0.0.1", now=110.0)  # another user from that address is not affected
    with pytest.raises(auth.LoginThrottled):
        t.attempt("bob", "10.0.0.1", now=159.5)
    t.attempt("bob", "10.0.0.1", now=160.0)  # the oldest failure has left the window


def test_guesses_from_one_address_never_refuse_the_user_from_another(master) -> None:  # type: ignore[no-untyped-def]
    t = auth.LoginThrottle(master.sessions, per_user=3, per_address=100, window_s=60)
    for i in range(3):
        t.attempt("admin", "10.0.0.66", now=float(i))
    with pytest.raises(auth.LoginThrottled):
        t.attempt("admin", "10.0.0.66", now=3.0)
    t.attempt("admin", "10.0.0.7", now=3.0)  # the owner, from elsewhere
    for i in range(3):  # and every other address has its own count
        t.attempt("admin", f"10.0.1.{i}", now=4.0)


def test_throttle_refuses_an_address_spraying_usernames(master) -> None:  # type: ignore[no-untyped-def]
    t = auth.LoginThrottle(master.sessions, per_user=100, per_address=5, window_s=60)
    for i in range(5):
        t.attempt(f"user{i}", "10.0.0.1", now=0.0)
    with pytest.raises(auth.LoginThrottled) as err:
        t.attempt("fresh-name", "10.0.0.1", now=1.0)
    assert err.value.scope == "address" and err.value.retry_after_s == 59
    t.attempt("fresh-name", "10.0.0.2", now=1.0)


def test_a_successful_login_clears_the_users_failures(master) -> None:  # type: ignore[no-untyped-def]
    t = auth.LoginThrottle(master.sessions, per_user=3, per_address=100, window_s=60)
    t.attempt("bob", "a", now=0.0)
    t.attempt("bob", "a", now=1.0)
    t.attempt("bob", "a", now=2.0)
    t.succeeded("bob", "a")  # the third attempt was the right password
    for i in range(3):
        t.attempt("bob", "a", now=3.0 + i)


def test_concurrent_guesses_cannot_pass_the_limit(master) -> None:  # type: ignore[no-untyped-def]
    # Attempts are counted before the (slow) password check, so a burst of parallel guesses gets
    # exactly `per_user` through.
    t = auth.LoginThrottle(master.sessions, per_user=4, per_address=1000, window_s=60)
    admitted: list[int] = []
    barrier = threading.Barrier(32)

    def guess(i: int) -> None:
        barrier.wait()
        try:
            t.attempt("bob", "10.0.0.1", now=0.0)
            admitted.append(i)
        except auth.LoginThrottled:
            pass

    threads = [threading.Thread(target=guess, args=(i,)) for i in range(32)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(admitted) == 4


def test_failures_older_than_the_window_are_deleted(master) -> None:  # type: ignore[no-untyped-def]
    t = auth.LoginThrottle(master.sessions, per_user=1, per_address=1000, window_s=60)
    for i in range(200):
        t.attempt(f"u{i}", None, now=0.0)
    t.attempt("late", None, now=61.0)  # every earlier failure has left the window
    with master.read_sessions() as s:
        assert s.scalars(select(LoginFailure.username)).all() == ["late"]


def test_every_master_process_counts_the_same_failures(master) -> None:  # type: ignore[no-untyped-def]
    # Two throttles on one database stand for two API workers (or two masters).
    a = auth.LoginThrottle(master.sessions, per_user=3, per_address=100, window_s=60)
    b = auth.LoginThrottle(master.sessions, per_user=3, per_address=100, window_s=60)
    a.attempt("bob", "x", now=0.0)
    b.attempt("bob", "x", now=1.0)
    a.attempt("bob", "x", now=2.0)
    with pytest.raises(auth.LoginThrottled):
        b.attempt("bob", "x", now=3.0)
