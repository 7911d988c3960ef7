"""Where a cluster's Shipyard release lives in its bucket: what `det deploy aws|gcp up|upgrade` ships
(cli/deploy_release.py) and what the master's boot installs (templates/shipyard-master-boot.sh).

    shipyard/releases/<version>/<wheel file>       the wheel of the Shipyard that ran `det deploy`
    shipyard/releases/<version>/constraints.txt    exact pins of the master's dependency closure
    shipyard/releases/current                      two lines: the version, the wheel's file name

The master reads `current` at its first boot and at every start of its unit (ExecStartPre), so
`upgrade` is: ship a release, move `current`, restart the master.
"""

from __future__ import annotations

import re

PREFIX = "shipyard/releases"
CURRENT_KEY = f"{PREFIX}/current"
CONSTRAINTS_NAME = "constraints.txt"
# What `current` may name (checked by the boot before it builds a key from it).
VERSION_RE = re.compile(r"^[0-9][0-9A-Za-z.+!_-]{0,63}$")
WHEEL_RE = re.compile(r"^shipyard-[0-9][0-9A-Za-z.+!_]{0,63}-py3-none-any\.whl$")


def release_prefix(version: str) -> str:
    return f"{PREFIX}/{version}"


def wheel_key(version: str, wheel_name: str) -> str:
    return f"{release_prefix(version)}/{wheel_name}"


def constraints_key(version: str) -> str:
    return f"{release_prefix(version)}/{CONSTRAINTS_NAME}"


def current_text(version: str, wheel_name: str) -> str:
    if not VERSION_RE.match(version) or not WHEEL_RE.match(wheel_name):
        raise ValueError(f"not a release: {version!r} {wheel_name!r}")
    return f"{version}\n{wheel_name}\n"
