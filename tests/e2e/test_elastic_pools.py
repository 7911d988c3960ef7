"""Elastic pools end to end: a real master process scales a pool from zero through the cloud fakes
(moto server, GCE fake), the emulated boot runs the user-data it wrote (cloud-init → boot script →
agent fetched from the master → systemd unit's ExecStart), the agent registers, a Core API trial
runs on it, and the idle instance is terminated. Plus: a crash between launch and record, the
orphan sweep, and pool configs the master must refuse without stopping the other pools."""

from __future__ import annotations

import json
import stat
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import boto3
import httpx
import pytest

from provisioners.base import (
    MANAGED_BY_VALUE,
    TAG_CLUSTER,
    TAG_LAUNCH_ID,
    TAG_MANAGED_BY,
    TAG_MASTER,
    TAG_POOL,
)
from tests.e2e.boot import BootHarness, EmulatedInstance, GceFakeCloud, MotoCloud
from tests.e2e.conftest import AGENT_OPTIONS, E2E, REGION, aws_pool, default_subnet, wait_for
from tests.e2e.crash_after_launch import EXIT_STATUS

if TYPE_CHECKING:
    from tests.fakes.gce import GceFake
    from tests.provisioners.conftest import Ec2FaultProxy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def ec2(moto_url: str, session: boto3.Session) -> Any:
    return session.client("ec2", region_name=REGION, endpoint_url=moto_url)


def cluster_instances(client: Any, cluster_id: str) -> list[dict[str, Any]]:
    resp = client.describe_instances(Filters=[{"Name": f"tag:{TAG_CLUSTER}", "Values": [cluster_id]}])
    return [i for r in resp["Reservations"] for i in r["Instances"]]


def launches(proxy: Ec2FaultProxy) -> list[Any]:
    """RunInstances calls that reached moto (a ClientToken replay is not a new launch)."""
    return [c for c in proxy.calls("RunInstances") if not c.replayed]


def one_booted(harness: BootHarness, timeout: float = 45) -> EmulatedInstance:
    return harness.wait_for(lambda: next((i for i in harness.instances.values() if i.state == "running"), None),
                            timeout, "an instance booted by its user-data")


def trial_logs(e2e: E2E, trial_id: int) -> list[dict[str, Any]]:
    r = httpx.get(f"{e2e.m.url}/api/v1/trials/{trial_id}/logs", headers=e2e.headers(), timeout=30)
    r.raise_for_status()
    return [json.loads(line)["result"] for line in r.text.splitlines() if line.strip()]


def assert_ran_on(e2e: E2E, trial_id: int, agent_id: str) -> None:
    logs = trial_logs(e2e, trial_id)
    assert any("e2e trial done" in entry["log"] and entry["agentId"] == agent_id for entry in logs), logs[-5:]


def agent_state(e2e: E2E, agent_id: str) -> str | None:
    r = httpx.get(f"{e2e.m.url}/api/v1/agents/{agent_id}", headers=e2e.headers(), timeout=30)
    return r.json()["agent"]["state"] if r.status_code == 200 else None


def assert_agent_registered(e2e: E2E, inst: EmulatedInstance, pool: str) -> None:
    agent = e2e.get(f"/api/v1/agents/{inst.id}")["agent"]
    assert agent["instanceId"] == inst.id and agent["resourcePools"] == [pool]


def assert_sandbox_as_written(inst: EmulatedInstance) -> None:
    token_file = inst.sandbox / "etc/shipyard/agent-token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    token = token_file.read_text().strip()
    assert inst.user_data.count(token) == 1  # the bootstrap token only in the token file
    assert token not in inst.agent_log and token not in inst.boot_log
    assert inst.unit is not None and inst.unit.settings["Restart"] == "on-failure"
    argv = inst.unit.exec_start
    assert argv[argv.index("--instance-id") + 1] == inst.id


# ---- AWS -----------------------------------------------------------------------------------------


