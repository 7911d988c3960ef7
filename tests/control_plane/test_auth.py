"""control_plane/auth.py: the token key file, and the
unknown-user path of a login costing one Argon2 verification like a known user's."""

from __future__ import annotations

import stat
import threading
from datetime import UTC
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


def test_the_default_argon2_parameters_are_rfc_9106s_low_memory_profile() -> None:
    from control_plane.config import load_config

    cfg = load_config(env={})
    default = PasswordHasher()  # argon2-cffi's RFC 9106 low-memory profile
    assert (cfg.password_hash_time_cost, cfg.password_hash_memory_kib, cfg.password_hash_parallelism) == (
        default.time_cost, default.memory_cost, default.parallelism) == (3, 65536, 4)


def test_too_little_argon2_memory_is_refused_naming_the_setting() -> None:
    from control_plane.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="password_hash_memory_kib"):
        load_config(env={"SHIPYARD_PASSWORD_HASH_MEMORY_KIB": "64"})


def _params(stored: str) -> str:
    return stored.split("$")[3]  # m=...,t=...,p=...


def test_a_hash_made_under_other_parameters_verifies_and_is_remade_at_login(master, client) -> None:  # type: ignore[no-untyped-def]
    from datetime import datetime

    from sqlalchemy import select

    from tests.conftest import TEST_PASSWORD_HASHING, login

    old = PasswordHasher(time_cost=2, memory_cost=2048, parallelism=2).hash(auth.client_hash("carols-password"))
    now = datetime.now(UTC)
    with master.sessions() as s, s.begin():
        s.add(User(username="carol", password_hash=old, admin=False, created_at=now, modified_at=now))
    login(client, "carol", "carols-password")
    with master.sessions() as s:
        stored = s.scalar(select(User.password_hash).where(User.username == "carol"))
    t, m, p = (TEST_PASSWORD_HASHING[f"password_hash_{k}"] for k in ("time_cost", "memory_kib", "parallelism"))
    assert _params(old) == "m=2048,t=2,p=2" and _params(stored) == f"m={m},t={t},p={p}"
    assert not auth.needs_rehash(stored)
    login(client, "carol", "carols-password")  # the new hash verifies the same password
    r = client.post("/api/v1/auth/login", json={"username": "carol", "password": "not-carols-password"})
    assert r.status_code == 403 and r.json()["message"] == "invalid credentials", r.text
