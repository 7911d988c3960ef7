"""The AWS and GCP programs under Pulumi's mocks: the security properties of what they declare, the
cluster tag on everything that takes one, and a master.yaml the master's own loader accepts."""

from __future__ import annotations

import importlib
import inspect
import json
import warnings
from pathlib import Path
from typing import Any

import pulumi
import pytest
import yaml

from control_plane.config import load_config
from infra import AGENT_MANAGED_BY_LABEL, AGENT_MANAGED_BY_TAG, DEPLOY_TAG, MANAGED_BY_VALUE, render
from infra.aws import program as aws_program
from infra.gcp import program as gcp_program
from infra.settings import AwsSettings, GcpSettings
from provisioners import base as provider_base
from provisioners import gcp as gcp_provider
from provisioners.aws import AwsPoolConfig
from provisioners.factory import COMMON_KEYS, elastic_settings
from provisioners.gcp import GcpPoolConfig
from tests.infra.conftest import ADMIN_PASSWORD, DB_PASSWORD, Declared, Recorder, run

CID = "ml-prod"
SECRET_SIG = "4dabf18193072939515e22adb298388d"  # Pulumi's marker of a secret value on the wire


def aws_settings(**kw: Any) -> AwsSettings:
    return AwsSettings(**{"cluster_id": CID, "keypair": "ops-key", "inbound_cidr": "203.0.113.0/24",
                          "max_dynamic_agents": 8, "min_dynamic_agents": 1, "spot": True, "spot_max_price": "0.4",
                          "tags": {"team": "ml"}, **kw})


def gcp_settings(**kw: Any) -> GcpSettings:
    return GcpSettings(**{"cluster_id": CID, "project": "my-project-1", "inbound_cidr": "203.0.113.0/24",
                          "max_dynamic_agents": 6, "tags": {"team": "ml"}, **kw})


@pytest.fixture(scope="module")
def aws_run() -> tuple[Recorder, dict[str, Any]]:
    s = aws_settings()
    return run(lambda: aws_program.build(s, db_password=DB_PASSWORD, admin_password=ADMIN_PASSWORD))


@pytest.fixture(scope="module")
def gcp_run() -> tuple[Recorder, dict[str, Any]]:
    s = gcp_settings()
    return run(lambda: gcp_program.build(s, db_password=DB_PASSWORD, admin_password=ADMIN_PASSWORD))


def of_type(rec: Recorder, suffix: str) -> list[Declared]:
    return [r for r in rec.resources if r.type.endswith(suffix)]


def one(rec: Recorder, suffix: str) -> Declared:
    [r] = of_type(rec, suffix)
    return r


def accepts(type_token: str, *params: str) -> bool:
    """Whether the Pulumi resource class behind `type_token` takes one of `params`."""
    pkg, mod, cls = type_token.split(":")
    with warnings.catch_warnings():  # importing a module touches its deprecated classes
        warnings.simplefilter("ignore", DeprecationWarning)
        module = importlib.import_module(f"pulumi_{pkg}.{mod.split('/')[0]}")
    names = inspect.signature(getattr(module, cls)._internal_init).parameters
    return any(p in names for p in params)


def assert_passwords_only_in_secrets(rec: Recorder, holders: tuple[str, ...]) -> None:
    """The passwords reach the secret store and the database's own user, as Pulumi secrets (encrypted
    in the state), and nothing else: not the user-data, not a tag, not an output."""
    seen = set()
    for r in rec.resources:
        for secret in (DB_PASSWORD, ADMIN_PASSWORD):
            if secret not in r.text:
                continue
            assert r.type.endswith(holders), r.type
            seen.add(r.type)
            for value in r.inputs.values():
                if secret in json.dumps(value, default=str):
                    assert isinstance(value, dict) and set(value) == {SECRET_SIG, "value"}, (r.type, value)
    assert len(seen) == len(holders)


def test_tag_and_label_keys_match_the_providers() -> None:
    assert AGENT_MANAGED_BY_TAG == provider_base.TAG_MANAGED_BY
    assert AGENT_MANAGED_BY_LABEL == gcp_provider.LABEL_MANAGED_BY
    assert MANAGED_BY_VALUE == provider_base.MANAGED_BY_VALUE


# ---- AWS -------------------------------------------------------------------------------------------


