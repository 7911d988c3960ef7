"""The UI's session: a user token in an HttpOnly, SameSite=Strict cookie, and the CSRF token every
state-changing request must carry.

The cookie has its own name (not Determined's `auth`, which the API also reads), so the JSON API
never accepts it: only these pages do, and every POST they take is checked here. The CSRF token is
bound to the session (an HMAC of the session token, which no script and no other site can read):
pages put it in their forms (an X-CSRF-Token header is accepted too); a request without it, or with another
session's, is refused with 403. The login form, before any session, uses a double-submit cookie."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import Response

from control_plane.auth import UI_SESSION_COOKIE, Principal, resolve_token
from control_plane.master import Master

SESSION_COOKIE = UI_SESSION_COOKIE
LOGIN_CSRF_COOKIE = "shipyard_login_csrf"
CSRF_FIELD = "csrf"
CSRF_HEADER = "x-csrf-token"


@dataclass(frozen=True)
class UISession:
    principal: Principal
    token: str

    @property
    def csrf(self) -> str:
        return csrf_token(self.token)


class LoginRequired(Exception):
    """No session cookie: the page redirects to the login page."""


class SessionExpired(Exception):
    """A session cookie whose token is expired, revoked, or not a user's: back to the login page
    with a message (401, like the API)."""


class CsrfRefused(Exception):
    """A state-changing request without the session's CSRF token (403)."""


def csrf_token(session_token: str) -> str:
    return hmac.new(session_token.encode(), b"shipyard-ui-csrf", hashlib.sha256).hexdigest()


def current(request: Request, master: Master) -> UISession:
    token = request.cookies.get(SESSION_COOKIE)
    if not token:
        raise LoginRequired()
    with master.read_sessions() as s:
        p = resolve_token(s, token, now=master.clock())
    if p is None or not p.is_user:
        raise SessionExpired()
    return UISession(p, token)


async def check_csrf(request: Request, session: UISession) -> None:
    """The form field or the header must hold this session's CSRF token."""
    sent = request.headers.get(CSRF_HEADER)
    if not sent:
        form = await request.form()
        value = form.get(CSRF_FIELD)
        sent = value if isinstance(value, str) else None
    if not sent or not hmac.compare_digest(sent, session.csrf):
        raise CsrfRefused()


def set_session(response: Response, request: Request, token: str, max_age_s: int) -> None:
    response.set_cookie(SESSION_COOKIE, token, max_age=max_age_s, httponly=True, samesite="strict",
                        secure=request.url.scheme == "https", path="/")


def clear_session(response: Response) -> None:
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict")


def new_login_csrf() -> str:
    return secrets.token_urlsafe(24)


def set_login_csrf(response: Response, request: Request, value: str) -> None:
    response.set_cookie(LOGIN_CSRF_COOKIE, value, httponly=True, samesite="strict",
                        secure=request.url.scheme == "https", path="/login")


def login_csrf_ok(request: Request, sent: str | None) -> bool:
    cookie = request.cookies.get(LOGIN_CSRF_COOKIE)
    return bool(cookie and sent and hmac.compare_digest(cookie, sent))