def test_aws_pool_scales_up_from_zero_runs_a_trial_and_reaps_the_idle_instance(
    e2e: E2E, ec2_faults: Ec2FaultProxy, moto_reset: str, aws_session: boto3.Session, moto_image: str,
) -> None:
    subnet = default_subnet(moto_reset, aws_session)
    e2e.start_master([aws_pool("aws", ec2_faults.url, moto_image, subnet)], "aws")
    cluster_id = e2e.cluster_id()
    harness = e2e.boot(MotoCloud(moto_reset))
    assert cluster_instances(ec2(moto_reset, aws_session), cluster_id) == []  # the pool starts empty

    trial_id = e2e.create_experiment("aws")["trialIds"][0]
    inst = one_booted(harness)
    [run] = launches(ec2_faults)
    assert run.params["InstanceType"] == "g4dn.xlarge" and run.params["SubnetId"] == subnet
    assert run.params["MetadataOptions.HttpTokens"] == "required"
    # IMDSv2: the boot script asked for a session token before the instance id.
    hits = e2e.harnesses[0].metadata.hits_for(inst.id)
    assert [(h.method, h.status) for h in hits[:2]] == [("PUT", 200), ("GET", 200)]
    assert_sandbox_as_written(inst)

    e2e.wait_trial_completed(trial_id, 60, harness)
    assert_agent_registered(e2e, inst, "aws")
    assert_ran_on(e2e, trial_id, inst.id)

    # Idle past max_idle_agent_period (3 s): TerminateInstances, and the row says why.
    client = ec2(moto_reset, aws_session)
    wait_for(lambda: cluster_instances(client, cluster_id)[0]["State"]["Name"] == "terminated", 40,
             "the idle instance terminated in moto")
    assert [c.params["InstanceId.1"] for c in ec2_faults.calls("TerminateInstances")] == [inst.id]
    row = wait_for(lambda: next((r for r in e2e.instance_rows("aws") if r["state"] == "terminated"), None), 20,
                   "the instance row closed")
    assert row["instance_id"] == inst.id
    assert row["terminate_reason"].startswith("idle for") and "max_idle_agent_period 3s" in row["terminate_reason"]
    # The VM went away with its agent.
    wait_for(lambda: inst.agent is not None and inst.agent.poll() is not None, 10, "the agent process gone")
    assert len(launches(ec2_faults)) == 1


def test_crash_between_launch_and_record_is_adopted_without_a_second_launch(
    e2e: E2E, ec2_faults: Ec2FaultProxy, moto_reset: str, aws_session: boto3.Session, moto_image: str,
) -> None:
    subnet = default_subnet(moto_reset, aws_session)
    master = e2e.start_master([aws_pool("aws", ec2_faults.url, moto_image, subnet, max_idle_agent_period="5m")],
                              "aws", module="tests.e2e.crash_after_launch")
    cluster_id = e2e.cluster_id()
    trial_id = e2e.create_experiment("aws")["trialIds"][0]

    # The master dies right after RunInstances returned, before it recorded the result.
    assert master.proc is not None
    assert master.proc.wait(timeout=40) == EXIT_STATUS
    assert "event=failpoint name=after_launch" in e2e.master_log()
    [run] = launches(ec2_faults)
    [cloud_inst] = cluster_instances(ec2(moto_reset, aws_session), cluster_id)
    [row] = e2e.instance_rows("aws")
    assert row["state"] == "requested" and row["instance_id"] is None
    assert dict((t["Key"], t["Value"]) for t in cloud_inst["Tags"])[TAG_LAUNCH_ID] == row["launch_id"]

    # The instance boots while the master is down: its boot script keeps asking for the agent.
    harness = e2e.boot(MotoCloud(moto_reset))
    harness.wait_for(lambda: "event=instance_identified" in "".join(i.boot_log for i in harness.instances.values()),
                     30, "the boot waiting for the master")
    [inst] = harness.instances.values()
    assert inst.id == cloud_inst["InstanceId"] and inst.state == "booting"

    master.module = "control_plane"  # the plain master from here on
    master.start()  # same port, same database
    one_booted(harness)
    wait_for(lambda: e2e.instance_rows("aws")[0]["instance_id"] == inst.id, 20, "the instance adopted")
    e2e.wait_trial_completed(trial_id, 60, harness)
    assert_ran_on(e2e, trial_id, inst.id)
    # No orphan, no duplicate: one launch, one instance, still alive and recorded.
    assert len(launches(ec2_faults)) == 1
    [after] = cluster_instances(ec2(moto_reset, aws_session), cluster_id)
    assert after["InstanceId"] == inst.id and after["State"]["Name"] == "running"
    [row] = e2e.instance_rows("aws")
    assert row["state"] == "running" and row["launch_id"] == run.params["ClientToken"]
    assert ec2_faults.calls("TerminateInstances") == []


