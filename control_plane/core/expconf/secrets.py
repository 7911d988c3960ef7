"""Which parts of an experiment (or task) config are secret, and how they are hidden when shown back.

Like Determined, the storage secret key is never shown back, nor are the image registry's
credentials (`environment.registry_auth`: password, auth, identitytoken, registrytoken); the row
keeps them for the agents. The API's `config` (experiments, trials, templates, commands, notebooks,
shells, TensorBoards), its `originalConfig` text, the web UI's YAML and a workspace's
`checkpointStorageConfig` all hide them through here. `environment.environment_variables` are shown
as written (as Determined does): secrets belong in the storage keys or registry_auth, not there."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

__all__ = ["REDACTED", "SECRET_REGISTRY_KEYS", "SECRET_STORAGE_KEYS", "redact_config", "redact_config_text",
           "redact_storage"]

REDACTED = "********"
SECRET_STORAGE_KEYS = ("secret_key",)
SECRET_REGISTRY_KEYS = ("password", "auth", "identitytoken", "registrytoken")

# `secret_key: value` in block or flow YAML (and JSON): the value up to the end of the scalar. The
# text is what the user wrote, not parsed: a key of one of these names anywhere in it is hidden.
_SECRET_VALUE = re.compile(
    r"""(\b(?:""" + "|".join(SECRET_STORAGE_KEYS + SECRET_REGISTRY_KEYS)
    + r""")["']?\s*:[ \t]*)("[^"\n]*"|'[^'\n]*'|[^\s,}\]#{\[][^,}\]\n#]*)""")


def _hidden(section: Any, keys: Sequence[str]) -> dict[str, Any] | None:
    """`section` with its set secret `keys` replaced, or None when it holds none."""
    if not isinstance(section, dict) or not any(section.get(k) for k in keys):
        return None
    return {**section, **{k: REDACTED for k in keys if section.get(k)}}


def redact_storage(storage: Any) -> Any:
    """A checkpoint_storage section (a config's or a workspace's) with its secret key hidden."""
    hidden = _hidden(storage, SECRET_STORAGE_KEYS)
    return storage if hidden is None else hidden


def redact_config(config: dict[str, Any]) -> dict[str, Any]:
    """The stored config with its secrets replaced by REDACTED (the input is not changed)."""
    out = config
    storage = _hidden(config.get("checkpoint_storage"), SECRET_STORAGE_KEYS)
    if storage is not None:
        out = {**out, "checkpoint_storage": storage}
    env = config.get("environment")
    auth = _hidden(env.get("registry_auth"), SECRET_REGISTRY_KEYS) if isinstance(env, dict) else None
    if auth is not None:
        out = {**out, "environment": {**env, "registry_auth": auth}}
    return out


def redact_config_text(text: str) -> str:
    """The config as the user wrote it (YAML or JSON text), its secret values replaced."""

    def hide(m: re.Match[str]) -> str:
        value = m.group(2)
        return f'{m.group(1)}"{REDACTED}"{value[len(value.rstrip()):]}'

    return _SECRET_VALUE.sub(hide, text)
