"""Pulumi programs under `pulumi.runtime.set_mocks`: no CLI, no plugin, no cloud. The mocks record
every resource the program declares (type, name, inputs as the engine would receive them) and
answer the data-source calls with fixed values."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi
import pytest

DB_PASSWORD = "db-Secret-pw-123"
ADMIN_PASSWORD = "admin-Secret-pw-456"


@dataclass
class Declared:
    type: str
    name: str
    inputs: dict[str, Any]

    @property
    def text(self) -> str:
        return json.dumps(self.inputs, sort_keys=True, default=str)


def _arn(kind: str, name: str) -> str:
    return f"arn:aws:{kind}:us-east-1:123456789012:{name}"


class Recorder(pulumi.runtime.Mocks):
    def __init__(self) -> None:
        self.resources: list[Declared] = []
        self.calls: list[str] = []

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        self.resources.append(Declared(args.typ, args.name, dict(args.inputs)))
        out = dict(args.inputs)
        t = args.typ
        if t == "aws:ec2/networkInterface:NetworkInterface":
            out["privateIp"] = "10.0.0.37"
        elif t == "aws:ec2/eip:Eip":
            out["publicIp"] = "198.51.100.7"
        elif t == "aws:s3/bucket:Bucket":
            out["bucket"] = out.get("bucketPrefix", "b-") + "x1y2z3"
            out["arn"] = f"arn:aws:s3:::{out['bucket']}"
        elif t == "aws:rds/instance:Instance":
            out["address"] = f"{args.name}.abc.us-east-1.rds.amazonaws.com"
        elif t in ("aws:iam/role:Role", "aws:iam/instanceProfile:InstanceProfile"):
            out["arn"] = _arn("iam", f"role/{out.get('name', args.name)}")
        elif t == "aws:secretsmanager/secret:Secret":
            out["arn"] = _arn("secretsmanager", f"secret:{out['name']}-AbCdEf")
        elif t == "aws:cloudwatch/logGroup:LogGroup":
            out["arn"] = _arn("logs", f"log-group:{out['name']}")
        elif t == "gcp:compute/address:Address":
            out["address"] = "10.10.0.5" if out.get("addressType") == "INTERNAL" else "203.0.113.9"
        elif t == "gcp:compute/globalAddress:GlobalAddress":
            out["address"] = "10.30.0.0"
        elif t == "gcp:serviceaccount/account:Account":
            out["email"] = f"{out['accountId']}@{out.get('project', 'p')}.iam.gserviceaccount.com"
            out["name"] = f"projects/{out.get('project', 'p')}/serviceAccounts/{out['email']}"
        elif t == "gcp:storage/bucket:Bucket":
            out["url"] = f"gs://{out['name']}"
        elif t == "gcp:sql/databaseInstance:DatabaseInstance":
            out["privateIpAddress"] = "10.20.0.3"
            out["connectionName"] = f"p:r:{args.name}"
        elif t == "gcp:secretmanager/secret:Secret":
            out["name"] = f"projects/{out.get('project', 'p')}/secrets/{out['secretId']}"
        elif t == "gcp:filestore/instance:Instance":
            out["networks"] = [{**net, "ipAddresses": ["10.40.0.2"]} for net in out.get("networks", [])]
        elif t == "aws:efs/fileSystem:FileSystem":
            out["dnsName"] = f"{args.name}-id.efs.us-east-1.amazonaws.com"
        elif t == "gcp:projects/iAMCustomRole:IAMCustomRole":
            out["name"] = f"projects/{out['project']}/roles/{out['roleId']}"
        if t.startswith("gcp:compute/") and "name" in out:
            out["selfLink"] = f"https://compute.googleapis.com/compute/v1/projects/p/{args.name}"
        return f"{args.name}-id", out

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict[str, Any], list[tuple[str, str]]]:
        self.calls.append(args.token)
        if args.token == "aws:index/getAvailabilityZones:getAvailabilityZones":
            return {"names": ["us-east-1a", "us-east-1b", "us-east-1c"], "zoneIds": ["a", "b", "c"]}, []
        if args.token == "aws:ssm/getParameter:getParameter":
            return {"name": args.args["name"], "value": "ami-0123456789abcdef0", "type": "String"}, []
        if args.token == "aws:ec2/getVpc:getVpc":
            return {"id": "vpc-default", "cidrBlock": "172.31.0.0/16"}, []
        if args.token == "aws:ec2/getSubnets:getSubnets":
            return {"ids": ["subnet-d1", "subnet-d2"]}, []
        if args.token == "gcp:compute/getNetwork:getNetwork":
            name, project = args.args["name"], args.args.get("project", "p")
            return {"id": f"projects/{project}/global/networks/{name}", "name": name,
                    "selfLink": f"https://compute.googleapis.com/compute/v1/projects/{project}/global/networks/{name}"}, []
        if args.token == "gcp:compute/getSubnetwork:getSubnetwork":
            name, project, region = args.args["name"], args.args.get("project", "p"), args.args["region"]
            return {"id": f"projects/{project}/regions/{region}/subnetworks/{name}", "name": name,
                    "region": region, "ipCidrRange": "10.128.0.0/20"}, []
        return {}, []


def run(program: Callable[[], dict[str, Any]]) -> tuple[Recorder, dict[str, Any]]:
    """Run `program` under fresh mocks; returns the recorder and the program's resolved outputs.
    Pulumi's runtime takes the thread's current event loop: an earlier test in the same worker may
    have left none (asyncio.run clears it), so the program gets a loop of its own."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return _run(program)
    finally:
        asyncio.set_event_loop(None)
        loop.close()


def _run(program: Callable[[], dict[str, Any]]) -> tuple[Recorder, dict[str, Any]]:
    rec = Recorder()
    pulumi.runtime.set_mocks(rec, project="shipyard", stack="test", preview=False)
    resolved: dict[str, Any] = {}

    @pulumi.runtime.test
    def go() -> Any:
        outputs = program()
        keys = list(outputs)
        return pulumi.Output.all(*[outputs[k] for k in keys]).apply(
            lambda values: resolved.update(zip(keys, values, strict=True)))

    go()
    return rec, resolved


# ---- a release's dependencies without an index ---------------------------------------------------


def dependencies_dir(dest: Path) -> Path:
    """This virtualenv's installed distributions minus Shipyard itself and pip, as symlinks in `dest`:
    on PYTHONPATH (with PIP_NO_INDEX=1) they stand in for the index a real master's pip downloads the
    release's pinned dependencies from, so that a boot installs the shipped wheel, and only it."""
    import site

    [site_packages] = [p for p in site.getsitepackages() if p.endswith("site-packages")][:1]
    dest.mkdir(parents=True, exist_ok=True)
    for entry in Path(site_packages).iterdir():
        name = entry.name
        if (name.startswith(("shipyard", "__editable__", "pip", "_distutils_hack", "__pycache__"))
                or name.endswith(".pth")):
            continue
        link = dest / name
        if not link.exists():
            link.symlink_to(entry)
    return dest


@pytest.fixture
def gcs(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """gcp-storage-emulator for one test, STORAGE_EMULATOR_HOST pointing at it (no bucket yet)."""
    from gcp_storage_emulator.server import create_server

    from tests.pg import free_port

    port = free_port()
    server = create_server("127.0.0.1", port, in_memory=True)
    server.start()
    host = f"http://127.0.0.1:{port}"
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", host)
    try:
        yield host
    finally:
        server.stop()