def test_orphan_with_this_clusters_tags_is_terminated(
    e2e: E2E, ec2_faults: Ec2FaultProxy, moto_reset: str, aws_session: boto3.Session, moto_image: str,
) -> None:
    subnet = default_subnet(moto_reset, aws_session)
    e2e.start_master([aws_pool("aws", ec2_faults.url, moto_image, subnet)], "aws")
    cluster_id = e2e.cluster_id()
    client = ec2(moto_reset, aws_session)
    tags = {TAG_MANAGED_BY: MANAGED_BY_VALUE, TAG_CLUSTER: cluster_id, TAG_POOL: "aws",
            TAG_MASTER: e2e.m.url, TAG_LAUNCH_ID: uuid.uuid4().hex}
    tag_spec = [{"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}]
    orphan = client.run_instances(ImageId=moto_image, InstanceType="g4dn.xlarge", MinCount=1, MaxCount=1,
                                  SubnetId=subnet, TagSpecifications=tag_spec)["Instances"][0]["InstanceId"]
    # Someone else's instance (another cluster) must be left alone.
    other_spec = [{"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in
                                                        {**tags, TAG_CLUSTER: "another-cluster"}.items()]}]
    other = client.run_instances(ImageId=moto_image, InstanceType="g4dn.xlarge", MinCount=1, MaxCount=1,
                                 SubnetId=subnet, TagSpecifications=other_spec)["Instances"][0]["InstanceId"]

    def state(instance_id: str) -> str:
        return client.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]["State"]["Name"]

    wait_for(lambda: state(orphan) == "terminated", 20, "the orphan terminated")
    assert [c.params["InstanceId.1"] for c in ec2_faults.calls("TerminateInstances")] == [orphan]
    assert state(other) == "running"
    assert e2e.instance_rows("aws") == []  # the sweep records nothing, it only cleans up
    assert launches(ec2_faults) == []  # and no demand means no launch
    assert "event=orphans_terminated" in e2e.master_log()


def test_instance_powers_itself_off_when_the_master_is_gone_for_good(
    e2e: E2E, ec2_faults: Ec2FaultProxy, moto_reset: str, aws_session: boto3.Session, moto_image: str,
) -> None:
    # min_instances 1: an instance without demand; its agent gives up quickly once the master is gone.
    agent = {**AGENT_OPTIONS, "agent_reconnect_attempts": 2, "agent_reconnect_backoff": 0.2,
             "agent_reconnect_backoff_max": 0.5}
    subnet = default_subnet(moto_reset, aws_session)
    master = e2e.start_master([aws_pool("aws", ec2_faults.url, moto_image, subnet, min_instances=1, agent=agent)],
                              "aws")
    cluster_id = e2e.cluster_id()
    harness = e2e.boot(MotoCloud(moto_reset))
    inst = one_booted(harness)
    wait_for(lambda: agent_state(e2e, inst.id) == "connected", 30, "the agent registered")

    master.kill()  # gone for good
    # on_connection_lost (`systemctl poweroff || shutdown -h now`) powers the VM off, which ends a
    # Shipyard instance (shutdown behaviour: terminate): nothing is left billing.
    client = ec2(moto_reset, aws_session)
    wait_for(lambda: cluster_instances(client, cluster_id)[0]["State"]["Name"] == "terminated", 60,
             "the instance terminated after powering itself off")
    assert inst.powered_off
    assert (inst.sandbox / "poweroff-requested").read_text().split()[-1] == "poweroff"
    assert inst.agent is not None and inst.agent.wait(timeout=10) == 4  # EXIT_CONNECTION_LOST
    assert "event=on_connection_lost_running" in inst.agent_log


# ---- GCP -----------------------------------------------------------------------------------------


