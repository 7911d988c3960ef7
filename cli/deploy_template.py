"""`det deploy aws|gcp up|render --master-config-template`: the master.yaml the stack would boot, with the
template merged in (infra/template.py), checked by the master's own models before any cloud call — the
config model of master.yaml (control_plane/config.py), each pool's `provider:` section through the
resolver the autoscaler reads it with, and the checkpoint storage through the model experiments are
checked with. A problem is one line naming the key.

The one place the CLI reads master internals (pyproject.toml's import contracts name this module): a
template is only as good as the master's acceptance of it, and the CLI and the master ship together.
"""

from __future__ import annotations

from typing import Any

from cli.errors import CliError
from control_plane.config import MasterConfig
from control_plane.core.expconf.models.storage import GCSStorage, S3Storage, SharedFSStorage
from infra import render
from infra.settings import Settings
from shipyard_common.settings import SettingsError, validate

FLAG = "--master-config-template"


# The storage models by `type` (which the deploy owns: it is always one of these).
_STORAGE = {"shared_fs": SharedFSStorage, "s3": S3Storage, "gcs": GCSStorage}


def check_master_config(config: dict[str, Any]) -> None:
    """CliError (one line naming the key) unless the master would start with `config` and its pools'
    and storage's sections are usable. `security` is left out: its files exist only on the master."""
    raw = {k: v for k, v in config.items() if k != "security"}
    try:
        master = validate(MasterConfig, raw)
    except SettingsError as e:
        raise CliError(f"{FLAG}: the master would refuse its config: {_names(e, config)}") from None
    for pool in master.resource_pools:
        try:
            pool.settings()
        except SettingsError as e:
            raise CliError(f"{FLAG}: {e.under(f'resource_pools[{pool.name}].provider')}") from None
    storage = master.checkpoint_storage or {}
    try:
        validate(_STORAGE[storage["type"]], storage)
    except SettingsError as e:
        raise CliError(f"{FLAG}: {e.under('checkpoint_storage')}") from None


def _names(e: SettingsError, config: dict[str, Any]) -> str:
    """The problems, with a pool's index replaced by its name (resource_pools[compute])."""
    pools = [str(p.get("name")) for p in config.get("resource_pools") or [] if isinstance(p, dict)]
    text = str(e)
    for i, name in enumerate(pools):
        text = text.replace(f"resource_pools[{i}]", f"resource_pools[{name}]")
    return text


def check_settings(s: Settings) -> None:
    """What `up` and `render` check first: the master.yaml these settings render (with placeholders for
    what the stack creates) is one the master accepts."""
    check_master_config(render.placeholder_config(s))
