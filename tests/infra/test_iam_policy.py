"""The master's rendered IAM policy (infra/aws/program.py master_policy) against every EC2 call the AWS
provider really makes: the provider runs against moto with the pool settings `det deploy` renders, a
botocore hook records each request as sent, and a small evaluator of the policy JSON (Action,
Resource, and the condition operators the policy uses) decides each authorization the request needs,
modelled on EC2's documented authorization of RunInstances (one check per resource it creates or
uses, aws:RequestTag from that resource type's TagSpecifications, CreateTags with
ec2:CreateAction=RunInstances for each tagged type). moto's own IAM enforcement evaluates neither
these conditions nor RunInstances' per-resource checks, so the policy is evaluated here."""

from __future__ import annotations

import fnmatch
import json
from typing import Any

import boto3
import pytest

from infra import DEPLOY_TAG, render
from infra.aws.program import master_policy
from infra.settings import AwsSettings
from provisioners.aws import AwsPoolConfig, AwsProvider
from provisioners.base import LaunchSpec
from provisioners.factory import COMMON_KEYS
from tests.provisioners.conftest import aws_session, moto_reset, moto_server  # noqa: F401

REGION = "us-east-1"
CID = "ml-prod"
ACCOUNT = "123456789012"
AGENT_ROLE = f"arn:aws:iam::{ACCOUNT}:role/shipyard-{CID}-agent"


# ---- the evaluator ---------------------------------------------------------------------------------


