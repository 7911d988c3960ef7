"""agent_bootstrap/constraints.txt read per Python version: what the cloud boot (cloud_init.py)
pins and what the docker runtime installs for an image's Python (runtime/harness_libs.py). Part
of the agent's package (agent_bootstrap/package.py ships agent_bootstrap/agent/ and the file)."""

from __future__ import annotations

import re
import sys
from importlib import resources
from typing import Optional


def constraints_text() -> str:
    """agent_bootstrap/constraints.txt: exact pins of what the agent and the harness import, for
    every Python from 3.9 to 3.13 (the master's own pins may need a newer one)."""
    return resources.files("agent_bootstrap").joinpath("constraints.txt").read_text("utf-8")


# Each cloud's bucket client: (the module the harness's storage imports, its distribution). A cloud
# agent's boot installs its own cloud's (cloud_init.py); container_harness_libs adds those the agent has.
STORAGE_CLIENTS = {"aws": ("boto3", "boto3"), "gcp": ("google.cloud.storage", "google-cloud-storage")}

_MARKER_RE = re.compile(r'^python_version\s*(<|<=|>=|>|==)\s*"(\d+)\.(\d+)"$')
_COMPARE = {"<": tuple.__lt__, "<=": tuple.__le__, ">=": tuple.__ge__, ">": tuple.__gt__, "==": tuple.__eq__}


def agent_constraints(python: Optional[tuple[int, int]] = None) -> dict[str, str]:
    """The constraints file as {normalized distribution name: version} for Python `python` (default:
    this interpreter's): a pin with a marker (`; python_version < "3.10"`, the only kind the file
    uses) counts where the marker holds."""
    py = python or (sys.version_info[0], sys.version_info[1])
    pins: dict[str, str] = {}
    for line in constraints_text().splitlines():
        line, _, marker = line.split("#", 1)[0].partition(";")
        line, marker = line.strip(), marker.strip()
        if not line:
            continue
        name, sep, ver = line.partition("==")
        if not sep or not ver.strip():
            raise ValueError(f"constraints.txt: {line!r} is not an exact pin (name==version)")
        if marker:
            m = _MARKER_RE.match(marker)
            if m is None:
                raise ValueError(f"constraints.txt: {marker!r} is not a python_version marker")
            if not _COMPARE[m.group(1)](py, (int(m.group(2)), int(m.group(3)))):
                continue
        pins[normalized(name)] = ver.strip()
    return pins


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()
