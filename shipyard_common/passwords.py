"""Passwords Shipyard makes up (the admin's of `det deploy local` and of a cloud cluster, the
database's): URL-safe random text that never starts with `-`, so `det user login admin --password
PW` (and any other command line it is pasted into) does not read it as an option. Shared by the
master and the CLI, hence here."""

from __future__ import annotations

import secrets


def generate(nbytes: int = 15) -> str:
    """`secrets.token_urlsafe(nbytes)` with a first character that is not `-` (about 1 in 64 are)."""
    while True:
        password = secrets.token_urlsafe(nbytes)
        if not password.startswith("-"):
            return password
