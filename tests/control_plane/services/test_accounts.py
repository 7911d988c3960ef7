"""services/users.py on SQLite and PostgreSQL: the last admin, sessions after a password change,
login throttling under a fake clock, and two admins demoting each other at once."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from control_plane import auth
from control_plane.auth import Principal, TokenKind
from control_plane.config import load_config
from control_plane.db.engine import transaction
from control_plane.db.models import Allocation, User
from control_plane.errors import Conflict, PermissionDenied, TooManyRequests
from control_plane.master import Master
from control_plane.services import allocations, users
from control_plane.services.users import NewUser, UserChange
from tests.conftest import ADMIN_PASSWORD, TEST_PASSWORD_HASHING
from tests.control_plane.loops.conftest import FakeClock
from tests.control_plane.services.builders import admin, create_experiment


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def strict_master(db_url: str, tmp_path: Path, clock: FakeClock) -> Iterator[Master]:
    config = load_config(env={}, db_url=db_url, state_dir=str(tmp_path / "state"), admin_password=ADMIN_PASSWORD, **TEST_PASSWORD_HASHING,
                         login_max_failures_per_user=3, login_max_failures_per_address=5,
                         login_failure_window_s=60)
    m = Master(config, clock=clock)
    m.prepare()
    yield m
    m.stop()


def _login(m: Master, username: str, password: str, address: str = "10.0.0.1") -> str:
    with transaction(m.sessions) as s:
        return users.login(s, m, username, password, is_hashed=False, address=address)[0]


def _principal(m: Master, token: str) -> Principal | None:
    with m.read_sessions() as s:
        return auth.resolve_token(s, token, now=m.clock())


def test_throttle_window_and_addresses(strict_master: Master, clock: FakeClock) -> None:
    m = strict_master
    with transaction(m.sessions) as s:
        users.create_user(s, m, NewUser("bob", "bobs-password-1"))
    for _ in range(3):
        with pytest.raises(PermissionDenied):
            _login(m, "bob", "wrong-guess", address="10.0.0.1")
    with pytest.raises(TooManyRequests) as err:
        _login(m, "bob", "bobs-password-1", address="10.0.0.1")  # even the right password, from there
    assert err.value.retry_after_s == 60 and "this user from this address" in err.value.message
    # bob from another address is not refused for what was guessed from 10.0.0.1
    assert _principal(m, _login(m, "bob", "bobs-password-1", address="10.0.0.2")) is not None
    clock.advance(seconds=30)
    with pytest.raises(TooManyRequests) as err:
        _login(m, "bob", "bobs-password-1")
    assert err.value.retry_after_s == 30
    clock.advance(seconds=30)
    assert _principal(m, _login(m, "bob", "bobs-password-1")) is not None

    # An address spraying usernames (existing or not) is stopped, for every username.
    for i in range(5):
        with pytest.raises(PermissionDenied):
            _login(m, f"guess-{i}", "wrong-guess", address="10.0.0.66")
    with pytest.raises(TooManyRequests) as err:
        _login(m, "admin", ADMIN_PASSWORD, address="10.0.0.66")
    assert "this address" in err.value.message
    assert _principal(m, _login(m, "admin", ADMIN_PASSWORD, address="10.0.0.7")) is not None


def test_every_failed_login_gets_the_same_answer(strict_master: Master) -> None:
    """Unknown user, wrong password, deactivated account (right or wrong password): one answer, and
    each counts as a failure."""
    m = strict_master
    with transaction(m.sessions) as s:
        users.create_user(s, m, NewUser("bob", "bobs-password-1"))
        users.create_user(s, m, NewUser("gone", "gones-password-1", active=False))
    answers = []
    for username, password in (("nobody", "bobs-password-1"), ("bob", "wrong-guess"),
                               ("gone", "gones-password-1"), ("gone", "wrong-guess")):
        with pytest.raises(PermissionDenied) as err:
            _login(m, username, password, address=f"10.0.1.{len(answers)}")
        answers.append(err.value.message)
    assert answers == ["invalid credentials"] * 4
    for _ in range(2):  # the right password of a deactivated account counts as a failure too
        with pytest.raises(PermissionDenied):
            _login(m, "gone", "gones-password-1", address="10.0.2.1")
    with pytest.raises(PermissionDenied):
        _login(m, "gone", "wrong-guess", address="10.0.2.1")
    with pytest.raises(TooManyRequests):
        _login(m, "gone", "gones-password-1", address="10.0.2.1")


def test_the_last_active_admin_stays(master: Master) -> None:
    root = admin(master)
    with pytest.raises(Conflict) as err, transaction(master.sessions) as s:
        users.change_user(s, master, root, root.user_id, UserChange(admin=False))
    assert "last active admin" in err.value.message
    with master.read_sessions() as s:
        u = s.get(User, root.user_id)
        assert u.admin and u.active


@pytest.mark.parametrize("change", [UserChange(admin=False), UserChange(active=False)], ids=["demote", "deactivate"])
def test_two_admins_removing_each_other_at_once_leave_one(master: Master, change: UserChange) -> None:
    with transaction(master.sessions) as s:
        other_id = users.create_user(s, master, NewUser("root2", "root2-password", admin=True)).id
    root = admin(master)
    root2 = Principal(kind=TokenKind.USER, token_id=0, user_id=other_id, username="root2", admin=True)
    outcomes: list[str] = []

    # The first demotion holds its transaction open while the second runs in another thread; the
    # second waits for the lock (PostgreSQL row lock, SQLite write lock) and then sees the first.
    first = master.sessions()
    first.begin()
    users.change_user(first, master, root2, root.user_id, change)
    first.flush()

    def second() -> None:
        try:
            with transaction(master.sessions) as s:
                users.change_user(s, master, root, other_id, change)
            outcomes.append("removed")
        except Conflict:
            outcomes.append("refused")

    t = threading.Thread(target=second)
    t.start()
    first.commit()
    first.close()
    t.join(timeout=60)
    assert outcomes == ["refused"]
    with master.read_sessions() as s:
        assert s.scalars(select(User.username).where(User.admin.is_(True), User.active.is_(True))).all() == ["root2"]


def test_a_password_change_keeps_the_users_running_trials(master: Master) -> None:
    with transaction(master.sessions) as s:
        bob_id = users.create_user(s, master, NewUser("bob", "bobs-password-1")).id
    bob = Principal(kind=TokenKind.USER, token_id=0, user_id=bob_id, username="bob")
    create_experiment(master, owner=bob)
    with transaction(master.sessions) as s:
        alloc = s.scalar(select(Allocation))
        trial_token = allocations.ensure_allocation_token(s, master, alloc)
    session = _login(master, "bob", "bobs-password-1")
    with transaction(master.sessions) as s:
        users.change_user(s, master, admin(master), bob_id, UserChange(password="bobs-password-2"))
    assert _principal(master, session) is None  # his session ended
    assert _principal(master, trial_token) is not None  # his trial did not
