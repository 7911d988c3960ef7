"""Parking (provisioners.base.Parker): the AWS and GCP providers stop an instance keeping its disks
and start it again, through the real SDKs: boto3 against the moto server behind the EC2 fault proxy
(tests/provisioners/conftest.py), google-cloud-compute against the GCE fake (tests/fakes/gce.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from provisioners.aws import AwsPoolConfig, AwsProvider
from provisioners.base import (
    INSTANCE_NOT_FOUND,
    INSTANCE_STILL_STOPPING,
    CloudState,
    ErrorKind,
    ErrorScope,
    ProviderError,
    parker,
)
from provisioners.local import LocalPoolConfig, LocalProvider
from provisioners.static import StaticPoolConfig, StaticProvider
from tests.fakes.gce import GceFake, _op_error, _op_http_error, running_gce_fake
from tests.provisioners import test_aws
from tests.provisioners.test_aws import Net, _describe, _provider, _spec
from tests.provisioners.test_gcp import ZONE_A, ZONE_B, make_provider, specs

if TYPE_CHECKING:
    from tests.provisioners.conftest import Ec2FaultProxy

integration = pytest.mark.integration
# test_aws's fixtures: a VPC with two subnets and an image on the moto server.
net = test_aws.net
xvda_image = test_aws.xvda_image


def _sent_ids(proxy: Ec2FaultProxy, action: str) -> list[list[str]]:
    return [sorted(v for k, v in c.params.items() if k.startswith("InstanceId.")) for c in proxy.calls(action)]


def _state(provider: Any, instance_id: str) -> CloudState | None:
    """The instance's state in a list, checked against a lookup by id: the two must agree."""
    listed = {i.id: i.state for i in provider.list()}.get(instance_id)
    described = provider.describe([instance_id])[instance_id]
    assert listed == (described.state if described is not None else None)
    return listed


# --- which providers park ---------------------------------------------------------------------


def test_parker_is_the_provider_with_stop_and_start(tmp_path: Path) -> None:
    local = LocalProvider(LocalPoolConfig.from_dict({}), cluster_id="c", pool="p", master_url="http://127.0.0.1:9",
                          state_dir=tmp_path)
    key = tmp_path / "key"
    key.write_text("not a key")
    static = StaticProvider(StaticPoolConfig.from_dict({"type": "static", "hosts": [
        {"address": "127.0.0.1", "user": "u", "key_file": str(key), "agent_id": "h1"}]}),
        cluster_id="c", pool="p", master_url="http://127.0.0.1:9")
    assert parker(local) is None and parker(static) is None

    class StopOnly:
        def stop(self, ids: Any) -> None: ...

    assert parker(StopOnly()) is None
    with running_gce_fake() as fake:
        gcp = make_provider(fake)
        assert parker(gcp) is gcp
    aws = AwsProvider(AwsPoolConfig.from_dict({"region": "us-east-1", "image_id": "ami-12345678",
                                               "instance_type": "g4dn.xlarge", "endpoint_url": "http://127.0.0.1:9"}),
                      cluster_id="c", pool="p", master_url="http://127.0.0.1:9")
    assert parker(aws) is aws  # built without a call to AWS


# --- AWS --------------------------------------------------------------------------------------


@integration
def test_aws_stop_keeps_the_disks_and_start_runs_the_instance_again(net: Net, ec2_faults: Ec2FaultProxy) -> None:
    provider = _provider(net, ec2_faults)
    (instance,) = provider.launch([_spec("park-1")]).launched
    volumes = [m["Ebs"]["VolumeId"] for m in _describe(net, instance.id)["BlockDeviceMappings"]]

    found = parker(provider)
    assert found is not None
    found.stop([instance.id])

    assert _sent_ids(ec2_faults, "StopInstances") == [[instance.id]]
    assert _describe(net, instance.id)["State"]["Name"] == "stopped"
    assert _state(provider, instance.id) is CloudState.STOPPED
    assert [m["Ebs"]["VolumeId"] for m in _describe(net, instance.id)["BlockDeviceMappings"]] == volumes

    found.start([instance.id])

    assert _sent_ids(ec2_faults, "StartInstances") == [[instance.id]]
    assert _state(provider, instance.id) in (CloudState.PENDING, CloudState.RUNNING)
    assert _describe(net, instance.id)["State"]["Name"] == "running"
    assert [i.id for i in provider.list()] == [instance.id]  # the same instance, nothing launched


