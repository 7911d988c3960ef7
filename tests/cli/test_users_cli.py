"""det user / det master against a real master: the token cache per master and user."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.conftest import Det, one_error_line
from tests.conftest import ADMIN_PASSWORD, LiveMaster

pytestmark = pytest.mark.integration


def _cache(cli_env: Path) -> dict:
    return json.loads((cli_env / "auth.json").read_text())


def test_master_info(det: Det, cli_master: LiveMaster) -> None:
    r = det("master", "info", master=cli_master.url)
    assert r.code == 0 and "version" in r.out and cli_master.url in r.out
    r = det("master", "info", "--json", master=cli_master.url)
    info = json.loads(r.out)
    assert info["clusterId"] and info["version"]


def test_login_whoami_logout_and_switching_users(det: Det, cli_master: LiveMaster, cli_env: Path) -> None:
    url = cli_master.url
    assert "not logged in" in one_error_line(det("user", "whoami", master=url))

    r = det("user", "login", "admin", "--password", ADMIN_PASSWORD, master=url)
    assert r.code == 0 and "Logged in as admin" in r.out
    assert (cli_env / "auth.json").stat().st_mode & 0o777 == 0o600
    assert "'admin' (admin)" in det("user", "whoami", master=url).out

    r = det("user", "create", "alice-sw", "--password", "alice-pass-1", master=url)
    assert r.code == 0 and "Created user alice-sw" in r.out
    assert det("user", "login", "alice-sw", "--password", "alice-pass-1", master=url).code == 0
    # The last login is the active user; -u picks another cached one.
    assert "'alice-sw'" in det("user", "whoami", master=url).out
    assert "'admin' (admin)" in det("-u", "admin", "user", "whoami", master=url).out
    cache = _cache(cli_env)[url]
    assert cache["active"] == "alice-sw" and set(cache["tokens"]) == {"admin", "alice-sw"}

    # A user without a cached token: one line saying how to fix it.
    line = one_error_line(det("-u", "nobody", "user", "whoami", master=url))
    assert "no cached token for nobody" in line

    # Tokens are per master: another master URL has none.
    other = cli_master.url.replace("127.0.0.1", "localhost")
    assert "not logged in" in one_error_line(det("user", "whoami", master=other))

    r = det("user", "logout", master=url)
    assert r.code == 0 and "Logged out alice-sw" in r.out
    assert "alice-sw" not in _cache(cli_env)[url]["tokens"]
    assert "'admin' (admin)" in det("-u", "admin", "user", "whoami", master=url).out
    assert det("-u", "admin", "user", "logout", master=url).code == 0
    assert "not logged in" in one_error_line(det("user", "whoami", master=url))


def test_wrong_password_is_one_line(det: Det, cli_master: LiveMaster) -> None:
    line = one_error_line(det("user", "login", "admin", "--password", "wrong-password", master=cli_master.url))
    assert "403" in line and "invalid credentials" in line


def test_user_admin_commands(admin_det: Det, det: Det, cli_master: LiveMaster) -> None:
    url = cli_master.url
    assert admin_det("user", "create", "bob-adm", "--password", "bob-pass-12").code == 0
    line = one_error_line(admin_det("user", "create", "bob-adm", "--password", "bob-pass-12"))
    assert "409" in line or "exists" in line
    assert "at least" in one_error_line(admin_det("user", "create", "shortpw", "--password", "x"))

    users = json.loads(admin_det("user", "list", "--json").out)
    bob = next(u for u in users if u["username"] == "bob-adm")
    assert bob["active"] is True and bob["admin"] is False
    assert "bob-adm" in admin_det("user", "list").out

    # Admin changes bob's password: the old one stops working, the new one works.
    r = admin_det("user", "change-password", "bob-adm", "--password", "bob-pass-new")
    assert r.code == 0 and "Password changed for bob-adm" in r.out
    assert det("user", "login", "bob-adm", "--password", "bob-pass-12", master=url).code == 1
    assert det("user", "login", "bob-adm", "--password", "bob-pass-new", master=url).code == 0
    # A non-admin cannot deactivate anyone: the server's 403 in one line.
    assert "403" in one_error_line(det("-u", "bob-adm", "user", "deactivate", "admin", master=url))

    assert admin_det("-u", "admin", "user", "deactivate", "bob-adm").code == 0
    users = json.loads(admin_det("-u", "admin", "user", "list", "--json").out)
    assert next(u for u in users if u["username"] == "bob-adm")["active"] is False
    # Deactivation revoked bob's session and blocks new logins.
    assert "401" in one_error_line(det("-u", "bob-adm", "user", "whoami", master=url))
    # ... with the answer of any failed login (a deactivated account is no password oracle)
    assert "invalid credentials" in one_error_line(det("user", "login", "bob-adm", "--password", "bob-pass-new",
                                                       master=url))
    assert admin_det("-u", "admin", "user", "activate", "bob-adm").code == 0
    assert det("user", "login", "bob-adm", "--password", "bob-pass-new", master=url).code == 0
    assert "no user named 'ghost'" in one_error_line(admin_det("-u", "admin", "user", "deactivate", "ghost"))
