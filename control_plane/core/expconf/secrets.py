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

__all__ = ["PLACEHOLDER", "REDACTED", "SECRET_REGISTRY_KEYS", "SECRET_STORAGE_KEYS", "keep_redacted", "keep_redacted_storage",
           "redact_config", "redact_config_text", "redact_storage", "redacted_left"]

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


# Written back as shown (a template or a workspace read, edited and saved): the placeholder stands
# for the value stored in the same record, which it keeps; anywhere else it is refused, never stored.
# Only for the same destination: a secret is never carried to another bucket, endpoint, key id or
# registry (whoever may edit the record could otherwise send it where they read it).
_STORAGE_IDENTITY = ("type", "bucket", "endpoint_url", "access_key", "host_path")
_REGISTRY_IDENTITY = ("serveraddress", "username")


def _kept(new: Any, old: Any, keys: Sequence[str], identity: Sequence[str]) -> Any:
    if not isinstance(new, dict) or not any(new.get(k) == REDACTED for k in keys):
        return new
    old = old if isinstance(old, dict) else {}
    if any(new.get(k) != old.get(k) for k in identity):
        return new  # the placeholder stays, and is refused (redacted_left)
    return {**new, **{k: old[k] for k in keys if new.get(k) == REDACTED and old.get(k)}}


def keep_redacted_storage(new: Any, old: Any) -> Any:
    """A checkpoint_storage section saved over `old`: REDACTED secrets take `old`'s values when it
    names the same storage (type, bucket, endpoint, access key, host path)."""
    return _kept(new, old, SECRET_STORAGE_KEYS, _STORAGE_IDENTITY)


def keep_redacted(new: dict[str, Any], old: dict[str, Any] | None) -> dict[str, Any]:
    """A config saved over `old` (the same record's): its REDACTED secrets take `old`'s values, for
    the same storage or registry only."""
    old = old or {}
    out = new
    storage = keep_redacted_storage(new.get("checkpoint_storage"), old.get("checkpoint_storage"))
    if storage is not new.get("checkpoint_storage"):
        out = {**out, "checkpoint_storage": storage}
    env, old_env = new.get("environment"), old.get("environment")
    if isinstance(env, dict):
        auth = _kept(env.get("registry_auth"), old_env.get("registry_auth") if isinstance(old_env, dict) else None,
                     SECRET_REGISTRY_KEYS, _REGISTRY_IDENTITY)
        if auth is not env.get("registry_auth"):
            out = {**out, "environment": {**env, "registry_auth": auth}}
    return out


PLACEHOLDER = f"is {REDACTED!r}, the placeholder shown for a hidden secret: give the secret itself, or leave it out"


def redacted_left(config: dict[str, Any]) -> str | None:
    """The field of `config` that still holds the REDACTED placeholder as a secret (a config shown
    back and sent again where no stored value stands behind it), or None."""
    storage = config.get("checkpoint_storage")
    for key in SECRET_STORAGE_KEYS:
        if isinstance(storage, dict) and storage.get(key) == REDACTED:
            return f"checkpoint_storage.{key}"
    env = config.get("environment")
    auth = env.get("registry_auth") if isinstance(env, dict) else None
    for key in SECRET_REGISTRY_KEYS:
        if isinstance(auth, dict) and auth.get(key) == REDACTED:
            return f"environment.registry_auth.{key}"
    return None
