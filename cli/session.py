"""HTTP to the master, and the per-master, per-user token cache."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from cli.errors import CliError
from shipyard_common import private_files

DEFAULT_MASTER = "http://localhost:8080"
# httpx is imported where a request is made: ~100 ms that `det --help` and a parse error need not pay.


def master_url(arg: str | None) -> str:
    url = arg or os.environ.get("DET_MASTER") or DEFAULT_MASTER
    if "://" not in url:
        url = "http://" + url
    return url.rstrip("/")


def cache_path() -> Path:
    base = os.environ.get("SHIPYARD_CLI_DIR") or os.path.expanduser("~/.shipyard")
    return Path(base) / "auth.json"


class TokenStore:
    """{master_url: {"active": username, "tokens": {username: token}}}, mode 0600."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or cache_path()

    def _load(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def _save(self, data: dict[str, Any]) -> None:
        # 0600 from creation (a leftover temporary file with another mode is never reused).
        private_files.write_private(self.path, json.dumps(data).encode())

    def get(self, master: str, user: str | None = None) -> tuple[str | None, str | None]:
        entry = self._load().get(master) or {}
        user = user or entry.get("active")
        return user, (entry.get("tokens") or {}).get(user) if user else None

    def put(self, master: str, user: str, token: str) -> None:
        data = self._load()
        entry = data.setdefault(master, {"tokens": {}})
        entry.setdefault("tokens", {})[user] = token
        entry["active"] = user
        self._save(data)

    def drop(self, master: str, user: str) -> None:
        data = self._load()
        entry = data.get(master) or {}
        (entry.get("tokens") or {}).pop(user, None)
        if entry.get("active") == user:
            entry.pop("active", None)
        self._save(data)


class Session:
    def __init__(self, master: str, token: str | None = None, timeout: float = 30.0) -> None:
        import httpx

        self.master = master
        self.token = token
        self._client = httpx.Client(base_url=master, timeout=timeout)

    def request(self, method: str, path: str, *, json_body: Any = None, params: Any = None,
                auth: bool = True, stream: bool = False) -> Any:
        import httpx

        headers = {}
        if auth:
            if not self.token:
                raise CliError("not logged in: run `det user login` first")
            headers["Authorization"] = f"Bearer {self.token}"
        try:
            if stream:
                return self._client.stream(method, path, json=json_body, params=params, headers=headers,
                                           timeout=None)
            r = self._client.request(method, path, json=json_body, params=params, headers=headers)
        except httpx.ConnectError:
            raise CliError(f"cannot reach the master at {self.master} (is it running? set -m or DET_MASTER)") from None
        except httpx.TimeoutException:
            raise CliError(f"the master at {self.master} did not answer in time") from None
        except httpx.HTTPError as e:
            raise CliError(f"request to {self.master} failed: {e}") from None
        return self.check(r)

    @staticmethod
    def check(r: Any) -> Any:
        if r.status_code >= 400:
            message = ""
            try:
                body = r.json()
                message = body.get("message") or (body.get("error") or {}).get("error") or ""
            except ValueError:
                message = r.text[:300]
            if r.status_code == 401:
                message = f"{message or 'unauthenticated'} (run `det user login`)"
            raise CliError(f"{r.status_code}: {message}")
        if not r.content:
            return {}
        try:
            return r.json()
        except ValueError:
            return r.text

    def get(self, path: str, **kw: Any) -> Any:
        return self.request("GET", path, **kw)

    def post(self, path: str, body: Any = None, **kw: Any) -> Any:
        return self.request("POST", path, json_body=body if body is not None else {}, **kw)

    def patch(self, path: str, body: Any, **kw: Any) -> Any:
        return self.request("PATCH", path, json_body=body, **kw)

    def delete(self, path: str, body: Any = None, **kw: Any) -> Any:
        return self.request("DELETE", path, json_body=body, **kw)


def authed(args: Any) -> Session:
    master = master_url(args.master)
    user, token = TokenStore().get(master, getattr(args, "user", None))
    if token is None:
        # Non-interactive use (CI, scripts): DET_USER / DET_PASS log in on the fly.
        env_user, env_pass = os.environ.get("DET_USER"), os.environ.get("DET_PASS")
        if env_user and env_pass:
            token = login(master, env_user, env_pass)
        elif user is None:
            raise CliError("not logged in: run `det user login`")
        else:
            raise CliError(f"no cached token for {user} at {master}: run `det user login {user}`")
    return Session(master, token)


def login(master: str, username: str, password: str) -> str:
    s = Session(master)
    body = s.request("POST", "/api/v1/auth/login", json_body={"username": username, "password": password},
                     auth=False)
    TokenStore().put(master, username, body["token"])
    return body["token"]