def test_aws_every_taggable_resource_carries_the_cluster_tag(aws_run: tuple[Recorder, dict[str, Any]]) -> None:
    rec, _ = aws_run
    taggable = [r for r in rec.resources if accepts(r.type, "tags")]
    assert len(taggable) >= 15
    for r in taggable:
        assert r.inputs.get("tags", {}).get(DEPLOY_TAG) == CID, (r.type, r.name)
        assert r.inputs["tags"].get("team") == "ml"
    root = one(rec, "ec2/instance:Instance").inputs["rootBlockDevice"]
    assert root["tags"][DEPLOY_TAG] == CID and root["encrypted"] is True


def test_aws_nothing_but_the_api_and_ssh_is_open_and_only_to_the_inbound_cidr(
    aws_run: tuple[Recorder, dict[str, Any]],
) -> None:
    rec, _ = aws_run
    groups = {r.name.removeprefix(f"shipyard-{CID}-"): r.inputs for r in of_type(rec, "SecurityGroup")}
    for name, sg in groups.items():
        for rule in sg.get("ingress", []):
            assert "0.0.0.0/0" not in rule.get("cidrBlocks", []), (name, rule)
            if rule.get("cidrBlocks"):
                assert rule["cidrBlocks"] == ["203.0.113.0/24"] and rule["fromPort"] in (22, 8080), (name, rule)
    [db_rule] = groups["db"]["ingress"]
    assert db_rule["fromPort"] == db_rule["toPort"] == 5432 and db_rule["securityGroups"] == [f"shipyard-{CID}-master-id"]
    assert "cidrBlocks" not in db_rule
    db = one(rec, "rds/instance:Instance").inputs
    assert db["publiclyAccessible"] is False and db["storageEncrypted"] is True
    assert db["backupRetentionPeriod"] >= 1 and db["engine"] == "postgres"
    assert db["vpcSecurityGroupIds"] == [f"shipyard-{CID}-db-id"]
    master = one(rec, "ec2/instance:Instance").inputs
    assert master["metadataOptions"]["httpTokens"] == "required"


def test_aws_bucket_is_private_encrypted_and_tls_only(aws_run: tuple[Recorder, dict[str, Any]]) -> None:
    rec, _ = aws_run
    block = one(rec, "BucketPublicAccessBlock").inputs
    assert all(block[k] is True for k in ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls",
                                          "restrictPublicBuckets"))
    [rule] = one(rec, "BucketServerSideEncryptionConfiguration").inputs["rules"]
    assert rule["applyServerSideEncryptionByDefault"]["sseAlgorithm"] in ("AES256", "aws:kms")
    assert one(rec, "BucketOwnershipControls").inputs["rule"]["objectOwnership"] == "BucketOwnerEnforced"
    [deny] = json.loads(one(rec, "BucketPolicy").inputs["policy"])["Statement"]
    assert deny["Effect"] == "Deny" and deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    assert "acl" not in one(rec, "s3/bucket:Bucket").inputs


def _statements(rec: Recorder, role: str) -> list[dict[str, Any]]:
    policy = next(r for r in of_type(rec, "RolePolicy") if r.name == f"shipyard-{CID}-{role}")
    return json.loads(policy.inputs["policy"])["Statement"]


def test_aws_master_iam_is_conditioned_on_the_cluster_tag(aws_run: tuple[Recorder, dict[str, Any]]) -> None:
    rec, _ = aws_run
    stmts = _statements(rec, "master")
    assert all(st["Effect"] == "Allow" for st in stmts)
    by_action: dict[str, list[dict[str, Any]]] = {}
    for st in stmts:
        for action in [st["Action"]] if isinstance(st["Action"], str) else st["Action"]:
            by_action.setdefault(action, []).append(st)
    # Instances and volumes are created only with this cluster's tag in the request...
    runs = by_action["ec2:RunInstances"]
    instance_stmt = next(st for st in runs if any(":instance/" in r for r in st["Resource"]))
    assert instance_stmt["Condition"] == {"StringEquals": {f"aws:RequestTag/{DEPLOY_TAG}": CID}}
    assert all(":instance/" not in r for st in runs if st is not instance_stmt for r in st["Resource"])
    # ...tagged only at launch, and terminated, stopped or modified only when they carry it.
    [tag] = by_action["ec2:CreateTags"]
    assert tag["Condition"]["StringEquals"]["ec2:CreateAction"] == "RunInstances"
    assert tag["Condition"]["StringEquals"][f"aws:RequestTag/{DEPLOY_TAG}"] == CID
    for action in ("ec2:TerminateInstances", "ec2:StopInstances", "ec2:ModifyInstanceAttribute"):
        [st] = by_action[action]
        assert st["Condition"] == {"StringEquals": {f"ec2:ResourceTag/{DEPLOY_TAG}": CID}}
    # Read-only Describe* is the only unconditioned wildcard (EC2 has no resource-level Describe).
    for st in stmts:
        if st["Resource"] == "*":
            assert all(a.startswith("ec2:Describe") for a in st["Action"]) and "Condition" not in st
    [pass_role] = by_action["iam:PassRole"]
    assert pass_role["Resource"] == f"arn:aws:iam:us-east-1:123456789012:role/shipyard-{CID}-agent"
    [secret] = by_action["secretsmanager:GetSecretValue"]
    assert secret["Resource"].endswith(f"secret:shipyard/{CID}/master-AbCdEf")