@integration
def test_aws_stop_is_idempotent_and_skips_gone_instances(net: Net, ec2_faults: Ec2FaultProxy) -> None:
    provider = _provider(net, ec2_faults)
    parked, ended = provider.launch([_spec("idem-1"), _spec("idem-2")]).launched
    provider.terminate([ended.id])
    unknown = "i-0123456789abcdef0"

    provider.stop([parked.id, parked.id, ended.id, unknown])
    provider.stop([parked.id])  # already stopped
    provider.stop([])

    # Only the running one was asked to stop, once; the terminated one stays terminated.
    assert _sent_ids(ec2_faults, "StopInstances") == [[parked.id]]
    assert _describe(net, parked.id)["State"]["Name"] == "stopped"
    assert _describe(net, ended.id)["State"]["Name"] == "terminated"


@integration
def test_aws_start_of_a_running_instance_is_a_no_op(net: Net, ec2_faults: Ec2FaultProxy) -> None:
    provider = _provider(net, ec2_faults)
    (instance,) = provider.launch([_spec("running-1")]).launched

    provider.start([instance.id])

    assert ec2_faults.calls("StartInstances") == []
    assert _describe(net, instance.id)["State"]["Name"] == "running"


@integration
def test_aws_start_without_capacity_is_a_capacity_error_at_the_subnet(net: Net, ec2_faults: Ec2FaultProxy) -> None:
    provider = _provider(net, ec2_faults)
    (instance,) = provider.launch([_spec("no-room")]).launched
    provider.stop([instance.id])
    ec2_faults.inject("StartInstances", "InsufficientInstanceCapacity", times=None)

    with pytest.raises(ProviderError) as info:
        provider.start([instance.id])

    err = info.value
    assert (err.kind, err.scope, err.code) == (ErrorKind.CAPACITY, ErrorScope.ZONE, "InsufficientInstanceCapacity")
    assert err.location == net.subnet_a == instance.location
    assert instance.id in str(err)
    assert len(ec2_faults.calls("StartInstances")) == 1  # capacity is not retried in place
    assert _state(provider, instance.id) is CloudState.STOPPED


@integration
def test_aws_start_of_gone_or_still_stopping_instances(net: Net, ec2_faults: Ec2FaultProxy) -> None:
    provider = _provider(net, ec2_faults)
    (instance,) = provider.launch([_spec("gone-1")]).launched
    provider.terminate([instance.id])

    with pytest.raises(ProviderError) as gone:
        provider.start([instance.id])
    assert (gone.value.kind, gone.value.code) == (ErrorKind.INVALID, INSTANCE_NOT_FOUND)
    with pytest.raises(ProviderError) as unknown:
        provider.start(["i-0123456789abcdef0"])
    assert (unknown.value.kind, unknown.value.code) == (ErrorKind.INVALID, INSTANCE_NOT_FOUND)
    assert ec2_faults.calls("StartInstances") == []

    # AWS refuses a start while the instance is still stopping: transient, not a capacity error.
    (parked,) = provider.launch([_spec("stopping-1")]).launched
    provider.stop([parked.id])
    ec2_faults.inject("StartInstances", "IncorrectInstanceState", times=1)
    with pytest.raises(ProviderError) as stopping:
        provider.start([parked.id])
    assert (stopping.value.kind, stopping.value.code) == (ErrorKind.UNKNOWN, "IncorrectInstanceState")
    provider.start([parked.id])  # later: it starts
    assert _describe(net, parked.id)["State"]["Name"] == "running"


