"""The Shipyard release `det deploy aws|gcp up|upgrade` ships to the cluster's bucket (layout in
infra/release.py): the wheel of the Shipyard this CLI runs, and exact pins of the master's
dependency closure, so that the master installs the same code and the same libraries as here.

- `build_release`: the wheel, built from the source tree of the installed `shipyard` (a checkout or an
  editable install) with setuptools' PEP 517 hook, offline, in a scratch copy of the packages (the tree
  is never written to); when there is no source tree (installed from a wheel), the installed files
  are packed back into a wheel from the distribution's RECORD. Either way its version is the CLI's.
- `constraints`: `name==version` for every distribution `shipyard` requires, transitively, as
  installed here (markers evaluated for this interpreter, no extras).
- `ship`: uploads the wheel and the constraints, then moves `current` to them (S3 objects carry the
  cluster's tag; GCS objects, which take no labels, carry it as metadata).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlencode

from cli.errors import CliError
from infra import DEPLOY_TAG, release

DIST = "shipyard"
BUILD_TIMEOUT_S = 300


@dataclass(frozen=True)
class Release:
    version: str
    wheel: Path
    constraints: Path

    @property
    def wheel_key(self) -> str:
        return release.wheel_key(self.version, self.wheel.name)

    @property
    def constraints_key(self) -> str:
        return release.constraints_key(self.version)


def _canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def cli_version() -> str:
    try:
        return metadata.version(DIST)
    except metadata.PackageNotFoundError:
        raise CliError("the `shipyard` distribution is not installed here, so there is no wheel to ship; "
                       "install Shipyard (pip install -e <checkout>) or pass --shipyard-package") from None


def constraints(root: str = DIST, requires: list[str] | None = None) -> list[str]:
    """Exact pins of `root`'s dependency closure as installed here (`root` itself left out), from
    `requires` (the Requires-Dist of the wheel being shipped) or else the installed `root`'s; the
    dependencies of the extras a requirement asks for included (google-cloud-compute needs
    `google-api-core[grpc]`, hence grpcio-status: without its pin the master's pip took whatever the
    index had, and a boot from an index holding exactly the pins failed)."""
    try:
        from packaging.markers import default_environment
        from packaging.requirements import InvalidRequirement, Requirement
    except ImportError:  # not a dependency of shipyard; pip carries a copy
        from pip._vendor.packaging.markers import default_environment  # type: ignore[no-redef]
        from pip._vendor.packaging.requirements import InvalidRequirement, Requirement  # type: ignore[no-redef]

    base = default_environment()
    pins: dict[str, str] = {}
    todo: list[tuple[str, frozenset[str]]] = [(root, frozenset())]
    seen: set[tuple[str, frozenset[str]]] = {(_canon(root), frozenset())}
    missing: list[str] = []
    while todo:
        dist_name, extras = todo.pop()
        if requires is not None and _canon(dist_name) == _canon(root):
            texts = requires
        else:
            try:
                texts = metadata.distribution(dist_name).requires or []
            except metadata.PackageNotFoundError:
                continue
        for text in texts:
            try:
                req = Requirement(text)
            except InvalidRequirement:
                continue
            if req.marker is not None and not any(req.marker.evaluate({**base, "extra": e})
                                                  for e in ("", *sorted(extras))):
                continue
            name = _canon(req.name)
            wanted = frozenset(_canon(e) for e in req.extras)
            if (name, wanted) in seen:
                continue
            seen.add((name, wanted))
            try:
                pins[name] = metadata.version(req.name)
            except metadata.PackageNotFoundError:
                if dist_name == root:
                    missing.append(str(req))
                continue  # a transitive one not installed here: left to pip on the master
            todo.append((req.name, wanted))
    if missing:
        # The wheel needs what this environment lacks (pyproject.toml changed since the install):
        # its pins would be missing, and the master would install something else than here.
        raise CliError(f"shipyard requires {', '.join(sorted(missing))}, not installed here: reinstall it "
                       "(pip install -e <checkout>) so that the release pins what the master installs")
    pins.pop(_canon(root), None)
    return [f"{name}=={version}" for name, version in sorted(pins.items())]


def wheel_requires(wheel: Path) -> list[str]:
    """The Requires-Dist lines of a wheel's METADATA."""
    from email.parser import Parser

    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        return Parser().parsestr(z.read(name).decode("utf-8")).get_all("Requires-Dist") or []


def source_tree() -> Path | None:
    """The checkout the installed `shipyard` comes from (editable install or run from the tree)."""
    import infra

    root = Path(infra.__file__).resolve().parents[1]
    pyproject = root / "pyproject.toml"
    if not pyproject.is_file():
        return None
    try:
        project = tomllib.loads(pyproject.read_text())["project"]
    except (OSError, ValueError, KeyError):
        return None
    return root if project.get("name") == DIST else None


def _scratch_copy(root: Path, dest: Path) -> None:
    """What setuptools needs to build the wheel: pyproject.toml, the readme, the packages it finds."""
    conf = tomllib.loads((root / "pyproject.toml").read_text())
    for name in ("pyproject.toml", "setup.py", "setup.cfg", "MANIFEST.in", "LICENSE", conf["project"].get("readme")):
        if isinstance(name, str) and (root / name).is_file():
            shutil.copy2(root / name, dest / name)
    find = conf.get("tool", {}).get("setuptools", {}).get("packages", {}).get("find", {})
    tops = sorted({pattern.split(".")[0].rstrip("*") for pattern in find.get("include", [])})
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "node_modules")
    for top in tops:
        if (root / top).is_dir():
            shutil.copytree(root / top, dest / top, ignore=ignore, symlinks=False)


