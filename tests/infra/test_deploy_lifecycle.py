"""`det deploy aws|gcp` lifecycle: `down` asks first and changes nothing unconfirmed, `--delete-data`
removes what `down` keeps, `upgrade` ships the release and restarts the master (moto; the GCE fake and
gcp-storage-emulator), and `up`'s wait for the master's answer."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import boto3
import pytest

from cli import deploy_cloud, deploy_release
from cli.errors import CliError
from infra import DEPLOY_TAG, db_final_snapshot_id, release
from infra.settings import AwsSettings, GcpSettings
from tests.cli.conftest import (  # noqa: F401 (fixtures)
    Det,
    cli_env,  # noqa: F401
    det,
)
from tests.fakes.gce import gce_fake  # noqa: F401
from tests.infra.test_deploy_cli import _write_stack, moto_env, no_pulumi  # noqa: F401
from tests.pg import free_port
from tests.provisioners.conftest import aws_session, moto_reset, moto_server  # noqa: F401

REGION = "us-east-1"
CID = "ml-prod"


# ---- down asks -------------------------------------------------------------------------------------


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_down_without_the_cluster_id_typed_back_changes_nothing(det: Det, no_pulumi: None,  # noqa: F811
                                                                monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str], cloud: str) -> None:
    state = tmp_path / "state"
    for answer in ("", "y\n", "ml-pro\n"):
        monkeypatch.setattr("sys.stdin", io.StringIO(answer))
        r = det("deploy", cloud, "down", "--cluster-id", CID, "--state-dir", str(state))
        assert r.code == 1 and "Type the cluster id (ml-prod)" in r.err
        assert r.err.endswith("det: error: not confirmed: nothing was changed (type ml-prod when asked, or pass --yes)\n")
    assert not state.exists()
    # Typed back (or --yes): it goes on, here as far as the missing pulumi CLI.
    monkeypatch.setattr("sys.stdin", io.StringIO("ml-prod\n"))
    r = det("deploy", cloud, "down", "--cluster-id", CID, "--state-dir", str(state), "--delete-data")
    assert "DELETED too" in r.err and r.err.endswith(f"det: error: {deploy_cloud.PULUMI_MISSING}\n")
    r = det("deploy", cloud, "down", "--cluster-id", CID, "--state-dir", str(state), "--yes")
    assert r.err == f"det: error: {deploy_cloud.PULUMI_MISSING}\n"


def test_down_on_a_closed_stdin_is_not_confirmed(det: Det, no_pulumi: None) -> None:  # noqa: F811
    # pytest's own stdin raises on read, as a detached process's would give EOF.
    r = det("deploy", "aws", "down", "--cluster-id", CID)
    assert r.code == 1 and "not confirmed" in r.err


# ---- --delete-data ------------------------------------------------------------------------------------


def test_delete_data_removes_the_kept_bucket_and_snapshot_on_aws(moto_env: str) -> None:  # noqa: F811
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket="shipyard-ml-prod-x1")
    s3.put_object(Bucket="shipyard-ml-prod-x1", Key="checkpoints/a/b", Body=b"1")
    s3.put_object(Bucket="shipyard-ml-prod-x1", Key=release.CURRENT_KEY, Body=b"0.1.0\n")
    s3.create_bucket(Bucket="other")
    rds = boto3.client("rds", region_name=REGION)
    rds.create_db_instance(DBInstanceIdentifier="db1", DBInstanceClass="db.t4g.medium", Engine="postgres",
                           MasterUsername="shipyard", MasterUserPassword="secret-123", AllocatedStorage=20)
    rds.create_db_snapshot(DBInstanceIdentifier="db1", DBSnapshotIdentifier=db_final_snapshot_id(CID))
    outputs = {"cluster_id": CID, "checkpoint_bucket": "shipyard-ml-prod-x1", "region": REGION}
    deploy_cloud.delete_kept_data("aws", outputs)
    assert [b["Name"] for b in s3.list_buckets()["Buckets"]] == ["other"]
    assert [sn["DBSnapshotIdentifier"] for sn in rds.describe_db_snapshots(SnapshotType="manual")["DBSnapshots"]] == []
    deploy_cloud.delete_kept_data("aws", outputs)  # a second run finds nothing and says nothing


def test_delete_data_removes_the_kept_bucket_on_gcp(gcs: str) -> None:
    bucket = deploy_release.gcs_bucket("p-ml-prod-ckpt", "p")
    bucket.client.create_bucket("p-ml-prod-ckpt")
    bucket.blob("checkpoints/a").upload_from_string(b"1")
    deploy_cloud.delete_kept_data("gcp", {"cluster_id": CID, "checkpoint_bucket": "p-ml-prod-ckpt", "project": "p"})
    assert [b.name for b in bucket.client.list_buckets()] == []


# ---- upgrade ---------------------------------------------------------------------------------------


def test_aws_upgrade_ships_the_release_and_restarts_the_master(det: Det, moto_env: str, no_pulumi: None,  # noqa: F811
                                                               tmp_path: Path) -> None:
    ec2 = boto3.client("ec2", region_name=REGION)
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket="shipyard-ml-prod-x1")
    image = ec2.describe_images()["Images"][0]["ImageId"]
    master = ec2.run_instances(ImageId=image, InstanceType="m6i.large", MinCount=1, MaxCount=1)["Instances"][0]
    s = AwsSettings(cluster_id=CID, keypair="ops", inbound_cidr="203.0.113.0/24")
    _write_stack(tmp_path, CID, {"cloud": "aws", "cluster_id": CID, "region": REGION, "settings": s.to_json(),
                                 "master_url": "http://198.51.100.7:8080", "master_instance_id": master["InstanceId"],
                                 "checkpoint_bucket": "shipyard-ml-prod-x1"})
    r = det("deploy", "aws", "upgrade", "--cluster-id", CID, "--state-dir", str(tmp_path), "--wait-timeout", "0")
    assert r.code == 0, r.err
    version = deploy_release.cli_version()
    lines = r.out.splitlines()
    i = master["InstanceId"]
    assert lines.index(f"stopping the master {i}") < lines.index(f"{i}: stopped") < \
        lines.index(f"starting the master {i}") < lines.index(f"{i}: running")
    assert f"the master installs shipyard {version}" in r.out
    assert deploy_release.current("aws", "shipyard-ml-prod-x1", region=REGION) == version
    tags = s3.get_object_tagging(Bucket="shipyard-ml-prod-x1", Key=release.CURRENT_KEY)["TagSet"]
    assert tags == [{"Key": DEPLOY_TAG, "Value": CID}]
    state = ec2.describe_instances(InstanceIds=[i])["Reservations"][0]["Instances"][0]["State"]["Name"]
    assert state == "running"

    # A cluster that installs its own package is not upgraded behind its back.
    own = AwsSettings(cluster_id=CID, keypair="ops", inbound_cidr="203.0.113.0/24", shipyard_package="shipyard==9")
    _write_stack(tmp_path, CID, {"cloud": "aws", "cluster_id": CID, "settings": own.to_json()})
    r = det("deploy", "aws", "upgrade", "--cluster-id", CID, "--state-dir", str(tmp_path))
    assert r.code == 1 and "installs --shipyard-package 'shipyard==9'" in r.err and r.err.count("\n") == 1


def test_gcp_upgrade_ships_the_release_and_restarts_the_master(gcs: str, gce_fake: Any,  # noqa: F811
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import compute_v1

    deploy_release.gcs_bucket("p-ml-prod-ckpt", "p").client.create_bucket("p-ml-prod-ckpt")
    gce_fake.add_instance(project="my-project-1", zone="us-central1-a", name="ml-prod-master",
                          labels={DEPLOY_TAG: CID})
    opts = {"credentials": AnonymousCredentials(), "client_options": {"api_endpoint": gce_fake.endpoint},
            "transport": "rest"}
    client = (compute_v1.InstancesClient(**opts), compute_v1.ZoneOperationsClient(**opts))
    s = GcpSettings(cluster_id=CID, project="my-project-1", inbound_cidr="203.0.113.0/24")
    outputs = {"cloud": "gcp", "cluster_id": CID, "project": "my-project-1", "zone": "us-central1-a",
               "settings": s.to_json(), "master_instance": "ml-prod-master", "checkpoint_bucket": "p-ml-prod-ckpt"}
    version = deploy_cloud.upgrade("gcp", outputs, poll_s=0.05, gce=client)
    assert version == deploy_release.cli_version()
    assert deploy_release.current("gcp", "p-ml-prod-ckpt", project="p") == version
    assert [c.method for c in gce_fake.calls if c.method in ("stop", "start")] == ["stop", "start"]
    out = capsys.readouterr().out
    assert "ml-prod-master: terminated" in out and out.index("terminated") < out.index("ml-prod-master: running")
    assert gce_fake.instance("ml-prod-master")["status"] == "RUNNING"


# ---- up waits for the master ----------------------------------------------------------------------


@pytest.fixture
def slow_master() -> Iterator[tuple[str, list[int]]]:
    """Answers 503 twice, then /api/v1/master as a master does."""
    seen: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(1)
            ok = len(seen) > 2 and self.path == "/api/v1/master"
            body = json.dumps({"shipyardVersion": "0.1.0"} if ok else {"error": "starting"}).encode()
            self.send_response(200 if ok else 503)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def test_wait_for_master_polls_with_a_progress_line_until_it_answers(slow_master: tuple[str, list[int]]) -> None:
    url, seen = slow_master
    said: list[str] = []
    info = deploy_cloud.wait_for_master(url, timeout_s=30, poll_s=0.05, say=said.append)
    assert info["shipyardVersion"] == "0.1.0" and len(seen) == 3
    assert said == [s for s in said if s.startswith(f"waiting for the master at {url} (")] and len(said) == 2
    assert "HTTP 503" in said[0]


def test_wait_for_master_gives_up_with_one_line() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(CliError) as e:
        deploy_cloud.wait_for_master(url, timeout_s=0.2, poll_s=0.05, say=lambda _: None)
    assert str(e.value).startswith(f"the master at {url} did not answer within 0s (ConnectError)")
    assert "\n" not in str(e.value)


def test_negative_wait_timeout_is_one_line(det: Det, no_pulumi: None) -> None:  # noqa: F811
    r = det("deploy", "aws", "up", "--cluster-id", CID, "--keypair", "ops", "--inbound-cidr", "203.0.113.0/24",
            "--wait-timeout", "-1")
    assert r.code == 1 and r.err == "det: error: --wait-timeout: must be 0 or more seconds\n"


def test_local_env_image_needs_the_docker_runtime(det: Det, tmp_path: Path) -> None:  # noqa: F811
    r = det("deploy", "local", "up", "--env-image", "python:3.12-slim", "--state-dir", str(tmp_path / "s"))
    assert r.code == 1 and r.err == "det: error: --env-image: only applies with --runtime docker\n"
    assert not (tmp_path / "s").exists()
    r = det("deploy", "local", "up", "--help")
    assert "--runtime {process,docker}" in r.out
