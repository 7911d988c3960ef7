"""det user login|logout|whoami|create|list|change-password|deactivate|activate"""

from __future__ import annotations

import argparse
import getpass
import os
from typing import Any

from cli import session
from cli.commands import group
from cli.errors import CliError
from cli.output import print_json, table
from cli.session import authed


def register(sub: argparse._SubParsersAction) -> None:
    g = group(sub, "user", "manage users and log in", aliases=("u",))
    p = g.add_parser("login", help="log in and cache a token for this master")
    p.add_argument("username", nargs="?", default=None)
    p.add_argument("--password", help="(else $DET_PASS, else prompt)")
    p.set_defaults(func=login)
    p = g.add_parser("logout", help="log out (revoke and forget the cached token)")
    p.set_defaults(func=logout)
    p = g.add_parser("whoami", help="show the current user")
    p.set_defaults(func=whoami)
    p = g.add_parser("create", help="create a user (admin)")
    p.add_argument("username")
    p.add_argument("--admin", action="store_true")
    p.add_argument("--password", help="(else prompt); accounts always have a password")
    p.set_defaults(func=create)
    p = g.add_parser("list", help="list users")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=list_users)
    p = g.add_parser("change-password", help="change your (or, as admin, another user's) password")
    p.add_argument("target", nargs="?", default=None)
    p.add_argument("--password", help="(else prompt)")
    p.set_defaults(func=change_password)
    for verb, active in (("deactivate", False), ("activate", True)):
        p = g.add_parser(verb, help=f"{verb} a user (admin)")
        p.add_argument("username")
        p.set_defaults(func=set_active, active=active)


def _password(arg: str | None, prompt: str, confirm: bool = False) -> str:
    if arg is not None:
        return arg
    env = os.environ.get("DET_PASS")
    if env:
        return env
    pw = getpass.getpass(prompt)
    if confirm and getpass.getpass("Confirm password: ") != pw:
        raise CliError("passwords do not match")
    return pw


def login(args: Any) -> int:
    master = session.master_url(args.master)
    username = args.username or args.user or os.environ.get("DET_USER") or input("Username: ")
    pw = _password(args.password, f"Password for {username}: ")
    session.login(master, username, pw)
    print(f"Logged in as {username} at {master}")
    return 0


def logout(args: Any) -> int:
    master = session.master_url(args.master)
    store = session.TokenStore()
    user, token = store.get(master, args.user)
    if token is None or user is None:
        print("Not logged in")
        return 0
    try:
        session.Session(master, token).post("/api/v1/auth/logout")
    except CliError:
        pass  # the token may already be expired; forget it anyway
    store.drop(master, user)
    print(f"Logged out {user}")
    return 0


def whoami(args: Any) -> int:
    u = authed(args).get("/api/v1/me")["user"]
    print(f"You are logged in as user '{u['username']}'{' (admin)' if u['admin'] else ''}")
    return 0


def _find(s: Any, username: str) -> dict[str, Any]:
    for u in s.get("/api/v1/users")["users"]:
        if u["username"] == username:
            return u
    raise CliError(f"no user named {username!r}")


def create(args: Any) -> int:
    s = authed(args)
    pw = _password(args.password, f"Password for new user {args.username}: ", confirm=True)
    u = s.post("/api/v1/users", {"user": {"username": args.username, "admin": args.admin, "active": True},
                                 "password": pw})["user"]
    print(f"Created user {u['username']} (id {u['id']}{', admin' if u['admin'] else ''})")
    return 0


def list_users(args: Any) -> int:
    users = authed(args).get("/api/v1/users")["users"]
    if args.json:
        print_json(users)
    else:
        table(["ID", "Username", "Admin", "Active", "Last login"],
              [[u["id"], u["username"], u["admin"], u["active"], u.get("lastAuthAt") or ""] for u in users])
    return 0


def change_password(args: Any) -> int:
    s = authed(args)
    me = s.get("/api/v1/me")["user"]
    target = _find(s, args.target) if args.target and args.target != me["username"] else me
    pw = _password(args.password, f"New password for {target['username']}: ", confirm=True)
    s.post(f"/api/v1/users/{target['id']}/password", pw)
    print(f"Password changed for {target['username']}")
    return 0


def set_active(args: Any) -> int:
    s = authed(args)
    u = _find(s, args.username)
    s.patch(f"/api/v1/users/{u['id']}", {"active": args.active})
    print(f"{'Activated' if args.active else 'Deactivated'} {args.username}")
    return 0