def _build_from_tree(root: Path, out: Path) -> Path:
    with tempfile.TemporaryDirectory(prefix="shipyard-wheel-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        _scratch_copy(root, src)
        code = ("import sys, setuptools.build_meta as b; "
                "print(b.build_wheel(sys.argv[1]))")
        proc = subprocess.run([sys.executable, "-c", code, str(out)], cwd=src, capture_output=True, text=True,
                              timeout=BUILD_TIMEOUT_S, check=False)
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["?"])[-1]
            raise CliError(f"cannot build the Shipyard wheel from {root}: {last}")
        return out / proc.stdout.strip().splitlines()[-1]


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def repack_installed(dist: metadata.Distribution, out: Path) -> Path:
    """A wheel of an installed (non-editable) distribution, from the files its RECORD lists."""
    files = [f for f in dist.files or [] if not str(f).endswith((".pyc", "RECORD", "INSTALLER", "REQUESTED",
                                                                 "direct_url.json"))
             and "__pycache__" not in f.parts and not str(f).startswith("..")]
    if not any(str(f).endswith(".py") for f in files):
        raise CliError("the installed shipyard lists no module files (an editable install without its "
                       "source tree?); pass --shipyard-package")
    version = dist.version
    info = f"{DIST}-{version}.dist-info"
    wheel = out / f"{DIST}-{version}-py3-none-any.whl"
    rows: list[tuple[str, str, str]] = []
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for f in files:
            data = f.read_binary()
            name = str(f).replace("\\", "/")
            if name == f"{info}/WHEEL":
                data = b"Wheel-Version: 1.0\nGenerator: shipyard-repack\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
            zf.writestr(name, data)
            rows.append((name, _record_hash(data), str(len(data))))
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerows([*rows, (f"{info}/RECORD", "", "")])
        zf.writestr(f"{info}/RECORD", buf.getvalue())
    return wheel


def build_release(out: Path) -> Release:
    """The wheel and constraints of the Shipyard this CLI runs, written into `out`."""
    version = cli_version()
    out.mkdir(parents=True, exist_ok=True)
    root = source_tree()
    if root is not None:
        tree_version = tomllib.loads((root / "pyproject.toml").read_text())["project"].get("version")
        if tree_version != version:
            raise CliError(f"the source tree {root} is version {tree_version} but the installed shipyard is "
                           f"{version}: reinstall it (pip install -e {root}) so that the master runs this CLI's code")
        wheel = _build_from_tree(root, out)
    else:
        wheel = repack_installed(metadata.distribution(DIST), out)
    wheel_version = wheel.name.split("-")[1]
    if wheel_version != version:
        raise CliError(f"built {wheel.name}, not version {version}")
    release.current_text(version, wheel.name)  # a name the boot accepts
    pins = out / release.CONSTRAINTS_NAME
    pins.write_text(f"# The dependency closure of shipyard {version}, as installed where `det deploy` ran.\n"
                    + "\n".join(constraints(requires=wheel_requires(wheel))) + "\n")
    return Release(version=version, wheel=wheel, constraints=pins)


# ---- the bucket ---------------------------------------------------------------------------------


def ship(cloud: Literal["aws", "gcp"], bucket: str, rel: Release, *, cluster_id: str, region: str | None = None,
         project: str | None = None) -> None:
    """Upload the release, then point `current` at it (so a master never reads a half-shipped one)."""
    objects = [(rel.wheel_key, rel.wheel.read_bytes(), "application/octet-stream"),
               (rel.constraints_key, rel.constraints.read_bytes(), "text/plain"),
               (release.CURRENT_KEY, release.current_text(rel.version, rel.wheel.name).encode(), "text/plain")]
    if cloud == "aws":
        import boto3

        s3 = boto3.client("s3", region_name=region)
        tagging = urlencode({DEPLOY_TAG: cluster_id})
        for key, data, content_type in objects:
            s3.put_object(Bucket=bucket, Key=key, Body=data, ContentType=content_type, Tagging=tagging)
    else:
        gcs = gcs_bucket(bucket, project)
        for key, data, content_type in objects:
            blob = gcs.blob(key)
            blob.metadata = {DEPLOY_TAG: cluster_id}
            blob.upload_from_string(data, content_type=content_type)


def current(cloud: Literal["aws", "gcp"], bucket: str, *, region: str | None = None,
            project: str | None = None) -> str | None:
    """The version `current` names, or None when there is none."""
    if cloud == "aws":
        import boto3

        s3 = boto3.client("s3", region_name=region)
        try:
            body = s3.get_object(Bucket=bucket, Key=release.CURRENT_KEY)["Body"].read()
        except s3.exceptions.NoSuchKey:
            return None
    else:
        blob = gcs_bucket(bucket, project).blob(release.CURRENT_KEY)
        if not blob.exists():
            return None
        body = blob.download_as_bytes()
    return body.decode().splitlines()[0].strip() or None


def gcs_bucket(bucket: str, project: str | None) -> Any:
    from google.cloud import storage

    if os.environ.get("STORAGE_EMULATOR_HOST"):
        from google.auth.credentials import AnonymousCredentials

        client = storage.Client(project=project or "emulated", credentials=AnonymousCredentials())
    else:
        client = storage.Client(project=project)
    return client.bucket(bucket)
