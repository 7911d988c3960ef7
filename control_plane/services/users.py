"""Users and sessions: logging in, accounts, passwords, and who may change what.

Rules: every account has a password (also a client-side hash of the empty string is refused);
every failed login (unknown user, wrong password, deactivated account) gets the same answer, in the
same time (one Argon2 verification either way); failed logins are throttled per (username, source
address) and per source address (429), never per username alone; changing a
password, by any path, ends the user's other sessions; deactivating a user ends all of them; only
an admin changes another user, anyone's admin or active flag, or a username; nobody deactivates
themselves; the last active admin can be neither demoted nor deactivated.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from control_plane import auth
from control_plane.auth import Principal, TokenKind
from control_plane.db.models import Token, User
from control_plane.errors import (
    PermissionDenied,
    TooManyRequests,
    bad_request,
    conflict,
    forbidden,
    not_found,
)
from control_plane.master import Master
from control_plane.services import authz

log = logging.getLogger("shipyard.users")

_NO_PASSWORD = "a password is required: accounts without a password are not allowed"


def login(s: Session, master: Master, username: str, password: str, *, is_hashed: bool,
          address: str | None = None) -> tuple[str, User]:
    """A new user token and the user; the same refusal, in the same time, for an unknown user, a
    wrong password and a deactivated account (no user enumeration, no password oracle). `address`
    is the caller's, for throttling. The user is read in a session of its own, so `s` must not hold
    an uncommitted change to them."""
    try:
        master.login_throttle.attempt(username, address, master.clock().timestamp())
    except auth.LoginThrottled as e:
        log.warning("event=login_throttled scope=%s username=%s address=%s", e.scope, username, address)
        who = "this user from this address" if e.scope == "user" else "this address"
        raise TooManyRequests(f"too many failed logins for {who}; try again in {int(e.retry_after_s)} s",
                              retry_after_s=int(e.retry_after_s)) from None
    # Looked up and verified through a read-only session, before `s` is first used: the slow Argon2
    # check must not hold SQLite's write lock (taken by the first statement of a write session).
    with master.read_sessions() as rs:
        found = rs.scalar(select(User).where(User.username == username))
    if not auth.verify_login(found, password, is_hashed=is_hashed) or found is None or not found.active:
        log.info("event=login_failed username=%s address=%s", username, address)
        raise PermissionDenied("invalid credentials")
    master.login_throttle.succeeded(username, address)  # before `s` is used (SQLite: one writer)
    u = s.get(User, found.id)
    if u is None or not u.active:  # removed or deactivated in the meantime
        raise PermissionDenied("invalid credentials")
    if auth.needs_rehash(u.password_hash):  # made under other Argon2 parameters than the master's
        u.password_hash = auth.hash_password(password, is_hashed=is_hashed)
    now = master.clock()
    u.last_auth_at = now
    token = auth.issue_token(s, TokenKind.USER, now=now, ttl=timedelta(hours=master.config.token_ttl_hours),
                             user_id=u.id)
    log.info("event=login username=%s", u.username)
    return token, u


def password_hash(password: str | None, is_hashed: bool, field: str) -> str:
    """The stored hash of a new password, or a 400 naming `field` if the password is refused."""
    if password is None or password == "":
        raise bad_request(_NO_PASSWORD, field)
    if is_hashed:
        # A client-side hash of the empty string is still an empty password.
        if password == auth.client_hash(""):
            raise bad_request(_NO_PASSWORD, field)
        return auth.hash_password(password, is_hashed=True)
    if problem := auth.password_problem(password):
        raise bad_request(problem, field)
    return auth.hash_password(password)


def _revoke_sessions(s: Session, master: Master, user: User, keep_token_id: int | None = None, *,
                     only_user_tokens: bool = False) -> None:
    """Revoke the user's tokens but `keep_token_id`. `only_user_tokens` spares the allocation
    tokens of their running trials (a password change ends sessions, not training)."""
    q = select(Token).where(Token.user_id == user.id, Token.revoked_at.is_(None))
    if only_user_tokens:
        q = q.where(Token.kind == TokenKind.USER.value)
    for t in s.scalars(q):
        if t.id != keep_token_id:
            t.revoked_at = master.clock()


def _change_password(s: Session, master: Master, by: Principal, u: User, password: str, *, is_hashed: bool) -> None:
    """The one path for every password change: the new hash, and the end of the user's other
    sessions (the caller's own session survives a change of their own password)."""
    u.password_hash = password_hash(password, is_hashed, "password")
    keep = by.token_id if by.user_id == u.id else None
    _revoke_sessions(s, master, u, keep_token_id=keep, only_user_tokens=True)
    log.info("event=password_changed username=%s by=%s", u.username, by.username)


def _keep_an_admin(s: Session, u: User, *, admin: bool, active: bool) -> None:
    """Refuse a change that would leave no active admin. The active admins' rows are locked
    (PostgreSQL; SQLite's writers are serialised anyway) so that two admins demoting each other
    at once cannot both succeed."""
    if not (u.admin and u.active) or (admin and active):
        return
    admins = s.scalars(select(User.id).where(User.admin.is_(True), User.active.is_(True)).with_for_update()).all()
    if not any(i != u.id for i in admins):
        what = "deactivated" if not active else "demoted"
        raise conflict(f"user {u.username!r} is the last active admin and cannot be {what}; "
                       "make another user an admin first")


@dataclass(frozen=True)
class NewUser:
    username: str
    password: str | None
    is_hashed: bool = False
    admin: bool = False
    active: bool = True
    display_name: str | None = None


def create_user(s: Session, master: Master, new: NewUser) -> User:
    pw_hash = password_hash(new.password, new.is_hashed, "password")
    if s.scalar(select(User).where(User.username == new.username)) is not None:
        raise conflict(f"user {new.username!r} already exists")
    now = master.clock()
    u = User(username=new.username, password_hash=pw_hash, admin=new.admin, active=new.active,
             display_name=new.display_name, created_at=now, modified_at=now)
    s.add(u)
    s.flush()
    log.info("event=user_created username=%s admin=%s", u.username, u.admin)
    return u


def get_user(s: Session, user_id: int) -> User:
    u = s.get(User, user_id)
    if u is None:
        raise not_found(f"user {user_id}")
    return u


def get_user_by_name(s: Session, username: str) -> User:
    u = s.scalar(select(User).where(User.username == username))
    if u is None:
        raise not_found(f"user {username!r}")
    return u


@dataclass(frozen=True)
class UserFilter:
    name: str | None = None  # a part of the username
    active: bool | None = None
    admin: bool | None = None


def list_users(s: Session, flt: UserFilter, offset: int, limit: int) -> tuple[list[User], int]:
    """A page of users in id order (limit 0 = all) and how many match."""
    q = select(User)
    if flt.name:
        q = q.where(User.username.contains(flt.name))
    if flt.active is not None:
        q = q.where(User.active == flt.active)
    if flt.admin is not None:
        q = q.where(User.admin == flt.admin)
    total = s.scalar(select(func.count()).select_from(q.subquery())) or 0
    q = q.order_by(User.id).offset(offset)
    if limit:
        q = q.limit(limit)
    return list(s.scalars(q)), total


def _looks_client_hashed(password: str) -> bool:
    # Determined's own client always sends the client-side hash (128 hex digits).
    return len(password) == 128 and all(c in "0123456789abcdef" for c in password)


def set_password(s: Session, master: Master, by: Principal, user_id: int, password: str, *, is_hashed: bool) -> User:
    """A user changes their own password, an admin (or ClusterAdmin) anyone's; the user's other
    sessions end. A 128-hex password is taken as a client-side hash even without `is_hashed`."""
    if by.user_id != user_id and not authz.is_cluster_admin(s, by):
        raise forbidden("only an admin can change another user's password")
    u = get_user(s, user_id)
    _change_password(s, master, by, u, password, is_hashed=is_hashed or _looks_client_hashed(password))
    u.modified_at = master.clock()
    return u


@dataclass(frozen=True)
class UserChange:
    """None leaves a field as it is."""

    username: str | None = None
    display_name: str | None = None
    admin: bool | None = None
    active: bool | None = None
    password: str | None = None
    is_hashed: bool = False


def change_user(s: Session, master: Master, by: Principal, user_id: int, change: UserChange) -> User:
    u = get_user(s, user_id)
    own = by.user_id == user_id
    if (not own or change.admin is not None or change.active is not None or change.username is not None) \
            and not authz.is_cluster_admin(s, by):
        raise forbidden("only an admin can change that")
    if change.active is False and own:
        raise bad_request("you cannot deactivate yourself", "active")
    if change.username is not None and change.username != u.username:
        if s.scalar(select(User).where(User.username == change.username)) is not None:
            raise conflict(f"user {change.username!r} already exists")
        u.username = change.username
    if change.display_name is not None:
        u.display_name = change.display_name
    _keep_an_admin(s, u, admin=u.admin if change.admin is None else change.admin,
                   active=u.active if change.active is None else change.active)
    if change.admin is not None:
        u.admin = change.admin
    if change.active is not None:
        u.active = change.active
        if not change.active:
            _revoke_sessions(s, master, u)
    if change.password is not None:
        _change_password(s, master, by, u, change.password, is_hashed=change.is_hashed)
    u.modified_at = master.clock()
    log.info("event=user_patched username=%s by=%s", u.username, by.username)
    return u
