"""Passwords and scoped bearer tokens.

Passwords: Determined's client hashes on its side (salted SHA-512, `isHashed=true`); the plain
form is normalised to that same value, and only an Argon2id hash of it is stored. So both login
forms work and a leaked database gives neither form away.

Tokens: 32 random bytes, URL-safe; the database keeps only their SHA-256. Tokens the master must
re-derive (an allocation's, sent again with every repeated start command) are an HMAC under a key
kept in a 0600 file outside the database (`load_token_key`), so a copy of the database mints none.

Logins: an unknown username costs one Argon2 verification like a known one (`verify_login`), and
failures are throttled per (username, source address) and per source address (`LoginThrottle`).
"""

from __future__ import annotations

import enum
import hashlib
import logging
import math
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from sqlalchemy import bindparam, delete, func, select, true
from sqlalchemy.orm import Session, sessionmaker

from control_plane.db.models import LoginFailure, Token, User
from shipyard_common import passwords, private_files

log = logging.getLogger("shipyard.auth")

# Determined's client-side salt (determined/common/api/authentication.py); public by design.
DETERMINED_PASSWORD_SALT = "GubPEmmotfiK9TMD6Zdw"
MIN_PASSWORD_LENGTH = 8

# The process's Argon2id parameters: argon2-cffi's defaults until the master configures its own
# (configure_password_hashing, from MasterConfig.password_hash_*).
_hasher = PasswordHasher()


# The web UI's session cookie (ui/session.py sets it; the task proxy, api/proxy.py, reads it too).
UI_SESSION_COOKIE = "shipyard_session"


class TokenKind(enum.StrEnum):
    USER = "user"
    AGENT = "agent"
    ALLOCATION = "allocation"
    BOOTSTRAP = "bootstrap"
    # One agent's own identity, issued at its enrolment (services/agents.py); the pool's agent
    # tokens and bootstrap tokens only enrol.
    AGENT_CREDENTIAL = "agent_credential"


def client_hash(password: str) -> str:
    return hashlib.sha512((DETERMINED_PASSWORD_SALT + password).encode()).hexdigest()


def configure_password_hashing(*, time_cost: int, memory_kib: int, parallelism: int) -> None:
    """Hash new passwords with these Argon2id parameters. Stored hashes carry their own, so the
    ones made before still verify (and `needs_rehash` says so at their next login)."""
    global _hasher, _dummy_hash
    params = (time_cost, memory_kib, parallelism)
    if (_hasher.time_cost, _hasher.memory_cost, _hasher.parallelism) == params:
        return
    _hasher = PasswordHasher(time_cost=time_cost, memory_cost=memory_kib, parallelism=parallelism)
    _dummy_hash = None  # an unknown user's verification must cost what a known user's does


def needs_rehash(stored: str) -> bool:
    """Whether `stored` was made with other parameters than the configured ones."""
    try:
        return _hasher.check_needs_rehash(stored)
    except InvalidHashError:
        return True


def hash_password(password: str, *, is_hashed: bool = False) -> str:
    return _hasher.hash(password if is_hashed else client_hash(password))


def verify_password(stored: str, password: str, *, is_hashed: bool = False) -> bool:
    try:
        return _hasher.verify(stored, password if is_hashed else client_hash(password))
    except (VerificationError, InvalidHashError):
        return False


_dummy_hash: str | None = None


def verify_login(user: User | None, password: str, *, is_hashed: bool) -> bool:
    """Whether `password` is `user`'s. For an unknown user (None) the same Argon2 verification runs
    against a hash made with the same parameters, so the answer takes as long as for a known user
    with a wrong password and timing does not tell which usernames exist."""
    global _dummy_hash
    if user is not None:
        return verify_password(user.password_hash, password, is_hashed=is_hashed)
    if _dummy_hash is None:
        _dummy_hash = _hasher.hash(secrets.token_hex(16))
    verify_password(_dummy_hash, password, is_hashed=is_hashed)
    return False


