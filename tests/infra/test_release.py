"""The release `det deploy` ships (cli/deploy_release.py) and the master's boot that installs it
(infra/templates/shipyard-master-boot.sh, run unmodified with SHIPYARD_ROOT as a sandbox): a real
wheel of this Shipyard, exact pins, the upload to moto's S3 and to gcp-storage-emulator with the
cluster's tag, the boot installing from the bucket, and a boot that fails loudly when the wheel is
missing. The dependencies the boot's pip would download are this virtualenv's (tests/infra/conftest.py
dependencies_dir), with PIP_NO_INDEX=1, so nothing else can be installed."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Any

import boto3
import pytest

import control_plane
from cli import deploy_release
from cli.errors import CliError
from infra import DEPLOY_TAG, release, render
from tests.infra.conftest import dependencies_dir
from tests.provisioners.conftest import aws_session, moto_reset, moto_server  # noqa: F401

CID = "ml-prod"
REGION = "us-east-1"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> deploy_release.Release:
    return deploy_release.build_release(tmp_path_factory.mktemp("release"))


@pytest.fixture(scope="module")
def deps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return dependencies_dir(tmp_path_factory.mktemp("deps"))


def test_the_wheel_is_this_cli_and_the_constraints_exact_pins(built: deploy_release.Release) -> None:
    assert built.version == control_plane.__version__ == metadata.version("shipyard")
    assert built.wheel.name == f"shipyard-{built.version}-py3-none-any.whl"
    names = set(zipfile.ZipFile(built.wheel).namelist())
    for needed in ("control_plane/__main__.py", "agent_bootstrap/agent/__main__.py", "harness/__init__.py",
                   "infra/templates/shipyard-master-boot.sh", "control_plane/db/migrations/env.py",
                   f"shipyard-{built.version}.dist-info/entry_points.txt"):
        assert needed in names, needed
    entry_points = zipfile.ZipFile(built.wheel).read(f"shipyard-{built.version}.dist-info/entry_points.txt")
    assert b"det-master = control_plane.__main__:main" in entry_points
    lines = [ln for ln in built.constraints.read_text().splitlines() if ln and not ln.startswith("#")]
    pins = dict(ln.split("==") for ln in lines)
    assert all("==" in ln and ln.count("==") == 1 for ln in lines)
    for name, version in pins.items():
        assert metadata.version(name) == version, name
    # The direct dependencies, the transitive ones, nothing of the dev tools, not shipyard itself.
    assert {"fastapi", "boto3", "botocore", "starlette", "google-cloud-storage", "sqlalchemy"} <= set(pins)
    assert not {"shipyard", "pytest", "moto", "pulumi", "ruff"} & set(pins)
    # What an extra a requirement asks for brings: google-cloud-compute -> google-api-core[grpc].
    assert {"grpcio", "grpcio-status"} <= set(pins)


def test_without_a_source_tree_the_installed_files_are_packed_back(built: deploy_release.Release,
                                                                    tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--target",
                    str(target), str(built.wheel)], check=True, timeout=120)
    [info] = target.glob("shipyard-*.dist-info")
    repacked = deploy_release.repack_installed(metadata.Distribution.at(info), tmp_path)
    original = {n for n in zipfile.ZipFile(built.wheel).namelist() if not n.endswith("RECORD")}
    again = {n for n in zipfile.ZipFile(repacked).namelist() if not n.endswith("RECORD")}
    assert repacked.name == built.wheel.name and original <= again | {f"shipyard-{built.version}.dist-info/WHEEL"}
    assert again - original <= {f"shipyard-{built.version}.dist-info/{n}" for n in ("INSTALLER", "REQUESTED")}


# ---- the bucket ------------------------------------------------------------------------------------


@pytest.fixture
def s3(moto_reset: str, monkeypatch: pytest.MonkeyPatch) -> Any:  # noqa: F811
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto_reset)
    client = boto3.client("s3", region_name=REGION)
    client.create_bucket(Bucket="ckpt")
    return client


def test_ship_to_s3_tags_every_object_and_moves_current_last(s3: Any, built: deploy_release.Release) -> None:
    assert deploy_release.current("aws", "ckpt", region=REGION) is None
    deploy_release.ship("aws", "ckpt", built, cluster_id=CID, region=REGION)
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket="ckpt")["Contents"]}
    assert keys == {built.wheel_key, built.constraints_key, release.CURRENT_KEY}
    assert built.wheel_key == f"shipyard/releases/{built.version}/{built.wheel.name}"
    for key in keys:
        tags = {t["Key"]: t["Value"] for t in s3.get_object_tagging(Bucket="ckpt", Key=key)["TagSet"]}
        assert tags == {DEPLOY_TAG: CID}
    assert s3.get_object(Bucket="ckpt", Key=built.wheel_key)["Body"].read() == built.wheel.read_bytes()
    assert deploy_release.current("aws", "ckpt", region=REGION) == built.version


def test_ship_to_gcs_labels_every_object_in_its_metadata(gcs: str,  # noqa: F811
                                                         built: deploy_release.Release) -> None:
    deploy_release.gcs_bucket("ckpt", "p").client.create_bucket("ckpt")
    assert deploy_release.current("gcp", "ckpt", project="p") is None
    deploy_release.ship("gcp", "ckpt", built, cluster_id=CID, project="p")
    bucket = deploy_release.gcs_bucket("ckpt", "p")
    blobs = {b.name: b for b in bucket.client.list_blobs("ckpt")}
    assert set(blobs) == {built.wheel_key, built.constraints_key, release.CURRENT_KEY}
    assert all(b.metadata == {DEPLOY_TAG: CID} for b in blobs.values())
    assert bucket.blob(built.constraints_key).download_as_bytes() == built.constraints.read_bytes()
    assert deploy_release.current("gcp", "ckpt", project="p") == built.version


# ---- the boot installs from the bucket ---------------------------------------------------------------


def _boot(tmp_path: Path, provider: str, deps: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """The rendered boot and fetch programs, written into a sandbox and run as cloud-init would."""
    sandbox = tmp_path / "root"
    bin_dir = sandbox / "usr/local/bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / "shipyard-master-boot").write_text(render.boot_script("", provider))  # type: ignore[arg-type]
    (bin_dir / "shipyard-master-fetch").write_text(render.fetch_program(provider, "ckpt", REGION))  # type: ignore[arg-type]
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    full_env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(tmp_path),
                "SHIPYARD_ROOT": str(sandbox), "SHIPYARD_PYTHON": sys.executable, "SHIPYARD_RELEASE_WAIT_S": "0",
                "PYTHONPATH": str(deps), "PIP_NO_INDEX": "1", **env}
    return subprocess.run([str(bin_dir / "shipyard-master-boot"), *args], env=full_env, capture_output=True,
                          text=True, timeout=300, check=False)


def _aws_env() -> dict[str, str]:
    return {k: os.environ[k] for k in ("AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                       "AWS_DEFAULT_REGION", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE",
                                       "AWS_EC2_METADATA_DISABLED")}


def test_aws_boot_installs_the_shipped_wheel_and_nothing_when_it_is_missing(
    s3: Any, built: deploy_release.Release, deps: Path, tmp_path: Path,
) -> None:
    # No release in the bucket: a loud failure, nothing installed.
    r = _boot(tmp_path, "aws", deps, _aws_env(), "--install-only")
    assert r.returncode == 1, r.stderr
    assert "event=boot_failed" in r.stderr and "shipyard/releases/current is missing" in r.stderr
    venv = tmp_path / "root/opt/shipyard-master"
    assert not (venv / "bin/det-master").exists()

    # The pointer without its wheel: the same.
    deploy_release.ship("aws", "ckpt", built, cluster_id=CID, region=REGION)
    s3.delete_object(Bucket="ckpt", Key=built.wheel_key)
    r = _boot(tmp_path, "aws", deps, _aws_env(), "--install-only")
    assert r.returncode == 1 and f"{built.wheel_key} is missing" in r.stderr, r.stderr
    assert not (venv / "bin/det-master").exists()

    # The release: installed into the virtualenv, the version recorded; a second start keeps it.
    deploy_release.ship("aws", "ckpt", built, cluster_id=CID, region=REGION)
    r = _boot(tmp_path, "aws", deps, _aws_env(), "--install-only")
    assert r.returncode == 0, r.stderr
    assert f"event=release_installed version={built.version}" in r.stderr
    assert (venv / ".shipyard-release").read_text().strip() == built.version
    where = subprocess.run([str(venv / "bin/python"), "-c", "import control_plane; print(control_plane.__file__)"],
                           capture_output=True, text=True, env={"PYTHONPATH": str(deps)}, check=True, cwd=tmp_path)
    assert where.stdout.startswith(str(venv))  # the wheel's code, not this checkout's
    r = _boot(tmp_path, "aws", deps, _aws_env(), "--install-only")
    assert r.returncode == 0 and "event=release_current" in r.stderr, r.stderr


def test_gcp_boot_reads_the_bucket_with_the_metadata_token(
    gcs: str, built: deploy_release.Release, deps: Path, tmp_path: Path,
) -> None:
    from tests.e2e.test_deploy_boot import FakeGcpIdentity

    identity = FakeGcpIdentity("p")
    env = {"GCE_METADATA_HOST": identity.host, "STORAGE_EMULATOR_HOST": gcs}
    deploy_release.gcs_bucket("ckpt", "p").client.create_bucket("ckpt")
    try:
        r = _boot(tmp_path, "gcp", deps, env, "--install-only")
        assert r.returncode == 1 and "shipyard/releases/current is missing" in r.stderr, r.stderr
        deploy_release.ship("gcp", "ckpt", built, cluster_id=CID, project="p")
        r = _boot(tmp_path, "gcp", deps, env, "--install-only")
        assert r.returncode == 0, r.stderr
        assert (tmp_path / "root/opt/shipyard-master/bin/det-master").exists()
        assert "boto3" not in r.stderr  # GCP reads its bucket with the standard library
    finally:
        identity.stop()


def test_the_pins_follow_the_shipped_wheel_and_a_requirement_not_installed_here_is_refused() -> None:
    # The wheel's own Requires-Dist, not the installed metadata (which lags a pyproject.toml edited
    # since the install): httpx's closure, nothing of the rest of shipyard's.
    pins = dict(p.split("==") for p in deploy_release.constraints(requires=["httpx"]))
    assert {"httpx", "httpcore", "h11", "anyio", "idna", "certifi"} <= set(pins) and "fastapi" not in pins
    with pytest.raises(CliError, match="no-such-distribution-here==1.0, not installed here"):
        deploy_release.constraints(requires=["httpx", "no-such-distribution-here==1.0"])
