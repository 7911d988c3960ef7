"""AwsProvider driven through real boto3 over HTTP against a moto server (with a fault proxy).

Setup and checks talk to moto directly; the provider talks to the fault proxy, so that the proxy's
record holds exactly the provider's calls.
"""

from __future__ import annotations

import base64
import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import boto3
import pytest
from botocore.exceptions import ClientError

from provisioners import aws
from provisioners.aws import AwsPoolConfig, AwsProvider, classify_error
from provisioners.aws import provider as aws_provider
from provisioners.base import (
    MANAGED_BY_VALUE,
    TAG_CAPACITY,
    TAG_CLUSTER,
    TAG_LAUNCH_ID,
    TAG_MANAGED_BY,
    TAG_MASTER,
    TAG_POOL,
    CloudState,
    ErrorKind,
    ErrorScope,
    LaunchChoice,
    LaunchSpec,
    ProviderError,
)
from shipyard_common.settings import SettingsError

if TYPE_CHECKING:
    from tests.provisioners.conftest import Ec2FaultProxy

REGION = "us-east-1"
CLUSTER = "c-test"
POOL = "gpu"
MASTER = "https://master.example:8080"
SECRET = "agent-token-s3cr3t-do-not-log"

integration = pytest.mark.integration


@dataclass(frozen=True)
class Net:
    session: boto3.Session
    moto_url: str
    vpc_id: str
    subnet_a: str
    subnet_b: str
    security_group: str
    image_id: str
    root_device_name: str
    instance_profile: str
    key_name: str


def _client(session: boto3.Session, url: str, service: str = "ec2") -> Any:
    return session.client(service, region_name=REGION, endpoint_url=url)


@pytest.fixture(scope="session")
def xvda_image(moto_server: str, aws_session: boto3.Session) -> tuple[str, str]:
    """An Amazon Linux style AMI from moto's built-in set: its root device is /dev/xvda, not moto's
    default /dev/sda1, so the root volume mapping only lands on the root device if the provider
    looked the name up. Listing every AMI is slow and the set survives a reset: look once."""
    images = _client(aws_session, moto_server).describe_images()["Images"]
    image = next(i for i in images if i.get("RootDeviceName") == "/dev/xvda")
    return image["ImageId"], image["RootDeviceName"]


@pytest.fixture
def net(
    ec2_faults: Ec2FaultProxy, moto_reset: str, aws_session: boto3.Session, xvda_image: tuple[str, str]
) -> Net:
    ec2 = _client(aws_session, moto_reset)
    vpc_id = ec2.create_vpc(CidrBlock="10.10.0.0/16")["Vpc"]["VpcId"]
    subnet_a = ec2.create_subnet(VpcId=vpc_id, CidrBlock="10.10.1.0/24", AvailabilityZone="us-east-1a")
    subnet_b = ec2.create_subnet(VpcId=vpc_id, CidrBlock="10.10.2.0/24", AvailabilityZone="us-east-1b")
    sg = ec2.create_security_group(GroupName="shipyard-agents", Description="agents", VpcId=vpc_id)
    _client(aws_session, moto_reset, "iam").create_instance_profile(InstanceProfileName="shipyard-agent")
    ec2.create_key_pair(KeyName="ops")
    return Net(
        session=aws_session,
        moto_url=moto_reset,
        vpc_id=vpc_id,
        subnet_a=subnet_a["Subnet"]["SubnetId"],
        subnet_b=subnet_b["Subnet"]["SubnetId"],
        security_group=sg["GroupId"],
        image_id=xvda_image[0],
        root_device_name=xvda_image[1],
        instance_profile="shipyard-agent",
        key_name="ops",
    )


def _config(net: Net, proxy: Ec2FaultProxy, **overrides: Any) -> AwsPoolConfig:
    data: dict[str, Any] = {
        "region": REGION,
        "image_id": net.image_id,
        "instance_type": "g4dn.12xlarge",
        "subnet_ids": [net.subnet_a, net.subnet_b],
        "security_group_ids": [net.security_group],
        "iam_instance_profile": net.instance_profile,
        "ssh_key_name": net.key_name,
        "root_volume_size_gb": 150,
        "tags": {"team": "ml-infra", "cost-center": "42"},
        "endpoint_url": proxy.url,
    }
    data.update(overrides)
    return AwsPoolConfig.from_dict(data)


def _provider(
    net: Net,
    proxy: Ec2FaultProxy,
    *,
    pool: str = POOL,
    cluster: str = CLUSTER,
    max_attempts: int = 4,
    **cfg: Any,
) -> AwsProvider:
    return AwsProvider(
        _config(net, proxy, **cfg),
        cluster_id=cluster,
        pool=pool,
        master_url=MASTER,
        session=net.session,
        max_attempts=max_attempts,
        call_timeout_s=10,
        backoff_base_s=0.001,  # keep the jittered backoff real but short
        backoff_max_s=0.01,
    )


def _spec(launch_id: str) -> LaunchSpec:
    return LaunchSpec(launch_id=launch_id, user_data=f"#cloud-config\nwrite_files: [{{content: {SECRET}}}]\n")


def _describe(net: Net, instance_id: str) -> dict[str, Any]:
    return _client(net.session, net.moto_url).describe_instances(InstanceIds=[instance_id])["Reservations"][
        0
    ]["Instances"][0]


def _run_calls(proxy: Ec2FaultProxy) -> list[dict[str, str]]:
    return [c.params for c in proxy.calls("RunInstances")]


# --- launch ---------------------------------------------------------------------------------