def gcp_e2e_pool(fake: GceFake, **overrides: Any) -> dict[str, Any]:
    return {
        "name": "gcp",
        "provider": {
            "type": "gcp",
            "project": "shipyard-e2e",
            "zones": ["us-central1-a"],
            "machine_type": "e2-standard-4",
            "instance_slots": 1,
            "boot_disk_source_image": "projects/debian-cloud/global/images/family/debian-12",
            "api_endpoint": fake.endpoint,
            "min_instances": 0,
            "max_instances": 2,
            "max_idle_agent_period": "3s",
            "agent": dict(AGENT_OPTIONS),
            **overrides,
        },
    }


def test_gcp_pool_scales_up_from_zero_runs_a_trial_and_reaps_the_idle_instance(e2e: E2E, gce_fake: GceFake) -> None:
    pool = gcp_e2e_pool(gce_fake)
    e2e.start_master([pool], "gcp", module="tests.e2e.gce_fake_master")  # anonymous credentials for the fake
    harness = e2e.boot(GceFakeCloud(gce_fake))
    assert gce_fake.instances == []

    trial_id = e2e.create_experiment("gcp")["trialIds"][0]
    inst = one_booted(harness)
    assert len(gce_fake.calls_to("insert")) == 1
    sent = gce_fake.sent[inst.id]
    user_data = next(i["value"] for i in sent["metadata"]["items"] if i["key"] == "user-data")
    assert user_data == inst.user_data and user_data.startswith("#cloud-config\n")
    hits = harness.metadata.hits_for(inst.id)
    assert hits and hits[0].path.endswith("/computeMetadata/v1/instance/name") and hits[0].status == 200
    assert_sandbox_as_written(inst)

    e2e.wait_trial_completed(trial_id, 60, harness)
    assert_agent_registered(e2e, inst, "gcp")
    assert_ran_on(e2e, trial_id, inst.id)

    wait_for(lambda: not gce_fake.has_instance(inst.id), 40, "the idle instance deleted")
    assert [c.zone for c in gce_fake.calls_to("delete")][:1] == ["us-central1-a"]
    row = wait_for(lambda: next((r for r in e2e.instance_rows("gcp") if r["state"] == "terminated"), None), 20,
                   "the instance row closed")
    assert row["instance_id"] == inst.id and row["terminate_reason"].startswith("idle for")
    wait_for(lambda: inst.agent is not None and inst.agent.poll() is not None, 10, "the agent process gone")
    assert len(gce_fake.calls_to("insert")) == 1


# ---- bad pool configs ------------------------------------------------------------------------------


def test_bad_pools_are_refused_clearly_and_the_good_pool_still_runs(
    e2e: E2E, ec2_faults: Ec2FaultProxy, moto_reset: str, aws_session: boto3.Session, moto_image: str,
    tmp_path: Path,
) -> None:
    subnet = default_subnet(moto_reset, aws_session)
    # Wrong credentials: what EC2 answers a request signed with an unknown key.
    ec2_faults.inject("DescribeInstanceTypes", "AuthFailure", times=None, when={"InstanceType.1": "g4dn.xlarge"},
                      message="AWS was not able to validate the provided access credentials")
    pools = [
        {"name": "good", "provider": {"type": "local", "max_instances": 1, "max_idle_agent_period": "1m",
                                      "work_dir": str(tmp_path / "local-instances")}},
        aws_pool("min-above-max", ec2_faults.url, moto_image, subnet, min_instances=3, max_instances=1),
        aws_pool("unknown-type", ec2_faults.url, moto_image, subnet, instance_type="x9.imaginary"),
        aws_pool("no-subnets", ec2_faults.url, moto_image, subnet, subnet_ids=[]),
        aws_pool("bad-credentials", ec2_faults.url, moto_image, subnet),
    ]
    e2e.start_master(pools, "good")
    expected = {
        "min-above-max": "min_instances (3) is greater than max_instances (1)",
        "unknown-type": "instance type 'x9.imaginary' is not offered in us-east-1",
        "no-subnets": "subnet_ids: must not be empty",
        "bad-credentials": "AuthFailure",
    }

    def refused() -> bool:
        return all(e2e.pool(name)["state"] == "error" and e2e.pool(name)["error"] for name in expected)

    wait_for(refused, 30, "the bad pools refused")
    for name, text in expected.items():
        p = e2e.pool(name)
        assert p["error"].startswith(f"pool {name!r} is not usable: ") and text in p["error"], p["error"]
        assert p["instances"] == []
    assert "unknown-type" in e2e.master_log() and "event=pool_config_error" in e2e.master_log()

    trial_id = e2e.create_experiment("good")["trialIds"][0]
    e2e.wait_trial_completed(trial_id, 60)
    assert e2e.pool("good")["state"] == "ok"
    assert launches(ec2_faults) == []  # nothing was launched for the refused pools