def _listed(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def _condition_holds(condition: dict[str, dict[str, Any]], context: dict[str, str]) -> bool:
    for op, tests in condition.items():
        for key, wanted in tests.items():
            have = context.get(key)
            if have is None:
                return False  # a missing key fails every operator the policy uses
            wanted_values = _listed(wanted)
            if op == "StringEquals" and have not in wanted_values:
                return False
            if op in ("ArnLike", "StringLike") and not any(fnmatch.fnmatchcase(have, w) for w in wanted_values):
                return False
            if op not in ("StringEquals", "ArnLike", "StringLike"):
                raise AssertionError(f"the evaluator does not know {op}: teach it before trusting it")
    return True


def allowed(policy: dict[str, Any], action: str, resource: str, context: dict[str, str]) -> bool:
    allow = False
    for st in policy["Statement"]:
        if not any(fnmatch.fnmatchcase(action, a) for a in _listed(st["Action"])):
            continue
        if not any(fnmatch.fnmatchcase(resource, r) for r in _listed(st["Resource"])):
            continue
        if not _condition_holds(st.get("Condition", {}), context):
            continue
        if st["Effect"] == "Deny":
            return False
        allow = True
    return allow


# ---- EC2's authorization of a request, as documented ---------------------------------------------------


def _tags_of(spec: list[dict[str, Any]], resource_type: str) -> dict[str, str]:
    return {t["Key"]: t["Value"] for s in spec if s["ResourceType"] == resource_type for t in s["Tags"]}


def authorizations(op: str, params: dict[str, Any], ec2: Any, vpc_arn: str) -> list[tuple[str, str, dict[str, str]]]:
    """(action, resource ARN, condition context) for every check EC2 makes for this request."""
    arn = f"arn:aws:ec2:{REGION}:{ACCOUNT}"
    if op.startswith("Describe"):
        return [(f"ec2:{op}", "*", {})]
    if op == "RunInstances":
        specs = params.get("TagSpecifications", [])
        created = ["instance", "volume", "network-interface"]
        if params.get("InstanceMarketOptions", {}).get("MarketType") == "spot":
            created.append("spot-instances-request")
        checks: list[tuple[str, str, dict[str, str]]] = []
        for rtype in created:
            tags = _tags_of(specs, rtype)
            context = {f"aws:RequestTag/{k}": v for k, v in tags.items()}
            if rtype == "network-interface":
                context["ec2:Vpc"] = vpc_arn
            checks.append(("ec2:RunInstances", f"{arn}:{rtype}/*", context))
            if tags:
                checks.append(("ec2:CreateTags", f"{arn}:{rtype}/*", {**context, "ec2:CreateAction": "RunInstances"}))
        checks.append(("ec2:RunInstances", f"arn:aws:ec2:{REGION}::image/{params['ImageId']}", {}))
        checks.append(("ec2:RunInstances", f"{arn}:subnet/{params['SubnetId']}", {"ec2:Vpc": vpc_arn}))
        checks += [("ec2:RunInstances", f"{arn}:security-group/{g}", {"ec2:Vpc": vpc_arn})
                   for g in params.get("SecurityGroupIds", [])]
        if params.get("KeyName"):
            checks.append(("ec2:RunInstances", f"{arn}:key-pair/{params['KeyName']}", {}))
        if params.get("IamInstanceProfile"):
            checks.append(("iam:PassRole", AGENT_ROLE, {"iam:PassedToService": "ec2.amazonaws.com"}))
        return checks
    if op in ("TerminateInstances", "StopInstances", "StartInstances", "ModifyInstanceAttribute"):
        ids = params["InstanceIds"] if "InstanceIds" in params else [params["InstanceId"]]
        out = []
        for i in ids:
            raw = ec2.describe_instances(InstanceIds=[i])["Reservations"][0]["Instances"][0]
            context = {f"ec2:ResourceTag/{t['Key']}": t["Value"] for t in raw.get("Tags", [])}
            out.append((f"ec2:{op}", f"{arn}:instance/{i}", context))
        return out
    raise AssertionError(f"no authorization model for {op}: add one")


# ---- the provider's calls ---------------------------------------------------------------------------------


@pytest.fixture
def cluster(moto_reset: str, aws_session: boto3.Session) -> dict[str, Any]:  # noqa: F811
    ec2 = aws_session.client("ec2", region_name=REGION, endpoint_url=moto_reset)
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.0.0/20", AvailabilityZone="us-east-1a")["Subnet"]["SubnetId"]
    sg = ec2.create_security_group(GroupName="agents", Description="agents", VpcId=vpc)["GroupId"]
    ec2.create_key_pair(KeyName="ops")
    aws_session.client("iam", region_name=REGION, endpoint_url=moto_reset).create_instance_profile(
        InstanceProfileName=f"shipyard-{CID}-agent")
    image = ec2.describe_images()["Images"][0]["ImageId"]
    s = AwsSettings(cluster_id=CID, keypair="ops", inbound_cidr="203.0.113.0/24", spot=True, agent_ami=image,
                    aux_ami=image)
    facts = render.AwsFacts(master_private_ip="10.0.0.10", bucket="b", subnet_ids=(subnet,),
                            agent_security_group_id=sg, agent_instance_profile=f"shipyard-{CID}-agent",
                            secret_id="s", endpoint_url=moto_reset)
    policy = json.loads(master_policy(s, vpc_id=vpc, agent_role_arn=AGENT_ROLE, secret_arn="arn:secret",
                                      bucket="b", log_group_arn="arn:logs"))
    return {"ec2": ec2, "config": render.aws_master_config(s, facts), "policy": policy,
            "vpc_arn": f"arn:aws:ec2:{REGION}:{ACCOUNT}:vpc/{vpc}", "image": image, "subnet": subnet}


def _recording_session(calls: list[tuple[str, dict[str, Any]]]) -> boto3.Session:
    session = boto3.Session(region_name=REGION)

    def record(params: dict[str, Any], model: Any, **_: Any) -> None:
        calls.append((model.name, json.loads(json.dumps(params, default=str))))

    session.events.register("provide-client-params.ec2", record)
    return session


def test_every_call_of_a_spot_pool_is_allowed_for_the_clusters_instances(cluster: dict[str, Any]) -> None:
    calls: list[tuple[str, dict[str, Any]]] = []
    section = next(p for p in cluster["config"]["resource_pools"] if p["name"] == "compute")["provider"]
    assert section["spot"] is True
    cfg = AwsPoolConfig.from_dict({k: v for k, v in section.items() if k not in COMMON_KEYS})
    provider = AwsProvider(cfg, cluster_id="master-1", pool="compute", master_url="http://10.0.0.10:8080",
                           session=_recording_session(calls), max_attempts=2, call_timeout_s=10)
    launched = provider.launch([LaunchSpec(launch_id="l-1", user_data="#cloud-config\n")]).launched
    assert launched
    provider.list()
    provider.describe([i.id for i in launched])
    provider.terminate([i.id for i in launched])

    ops = {op for op, _ in calls}
    assert {"RunInstances", "DescribeInstances", "TerminateInstances"} <= ops
    [run] = [p for op, p in calls if op == "RunInstances"]
    assert run["InstanceMarketOptions"]["MarketType"] == "spot"
    checked = 0
    for op, params in calls:
        for action, resource, context in authorizations(op, params, cluster["ec2"], cluster["vpc_arn"]):
            assert allowed(cluster["policy"], action, resource, context), (op, action, resource, context)
            checked += 1
    assert checked >= 12
    # The spot request is one of the resources checked, with the cluster's tag.
    spot = [c for c in authorizations("RunInstances", run, cluster["ec2"], cluster["vpc_arn"])
            if "spot-instances-request" in c[1]]
    assert [a for a, _, _ in spot] == ["ec2:RunInstances", "ec2:CreateTags"]
    assert all(ctx[f"aws:RequestTag/{DEPLOY_TAG}"] == CID for _, _, ctx in spot)


def test_untagged_or_foreign_instances_and_untagged_spot_requests_are_refused(cluster: dict[str, Any]) -> None:
    ec2, policy, vpc_arn = cluster["ec2"], cluster["policy"], cluster["vpc_arn"]
    [untagged] = [i["InstanceId"] for i in ec2.run_instances(ImageId=cluster["image"], InstanceType="t3.large",
                                                             MinCount=1, MaxCount=1)["Instances"]]
    [foreign] = [i["InstanceId"] for i in ec2.run_instances(
        ImageId=cluster["image"], InstanceType="t3.large", MinCount=1, MaxCount=1,
        TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": DEPLOY_TAG, "Value": "other"}]}],
    )["Instances"]]
    for instance in (untagged, foreign):
        for op in ("TerminateInstances", "StopInstances", "StartInstances"):
            [(action, resource, context)] = authorizations(op, {"InstanceIds": [instance]}, ec2, vpc_arn)
            assert not allowed(policy, action, resource, context), (op, instance)
        [(action, resource, context)] = authorizations("ModifyInstanceAttribute", {"InstanceId": instance}, ec2,
                                                       vpc_arn)
        assert not allowed(policy, action, resource, context)

    def run(tags: dict[str, dict[str, str]]) -> list[bool]:
        params = {"ImageId": cluster["image"], "SubnetId": cluster["subnet"],
                  "InstanceMarketOptions": {"MarketType": "spot"},
                  "TagSpecifications": [{"ResourceType": t, "Tags": [{"Key": k, "Value": v} for k, v in kv.items()]}
                                        for t, kv in tags.items()]}
        return [allowed(policy, a, r, c) for a, r, c in authorizations("RunInstances", params, ec2, vpc_arn)
                if r.endswith(("instance/*", "volume/*", "spot-instances-request/*"))]

    ours = {DEPLOY_TAG: CID}
    assert all(run({"instance": ours, "volume": ours, "spot-instances-request": ours}))
    assert not all(run({"instance": ours, "volume": ours}))  # the spot request untagged
    assert not any(run({t: {DEPLOY_TAG: "other"} for t in ("instance", "volume", "spot-instances-request")}))
    # Somebody else's AMI is allowed (images are the account's choice), a subnet of another VPC is not.
    other_vpc = "arn:aws:ec2:us-east-1:123456789012:vpc/vpc-other"
    assert not allowed(policy, "ec2:RunInstances", f"arn:aws:ec2:{REGION}:{ACCOUNT}:subnet/subnet-x",
                       {"ec2:Vpc": other_vpc})


def test_every_call_of_a_warm_pool_is_allowed_for_the_clusters_instances(cluster: dict[str, Any]) -> None:
    """An on-demand pool with a warm pool stops (parks) and starts its instances again."""
    calls: list[tuple[str, dict[str, Any]]] = []
    section = next(p for p in cluster["config"]["resource_pools"] if p["name"] == "compute")["provider"]
    own = {k: v for k, v in section.items() if k not in COMMON_KEYS}
    cfg = AwsPoolConfig.from_dict({**own, "spot": False})
    provider = AwsProvider(cfg, cluster_id="master-1", pool="compute", master_url="http://10.0.0.10:8080",
                           session=_recording_session(calls), max_attempts=2, call_timeout_s=10)
    [inst] = provider.launch([LaunchSpec(launch_id="l-1", user_data="#cloud-config\n")]).launched
    provider.stop([inst.id])
    cluster["ec2"].get_waiter("instance_stopped").wait(InstanceIds=[inst.id], WaiterConfig={"Delay": 1})
    provider.start([inst.id])
    ops = [op for op, _ in calls]
    assert "StopInstances" in ops and "StartInstances" in ops
    for op, params in calls:
        for action, resource, context in authorizations(op, params, cluster["ec2"], cluster["vpc_arn"]):
            assert allowed(cluster["policy"], action, resource, context), (op, action, resource, context)
