"""control_plane/auth.py: the token key file, and the
unknown-user path of a login costing one Argon2 verification like a known user's."""

from __future__ import annotations

import stat
import threading
from pathlib import Path

import pytest
from argon2 import PasswordHasher

from control_plane import auth
from control_plane.db.models import User


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
