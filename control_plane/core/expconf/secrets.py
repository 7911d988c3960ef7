"""Which parts of an experiment config are secret, and how they are hidden when shown back.

Like Determined, the storage secret key is never shown back (the row keeps it for the agents):
the API's `config`, its `originalConfig` text and the web UI's YAML all hide it through here."""

from __future__ import annotations

import re
from typing import Any

__all__ = ["REDACTED", "SECRET_STORAGE_KEYS", "redact_config", "redact_config_text"]

REDACTED = "********"
SECRET_STORAGE_KEYS = ("secret_key",)

# `secret_key: value` in block or flow YAML (and JSON): the value up to the end of the scalar.
_SECRET_VALUE = re.compile(
    r"""(\b(?:""" + "|".join(SECRET_STORAGE_KEYS) + r""")["']?\s*:[ \t]*)("[^"\n]*"|'[^'\n]*'|[^\s,}\]#][^,}\]\n#]*)""")


def redact_config(config: dict[str, Any]) -> dict[str, Any]:
    """The stored config with its storage secrets replaced by REDACTED (the input is not changed)."""
    storage = config.get("checkpoint_storage")
    if not isinstance(storage, dict) or not any(storage.get(k) for k in SECRET_STORAGE_KEYS):
        return config
    return {**config, "checkpoint_storage": {**storage, **{k: REDACTED for k in SECRET_STORAGE_KEYS if storage.get(k)}}}


def redact_config_text(text: str) -> str:
    """The config as the user wrote it (YAML or JSON text), its secret values replaced."""

    def hide(m: re.Match[str]) -> str:
        value = m.group(2)
        return f'{m.group(1)}"{REDACTED}"{value[len(value.rstrip()):]}'

    return _SECRET_VALUE.sub(hide, text)