@integration
def test_launch_tags_user_data_imdsv2_shutdown_and_root_volume(net: Net, ec2_faults: Ec2FaultProxy) -> None:
    provider = _provider(net, ec2_faults)

    result = provider.launch([_spec("launch-1"), _spec("launch-2")])

    assert result.error is None
    assert [i.launch_id for i in result.launched] == ["launch-1", "launch-2"]
    ec2 = _client(net.session, net.moto_url)
    for launched in result.launched:
        assert launched.state in (CloudState.PENDING, CloudState.RUNNING)
        assert launched.location == net.subnet_a
        assert launched.instance_type == "g4dn.12xlarge"
        assert launched.spot is False
        assert launched.private_ip and launched.private_ip.startswith("10.10.1.")
        assert launched.launched_at.tzinfo is not None

        raw = _describe(net, launched.id)
        tags = {t["Key"]: t["Value"] for t in raw["Tags"]}
        assert tags == {
            "Name": f"shipyard-{CLUSTER}-{POOL}",
            TAG_MANAGED_BY: MANAGED_BY_VALUE,
            TAG_CLUSTER: CLUSTER,
            TAG_POOL: POOL,
            TAG_MASTER: MASTER,
            TAG_LAUNCH_ID: launched.launch_id,
            TAG_CAPACITY: "on-demand",
            "team": "ml-infra",
            "cost-center": "42",
        }
        assert launched.tags == tags
        assert raw["MetadataOptions"]["HttpTokens"] == "required"
        assert raw["MetadataOptions"]["HttpEndpoint"] == "enabled"
        assert raw["SubnetId"] == net.subnet_a
        assert [g["GroupId"] for g in raw["NetworkInterfaces"][0]["Groups"]] == [net.security_group]
        assert raw["IamInstanceProfile"]["Arn"].endswith(f"instance-profile/{net.instance_profile}")
        assert raw["KeyName"] == net.key_name
        assert "InstanceLifecycle" not in raw

        user_data = ec2.describe_instance_attribute(InstanceId=launched.id, Attribute="userData")
        assert base64.b64decode(user_data["UserData"]["Value"]).decode() == _spec("x").user_data
        shutdown = ec2.describe_instance_attribute(
            InstanceId=launched.id, Attribute="instanceInitiatedShutdownBehavior"
        )
        assert shutdown["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"

        # Exactly one volume, the root one, resized, gp3, deleted with the instance, and tagged.
        assert [(m["DeviceName"], m["Ebs"]["DeleteOnTermination"]) for m in raw["BlockDeviceMappings"]] == [
            (net.root_device_name, True)
        ]
        volume = ec2.describe_volumes(VolumeIds=[raw["BlockDeviceMappings"][0]["Ebs"]["VolumeId"]])[
            "Volumes"
        ][0]
        assert (volume["Size"], volume["VolumeType"]) == (150, "gp3")
        assert {t["Key"]: t["Value"] for t in volume["Tags"]} == tags

    # One RunInstances per spec, each with its launch id as ClientToken.
    assert [(p["ClientToken"], p["MinCount"], p["MaxCount"]) for p in _run_calls(ec2_faults)] == [
        ("launch-1", "1", "1"),
        ("launch-2", "1", "1"),
    ]
    # The root device name was looked up once, not per launch.
    assert len(ec2_faults.calls("DescribeImages")) == 1


@integration
def test_spot_launch_requests_one_time_spot_with_max_price(net: Net, ec2_faults: Ec2FaultProxy) -> None:
    provider = _provider(net, ec2_faults, spot=True, spot_max_price=0.9)

    result = provider.launch([_spec("spot-1")])

    assert result.error is None
    (instance,) = result.launched
    assert instance.spot is True
    assert _describe(net, instance.id)["InstanceLifecycle"] == "spot"
    (params,) = _run_calls(ec2_faults)
    assert {k: v for k, v in params.items() if k.startswith("InstanceMarketOptions")} == {
        "InstanceMarketOptions.MarketType": "spot",
        "InstanceMarketOptions.SpotOptions.SpotInstanceType": "one-time",
        "InstanceMarketOptions.SpotOptions.InstanceInterruptionBehavior": "terminate",
        "InstanceMarketOptions.SpotOptions.MaxPrice": "0.9",
    }
    assert [i.spot for i in provider.list()] == [True]


@integration
def test_launch_into_default_vpc_without_subnets(net: Net, ec2_faults: Ec2FaultProxy) -> None:
    provider = _provider(net, ec2_faults, subnet_ids=None, security_group_ids=None)

    result = provider.launch([_spec("default-vpc")])

    assert result.error is None
    assert "SubnetId" not in _run_calls(ec2_faults)[0]
    assert result.launched[0].location  # moto's default subnet


@integration
def test_user_data_is_never_logged(
    net: Net, ec2_faults: Ec2FaultProxy, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=aws.__name__)
    ec2_faults.inject("RunInstances", "RequestLimitExceeded", times=1)
    ec2_faults.inject(
        "RunInstances", "InsufficientInstanceCapacity", when={"SubnetId": net.subnet_a}, times=None
    )

    result = _provider(net, ec2_faults).launch([_spec("log-1")])

    (instance,) = result.launched
    lines = [r.getMessage() for r in caplog.records if r.name == aws.__name__]
    assert any("event=aws_call_retry" in line and "code=RequestLimitExceeded" in line for line in lines)
    assert any("event=aws_launch_subnet_failover" in line for line in lines)
    assert any(
        f"instance_id={instance.id}" in line and f"pool={POOL}" in line and "launch_id=log-1" in line
        for line in lines
    )
    encoded = base64.b64encode(_spec("log-1").user_data.encode()).decode()
    assert all(SECRET not in line and encoded not in line for line in lines)


@integration
def test_same_launch_id_twice_makes_one_instance(net: Net, ec2_faults: Ec2FaultProxy) -> None:
    provider = _provider(net, ec2_faults)

    first = provider.launch([_spec("once")])
    second = provider.launch([_spec("once")])

    assert first.error is None and second.error is None
    assert first.launched[0].id == second.launched[0].id
    assert [i.id for i in provider.list()] == [first.launched[0].id]
    assert [p["ClientToken"] for p in _run_calls(ec2_faults)] == ["once", "once"]


@integration
def test_lost_response_is_retried_with_the_same_client_token(net: Net, ec2_faults: Ec2FaultProxy) -> None:
    # The first call starts the instance but its answer is an InternalError: the retry must get the
    # same instance back, not start a second one.
    ec2_faults.inject("RunInstances", "InternalError", times=1, after_forward=True)
    provider = _provider(net, ec2_faults)

    result = provider.launch([_spec("lost-answer")])

    assert result.error is None
    calls = ec2_faults.calls("RunInstances")
    assert [(c.faulted, c.replayed, c.params["ClientToken"]) for c in calls] == [
        (True, False, "lost-answer"),
        (False, True, "lost-answer"),
    ]
    assert [i.id for i in provider.list()] == [result.launched[0].id]


# --- list -----------------------------------------------------------------------------------


@integration
def test_list_returns_only_this_cluster_and_pool(
    net: Net, ec2_faults: Ec2FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    ours = _provider(net, ec2_faults)
    mine = ours.launch([_spec(f"mine-{n}") for n in range(5)]).launched
    other_pool = _provider(net, ec2_faults, pool="cpu", instance_slots=8).launch([_spec("cpu-1")])
    other_cluster = _provider(net, ec2_faults, cluster="c-other").launch([_spec("other-1")])
    assert other_pool.error is None and other_cluster.error is None
    ec2 = _client(net.session, net.moto_url)
    # A foreign instance that happens to carry our pool tag but not our cluster, and an untagged one.
    ec2.run_instances(
        ImageId=net.image_id,
        InstanceType="t3.micro",
        MinCount=1,
        MaxCount=1,
        TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": TAG_POOL, "Value": POOL}]}],
    )
    ec2.run_instances(ImageId=net.image_id, InstanceType="t3.micro", MinCount=1, MaxCount=1)
    # One of ours already terminated: not listed.
    ec2.terminate_instances(InstanceIds=[mine[0].id])
    ec2.stop_instances(InstanceIds=[mine[1].id])
    # Small pages, so that the listing has to follow NextToken.
    monkeypatch.setattr(aws_provider, "DESCRIBE_PAGE_SIZE", 2)

    listed = ours.list()

    assert sorted(i.id for i in listed) == sorted(i.id for i in mine[1:])
    by_id = {i.id: i for i in listed}
    assert by_id[mine[1].id].state is CloudState.STOPPED  # stopped by hand: still ours to clean
    for launched in mine[2:]:
        got = by_id[launched.id]
        assert got.launch_id == launched.launch_id
        assert got.state in (CloudState.PENDING, CloudState.RUNNING)
        assert got.location == net.subnet_a
        assert got.private_ip == launched.private_ip
        assert got.tags[TAG_MASTER] == MASTER
        assert got.spot is False
        assert isinstance(got.launched_at, datetime) and got.launched_at.tzinfo is not None
    assert len(ec2_faults.calls("DescribeInstances")) >= 2  # paginated


# --- terminate ------------------------------------------------------------------------------


@integration
def test_terminate_is_idempotent_and_skips_unknown_ids(
    net: Net, ec2_faults: Ec2FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider = _provider(net, ec2_faults)
    ids = [i.id for i in provider.launch([_spec(f"t-{n}") for n in range(5)]).launched]
    monkeypatch.setattr(aws_provider, "TERMINATE_CHUNK", 2)

    provider.terminate(ids[:2])
    assert sorted(i.id for i in provider.list()) == sorted(ids[2:])

    # Again, plus an id AWS has never heard of, plus a duplicate: no error, the rest goes.
    unknown = "i-0123456789abcdef0"
    ec2_faults.clear()
    provider.terminate([*ids[:2], unknown, ids[2], ids[3], ids[3]])
    assert sorted(i.id for i in provider.list()) == [ids[4]]
    calls = [c.params for c in ec2_faults.calls("TerminateInstances")]
    sent = [sorted(v for k, v in p.items() if k.startswith("InstanceId.")) for p in calls]
    # Chunks of 2 from [a, b, unknown, c, d]; the chunk with the unknown id is sent again without it.
    assert sent == [sorted(ids[:2]), sorted([unknown, ids[2]]), [ids[2]], [ids[3]]]

    provider.terminate([])
    assert len(ec2_faults.calls("TerminateInstances")) == 4


@integration
def test_terminate_retries_throttling_then_gives_up(net: Net, ec2_faults: Ec2FaultProxy) -> None:
    provider = _provider(net, ec2_faults, max_attempts=3)
    (instance,) = provider.launch([_spec("throttled-terminate")]).launched

    ec2_faults.inject("TerminateInstances", "RequestLimitExceeded", times=2)
    provider.terminate([instance.id])
    assert provider.list() == []
    assert [c.faulted for c in ec2_faults.calls("TerminateInstances")] == [True, True, False]

    ec2_faults.inject("TerminateInstances", "RequestLimitExceeded", times=None)
    with pytest.raises(ProviderError) as info:
        provider.terminate([instance.id])
    assert info.value.kind is ErrorKind.THROTTLED
    assert len(ec2_faults.calls("TerminateInstances")) == 3 + 3


@integration
def test_a_stopped_instance_is_listed_as_stopped_and_terminated(net: Net, ec2_faults: Ec2FaultProxy) -> None:
    provider = _provider(net, ec2_faults)
    (instance,) = provider.launch([_spec("stopped-by-hand")]).launched
    _client(net.session, net.moto_url).stop_instances(InstanceIds=[instance.id])

    [listed] = provider.list()
    assert (listed.id, listed.state) == (instance.id, CloudState.STOPPED)
    provider.terminate([instance.id])
    assert provider.list() == []
    assert _describe(net, instance.id)["State"]["Name"] == "terminated"


# --- describe by id -------------------------------------------------------------------------


@integration
def test_describe_by_id_says_terminated_or_unknown(net: Net, ec2_faults: Ec2FaultProxy) -> None:
    provider = _provider(net, ec2_faults)
    running, ended = provider.launch([_spec("d-1"), _spec("d-2")]).launched
    provider.terminate([ended.id])
    unknown = "i-0123456789abcdef0"

    found = provider.describe([running.id, ended.id, unknown])

    assert set(found) == {running.id, ended.id, unknown}
    assert found[running.id] is not None and found[running.id].state in (CloudState.PENDING, CloudState.RUNNING)
    assert found[running.id].launch_id == "d-1"
    assert found[ended.id] is not None and found[ended.id].state is CloudState.TERMINATED
    assert found[unknown] is None
    # The unknown id is named by AWS and dropped; the rest is described again without it.
    sent = [sorted(v for k, v in c.params.items() if k.startswith("InstanceId.")) for c in
            ec2_faults.calls("DescribeInstances") if any(k.startswith("InstanceId.") for k in c.params)]
    assert sent == [sorted([running.id, ended.id, unknown]), sorted([running.id, ended.id])]


@integration
def test_describe_retries_throttling_and_reports_auth_errors(net: Net, ec2_faults: Ec2FaultProxy) -> None:
    provider = _provider(net, ec2_faults, max_attempts=3)
    (instance,) = provider.launch([_spec("d-throttled")]).launched
    ec2_faults.inject("DescribeInstances", "RequestLimitExceeded", times=2)
    assert provider.describe([instance.id])[instance.id] is not None

    ec2_faults.inject("DescribeInstances", "UnauthorizedOperation", times=None)
    with pytest.raises(ProviderError) as info:
        provider.describe([instance.id])
    assert info.value.kind is ErrorKind.AUTH


# --- instance slots -------------------------------------------------------------------------


@integration
def test_instance_slots_from_describe_instance_types(net: Net, ec2_faults: Ec2FaultProxy) -> None:
    # moto's instance type data: g4dn.12xlarge has 4 T4 GPUs (p3.8xlarge is not in moto 5.2.5's data).
    provider = _provider(net, ec2_faults, instance_type="g4dn.12xlarge")
    assert provider.resolve_instance_slots() == 4
    assert provider.resolve_instance_slots() == 4
    assert len(ec2_faults.calls("DescribeInstanceTypes")) == 1  # cached

    assert _provider(net, ec2_faults, instance_type="p4d.24xlarge").resolve_instance_slots() == 8


@integration
def test_instance_slots_explicit_wins_without_asking_aws(net: Net, ec2_faults: Ec2FaultProxy) -> None:
    provider = _provider(net, ec2_faults, instance_type="m5.large", instance_slots=2)
    assert provider.resolve_instance_slots() == 2
    assert ec2_faults.calls("DescribeInstanceTypes") == []


@integration
@pytest.mark.parametrize(
    ("instance_type", "code"),
    [("m5.large", "NoGpus"), ("zz9.plural", "InvalidInstanceType")],
)
def test_instance_slots_config_errors(
    net: Net, ec2_faults: Ec2FaultProxy, instance_type: str, code: str
) -> None:
    provider = _provider(net, ec2_faults, instance_type=instance_type)
    with pytest.raises(ProviderError) as info:
        provider.resolve_instance_slots()
    assert (info.value.kind, info.value.code) == (ErrorKind.INVALID, code)
    assert instance_type in str(info.value)


# --- injected errors ------------------------------------------------------------------------


@integration
def test_capacity_in_first_subnet_fails_over_to_second(net: Net, ec2_faults: Ec2FaultProxy) -> None:
    ec2_faults.inject(
        "RunInstances", "InsufficientInstanceCapacity", when={"SubnetId": net.subnet_a}, times=None
    )
    provider = _provider(net, ec2_faults)

    result = provider.launch([_spec("fo-1"), _spec("fo-2")])

    assert result.error is None
    assert [i.location for i in result.launched] == [net.subnet_b, net.subnet_b]
    assert {_describe(net, i.id)["Placement"]["AvailabilityZone"] for i in result.launched} == {"us-east-1b"}
    # The second spec goes straight to the subnet that worked; each attempt kept its launch id.
    assert [(p["SubnetId"], p["ClientToken"]) for p in _run_calls(ec2_faults)] == [
        (net.subnet_a, "fo-1"),
        (net.subnet_b, "fo-1"),
        (net.subnet_b, "fo-2"),
    ]


@integration
def test_capacity_in_every_subnet_returns_what_launched(net: Net, ec2_faults: Ec2FaultProxy) -> None:
    ec2_faults.inject(
        "RunInstances", "InsufficientInstanceCapacity", when={"SubnetId": net.subnet_a}, times=None
    )
    # The second subnet has room for exactly one instance.
    ec2_faults.inject(
        "RunInstances", "InsufficientInstanceCapacity", when={"SubnetId": net.subnet_b}, times=None, skip=1
    )
    provider = _provider(net, ec2_faults)

    result = provider.launch([_spec("all-1"), _spec("all-2"), _spec("all-3")])

    assert [i.launch_id for i in result.launched] == ["all-1"]
    assert result.error is not None
    assert result.error.kind is ErrorKind.CAPACITY
    assert result.error.scope is ErrorScope.REGION
    assert result.error.code == "InsufficientInstanceCapacity"
    assert net.subnet_a in result.error.location and net.subnet_b in result.error.location
    assert [i.id for i in provider.list()] == [result.launched[0].id]
    assert len(_run_calls(ec2_faults)) == 3  # a, b (ok), b (full): no going back, no third spec


@integration
def test_quota_error_stops_the_launch(net: Net, ec2_faults: Ec2FaultProxy) -> None:
    ec2_faults.inject("RunInstances", "VcpuLimitExceeded", times=None)
    provider = _provider(net, ec2_faults)

    result = provider.launch([_spec("q-1"), _spec("q-2")])

    assert result.launched == ()
    assert result.error is not None
    assert (result.error.kind, result.error.code) == (ErrorKind.QUOTA, "VcpuLimitExceeded")
    assert len(_run_calls(ec2_faults)) == 1  # neither retried nor moved to another subnet


@integration
def test_throttling_is_retried_until_it_passes(net: Net, ec2_faults: Ec2FaultProxy) -> None:
    ec2_faults.inject("RunInstances", "RequestLimitExceeded", times=2)
    provider = _provider(net, ec2_faults)

    result = provider.launch([_spec("thr-1")])

    assert result.error is None
    assert len(result.launched) == 1
    calls = ec2_faults.calls("RunInstances")
    assert [(c.faulted, c.params["ClientToken"], c.params["SubnetId"]) for c in calls] == [
        (True, "thr-1", net.subnet_a),
        (True, "thr-1", net.subnet_a),
        (False, "thr-1", net.subnet_a),
    ]


@integration
def test_throttling_forever_gives_up_after_bounded_attempts(net: Net, ec2_faults: Ec2FaultProxy) -> None:
    ec2_faults.inject("RunInstances", "RequestLimitExceeded", times=None)
    provider = _provider(net, ec2_faults, max_attempts=4)

    result = provider.launch([_spec("thr-forever-1"), _spec("thr-forever-2")])

    assert result.launched == ()
    assert result.error is not None
    assert (result.error.kind, result.error.code) == (ErrorKind.THROTTLED, "RequestLimitExceeded")
    # Exactly max_attempts HTTP requests: botocore does not retry underneath tenacity.
    assert len(_run_calls(ec2_faults)) == 4
    assert provider.list() == []


@integration
def test_auth_error_stops_the_launch(net: Net, ec2_faults: Ec2FaultProxy) -> None:
    ec2_faults.inject("RunInstances", "UnauthorizedOperation", times=None)

    result = _provider(net, ec2_faults).launch([_spec("auth-1")])

    assert result.error is not None
    assert (result.error.kind, result.error.scope) == (ErrorKind.AUTH, ErrorScope.CLOUD)
    assert len(_run_calls(ec2_faults)) == 1


@integration
@pytest.mark.parametrize(
    ("overrides", "code"),
    [
        ({"subnet_ids": ["subnet-00000000deadbeef0"]}, "InvalidSubnetID.NotFound"),
        ({"security_group_ids": ["sg-00000000deadbeef0"]}, "InvalidGroup.NotFound"),
        ({"image_id": "ami-00000000deadbeef0"}, "InvalidAMIID.NotFound"),
    ],
)
def test_bad_references_are_invalid(
    net: Net, ec2_faults: Ec2FaultProxy, overrides: dict[str, Any], code: str
) -> None:
    # Real moto errors, not injected ones.
    result = _provider(net, ec2_faults, **overrides).launch([_spec("bad-1"), _spec("bad-2")])

    assert result.launched == ()
    assert result.error is not None
    assert (result.error.kind, result.error.code) == (ErrorKind.INVALID, code)
    assert len(_run_calls(ec2_faults)) <= 1


def test_launch_id_longer_than_a_client_token_is_invalid() -> None:
    cfg = AwsPoolConfig.from_dict(
        {
            "region": REGION,
            "image_id": "ami-1",
            "instance_type": "g5.xlarge",
            "root_device_name": "/dev/xvda",
            "endpoint_url": "http://127.0.0.1:9",
        }
    )
    session = boto3.Session(region_name=REGION, aws_access_key_id="x", aws_secret_access_key="x")
    provider = AwsProvider(cfg, cluster_id=CLUSTER, pool=POOL, master_url=MASTER, session=session)
    result = provider.launch([LaunchSpec(launch_id="x" * 65, user_data="")])
    assert result.error is not None and result.error.kind is ErrorKind.INVALID


# --- error classification (pure) ------------------------------------------------------------


def _client_error(code: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": f"msg for {code}"}}, "RunInstances")


@pytest.mark.parametrize(
    ("code", "kind", "scope"),
    [
        ("InsufficientInstanceCapacity", ErrorKind.CAPACITY, ErrorScope.ZONE),
        ("InsufficientHostCapacity", ErrorKind.CAPACITY, ErrorScope.ZONE),
        ("Unsupported", ErrorKind.CAPACITY, ErrorScope.ZONE),
        ("InsufficientFreeAddressesInSubnet", ErrorKind.CAPACITY, ErrorScope.ZONE),
        ("VcpuLimitExceeded", ErrorKind.QUOTA, ErrorScope.REGION),
        ("InstanceLimitExceeded", ErrorKind.QUOTA, ErrorScope.REGION),
        ("MaxSpotInstanceCountExceeded", ErrorKind.QUOTA, ErrorScope.REGION),
        ("RequestLimitExceeded", ErrorKind.THROTTLED, ErrorScope.REGION),
        ("Throttling", ErrorKind.THROTTLED, ErrorScope.REGION),
        ("ThrottlingException", ErrorKind.THROTTLED, ErrorScope.REGION),
        ("AuthFailure", ErrorKind.AUTH, ErrorScope.CLOUD),
        ("UnauthorizedOperation", ErrorKind.AUTH, ErrorScope.CLOUD),
        ("InvalidClientTokenId", ErrorKind.AUTH, ErrorScope.CLOUD),
        ("SignatureDoesNotMatch", ErrorKind.AUTH, ErrorScope.CLOUD),
        ("InvalidAMIID.NotFound", ErrorKind.INVALID, ErrorScope.REGION),
        ("InvalidAMIID.Malformed", ErrorKind.INVALID, ErrorScope.REGION),
        ("InvalidParameterValue", ErrorKind.INVALID, ErrorScope.REGION),
        ("InvalidGroup.NotFound", ErrorKind.INVALID, ErrorScope.REGION),
        ("InvalidSubnetID.NotFound", ErrorKind.INVALID, ErrorScope.ZONE),
        ("IdempotentParameterMismatch", ErrorKind.INVALID, ErrorScope.REGION),
        ("InternalError", ErrorKind.UNKNOWN, ErrorScope.REGION),
        ("SomethingNew", ErrorKind.UNKNOWN, ErrorScope.REGION),
    ],
)
def test_classify_error(code: str, kind: ErrorKind, scope: ErrorScope) -> None:
    err = classify_error(_client_error(code), "subnet-1")
    assert (err.kind, err.scope, err.code, err.location) == (kind, scope, code, "subnet-1")
    assert f"msg for {code}" in str(err)


# --- config (pure) --------------------------------------------------------------------------

_VALID = {"region": REGION, "image_id": "ami-1", "instance_type": "g5.xlarge"}


def test_config_defaults() -> None:
    cfg = AwsPoolConfig.from_dict(_VALID)
    assert cfg.subnet_ids is None  # default VPC
    assert cfg.security_group_ids == ()
    assert (cfg.root_volume_size_gb, cfg.spot, cfg.spot_max_price, cfg.instance_slots) == (
        100,
        False,
        None,
        None,
    )
    assert dict(cfg.tags) == {}


def test_config_full() -> None:
    cfg = AwsPoolConfig.from_dict(
        {
            **_VALID,
            "instance_slots": 2,
            "subnet_ids": ["subnet-a", "subnet-b"],
            "security_group_ids": ["sg-1"],
            "iam_instance_profile": "arn:aws:iam::123456789012:instance-profile/agent",
            "ssh_key_name": "ops",
            "root_volume_size_gb": 500,
            "spot": True,
            "spot_max_price": "1.25",
            "tags": {"team": "ml"},
            "endpoint_url": "http://localhost:5000",
        }
    )
    assert cfg.subnet_ids == ("subnet-a", "subnet-b")
    assert cfg.spot_max_price == "1.25"


@pytest.mark.parametrize(
    ("overrides", "path", "reason"),
    [
        ({"region": None}, "region", "must not be null"),
        ({"image_id": ""}, "image_id", "non-empty string"),
        ({"subnet_ids": []}, "subnet_ids", "must not be empty"),
        ({"subnet_ids": "subnet-a"}, "subnet_ids", "list of strings"),
        ({"subnet_ids": ["subnet-a", "subnet-a"]}, "subnet_ids[1]", "duplicate"),
        ({"instance_slots": 0}, "instance_slots", "between 1 and"),
        ({"instance_slots": True}, "instance_slots", "integer"),
        ({"root_volume_size_gb": "100"}, "root_volume_size_gb", "integer"),
        ({"spot": "yes"}, "spot", "true or false"),
        ({"spot_max_price": "0.5"}, "spot_max_price", "spot pools"),
        ({"spot": True, "spot_max_price": "cheap"}, "spot_max_price", "price"),
        ({"spot": True, "spot_max_price": -1}, "spot_max_price", "positive"),
        ({"tags": {"shipyard:pool": "x"}}, "tags['shipyard:pool']", "reserved"),
        ({"tags": {"aws:foo": "x"}}, "tags['aws:foo']", "reserved"),
        ({"tags": {"k": 1}}, "tags.k", "tag value"),
        ({"endpoint_url": "localhost:5000"}, "endpoint_url", "http://"),
        ({"image_id": "resolve:ssm:/aws/service/ami"}, "root_device_name", "SSM"),
        ({"subnets": ["subnet-a"]}, "subnets", "unknown field"),
    ],
)
def test_config_errors(overrides: dict[str, Any], path: str, reason: str) -> None:
    with pytest.raises(SettingsError) as info:
        AwsPoolConfig.from_dict({**_VALID, **overrides})
    assert any(p == path and reason in r for p, r in info.value.problems), info.value.problems
    assert path in str(info.value)


def test_config_reports_every_problem_at_once() -> None:
    with pytest.raises(SettingsError) as info:
        AwsPoolConfig.from_dict({"subnet_ids": [], "spot": 1})
    paths = {p for p, _ in info.value.problems}
    assert {"region", "image_id", "instance_type", "subnet_ids", "spot"} <= paths


# --- capacity memory across batches (issue 10, item 7) ----------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


def _three_subnets(net: Net) -> str:
    ec2 = _client(net.session, net.moto_url)
    return ec2.create_subnet(VpcId=net.vpc_id, CidrBlock="10.10.3.0/24", AvailabilityZone="us-east-1c")["Subnet"][
        "SubnetId"]


def _cooling_provider(net: Net, proxy: Ec2FaultProxy, clock: _Clock, **cfg: Any) -> AwsProvider:
    return AwsProvider(_config(net, proxy, **cfg), cluster_id=CLUSTER, pool=POOL, master_url=MASTER,
                       session=net.session, call_timeout_s=10, backoff_base_s=0.001, backoff_max_s=0.01, clock=clock)


@integration
def test_exhausted_subnets_are_skipped_by_later_batches_until_their_cooldown_ends(
        net: Net, ec2_faults: Ec2FaultProxy) -> None:
    subnet_c = _three_subnets(net)
    for subnet in (net.subnet_a, net.subnet_b):
        ec2_faults.inject("RunInstances", "InsufficientInstanceCapacity", when={"SubnetId": subnet}, times=None)
    clock = _Clock()
    provider = _cooling_provider(net, ec2_faults, clock, subnet_ids=[net.subnet_a, net.subnet_b, subnet_c])

    first = provider.launch([_spec("cd-1")])
    assert first.error is None and [i.location for i in first.launched] == [subnet_c]
    assert [p["SubnetId"] for p in _run_calls(ec2_faults)] == [net.subnet_a, net.subnet_b, subnet_c]
    cooling = provider.capacity_cooldowns()
    assert sorted((c.location, c.instance_type, c.code) for c in cooling) == sorted([
        (net.subnet_a, "g4dn.12xlarge", "InsufficientInstanceCapacity"),
        (net.subnet_b, "g4dn.12xlarge", "InsufficientInstanceCapacity")])
    assert all(c.until == clock.now + timedelta(minutes=10) for c in cooling)  # the default cool-down

    # The next batch calls RunInstances on subnet c only: no wasted calls on a and b.
    ec2_faults.clear()
    for subnet in (net.subnet_a, net.subnet_b):
        ec2_faults.inject("RunInstances", "InsufficientInstanceCapacity", when={"SubnetId": subnet}, times=None)
    clock.now += timedelta(minutes=5)
    second = provider.launch([_spec("cd-2"), _spec("cd-3")])
    assert second.error is None and len(second.launched) == 2
    assert [p["SubnetId"] for p in _run_calls(ec2_faults)] == [subnet_c, subnet_c]

    # After the cool-down, subnet a is asked again first (and still full: it cools down again).
    ec2_faults.clear()
    ec2_faults.inject("RunInstances", "InsufficientInstanceCapacity", when={"SubnetId": net.subnet_a}, times=None)
    clock.now += timedelta(minutes=6)
    third = provider.launch([_spec("cd-4")])
    assert third.error is None
    assert [p["SubnetId"] for p in _run_calls(ec2_faults)] == [net.subnet_a, net.subnet_b]
    assert [c.location for c in provider.capacity_cooldowns()] == [net.subnet_a]


@integration
def test_every_subnet_cooling_fails_the_batch_with_capacity_without_a_call(
        net: Net, ec2_faults: Ec2FaultProxy) -> None:
    ec2_faults.inject("RunInstances", "InsufficientInstanceCapacity", times=None)
    clock = _Clock()
    provider = _cooling_provider(net, ec2_faults, clock, capacity_cooldown_s=120)
    assert provider.launch([_spec("all-1")]).error is not None
    ec2_faults.clear()

    result = provider.launch([_spec("all-2"), _spec("all-3")])

    assert result.launched == ()
    assert result.error is not None and result.error.kind is ErrorKind.CAPACITY
    assert result.error.scope is ErrorScope.REGION  # the pool's launch backoff takes over
    assert "cooling down" in str(result.error) and net.subnet_a in str(result.error)
    assert _run_calls(ec2_faults) == []
    clock.now += timedelta(seconds=121)
    assert provider.capacity_cooldowns() == []


@integration
def test_quota_error_is_labelled_with_its_region(net: Net, ec2_faults: Ec2FaultProxy) -> None:
    ec2_faults.inject("RunInstances", "VcpuLimitExceeded", times=None)
    provider = _provider(net, ec2_faults)

    result = provider.launch([_spec("qr-1")])

    assert result.error is not None
    assert (result.error.scope, result.error.location) == (ErrorScope.REGION, REGION)
    assert str(result.error).startswith(f"quota (VcpuLimitExceeded) in region {REGION}: ")
    assert provider.capacity_cooldowns() == []  # a quota is not a subnet's capacity


# --- several instance types and capacities (issue 28) -----------------------------------------


def _typed(launch_id: str, *choices: tuple[str, bool]) -> LaunchSpec:
    return LaunchSpec(launch_id, _spec(launch_id).user_data, tuple(LaunchChoice(t, s) for t, s in choices))


@integration
def test_two_types_launch_as_chosen_each_in_its_capacity(net: Net, ec2_faults: Ec2FaultProxy) -> None:
    provider = _provider(net, ec2_faults, instance_type=None, instance_types=["g4dn.xlarge", "g5.xlarge"],
                         capacity="spot-then-on-demand")
    assert provider.resolve_instance_slots() == 1
    assert {(o.instance_type, o.spot) for o in provider.offers()} == {
        ("g4dn.xlarge", True), ("g4dn.xlarge", False), ("g5.xlarge", True), ("g5.xlarge", False)}

    result = provider.launch([_typed("t-1", ("g4dn.xlarge", True)), _typed("t-2", ("g5.xlarge", False))])

    assert result.error is None
    assert [(i.launch_id, i.instance_type, i.spot) for i in result.launched] == [
        ("t-1", "g4dn.xlarge", True), ("t-2", "g5.xlarge", False)]
    for launched in result.launched:
        tags = {t["Key"]: t["Value"] for t in _describe(net, launched.id)["Tags"]}
        assert tags[TAG_CAPACITY] == ("spot" if launched.spot else "on-demand")
    assert [c.get("InstanceMarketOptions.MarketType") for c in _run_calls(ec2_faults)] == ["spot", None]


@integration
def test_a_type_out_of_capacity_fails_over_to_the_next_and_is_then_skipped(net: Net,
                                                                           ec2_faults: Ec2FaultProxy) -> None:
    ec2_faults.inject("RunInstances", "InsufficientInstanceCapacity", when={"InstanceType": "g4dn.xlarge"},
                      times=None)
    provider = _provider(net, ec2_faults, instance_type=None, instance_types=["g4dn.xlarge", "g5.xlarge"])
    choices = (("g4dn.xlarge", False), ("g5.xlarge", False))

    first = provider.launch([_typed("f-1", *choices)])

    assert first.error is None and [i.instance_type for i in first.launched] == ["g5.xlarge"]
    # Both subnets were tried for g4dn.xlarge, then g5.xlarge went through in the first.
    assert [(c["InstanceType"], c["SubnetId"]) for c in _run_calls(ec2_faults)] == [
        ("g4dn.xlarge", net.subnet_a), ("g4dn.xlarge", net.subnet_b), ("g5.xlarge", net.subnet_a)]
    assert {(c.location, c.instance_type) for c in provider.capacity_cooldowns()} == {
        (net.subnet_a, "g4dn.xlarge"), (net.subnet_b, "g4dn.xlarge")}
    # Out of capacity in every subnet: the decider plans without it until the cool-downs end.
    assert provider.out_of_capacity() == {LaunchChoice("g4dn.xlarge", False)}

    ec2_faults.clear()
    second = provider.launch([_typed("f-2", *choices)])

    # The type is cooling down in every subnet: no call for it, straight to the next.
    assert [i.instance_type for i in second.launched] == ["g5.xlarge"]
    assert [c["InstanceType"] for c in _run_calls(ec2_faults)] == ["g5.xlarge"]


@integration
def test_spot_then_on_demand_falls_back_when_spot_capacity_fails(net: Net, ec2_faults: Ec2FaultProxy) -> None:
    ec2_faults.inject("RunInstances", "InsufficientInstanceCapacity",
                      when={"InstanceMarketOptions.MarketType": "spot"}, times=None)
    provider = _provider(net, ec2_faults, capacity="spot-then-on-demand")

    # No choices given: the pool's own, cheapest first (spot, then on demand).
    result = provider.launch([_spec("s-1")])

    assert result.error is None
    (inst,) = result.launched
    assert (inst.instance_type, inst.spot) == ("g4dn.12xlarge", False)
    assert [c.get("InstanceMarketOptions.MarketType") for c in _run_calls(ec2_faults)] == ["spot", "spot", None]


@integration
def test_every_choice_out_of_capacity_is_one_capacity_error(net: Net, ec2_faults: Ec2FaultProxy) -> None:
    ec2_faults.inject("RunInstances", "InsufficientInstanceCapacity", times=None)
    provider = _provider(net, ec2_faults, instance_type=None, instance_types=["g4dn.xlarge", "g5.xlarge"])

    result = provider.launch([_typed("x-1", ("g4dn.xlarge", False), ("g5.xlarge", False))])

    assert result.launched == () and result.error is not None
    assert result.error.kind is ErrorKind.CAPACITY
    assert "as any of g4dn.xlarge, g5.xlarge" in str(result.error)


def test_config_types_and_capacity_problems_are_named() -> None:
    base = {"region": REGION, "image_id": "ami-12345678"}
    with pytest.raises(SettingsError) as info:
        AwsPoolConfig.from_dict({**base, "instance_types": ["g4dn.xlarge", "m5.large"], "spot": True,
                                 "capacity": "on-demand"})
    assert dict(info.value.problems) == {
        "capacity": "contradicts spot: true (spot: true means capacity: spot; set one of them)",
        "instance_types[1]": "'m5.large' has no GPUs; a pool of several types takes GPU types (or one type with "
                             "instance_slots)"}
    with pytest.raises(SettingsError) as info:
        AwsPoolConfig.from_dict({**base, "instance_type": "g5.xlarge", "instance_types": ["g5.xlarge"],
                                 "capacity": "cheap"})
    assert {p for p, _ in info.value.problems} == {"instance_types", "capacity"}
    legacy = AwsPoolConfig.from_dict({**base, "instance_type": "g5.xlarge", "spot": True})
    assert legacy.capacity_mode.value == "spot" and legacy.types == ("g5.xlarge",)
