"""The leadership lease decision (core/lease.py): who may run the loops, and when another takes over."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from control_plane.core.lease import Lease, Move, decide, still_valid

T0 = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
TTL = timedelta(seconds=10)


def test_the_first_master_creates_the_lease_with_token_one() -> None:
    d = decide(None, "a", T0, TTL, holder_lock_free=True)
    assert (d.move, d.token, d.expires_at) == (Move.CREATE, 1, T0 + TTL)


def test_the_holder_renews_with_the_same_token() -> None:
    d = decide(Lease("a", 4, T0 + timedelta(seconds=2)), "a", T0, TTL, holder_lock_free=False)
    assert (d.move, d.token, d.expires_at) == (Move.RENEW, 4, T0 + TTL)


def test_a_live_holder_keeps_the_lease_while_it_is_valid() -> None:
    d = decide(Lease("a", 4, T0 + timedelta(seconds=3)), "b", T0, TTL, holder_lock_free=False)
    assert d.move is Move.STAND_BY and d.token is None and "a leads (token 4)" in d.reason


def test_an_expired_lease_is_taken_over_with_the_next_token() -> None:
    d = decide(Lease("a", 4, T0 - timedelta(seconds=1)), "b", T0, TTL, holder_lock_free=False)
    assert (d.move, d.token) == (Move.TAKE_OVER, 5) and "expired" in d.reason


def test_a_dead_holder_is_replaced_at_once_when_its_liveness_lock_is_free() -> None:
    d = decide(Lease("a", 4, T0 + timedelta(seconds=9)), "b", T0, TTL, holder_lock_free=True)
    assert (d.move, d.token) == (Move.TAKE_OVER, 5) and "gone" in d.reason


def test_the_fence_accepts_only_the_current_holder_and_token_before_expiry() -> None:
    lease = Lease("a", 4, T0 + timedelta(seconds=1))
    assert still_valid(lease, "a", 4, T0)
    assert not still_valid(lease, "a", 3, T0)  # an older incarnation's token
    assert not still_valid(lease, "b", 4, T0)
    assert not still_valid(lease, "a", 4, T0 + timedelta(seconds=1))  # expired: renew first
    assert not still_valid(None, "a", 4, T0)


def test_a_free_lock_says_nothing_about_a_holder_that_never_got_it() -> None:
    # b took over a paused a by expiry while a still held the lock; a lets it go when it wakes.
    # c taking the lock then must not depose b, which is alive.
    lease = Lease("b", 5, T0 + timedelta(seconds=8), locked=False)
    assert decide(lease, "c", T0, TTL, holder_lock_free=True).move is Move.STAND_BY
    assert decide(lease, "c", T0 + timedelta(seconds=9), TTL, holder_lock_free=True).move is Move.TAKE_OVER