def password_problem(password: str) -> str | None:
    """Why a new plain password is unacceptable, or None."""
    if len(password) < MIN_PASSWORD_LENGTH:
        return f"must be at least {MIN_PASSWORD_LENGTH} characters"
    if password.strip() == "":
        return "must not be blank"
    return None


def generate_password() -> str:
    return passwords.generate(15)


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def issue_token(
    session: Session,
    kind: TokenKind,
    *,
    now: datetime,
    ttl: timedelta | None,
    user_id: int | None = None,
    pool: str | None = None,
    agent_id: str | None = None,
    allocation_id: str | None = None,
    trial_id: int | None = None,
    launch_id: str | None = None,
) -> str:
    token = secrets.token_urlsafe(32)
    session.add(
        Token(
            token_hash=token_digest(token),
            kind=kind.value,
            user_id=user_id,
            pool=pool,
            agent_id=agent_id,
            allocation_id=allocation_id,
            trial_id=trial_id,
            launch_id=launch_id,
            created_at=now,
            expires_at=(now + ttl) if ttl else None,
        )
    )
    return token


@dataclass(frozen=True)
class Principal:
    """Who is calling, and what their token allows."""

    kind: TokenKind
    token_id: int
    user_id: int | None = None
    username: str | None = None
    admin: bool = False
    pool: str | None = None
    agent_id: str | None = None
    allocation_id: str | None = None
    trial_id: int | None = None
    launch_id: str | None = None

    @property
    def is_user(self) -> bool:
        return self.kind is TokenKind.USER


# Every request resolves its token: one query (the token and its user together), read as plain
# rows on the session's connection, no ORM objects.
_TOKEN_ROW = (
    select(Token.id, Token.kind, Token.user_id, Token.pool, Token.agent_id, Token.allocation_id, Token.trial_id,
           Token.launch_id, Token.expires_at, Token.revoked_at, User.username, User.admin, User.active)
    .outerjoin(User, User.id == Token.user_id)
    .where(Token.token_hash == bindparam("token_hash"))
)


def resolve_token(session: Session, token: str, *, now: datetime) -> Principal | None:
    if session.new or session.dirty or session.deleted:
        session.flush()  # what an ORM query would see (autoflush): a token issued in this session
    row = session.connection().execute(_TOKEN_ROW, {"token_hash": token_digest(token)}).first()
    if row is None or row.revoked_at is not None:
        return None
    if row.expires_at is not None and row.expires_at <= now:
        return None
    kind = TokenKind(row.kind)
    if kind is TokenKind.USER or (kind is TokenKind.ALLOCATION and row.user_id is not None):
        if row.username is None or not row.active:  # the user is gone or deactivated
            return None
        return Principal(
            kind=kind,
            token_id=row.id,
            user_id=row.user_id,
            username=row.username,
            admin=row.admin and kind is TokenKind.USER,
            allocation_id=row.allocation_id,
            trial_id=row.trial_id,
        )
    return Principal(
        kind=kind,
        token_id=row.id,
        pool=row.pool,
        agent_id=row.agent_id,
        allocation_id=row.allocation_id,
        trial_id=row.trial_id,
        launch_id=row.launch_id,
    )


def revoke_token(session: Session, token_id: int, *, now: datetime) -> None:
    row = session.get(Token, token_id)
    if row is not None and row.revoked_at is None:
        row.revoked_at = now


# -- the token key ------------------------------------------------------------------------------
TOKEN_KEY_BYTES = 32


class TokenKeyError(Exception):
    """The token key file is unusable; the message names the file and what is wrong."""


