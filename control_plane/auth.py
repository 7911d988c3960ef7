"""Passwords and scoped bearer tokens.

Passwords: Determined's client hashes on its side (salted SHA-512, `isHashed=true`); the plain
form is normalised to that same value, and only an Argon2id hash of it is stored. So both login
forms work and a leaked database gives neither form away.

Tokens: 32 random bytes, URL-safe; the database keeps only their SHA-256.
"""

from __future__ import annotations

import enum
import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from control_plane.db.models import Token, User

# Determined's client-side salt (determined/common/api/authentication.py); public by design.
DETERMINED_PASSWORD_SALT = "GubPEmmotfiK9TMD6Zdw"
MIN_PASSWORD_LENGTH = 8

_hasher = PasswordHasher()


class TokenKind(enum.StrEnum):
    USER = "user"
    AGENT = "agent"
    ALLOCATION = "allocation"
    BOOTSTRAP = "bootstrap"


def client_hash(password: str) -> str:
    return hashlib.sha512((DETERMINED_PASSWORD_SALT + password).encode()).hexdigest()


def hash_password(password: str, *, is_hashed: bool = False) -> str:
    return _hasher.hash(password if is_hashed else client_hash(password))


def verify_password(stored: str, password: str, *, is_hashed: bool = False) -> bool:
    try:
        return _hasher.verify(stored, password if is_hashed else client_hash(password))
    except (VerificationError, InvalidHashError):
        return False


def password_problem(password: str) -> str | None:
    """Why a new plain password is unacceptable, or None."""
    if len(password) < MIN_PASSWORD_LENGTH:
        return f"must be at least {MIN_PASSWORD_LENGTH} characters"
    if password.strip() == "":
        return "must not be blank"
    return None


def generate_password() -> str:
    return secrets.token_urlsafe(15)


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


def resolve_token(session: Session, token: str, *, now: datetime) -> Principal | None:
    row = session.scalar(select(Token).where(Token.token_hash == token_digest(token)))
    if row is None or row.revoked_at is not None:
        return None
    if row.expires_at is not None and row.expires_at <= now:
        return None
    kind = TokenKind(row.kind)
    if kind is TokenKind.USER or (kind is TokenKind.ALLOCATION and row.user_id is not None):
        user = session.get(User, row.user_id)
        if user is None or not user.active:
            return None
        return Principal(
            kind=kind,
            token_id=row.id,
            user_id=user.id,
            username=user.username,
            admin=user.admin and kind is TokenKind.USER,
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