def test_aws_agents_may_use_only_the_checkpoint_bucket(aws_run: tuple[Recorder, dict[str, Any]]) -> None:
    rec, out = aws_run
    bucket = out["checkpoint_bucket"]
    allows = [st for st in _statements(rec, "agent") if st["Effect"] == "Allow"]
    for st in allows:
        assert all(a.startswith("s3:") for a in ([st["Action"]] if isinstance(st["Action"], str) else st["Action"]))
        assert st["Resource"] in (f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*")
    # ...but never write the master's release (trial code runs on the agents).
    [deny] = [st for st in _statements(rec, "agent") if st["Effect"] == "Deny"]
    assert deny["Resource"] == f"arn:aws:s3:::{bucket}/shipyard/releases/*"
    assert set(deny["Action"]) == {"s3:PutObject", "s3:DeleteObject"}


def test_aws_user_data_holds_no_secret_and_a_master_yaml_the_master_accepts(
    aws_run: tuple[Recorder, dict[str, Any]], tmp_path: Path,
) -> None:
    rec, out = aws_run
    user_data = one(rec, "ec2/instance:Instance").inputs["userData"]
    assert user_data.startswith("#cloud-config\n")
    assert_passwords_only_in_secrets(rec, ("SecretVersion", "rds/instance:Instance"))
    version = one(rec, "SecretVersion").inputs["secretString"]
    payload = json.loads(version["value"] if isinstance(version, dict) else version)
    assert payload["admin_password"] == ADMIN_PASSWORD and DB_PASSWORD in payload["db_url"]

    config = render.user_data_config(user_data)
    path = tmp_path / "master.yaml"
    path.write_text(yaml.safe_dump(config))
    loaded = load_config(path, env={})
    assert [p.name for p in loaded.resource_pools] == ["compute", "aux"]
    assert loaded.default_resource_pool == "compute" and loaded.master_url == "http://10.0.0.37:8080"
    assert loaded.admin_password is None and loaded.db_url is None  # both come from the secret store
    assert loaded.checkpoint_storage == {"type": "s3", "bucket": out["checkpoint_bucket"], "prefix": "checkpoints"}
    compute, aux = (p.provider for p in loaded.resource_pools)
    assert compute is not None and aux is not None
    for section in (compute, aux):
        settings = elastic_settings(section)  # the elastic part, as the master reads it
        cfg = AwsPoolConfig.from_dict({k: v for k, v in section.items() if k not in COMMON_KEYS})
        assert cfg.tags[DEPLOY_TAG] == CID and cfg.iam_instance_profile == f"shipyard-{CID}-agent"
        assert cfg.subnet_ids == (f"shipyard-{CID}-subnet-0-id", f"shipyard-{CID}-subnet-1-id")
        assert cfg.ssh_key_name == "ops-key" and settings.max_idle_agent_period.total_seconds() == 600
    assert compute["instance_type"] == "g4dn.xlarge" and compute["spot"] is True and compute["spot_max_price"] == "0.4"
    assert (elastic_settings(compute).min_instances, elastic_settings(compute).max_instances) == (1, 8)
    assert aux["instance_type"] == "t3.large" and aux["instance_slots"] == 2 and aux["agent"]["slot_type"] == "cpu"


def test_aws_default_vpc_option_creates_no_network() -> None:
    s = aws_settings(use_default_vpc=True)
    rec, _ = run(lambda: aws_program.build(s, db_password=DB_PASSWORD, admin_password=ADMIN_PASSWORD))
    assert not of_type(rec, "ec2/vpc:Vpc") and not of_type(rec, "ec2/subnet:Subnet")
    assert one(rec, "rds/subnetGroup:SubnetGroup").inputs["subnetIds"] == ["subnet-d1", "subnet-d2"]


# ---- GCP -------------------------------------------------------------------------------------------


def test_gcp_every_labelable_resource_carries_the_cluster_label(gcp_run: tuple[Recorder, dict[str, Any]]) -> None:
    rec, _ = gcp_run
    labelable = [r for r in rec.resources if accepts(r.type, "labels")]
    assert len(labelable) >= 6
    for r in labelable:
        assert r.inputs.get("labels", {}).get(DEPLOY_TAG) == CID, (r.type, r.name)
    assert one(rec, "DatabaseInstance").inputs["settings"]["userLabels"][DEPLOY_TAG] == CID
    disk = one(rec, "compute/instance:Instance").inputs["bootDisk"]["initializeParams"]
    assert disk["labels"][DEPLOY_TAG] == CID
    # What takes no label is named after the cluster.
    for r in rec.resources:
        if not accepts(r.type, "labels") and "name" in r.inputs and r.type.startswith("gcp:compute/"):
            assert r.inputs["name"].startswith(f"{CID}-"), r.name


def test_gcp_firewall_opens_only_the_api_and_ssh_to_the_inbound_cidr_and_the_db_is_private(
    gcp_run: tuple[Recorder, dict[str, Any]],
) -> None:
    rec, _ = gcp_run
    for fw in of_type(rec, "Firewall"):
        ranges = fw.inputs.get("sourceRanges", [])
        assert "0.0.0.0/0" not in ranges
        if ranges:
            assert ranges == ["203.0.113.0/24"]
            assert {p for a in fw.inputs["allows"] for p in a["ports"]} <= {"22", "8080"}
    no_db = next(fw for fw in of_type(rec, "Firewall") if fw.name == f"{CID}-agents-no-db")
    assert no_db.inputs["direction"] == "EGRESS" and no_db.inputs["denies"] == [{"protocol": "tcp", "ports": ["5432"]}]
    ip = one(rec, "DatabaseInstance").inputs["settings"]["ipConfiguration"]
    assert ip["ipv4Enabled"] is False and ip["sslMode"] == "ENCRYPTED_ONLY" and not ip.get("authorizedNetworks")
    assert one(rec, "DatabaseInstance").inputs["settings"]["backupConfiguration"]["enabled"] is True


def test_gcp_bucket_is_private(gcp_run: tuple[Recorder, dict[str, Any]]) -> None:
    rec, _ = gcp_run
    bucket = one(rec, "storage/bucket:Bucket").inputs
    assert bucket["publicAccessPrevention"] == "enforced" and bucket["uniformBucketLevelAccess"] is True
    # Encrypted at rest by GCS itself; no public member anywhere.
    for m in of_type(rec, "BucketIAMMember"):
        assert m.inputs["member"].startswith("serviceAccount:") and m.inputs["role"] == "roles/storage.objectAdmin"


def test_gcp_master_iam_is_minimal_and_conditioned_on_the_agents(gcp_run: tuple[Recorder, dict[str, Any]]) -> None:
    rec, _ = gcp_run
    role = one(rec, "IAMCustomRole").inputs
    assert set(role["permissions"]) == set(gcp_program.MASTER_PERMISSIONS)
    assert not any(p.startswith(("iam.", "resourcemanager.", "storage.")) for p in role["permissions"])
    [binding] = of_type(rec, "projects/iAMMember:IAMMember")
    assert binding.inputs["role"] == f"projects/my-project-1/roles/{role['roleId']}"
    expr = binding.inputs["condition"]["expression"]
    assert f'startsWith("{CID}-agent-")' in expr and "compute.googleapis.com/Instance" in expr
    # The pools name their agents so that the condition matches them.
    user_data = one(rec, "compute/instance:Instance").inputs["metadata"]["user-data"]
    for pool in render.user_data_config(user_data)["resource_pools"]:
        assert pool["provider"]["name_prefix"].startswith(f"{CID}-agent-")
    [act_as] = of_type(rec, "serviceaccount/iAMMember:IAMMember")
    assert act_as.inputs["role"] == "roles/iam.serviceAccountUser"
    assert act_as.inputs["serviceAccountId"].endswith(f"{CID}-agent@my-project-1.iam.gserviceaccount.com")
    [reads] = of_type(rec, "SecretIamMember")
    assert reads.inputs["role"] == "roles/secretmanager.secretAccessor" and reads.inputs["secretId"] == f"{CID}-master"
    # No project-wide grant other than the conditioned custom role.
    assert all("condition" in b.inputs for b in of_type(rec, "projects/iAMMember:IAMMember"))


def test_gcp_user_data_holds_no_secret_and_a_master_yaml_the_master_accepts(
    gcp_run: tuple[Recorder, dict[str, Any]], tmp_path: Path,
) -> None:
    rec, out = gcp_run
    assert_passwords_only_in_secrets(rec, ("SecretVersion", "sql/user:User"))
    user_data = one(rec, "compute/instance:Instance").inputs["metadata"]["user-data"]
    path = tmp_path / "master.yaml"
    path.write_text(yaml.safe_dump(render.user_data_config(user_data)))
    loaded = load_config(path, env={})
    assert [p.name for p in loaded.resource_pools] == ["compute", "aux"]
    assert loaded.master_url == "http://10.10.0.5:8080"
    assert loaded.checkpoint_storage == {"type": "gcs", "bucket": out["checkpoint_bucket"], "prefix": "checkpoints"}
    compute, aux = (p.provider for p in loaded.resource_pools)
    assert compute is not None and aux is not None
    for section in (compute, aux):
        elastic_settings(section)
        cfg = GcpPoolConfig.from_dict({k: v for k, v in section.items() if k not in COMMON_KEYS})
        assert cfg.labels[DEPLOY_TAG] == CID and cfg.service_account_email == f"{CID}-agent@my-project-1.iam.gserviceaccount.com"
        assert cfg.subnetwork == f"regions/us-central1/subnetworks/{CID}-subnet"
    assert compute["gpu_type"] == "nvidia-tesla-t4" and compute["gpu_num"] == 1
    assert elastic_settings(compute).max_instances == 6
    assert aux["instance_slots"] == 4


# ---- what `down` keeps ---------------------------------------------------------------------------------


def _retained(build: Any) -> tuple[Recorder, set[str]]:
    """The program's resources, and the types of those declared with retain_on_delete."""
    kept: set[str] = set()

    def program() -> dict[str, Any]:
        def record(args: pulumi.ResourceTransformationArgs) -> None:
            if args.opts.retain_on_delete:
                kept.add(args.type_)

        pulumi.runtime.register_stack_transformation(record)
        return build()

    rec, _ = run(program)
    return rec, kept


def test_aws_down_keeps_a_final_snapshot_and_the_bucket() -> None:
    s = aws_settings()
    rec, kept = _retained(lambda: aws_program.build(s, db_password=DB_PASSWORD, admin_password=ADMIN_PASSWORD))
    db = one(rec, "rds/instance:Instance").inputs
    assert db["skipFinalSnapshot"] is False and db["finalSnapshotIdentifier"] == f"shipyard-{CID}-final"
    assert one(rec, "s3/bucket:Bucket").inputs["forceDestroy"] is False
    # The bucket and the settings that keep it private and encrypted outlive the stack.
    assert kept == {"aws:s3/bucket:Bucket", "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock",
                    "aws:cloudwatch/logGroup:LogGroup",
                    "aws:s3/bucketOwnershipControls:BucketOwnershipControls",
                    "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
                    "aws:s3/bucketPolicy:BucketPolicy"}


def test_gcp_down_keeps_a_final_backup_and_the_bucket_and_agents_cannot_write_the_release() -> None:
    s = gcp_settings()
    rec, kept = _retained(lambda: gcp_program.build(s, db_password=DB_PASSWORD, admin_password=ADMIN_PASSWORD))
    final = one(rec, "DatabaseInstance").inputs["settings"]["finalBackupConfig"]
    assert final == {"enabled": True, "retentionDays": gcp_program.FINAL_BACKUP_DAYS}
    assert one(rec, "storage/bucket:Bucket").inputs["forceDestroy"] is False
    assert kept == {"gcp:storage/bucket:Bucket"}
    members = {m.name: m.inputs for m in of_type(rec, "BucketIAMMember")}
    bucket = one(rec, "storage/bucket:Bucket").inputs["name"]
    expr = members[f"{CID}-agent-ckpt"]["condition"]["expression"]
    assert f'!resource.name.startsWith("projects/_/buckets/{bucket}/objects/shipyard/releases/")' in expr
    assert "condition" not in members[f"{CID}-master-ckpt"]  # the master reads its release