def load_token_key(path: Path) -> bytes:
    """The key allocation tokens are derived from, read from `path`, or created there (random,
    mode 0600 in a 0700 directory) when there is none. Two masters creating a shared file at once
    both end up with the one written first."""
    if not path.exists():
        key = secrets.token_bytes(TOKEN_KEY_BYTES)
        if private_files.write_private(path, key.hex().encode() + b"\n", exclusive=True):
            log.info("event=token_key_created path=%s", path)
            return key
    try:
        text = path.read_text(encoding="ascii").strip()
        key = bytes.fromhex(text)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise TokenKeyError(f"token secret file {path}: cannot read a hex key ({e})") from None
    if len(key) < TOKEN_KEY_BYTES:
        raise TokenKeyError(f"token secret file {path}: the key must be at least {TOKEN_KEY_BYTES} bytes "
                            f"({2 * TOKEN_KEY_BYTES} hex digits)")
    if (mode := private_files.loose_mode(path)) is not None:
        log.warning("event=token_key_readable_by_others path=%s mode=%o hint=chmod_600", path, mode)
    return key


# -- login throttling ---------------------------------------------------------------------------
class LoginThrottled(Exception):
    def __init__(self, scope: str, retry_after_s: float) -> None:
        super().__init__(scope)
        self.scope = scope  # "user" (this username from this address) or "address"
        self.retry_after_s = retry_after_s


class LoginThrottle:
    """Failed logins in a sliding window, per (username, source address) and per source address,
    kept in the database (LoginFailure) so that every master process (API workers, masters on
    other hosts) counts the same failures. Once a key has its `max_failures` in the window, attempts
    for it are refused until the oldest leaves the window; a successful login clears the failures of
    its username from its address. Never per username alone: whoever guesses a username's password
    from one address must not lock its owner out from another. Time is an argument (seconds).
    Attempts are serialized (a transaction lock: SQLite's write lock, or an advisory lock on
    PostgreSQL), so a burst of parallel guesses gets exactly the limit through; logins are rare and
    already cost an Argon2 verification each. An unknown address (None) is counted as "" for its
    usernames, and has no limit of its own."""

    LOCK_KEY = int.from_bytes(b"SHPYLGIN", "big", signed=True)

    def __init__(self, sessions: sessionmaker[Session], *, per_user: int, per_address: int, window_s: float) -> None:
        self.sessions = sessions
        self.limits = {"user": per_user, "address": per_address}
        self.window_s = window_s

    def _serialize(self, s: Session) -> None:
        if s.get_bind().dialect.name == "postgresql":
            s.execute(select(func.pg_advisory_xact_lock(self.LOCK_KEY)))

    @staticmethod
    def _key(username: str, address: str | None) -> tuple[str, str]:
        return username[:128], (address or "")[:255]

    def attempt(self, username: str, address: str | None, now: float) -> None:
        """Count a login attempt as a failure up front, or raise LoginThrottled if the username from
        this address, or the address, has used up its failures. Counting before the password is
        checked means concurrent guesses cannot all slip past the limit while their hashes are
        computed."""
        user, addr = self._key(username, address)
        cutoff = now - self.window_s
        scopes = [("user", LoginFailure.username == user)]
        if address is not None:
            scopes.append(("address", true()))
        with self.sessions() as s, s.begin():
            self._serialize(s)
            s.execute(delete(LoginFailure).where(LoginFailure.at <= cutoff))
            for scope, which in scopes:
                count, oldest = s.execute(select(func.count(), func.min(LoginFailure.at)).where(
                    LoginFailure.address == addr, which, LoginFailure.at > cutoff)).one()
                if count >= self.limits[scope]:
                    raise LoginThrottled(scope, max(1.0, math.ceil(oldest + self.window_s - now)))
            s.add(LoginFailure(address=addr, username=user, at=now))

    def succeeded(self, username: str, address: str | None) -> None:
        """The attempt was a good password: forget the failures of the username from this address
        (the attempt's own included)."""
        user, addr = self._key(username, address)
        with self.sessions() as s, s.begin():
            self._serialize(s)
            s.execute(delete(LoginFailure).where(LoginFailure.address == addr, LoginFailure.username == user))
