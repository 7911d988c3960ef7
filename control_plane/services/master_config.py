"""The master's configuration as an admin may see it (`GET /api/v1/master/config`, `det master
config`): the effective settings, every default filled, with secrets hidden. A value is hidden
when its key names a secret (password, secret, token, credential, private or access key), and a
database URL keeps everything but its password."""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from control_plane.config import MasterConfig
from control_plane.core.expconf.secrets import REDACTED

_SECRET_KEY = re.compile(r"password|passwd|secret|token(?!_ttl)|credential|private_key|access_key|api_key",
                         re.IGNORECASE)
# Paths to a file holding a secret are not the secret: shown.
_PATH_SUFFIXES = ("_file", "_path", "_dir")


def shown_config(config: MasterConfig) -> dict[str, Any]:
    raw = config.model_dump(mode="json")
    out = _hide(raw)
    if isinstance(raw.get("db_url"), str):
        out["db_url"] = _hide_url_password(raw["db_url"])
    return out


def _hide(value: Any, key: str = "") -> Any:
    if isinstance(value, dict):
        return {k: _hide(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_hide(v, key) for v in value]
    if value not in (None, "") and _SECRET_KEY.search(key) and not key.endswith(_PATH_SUFFIXES):
        return REDACTED
    return value


def _hide_url_password(url: str) -> str:
    try:
        parsed = make_url(url)
    except ArgumentError:
        return REDACTED  # not a URL we can read: show none of it
    if parsed.password is None:
        return url
    # SQLAlchemy masks it as "***"; the API's one mask is REDACTED.
    return parsed.render_as_string(hide_password=True).replace(":***@", f":{REDACTED}@", 1)