def test_aws_warm_pool_parks_the_idle_instance_and_starts_it_again_for_the_next_trial(
    e2e: E2E, ec2_faults: Ec2FaultProxy, moto_reset: str, aws_session: boto3.Session, moto_image: str,
) -> None:
    """`warm_pool_size: 1`: the idle instance is stopped, not terminated (the emulated VM powers down,
    its disk kept); the next trial starts it again instead of a launch: systemd starts the agent's
    unit, the agent registers with the credential it saved at its first boot, and the trial runs."""
    subnet = default_subnet(moto_reset, aws_session)
    e2e.start_master([aws_pool("aws", ec2_faults.url, moto_image, subnet, warm_pool_size=1, arrival_window="0s")],
                     "aws")
    cluster_id = e2e.cluster_id()
    harness = e2e.boot(MotoCloud(moto_reset))
    client = ec2(moto_reset, aws_session)

    first = e2e.create_experiment("aws")["trialIds"][0]
    inst = one_booted(harness)
    e2e.wait_trial_completed(first, 60, harness)
    assert_ran_on(e2e, first, inst.id)
    wait_for(lambda: cluster_instances(client, cluster_id)[0]["State"]["Name"] == "stopped", 40,
             "the idle instance stopped in moto")
    wait_for(lambda: inst.state == "stopped" and inst.agent is not None and inst.agent.poll() is not None, 20,
             "the emulated instance powered down with its agent")
    row = wait_for(lambda: next((r for r in e2e.instance_rows("aws") if r["state"] == "parked"), None), 20,
                   "the instance row parked")
    assert row["instance_id"] == inst.id and ec2_faults.calls("TerminateInstances") == []

    second = e2e.create_experiment("aws")["trialIds"][0]
    e2e.wait_trial_completed(second, 90, harness)
    assert_ran_on(e2e, second, inst.id)
    assert len(launches(ec2_faults)) == 1  # started again, never launched twice
    assert [c.params["InstanceId.1"] for c in ec2_faults.calls("StartInstances")] == [inst.id]
    assert inst.starts == 2  # its unit: the first boot, then the start from the warm pool
    [credential] = list(inst.sandbox.rglob("state/agent-credential"))  # saved on its disk at enrolment
    assert credential.stat().st_size > 0
    assert "already enrolled" not in e2e.master_log()  # it came back with its own credential
    resumed = next(r for r in e2e.instance_rows("aws") if r["instance_id"] == inst.id)
    assert resumed["resumed_at"] is not None and resumed["resume_connected_at"] is not None


def test_gcp_warm_pool_stops_the_idle_vm_and_starts_it_again_for_the_next_trial(e2e: E2E, gce_fake: GceFake) -> None:
    e2e.start_master([gcp_e2e_pool(gce_fake, warm_pool_size=1, arrival_window="0s")], "gcp",
                     module="tests.e2e.gce_fake_master")
    harness = e2e.boot(GceFakeCloud(gce_fake))
    first = e2e.create_experiment("gcp")["trialIds"][0]
    inst = one_booted(harness)
    e2e.wait_trial_completed(first, 60, harness)
    wait_for(lambda: gce_fake.instance(inst.id)["status"] == "TERMINATED", 40, "the idle VM stopped (TERMINATED)")
    wait_for(lambda: inst.state == "stopped", 20, "the emulated VM powered down")
    wait_for(lambda: any(r["state"] == "parked" for r in e2e.instance_rows("gcp")), 20, "the instance row parked")

    second = e2e.create_experiment("gcp")["trialIds"][0]
    e2e.wait_trial_completed(second, 90, harness)
    assert_ran_on(e2e, second, inst.id)
    assert len(gce_fake.calls_to("insert")) == 1 and len(gce_fake.calls_to("start")) == 1
    assert gce_fake.calls_to("delete") == [] and inst.starts == 2