@integration
def test_aws_stop_refused_for_a_spot_instance_is_a_clear_invalid_error(net: Net, ec2_faults: Ec2FaultProxy) -> None:
    provider = _provider(net, ec2_faults)
    (instance,) = provider.launch([_spec("spot-1")]).launched
    ec2_faults.inject("StopInstances", "UnsupportedOperation", times=None,
                      message=f"You can't stop the Spot Instance '{instance.id}' because it is associated "
                              "with a one-time Spot Instance request.")

    with pytest.raises(ProviderError) as info:
        provider.stop([instance.id])

    assert (info.value.kind, info.value.code) == (ErrorKind.INVALID, "UnsupportedOperation")
    assert "StopInstances" in str(info.value) and instance.id in str(info.value)
    assert len(ec2_faults.calls("StopInstances")) == 1  # a refusal is not retried
    assert _describe(net, instance.id)["State"]["Name"] == "running"


@integration
def test_aws_stop_retries_throttling_within_bounds(net: Net, ec2_faults: Ec2FaultProxy) -> None:
    provider = _provider(net, ec2_faults, max_attempts=3)
    (instance,) = provider.launch([_spec("throttled-stop")]).launched
    ec2_faults.inject("StopInstances", "RequestLimitExceeded", times=2)
    provider.stop([instance.id])
    assert len(ec2_faults.calls("StopInstances")) == 3
    assert _describe(net, instance.id)["State"]["Name"] == "stopped"

    ec2_faults.inject("StartInstances", "RequestLimitExceeded", times=None)
    with pytest.raises(ProviderError) as info:
        provider.start([instance.id])
    assert info.value.kind is ErrorKind.THROTTLED and len(ec2_faults.calls("StartInstances")) == 3


# --- GCP --------------------------------------------------------------------------------------


@pytest.fixture
def fake() -> Iterator[GceFake]:
    with running_gce_fake() as f:
        yield f


@integration
def test_gcp_stop_keeps_the_disks_and_start_runs_the_vm_again(fake: GceFake) -> None:
    prov = make_provider(fake)
    (vm,) = prov.launch(specs("park-1")).launched
    disks = fake.disks

    prov.stop([vm.id])

    [stop] = fake.calls_to("stop")
    assert stop.zone == vm.location == ZONE_A and stop.params.get("requestId")
    assert fake.instance(vm.id)["status"] == "STOPPING"  # not waited for: the autoscaler's tick goes on
    assert _state(prov, vm.id) is CloudState.STOPPED
    assert fake.disks == disks and fake.deleted_disks == []

    prov.start([vm.id])

    assert [c.zone for c in fake.calls_to("start")] == [ZONE_A]
    assert _state(prov, vm.id) in (CloudState.PENDING, CloudState.RUNNING)
    assert fake.instance(vm.id)["status"] == "RUNNING"
    assert [i.id for i in prov.list()] == [vm.id] and fake.disks == disks


@integration
def test_gcp_stop_is_idempotent_skips_gone_vms_and_finds_the_zone(fake: GceFake) -> None:
    prov = make_provider(fake, zones=[ZONE_A, ZONE_B])
    fake.inject("insert", zone=ZONE_A, code="ZONE_RESOURCE_POOL_EXHAUSTED", times=None)
    parked, deleted = prov.launch(specs("idem-1", "idem-2")).launched
    assert parked.location == ZONE_B
    prov.terminate([deleted.id])
    prov.list()
    prov.list()  # the fake lingers in STOPPING for one read after a delete

    fresh = make_provider(fake, zones=[ZONE_A, ZONE_B])  # a restarted master: no zone learnt yet
    fresh.stop([parked.id, parked.id, deleted.id, "never-existed"])
    fresh.stop([parked.id])  # already powered off

    assert [c.zone for c in fake.calls_to("stop")] == [ZONE_B]
    assert fake.instance(parked.id)["status"] == "TERMINATED"
    fresh.start([parked.id])
    fresh.start([parked.id])  # already running
    assert [c.zone for c in fake.calls_to("start")] == [ZONE_B]


@integration
def test_gcp_start_without_capacity_is_a_capacity_error_at_the_zone(fake: GceFake) -> None:
    prov = make_provider(fake, max_attempts=2)
    (vm,) = prov.launch(specs("no-room")).launched
    prov.stop([vm.id])
    fake.inject("start", status=503, reason="ZONE_RESOURCE_POOL_EXHAUSTED", times=None,
                message=f"The zone '{ZONE_A}' does not have enough resources available to fulfill the request.")

    with pytest.raises(ProviderError) as info:
        prov.start([vm.id])

    err = info.value
    assert (err.kind, err.scope, err.location) == (ErrorKind.CAPACITY, ErrorScope.ZONE, ZONE_A)
    assert err.code == "ZONE_RESOURCE_POOL_EXHAUSTED" and vm.id in str(err)
    assert _state(prov, vm.id) is CloudState.STOPPED


