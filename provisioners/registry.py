"""Which module provides each `provider.type`. Adding a cloud is one module that declares
`PROVIDER_TYPE` (a provisioners.base.ProviderType) and one line here.

Modules are imported on first use: a master without GCP pools never imports the GCP SDK."""

from __future__ import annotations

import importlib

from provisioners.base import ProviderType

_MODULES: dict[str, str] = {
    "aws": "provisioners.aws",
    "gcp": "provisioners.gcp",
    "local": "provisioners.local",
    "static": "provisioners.static",
}


def provider_types() -> tuple[str, ...]:
    """The `provider.type` values a pool may use."""
    return tuple(_MODULES)


def get(name: str) -> ProviderType:
    """The declaration of provider type `name`; KeyError if there is none."""
    module = importlib.import_module(_MODULES[name])
    declared: ProviderType = module.PROVIDER_TYPE
    if declared.name != name:  # a copy-pasted module that kept its model's name
        raise RuntimeError(f"{_MODULES[name]} declares provider type {declared.name!r}, registered as {name!r}")
    return declared
