"""control_plane/auth.py without a database: the login throttle, the token key file, and the
unknown-user path of a login costing one Argon2 verification like a known user's."""

from __future__ import annotations

import stat
import threading
from pathlib import Path

import pytest
from argon2 import PasswordHasher

from control_plane import auth
from control_plane.db.models import User


def test_throttle_refuses_after_max_failures_per_user_until_the_window_passes() -> None:
    t = auth.LoginThrottle(per_user=3, per_address=100, window_s=60)
    for i in range(3):
        t.attempt("bob", f"10.0.0.{i}", now=100.0 + i)  # three failed guesses from three addresses
    with pytest.raises(auth.LoginThrottled) as err:
        t.attempt("bob", "10.0.0.9", now=110.0)
    assert err.value.scope == "user" and err.value.retry_after_s == 50  # the first failure leaves at 160
    t.attempt("alice", "10.0.0.9", now=110.0)  # another user is not affected
    with pytest.raises(auth.LoginThrottled):
        t.attempt("bob", "10.0.0.9", now=159.5)
    t.attempt("bob", "10.0.0.9", now=160.0)  # the oldest failure has left the window


def test_throttle_refuses_an_address_spraying_usernames() -> None:
    t = auth.LoginThrottle(per_user=100, per_address=5, window_s=60)
    for i in range(5):
        t.attempt(f"user{i}", "10.0.0.1", now=0.0)
    with pytest.raises(auth.LoginThrottled) as err:
        t.attempt("fresh-name", "10.0.0.1", now=1.0)
    assert err.value.scope == "address" and err.value.retry_after_s == 59
    t.attempt("fresh-name", "10.0.0.2", now=1.0)


def test_a_successful_login_clears_the_users_failures() -> None:
    t = auth.LoginThrottle(per_user=3, per_address=100, window_s=60)
    t.attempt("bob", "a", now=0.0)
    t.attempt("bob", "a", now=1.0)
    t.attempt("bob", "a", now=2.0)
    t.succeeded("bob", "a", attempted_at=2.0)  # the third attempt was the right password
    for i in range(3):
        t.attempt("bob", "a", now=3.0 + i)


def test_concurrent_guesses_cannot_pass_the_limit() -> None:
    # Attempts are counted before the (slow) password check, so a burst of parallel guesses gets
    # exactly `per_user` through.
    t = auth.LoginThrottle(per_user=4, per_address=1000, window_s=60)
    admitted: list[int] = []
    barrier = threading.Barrier(32)

    def guess(i: int) -> None:
        barrier.wait()
        try:
            t.attempt("bob", f"10.0.{i}.1", now=0.0)
            admitted.append(i)
        except auth.LoginThrottled:
            pass

    threads = [threading.Thread(target=guess, args=(i,)) for i in range(32)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(admitted) == 4


def test_throttle_memory_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(auth.LoginThrottle, "MAX_KEYS", 50)
    t = auth.LoginThrottle(per_user=1, per_address=1000, window_s=60)
    for i in range(200):
        t.attempt(f"u{i}", None, now=0.0)
    assert len(t._failures) <= 50


class CountingHasher(PasswordHasher):
    """A real Argon2 hasher that counts its verifications."""

    def __init__(self) -> None:
        super().__init__()
        self.verified = 0

    def verify(self, hash: str | bytes, password: str | bytes) -> bool:  # noqa: A002 - argon2's own name
        self.verified += 1
        return super().verify(hash, password)


def test_unknown_user_costs_the_same_argon2_verification(monkeypatch: pytest.MonkeyPatch) -> None:
    hasher = CountingHasher()
    monkeypatch.setattr(auth, "_hasher", hasher)
    monkeypatch.setattr(auth, "_dummy_hash", None)
    known = User(username="bob", password_hash=auth.hash_password("bobs-password-1"))
    assert auth.verify_login(known, "wrong-password", is_hashed=False) is False
    assert hasher.verified == 1
    assert auth.verify_login(None, "wrong-password", is_hashed=False) is False
    assert hasher.verified == 2
    # ... against a hash made with the same parameters as a real one
    assert auth._dummy_hash is not None
    assert auth._dummy_hash.split("$")[:4] == known.password_hash.split("$")[:4]
    assert auth.verify_login(known, "bobs-password-1", is_hashed=False) is True


def test_token_key_file_is_created_private_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "new" / "dir" / "token-secret"
    key = auth.load_token_key(path)
    assert len(key) == auth.TOKEN_KEY_BYTES
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    for d in (path.parent, path.parent.parent):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700
    assert auth.load_token_key(path) == key
    assert [p.name for p in path.parent.iterdir()] == ["token-secret"]  # no temporary file left


def test_masters_creating_a_shared_key_at_once_agree(tmp_path: Path) -> None:
    path = tmp_path / "shared" / "token-secret"
    keys: list[bytes] = []
    barrier = threading.Barrier(8)

    def start() -> None:
        barrier.wait()
        keys.append(auth.load_token_key(path))

    threads = [threading.Thread(target=start) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(keys) == 8 and len(set(keys)) == 1


@pytest.mark.parametrize("content, reason", [
    ("not hex at all\n", "cannot read a hex key"),
    ("abcd\n", "at least 32 bytes"),
])
def test_a_bad_token_key_file_is_refused_with_its_name(tmp_path: Path, content: str, reason: str) -> None:
    path = tmp_path / "token-secret"
    path.write_text(content)
    with pytest.raises(auth.TokenKeyError) as err:
        auth.load_token_key(path)
    assert str(path) in str(err.value) and reason in str(err.value)