@integration
def test_gcp_start_without_capacity_reported_by_its_operation(fake: GceFake, monkeypatch: pytest.MonkeyPatch) -> None:
    """GCE accepts the start and its operation ends with ZONE_RESOURCE_POOL_EXHAUSTED, the VM still
    powered off. The fake only injects HTTP errors on start: its start operation is given the error."""
    prov = make_provider(fake)
    (vm,) = prov.launch(specs("no-room-op")).launched
    prov.stop([vm.id])
    power = fake._power

    def exhausted_start(method: str, project: str, zone: str, name: str) -> dict[str, Any]:
        view = power(method, project, zone, name)
        if method == "start":
            op = fake._operations[(project, zone, view["name"])]
            op.error = _op_error("ZONE_RESOURCE_POOL_EXHAUSTED", None, zone)
            op.http_error = _op_http_error("ZONE_RESOURCE_POOL_EXHAUSTED")
            op.on_done = None  # the VM stays TERMINATED
        return view

    monkeypatch.setattr(fake, "_power", exhausted_start)
    with pytest.raises(ProviderError) as info:
        prov.start([vm.id])

    err = info.value
    assert (err.kind, err.scope, err.location) == (ErrorKind.CAPACITY, ErrorScope.ZONE, ZONE_A)
    assert err.code == "ZONE_RESOURCE_POOL_EXHAUSTED" and vm.id in str(err)
    assert len(fake.calls_to("start")) == 1
    assert _state(prov, vm.id) is CloudState.STOPPED


@integration
def test_gcp_start_of_a_vm_still_stopping_is_transient_and_of_a_gone_one_not_found() -> None:
    with running_gce_fake(hold_operations=True) as fake:
        prov = make_provider(fake)
        prov._timeout = 0.5  # the stop's operation never finishes here: the wait is bounded
        (vm,) = prov.launch(specs("slow-stop")).launched
        fake.set_running(vm.id)

        prov.stop([vm.id])  # returns at its deadline, the VM still stopping
        assert _state(prov, vm.id) is CloudState.STOPPING

        with pytest.raises(ProviderError) as stopping:
            prov.start([vm.id])
        assert (stopping.value.kind, stopping.value.code) == (ErrorKind.UNKNOWN, INSTANCE_STILL_STOPPING)
        assert stopping.value.location == ZONE_A and fake.calls_to("start") == []

        # GCE's own refusal (the VM not ready yet) is transient too.
        fake.set_status(vm.id, "TERMINATED")
        fake.inject("start", status=400, reason="resourceNotReady",
                    message=f"The resource 'projects/p/zones/{ZONE_A}/instances/{vm.id}' is not ready")
        with pytest.raises(ProviderError) as refused:
            prov.start([vm.id])
        assert (refused.value.kind, refused.value.code) == (ErrorKind.UNKNOWN, "resourceNotReady")

        with pytest.raises(ProviderError) as gone:
            prov.start(["never-existed"])
        assert (gone.value.kind, gone.value.code) == (ErrorKind.INVALID, INSTANCE_NOT_FOUND)


@integration
def test_gcp_stop_refused_is_raised_and_other_vms_are_still_stopped(fake: GceFake) -> None:
    prov = make_provider(fake)
    refused, other = prov.launch(specs("refused", "other")).launched
    fake.set_running()
    fake.inject("stop", status=400, reason="unsupportedOperation", message="cannot stop this instance")

    with pytest.raises(ProviderError) as info:
        prov.stop([refused.id, other.id])

    assert info.value.kind is ErrorKind.INVALID and refused.id in str(info.value)
    assert fake.instance(refused.id)["status"] == "RUNNING"
    assert fake.instance(other.id)["status"] == "STOPPING"
    assert _state(prov, other.id) is CloudState.STOPPED
    assert len(fake.calls_to("stop")) == 2
