"""GCP provider: configuration and error taxonomy as plain units; launch / list / terminate through
the real google-cloud-compute REST client against the local GCE fake (tests/fakes/gce.py)."""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from google.api_core import exceptions as gexc
from google.auth import exceptions as auth_exc
from google.auth.credentials import AnonymousCredentials

from provisioners.base import (
    TAG_CLUSTER,
    TAG_LAUNCH_ID,
    TAG_MASTER,
    TAG_POOL,
    CloudState,
    ErrorKind,
    ErrorScope,
    LaunchSpec,
    ProviderError,
)
from provisioners.gcp import (
    GceOperationError,
    GcpPoolConfig,
    GcpProvider,
    classify_error,
    instance_name,
    label_value,
    request_id,
)
from shipyard_common.settings import SettingsError
from tests.fakes.gce import GceFake, gce_fake, running_gce_fake  # noqa: F401 - registers the gce_fake fixture

PROJECT = "shipyard-test-1"
ZONE_A, ZONE_B, ZONE_C = "us-central1-a", "us-central1-b", "us-east1-b"
MASTER = "http://10.0.0.2:8080"
GCE_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


def base_cfg(**over: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "type": "gcp",
        "project": PROJECT,
        "zones": [ZONE_A, ZONE_B],
        "machine_type": "n1-standard-8",
        "gpu_type": "nvidia-tesla-t4",
        "gpu_num": 2,
        "boot_disk_source_image": "projects/shipyard-images/global/images/family/agent-gpu",
    }
    cfg.update(over)
    return cfg


# ---- configuration ---------------------------------------------------------------------------


def test_config_from_dict_defaults_and_normalisation() -> None:
    cfg = GcpPoolConfig.from_dict(base_cfg(network_tags=["agents"], labels={"team": "ml"}))
    assert cfg.zones == (ZONE_A, ZONE_B)
    assert cfg.instance_slots == 2  # defaults to gpu_num
    assert cfg.network == "global/networks/default"
    assert cfg.boot_disk_size_gb == 100 and cfg.boot_disk_type == "pd-ssd"
    assert cfg.external_ip is True and cfg.spot is False
    assert cfg.service_account_email == "default"
    assert cfg.network_tags == ("agents",)
    assert cfg.labels == {"team": "ml"}


def test_config_cpu_pool_takes_explicit_slots() -> None:
    cfg = GcpPoolConfig.from_dict(base_cfg(gpu_type=None, gpu_num=0, instance_slots=8))
    assert cfg.instance_slots == 8 and cfg.gpu_type is None


@pytest.mark.parametrize(
    ("over", "path"),
    [
        ({"zones": []}, "zones"),
        ({"zones": "us-central1-a"}, "zones"),
        ({"zones": ["us-central1"]}, "zones[0]"),
        ({"zones": [ZONE_A, ZONE_A]}, "zones[1]"),
        ({"project": ""}, "project"),
        ({"project": "Bad_Project"}, "project"),
        ({"gpu_type": None}, "gpu_type"),
        ({"gpu_num": 0}, "gpu_num"),
        ({"gpu_num": 17}, "gpu_num"),
        ({"gpu_num": "2"}, "gpu_num"),
        ({"gpu_type": None, "gpu_num": 0}, "instance_slots"),
        ({"instance_slots": 0}, "instance_slots"),
        ({"spot": True, "preemptible": True}, "preemptible"),
        ({"spot": "yes"}, "spot"),
        ({"labels": {"Team": "ml"}}, "labels.Team"),
        ({"labels": {"team": "ML Research"}}, "labels.team"),
        ({"labels": {"shipyard-pool": "x"}}, "labels.shipyard-pool"),
        ({"boot_disk_size_gb": 5}, "boot_disk_size_gb"),
        ({"boot_disk_size_gb": True}, "boot_disk_size_gb"),
        ({"name_prefix": "1abc"}, "name_prefix"),
        ({"name_prefix": "abc-"}, "name_prefix"),
        ({"api_endpoint": "127.0.0.1:9"}, "api_endpoint"),
        ({"network_tags": ["Bad Tag"]}, "network_tags[0]"),
        ({"machine_type": "n1 standard"}, "machine_type"),
        ({"boot_disk_source_image": ""}, "boot_disk_source_image"),
        ({"zone": ZONE_A}, "zone"),
        ({"type": "aws"}, "type"),
    ],
)
def test_config_errors_name_the_field(over: dict[str, Any], path: str) -> None:
    with pytest.raises(SettingsError) as info:
        GcpPoolConfig.from_dict(base_cfg(**over))
    assert [p for p, _ in info.value.problems] == [path]
    assert str(info.value).startswith(f"{path}: ")


def test_config_missing_required_field() -> None:
    data = base_cfg()
    del data["boot_disk_source_image"]
    with pytest.raises(SettingsError, match="boot_disk_source_image: is required"):
        GcpPoolConfig.from_dict(data)


def test_config_reports_every_problem_at_once() -> None:
    with pytest.raises(SettingsError) as info:
        GcpPoolConfig.from_dict(base_cfg(project="Bad_Project", zones=[ZONE_A, "nowhere", "x"], gpu_num=17,
                                         labels={"Team": "ml", "ok": "Not OK"}, spot="yes"))
    assert [p for p, _ in info.value.problems] == [
        "project", "zones[1]", "zones[2]", "gpu_num", "spot", "labels.Team", "labels.ok"]


def test_config_accepts_domain_scoped_projects_and_null_labels() -> None:
    cfg = GcpPoolConfig.from_dict(base_cfg(project="example.com:my-project", labels=None))
    assert cfg.project == "example.com:my-project" and cfg.labels == {}


# ---- names, ids, labels ----------------------------------------------------------------------


@pytest.mark.parametrize("raw", ["GPU.Pool", "a" * 100, "x:y/z", "already-fine_1"])
def test_label_value_obeys_gce_rules(raw: str) -> None:
    v = label_value(raw)
    assert re.fullmatch(r"[a-z0-9_-]{0,63}", v)


def test_long_label_values_do_not_collide() -> None:
    assert label_value("a" * 80 + "1") != label_value("a" * 80 + "2")


def test_request_id_is_a_stable_uuid_per_launch_and_zone() -> None:
    rid = request_id("launch-1", ZONE_A)
    assert uuid.UUID(rid)
    assert rid == request_id("launch-1", ZONE_A)
    assert rid != request_id("launch-1", ZONE_B)
    assert rid != request_id("launch-2", ZONE_A)


@pytest.mark.parametrize("launch_id", ["L1", "Launch:With/Odd.Chars", "x" * 300])
def test_instance_names_are_valid_and_deterministic(launch_id: str) -> None:
    name = instance_name("shipyard-gpu", "cluster", launch_id)
    assert GCE_NAME.match(name)
    assert name == instance_name("shipyard-gpu", "cluster", launch_id)
    assert name != instance_name("shipyard-gpu", "other-cluster", launch_id)


# ---- error taxonomy --------------------------------------------------------------------------


def http_error(status: int, reason: str) -> gexc.GoogleAPICallError:
    return gexc.from_http_status(status, f"http {status}", errors=[{"reason": reason, "message": "m"}])


@pytest.mark.parametrize(
    ("exc", "kind", "scope"),
    [
        (
            GceOperationError([("ZONE_RESOURCE_POOL_EXHAUSTED", "m")], 503),
            ErrorKind.CAPACITY,
            ErrorScope.ZONE,
        ),
        (
            GceOperationError([("ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", "m")]),
            ErrorKind.CAPACITY,
            ErrorScope.ZONE,
        ),
        (
            GceOperationError([("QUOTA_EXCEEDED", "Quota 'CPUS' exceeded.")], 403),
            ErrorKind.QUOTA,
            ErrorScope.REGION,
        ),
        (
            GceOperationError([("QUOTA_EXCEEDED", "Quota 'GPUS_ALL_REGIONS' exceeded.")]),
            ErrorKind.QUOTA,
            ErrorScope.CLOUD,
        ),
        (
            GceOperationError([("RESOURCE_OPERATION_RATE_EXCEEDED", "m")]),
            ErrorKind.THROTTLED,
            ErrorScope.CLOUD,
        ),
        (GceOperationError([("INVALID_FIELD_VALUE", "m")], 400), ErrorKind.INVALID, ErrorScope.REGION),
        (GceOperationError([("SOMETHING_NEW", "m")], 403), ErrorKind.AUTH, ErrorScope.CLOUD),
        (GceOperationError([("SOMETHING_NEW", "m")], 500), ErrorKind.UNKNOWN, ErrorScope.REGION),
        (http_error(429, "rateLimitExceeded"), ErrorKind.THROTTLED, ErrorScope.CLOUD),
        (http_error(403, "rateLimitExceeded"), ErrorKind.THROTTLED, ErrorScope.CLOUD),
        (http_error(403, "userRateLimitExceeded"), ErrorKind.THROTTLED, ErrorScope.CLOUD),
        (http_error(403, "quotaExceeded"), ErrorKind.QUOTA, ErrorScope.REGION),
        (http_error(403, "forbidden"), ErrorKind.AUTH, ErrorScope.CLOUD),
        (http_error(401, "authError"), ErrorKind.AUTH, ErrorScope.CLOUD),
        (http_error(400, "invalid"), ErrorKind.INVALID, ErrorScope.REGION),
        (http_error(404, "notFound"), ErrorKind.INVALID, ErrorScope.REGION),
        (http_error(503, "backendError"), ErrorKind.UNKNOWN, ErrorScope.REGION),
        (auth_exc.DefaultCredentialsError("no ADC"), ErrorKind.AUTH, ErrorScope.CLOUD),
        (RuntimeError("boom"), ErrorKind.UNKNOWN, ErrorScope.REGION),
    ],
)
def test_classify_error(exc: BaseException, kind: ErrorKind, scope: ErrorScope) -> None:
    err = classify_error(exc, ZONE_A)
    assert (err.kind, err.scope) == (kind, scope)


def test_classify_error_keeps_code_and_location() -> None:
    err = classify_error(GceOperationError([("ZONE_RESOURCE_POOL_EXHAUSTED", "no T4")], 503), ZONE_B)
    assert (err.code, err.location) == ("ZONE_RESOURCE_POOL_EXHAUSTED", ZONE_B)
    quota = classify_error(GceOperationError([("QUOTA_EXCEEDED", "Quota 'NVIDIA_T4_GPUS' exceeded")]), ZONE_B)
    assert quota.location == "us-central1"


# ---- against the fake ------------------------------------------------------------------------


@pytest.fixture
def fake() -> Iterator[GceFake]:
    with running_gce_fake() as f:
        yield f


def make_provider(
    fake: GceFake, *, cluster_id: str = "c1", pool: str = "gpu", max_attempts: int = 4, **over: Any
) -> GcpProvider:
    cfg = GcpPoolConfig.from_dict(base_cfg(api_endpoint=fake.endpoint, **over))
    return GcpProvider(
        cfg,
        cluster_id=cluster_id,
        pool=pool,
        master_url=MASTER,
        credentials=AnonymousCredentials(),
        max_attempts=max_attempts,
        call_timeout_s=10,
        retry_base_s=0.01,
    )


def specs(*ids: str) -> list[LaunchSpec]:
    return [LaunchSpec(launch_id=i, user_data=f"#cloud-config\n# token for {i}\n") for i in ids]


def metadata_of(body: dict[str, Any]) -> dict[str, str]:
    return {it["key"]: it["value"] for it in body["metadata"]["items"]}


@pytest.mark.integration
def test_launch_sends_a_complete_instance(fake: GceFake) -> None:
    prov = make_provider(
        fake,
        pool="GPU.Pool",
        spot=True,
        subnetwork="agents",
        network_tags=["shipyard-agent"],
        labels={"team": "ml"},
        service_account_email="agents@shipyard-test-1.iam.gserviceaccount.com",
        boot_disk_size_gb=200,
        name_prefix="sy-gpu",
    )
    result = prov.launch(specs("Launch-0001"))

    assert result.error is None
    (inst,) = result.launched
    body = fake.sent[inst.id]
    assert GCE_NAME.match(body["name"]) and body["name"].startswith("sy-gpu-")
    assert body["machineType"] == f"zones/{ZONE_A}/machineTypes/n1-standard-8"
    assert body["labels"] == {
        "shipyard-managed-by": "shipyard",
        "shipyard-cluster-id": "c1",
        "shipyard-pool": "gpu-pool",
        "shipyard-launch-id": "launch-0001",
        "shipyard-capacity": "spot",
        "team": "ml",
    }
    md = metadata_of(body)
    assert md["user-data"] == "#cloud-config\n# token for Launch-0001\n"
    assert md["shipyard-master"] == MASTER
    assert (md["shipyard-pool"], md["shipyard-launch-id"]) == ("GPU.Pool", "Launch-0001")
    assert body["guestAccelerators"] == [
        {"acceleratorType": f"zones/{ZONE_A}/acceleratorTypes/nvidia-tesla-t4", "acceleratorCount": 2}
    ]
    assert body["scheduling"] == {
        "onHostMaintenance": "TERMINATE",
        "provisioningModel": "SPOT",
        "automaticRestart": False,
        "instanceTerminationAction": "DELETE",
    }
    assert body["serviceAccounts"] == [
        {
            "email": "agents@shipyard-test-1.iam.gserviceaccount.com",
            "scopes": ["https://www.googleapis.com/auth/cloud-platform"],
        }
    ]
    assert body["tags"] == {"items": ["shipyard-agent"]}
    (nic,) = body["networkInterfaces"]
    assert nic["network"] == "global/networks/default"
    assert nic["subnetwork"] == "regions/us-central1/subnetworks/agents"
    assert nic["accessConfigs"] == [{"name": "External NAT", "type": "ONE_TO_ONE_NAT"}]
    (disk,) = body["disks"]
    assert disk["boot"] is True and disk["autoDelete"] is True
    init = disk["initializeParams"]
    assert init["sourceImage"] == "projects/shipyard-images/global/images/family/agent-gpu"
    assert init["diskSizeGb"] == "200"
    assert init["diskType"] == f"zones/{ZONE_A}/diskTypes/pd-ssd"

    (insert,) = fake.calls_to("insert")
    assert insert.params["requestId"] == request_id("Launch-0001", ZONE_A)

    assert inst.state is CloudState.PENDING
    assert inst.launch_id == "Launch-0001"
    assert inst.location == ZONE_A and inst.instance_type == "n1-standard-8" and inst.spot is True
    assert inst.private_ip and inst.public_ip
    assert inst.tags[TAG_MASTER] == MASTER and inst.tags[TAG_POOL] == "GPU.Pool"
    assert inst.launched_at.tzinfo is not None
    assert abs(inst.launched_at - datetime.now(UTC)) < timedelta(minutes=5)


@pytest.mark.integration
def test_cpu_on_demand_pool_has_no_gpu_scheduling_or_public_ip(fake: GceFake) -> None:
    prov = make_provider(
        fake, gpu_type=None, gpu_num=0, instance_slots=4, external_ip=False, service_account_email=None
    )
    (inst,) = prov.launch(specs("cpu-1")).launched
    body = fake.sent[inst.id]
    assert "guestAccelerators" not in body
    assert body.get("scheduling", {}) == {}
    assert "accessConfigs" not in body["networkInterfaces"][0]
    assert "serviceAccounts" not in body
    assert inst.public_ip is None and inst.spot is False


@pytest.mark.integration
def test_launch_is_idempotent_per_launch_id(fake: GceFake) -> None:
    prov = make_provider(fake)
    first = prov.launch(specs("L1"))
    again = make_provider(fake).launch(specs("L1"))  # e.g. a restarted master retrying

    assert [i.id for i in again.launched] == [i.id for i in first.launched]
    assert len(fake.instances) == 1
    assert len(fake.calls_to("insert")) == 1


@pytest.mark.integration
def test_lost_insert_response_is_deduplicated_by_request_id(fake: GceFake) -> None:
    # The first insert lands but its response is lost (HTTP 503 after the effect): the retry
    # carries the same requestId and GCE answers with the first operation.
    fake.inject("insert", status=503, after=True)
    result = make_provider(fake).launch(specs("L1"))

    assert result.error is None and len(result.launched) == 1
    inserts = fake.calls_to("insert")
    assert len(inserts) == 2
    assert inserts[0].params["requestId"] == inserts[1].params["requestId"]
    assert len(fake.instances) == 1


@pytest.mark.integration
def test_list_selects_only_this_cluster_and_pool(fake: GceFake) -> None:
    mine = make_provider(fake, cluster_id="c1", pool="gpu")
    other_pool = make_provider(fake, cluster_id="c1", pool="cpu", gpu_type=None, gpu_num=0, instance_slots=4)
    other_cluster = make_provider(fake, cluster_id="c2", pool="gpu")
    mine.launch(specs("a", "b"))
    other_pool.launch(specs("c"))
    other_cluster.launch(specs("d"))
    fake.add_instance(project=PROJECT, zone=ZONE_A, name="hand-made", labels={"shipyard-pool": "gpu"})

    listed = mine.list()

    assert sorted(i.launch_id or "" for i in listed) == ["a", "b"]
    assert {i.state for i in listed} == {CloudState.RUNNING}  # PROVISIONING was read once at launch
    assert all(i.tags[TAG_CLUSTER] == "c1" and i.tags[TAG_LAUNCH_ID] == i.launch_id for i in listed)
    flt = fake.calls_to("aggregatedList")[-1].params["filter"]
    assert 'labels.shipyard-cluster-id = "c1"' in flt and 'labels.shipyard-pool = "gpu"' in flt
    assert sorted(i.launch_id or "" for i in other_pool.list()) == ["c"]


@pytest.mark.integration
def test_list_checks_exact_ids_behind_sanitized_labels(fake: GceFake) -> None:
    upper = make_provider(fake, pool="GPU")
    lower = make_provider(fake, pool="gpu")
    upper.launch(specs("u1"))
    lower.launch(specs("l1"))
    # Both pools carry label shipyard-pool=gpu; metadata keeps them apart.
    assert [i.launch_id for i in upper.list()] == ["u1"]
    assert [i.launch_id for i in lower.list()] == ["l1"]


@pytest.mark.integration
def test_list_follows_pages(fake: GceFake) -> None:
    prov = make_provider(fake)
    prov.launch(specs(*(f"p{i}" for i in range(5))))
    fake.max_page_size = 2
    before = len(fake.calls_to("aggregatedList"))

    listed = prov.list()

    assert sorted(i.launch_id or "" for i in listed) == [f"p{i}" for i in range(5)]
    pages = fake.calls_to("aggregatedList")[before:]
    assert [c.params.get("pageToken") for c in pages] == [None, "offset-2", "offset-4"]


@pytest.mark.integration
def test_list_maps_states_and_includes_powered_off_vms(fake: GceFake) -> None:
    prov = make_provider(fake, spot=True)
    launched = prov.launch(specs("s1", "s2", "s3", "s4")).launched
    names = {i.launch_id: i.id for i in launched}
    fake.set_status(names["s2"], "STOPPING")
    fake.set_status(names["s3"], "TERMINATED")  # powered off: its disk still bills
    fake.set_status(names["s4"], "SUSPENDED")

    by_id = {i.launch_id: i for i in prov.list()}

    assert set(by_id) == {"s1", "s2", "s3", "s4"}
    assert by_id["s1"].state is CloudState.RUNNING and by_id["s1"].spot is True
    assert by_id["s2"].state is CloudState.STOPPING
    assert by_id["s3"].state is CloudState.STOPPED and by_id["s4"].state is CloudState.STOPPED


@pytest.mark.integration
def test_a_terminated_vm_is_listed_and_deleted_with_its_disk(fake: GceFake) -> None:
    prov = make_provider(fake)
    (vm,) = prov.launch(specs("off")).launched
    fake.set_status(vm.id, "TERMINATED")
    [listed] = prov.list()
    assert (listed.id, listed.state) == (vm.id, CloudState.STOPPED)
    [insert] = fake.calls_to("insert")
    assert [d["autoDelete"] for d in insert.body["disks"]] == [True]  # the boot disk goes with the VM

    prov.terminate([vm.id])
    prov.list()  # the fake lingers in STOPPING for one read after a delete
    assert prov.list() == [] and not fake.has_instance(vm.id)
    assert [c.params.get("requestId") is not None for c in fake.calls_to("delete")] == [True]


@pytest.mark.integration
def test_describe_by_name_sees_what_a_list_misses_and_says_when_a_vm_is_gone(fake: GceFake) -> None:
    prov = make_provider(fake)
    kept, deleted = prov.launch(specs("d1", "d2")).launched
    fake.set_status(kept.id, "TERMINATED")
    prov.terminate([deleted.id])
    prov.list()
    prov.list()
    fresh = make_provider(fake)  # a restarted master: no zone learnt from a list yet

    found = fresh.describe([kept.id, deleted.id, "never-existed"])

    assert found[kept.id] is not None and found[kept.id].state is CloudState.STOPPED
    assert found[kept.id].launch_id == "d1" and found[kept.id].location == kept.location
    assert found[deleted.id] is None and found["never-existed"] is None


@pytest.mark.integration
def test_terminate_is_idempotent_and_never_touches_foreign_instances(fake: GceFake) -> None:
    prov = make_provider(fake)
    ids = [i.id for i in prov.launch(specs("t1", "t2")).launched]
    foreign = fake.add_instance(project=PROJECT, zone=ZONE_A, name="someone-elses")

    prov.terminate([*ids, foreign["name"]])
    assert {i.state for i in prov.list()} == {CloudState.STOPPING}
    prov.terminate(ids)  # again, while they are stopping
    assert prov.list() == []  # gone after their next read
    prov.terminate(ids)  # and once more after they are gone

    assert fake.has_instance("someone-elses")
    deleted = {c.params.get("requestId") for c in fake.calls_to("delete")}
    assert all(uuid.UUID(r) for r in deleted if r)
    assert not any("someone-elses" in str(c) for c in fake.calls_to("delete"))


@pytest.mark.integration
def test_terminate_from_a_fresh_provider_finds_zones_by_label(fake: GceFake) -> None:
    make_provider(fake, zones=[ZONE_B]).launch(specs("z1"))
    (inst,) = make_provider(fake).list()
    fresh = make_provider(fake)
    fresh.terminate([inst.id])
    (delete,) = fake.calls_to("delete")
    assert delete.zone == ZONE_B


@pytest.mark.integration
def test_zone_failover_on_resource_pool_exhausted(fake: GceFake) -> None:
    fake.inject("insert", zone=ZONE_A, code="ZONE_RESOURCE_POOL_EXHAUSTED", times=None)
    result = make_provider(fake).launch(specs("f1", "f2"))

    assert result.error is None
    assert [i.location for i in result.launched] == [ZONE_B, ZONE_B]
    assert {i["zone"].rsplit("/", 1)[-1] for i in fake.instances} == {ZONE_B}
    rids = [c.params["requestId"] for c in fake.calls_to("insert")]
    assert len(set(rids)) == len(rids)  # per-zone request ids: no replay of zone A's failure


@pytest.mark.integration
def test_capacity_everywhere_reports_partial_success(fake: GceFake) -> None:
    fake.inject("insert", zone=ZONE_A, code="ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", times=None)
    fake.inject("insert", zone=ZONE_B, code="ZONE_RESOURCE_POOL_EXHAUSTED", skip=1, times=None)

    result = make_provider(fake).launch(specs("x1", "x2", "x3"))

    assert len(result.launched) == 1 and result.launched[0].location == ZONE_B
    assert result.error is not None and result.error.kind is ErrorKind.CAPACITY
    assert "2 instance(s)" in str(result.error)


@pytest.mark.integration
def test_quota_exceeded_stops_without_trying_other_zones(fake: GceFake) -> None:
    fake.inject("insert", zone=ZONE_A, code="QUOTA_EXCEEDED", times=None)
    result = make_provider(fake).launch(specs("q1"))

    assert result.launched == ()
    assert result.error is not None and result.error.kind is ErrorKind.QUOTA
    assert result.error.code == "QUOTA_EXCEEDED" and result.error.location == "us-central1"
    assert fake.calls_to("insert", zone=ZONE_B) == []


@pytest.mark.integration
def test_quota_after_a_success_keeps_what_launched(fake: GceFake) -> None:
    fake.inject("insert", zone=ZONE_A, code="QUOTA_EXCEEDED", skip=1, times=None)
    result = make_provider(fake).launch(specs("k1", "k2"))
    assert [i.launch_id for i in result.launched] == ["k1"]
    assert result.error is not None and result.error.kind is ErrorKind.QUOTA


@pytest.mark.integration
def test_rate_limit_is_retried_then_succeeds(fake: GceFake) -> None:
    fake.inject("insert", status=429, times=2)
    result = make_provider(fake).launch(specs("r1"))

    assert result.error is None and len(result.launched) == 1
    inserts = fake.calls_to("insert")
    assert len(inserts) == 3 and len({c.params["requestId"] for c in inserts}) == 1


@pytest.mark.integration
def test_rate_limit_forever_gives_throttled_after_bounded_attempts(fake: GceFake) -> None:
    fake.inject("insert", status=429, times=None)
    result = make_provider(fake, max_attempts=3).launch(specs("r1"))

    assert result.launched == ()
    assert result.error is not None and result.error.kind is ErrorKind.THROTTLED
    assert len(fake.calls_to("insert")) == 3
    assert fake.calls_to("insert", zone=ZONE_B) == []


@pytest.mark.integration
def test_forbidden_is_auth_and_not_retried(fake: GceFake) -> None:
    fake.inject("insert", status=403, reason="forbidden", times=None)
    result = make_provider(fake).launch(specs("a1"))

    assert result.error is not None and result.error.kind is ErrorKind.AUTH
    assert len(fake.calls_to("insert")) == 1


@pytest.mark.integration
def test_bad_configuration_is_invalid(fake: GceFake) -> None:
    # A machine type pinned to another zone: GCE refuses the request with HTTP 400.
    prov = make_provider(fake, machine_type=f"zones/{ZONE_C}/machineTypes/n1-standard-8")
    result = prov.launch(specs("i1"))

    assert result.error is not None and result.error.kind is ErrorKind.INVALID
    assert len(fake.calls_to("insert")) == 1 and fake.instances == []


@pytest.mark.integration
def test_list_errors_are_raised_classified(fake: GceFake) -> None:
    fake.inject("aggregatedList", status=429, times=None)
    with pytest.raises(ProviderError) as info:
        make_provider(fake, max_attempts=2).list()
    assert info.value.kind is ErrorKind.THROTTLED
    assert len(fake.calls_to("aggregatedList")) == 2


@pytest.mark.integration
def test_launch_reports_auth_failure_of_its_lookup(fake: GceFake) -> None:
    fake.inject("aggregatedList", status=403, times=None)
    result = make_provider(fake).launch(specs("a1"))
    assert result.launched == () and result.error is not None and result.error.kind is ErrorKind.AUTH
    assert fake.calls_to("insert") == []


@pytest.mark.integration
def test_slow_operation_is_reported_pending_within_the_bound(fake: GceFake) -> None:
    fake.hold_operations = True
    cfg = GcpPoolConfig.from_dict(base_cfg(api_endpoint=fake.endpoint))
    prov = GcpProvider(
        cfg,
        cluster_id="c1",
        pool="gpu",
        master_url=MASTER,
        credentials=AnonymousCredentials(),
        call_timeout_s=0.3,
    )
    result = prov.launch(specs("slow"))

    assert result.error is None
    (inst,) = result.launched
    assert inst.state is CloudState.PENDING and inst.launch_id == "slow"
    assert len(fake.calls_to("operations.wait")) >= 1


@pytest.mark.integration
def test_user_data_is_never_logged(fake: GceFake, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    fake.inject("insert", zone=ZONE_A, code="ZONE_RESOURCE_POOL_EXHAUSTED")
    fake.inject("insert", zone=ZONE_B, status=429)
    secret = "token-7c1b9e5d"
    prov = make_provider(fake)
    prov.launch([LaunchSpec(launch_id="sec", user_data=f"#cloud-config\n# {secret}\n")])
    assert caplog.records  # the launch did log (retry, zone exhausted, launched)
    assert secret not in caplog.text


@pytest.mark.integration
def test_shared_fixture_serves_the_real_client(request: pytest.FixtureRequest) -> None:
    # Imported above, the shared fixture is found by name like any other.
    shared: GceFake = request.getfixturevalue("gce_fake")
    (inst,) = make_provider(shared).launch(specs("shared")).launched
    assert shared.instance(inst.id)["labels"]["shipyard-launch-id"] == "shared"


@pytest.mark.integration
def test_preemptible_pool_is_deleted_on_preemption(fake: GceFake) -> None:
    prov = make_provider(fake, gpu_type=None, gpu_num=0, instance_slots=4, preemptible=True)
    (inst,) = prov.launch(specs("pre-1")).launched
    assert fake.sent[inst.id]["scheduling"] == {
        "onHostMaintenance": "TERMINATE",
        "preemptible": True,
        "automaticRestart": False,
        "instanceTerminationAction": "DELETE",
    }
    assert inst.spot is True


def test_missing_credentials_are_an_auth_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # No credentials object: application default credentials are resolved on first use.
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    cfg = GcpPoolConfig.from_dict(base_cfg(api_endpoint="http://127.0.0.1:9"))
    prov = GcpProvider(cfg, cluster_id="c1", pool="gpu", master_url=MASTER)
    with pytest.raises(ProviderError) as info:
        prov.list()
    assert info.value.kind is ErrorKind.AUTH
    result = prov.launch(specs("l1"))
    assert result.launched == () and result.error is not None and result.error.kind is ErrorKind.AUTH


# ---- capacity memory (issue 10, item 7) ----------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


def _cooling_provider(fake: GceFake, clock: _Clock, **over: Any) -> GcpProvider:
    cfg = GcpPoolConfig.from_dict(base_cfg(api_endpoint=fake.endpoint, **over))
    return GcpProvider(cfg, cluster_id="c1", pool="gpu", master_url=MASTER, credentials=AnonymousCredentials(),
                       call_timeout_s=10, retry_base_s=0.01, clock=clock)


@pytest.mark.integration
def test_an_exhausted_zone_costs_one_insert_per_batch_then_is_skipped(fake: GceFake) -> None:
    fake.inject("insert", zone=ZONE_A, code="ZONE_RESOURCE_POOL_EXHAUSTED", times=None)
    clock = _Clock()
    provider = _cooling_provider(fake, clock, zones=[ZONE_A, ZONE_B, ZONE_C])

    first = provider.launch(specs("z1", "z2", "z3"))

    assert first.error is None and [i.location for i in first.launched] == [ZONE_B] * 3
    # One probe in zone a, not one insert per instance; zone b proved itself with its probe.
    assert len(fake.calls_to("insert", zone=ZONE_A)) == 1
    assert len(fake.calls_to("insert", zone=ZONE_B)) == 3
    assert fake.calls_to("insert", zone=ZONE_C) == []
    [cooling] = provider.capacity_cooldowns()
    assert (cooling.location, cooling.instance_type, cooling.code) == (
        ZONE_A, "n1-standard-8 + 2x nvidia-tesla-t4", "ZONE_RESOURCE_POOL_EXHAUSTED")
    assert cooling.until == clock.now + timedelta(minutes=10)

    clock.now += timedelta(minutes=9)
    second = provider.launch(specs("z4", "z5"))
    assert second.error is None and len(second.launched) == 2
    assert len(fake.calls_to("insert", zone=ZONE_A)) == 1  # not asked again while it cools down

    clock.now += timedelta(minutes=2)
    assert provider.capacity_cooldowns() == []
    provider.launch(specs("z6"))
    assert len(fake.calls_to("insert", zone=ZONE_A)) == 2  # the cool-down is over: asked first again


@pytest.mark.integration
def test_every_zone_cooling_fails_the_batch_with_capacity_without_an_insert(fake: GceFake) -> None:
    fake.inject("insert", code="ZONE_RESOURCE_POOL_EXHAUSTED", times=None)
    provider = _cooling_provider(fake, _Clock())
    failed = provider.launch(specs("n1", "n2", "n3"))
    assert failed.error is not None and failed.error.kind is ErrorKind.CAPACITY
    assert len(fake.calls_to("insert")) == 2  # one probe per zone

    again = provider.launch(specs("n4"))

    assert again.launched == () and again.error is not None and again.error.kind is ErrorKind.CAPACITY
    assert "cooling down" in str(again.error)
    assert len(fake.calls_to("insert")) == 2


@pytest.mark.integration
def test_quota_errors_name_their_region_or_the_project(fake: GceFake) -> None:
    fake.inject("insert", zone=ZONE_A, code="QUOTA_EXCEEDED", message="Quota 'NVIDIA_T4_GPUS' exceeded.",
                times=1)
    regional = make_provider(fake).launch(specs("qa"))
    assert regional.error is not None
    assert str(regional.error).startswith("quota (QUOTA_EXCEEDED) in region us-central1: ")

    fake.inject("insert", zone=ZONE_A, code="QUOTA_EXCEEDED", message="Quota 'GPUS_ALL_REGIONS' exceeded.",
                times=1)
    global_ = make_provider(fake).launch(specs("qb"))
    assert global_.error is not None and global_.error.scope is ErrorScope.CLOUD
    assert global_.error.location == PROJECT
    assert str(global_.error).startswith(f"quota (QUOTA_EXCEEDED) project-wide ({PROJECT}): ")


# ---- several machine types and capacities (issue 28) -------------------------------------------

_TWO_MACHINES = {"machine_type": None, "gpu_type": None, "gpu_num": None, "machine_types": [
    {"machine_type": "n1-standard-8", "gpu_type": "nvidia-tesla-t4", "gpu_num": 2},
    {"machine_type": "g2-standard-8"}]}


def _machines_cfg(**over: Any) -> dict[str, Any]:
    cfg = {k: v for k, v in base_cfg(**over).items() if k not in ("machine_type", "gpu_type", "gpu_num")}
    cfg["machine_types"] = _TWO_MACHINES["machine_types"]
    return cfg


def _typed_specs(*rows: tuple[str, tuple[tuple[str, bool], ...]]) -> list[LaunchSpec]:
    from provisioners.base import LaunchChoice

    return [LaunchSpec(i, f"#cloud-config\n# {i}\n", tuple(LaunchChoice(t, s) for t, s in choices))
            for i, choices in rows]


@pytest.mark.integration
def test_two_machine_types_launch_as_chosen_with_their_gpus_and_capacity(fake: GceFake) -> None:
    cfg = GcpPoolConfig.from_dict(_machines_cfg(api_endpoint=fake.endpoint, capacity="spot-then-on-demand"))
    prov = GcpProvider(cfg, cluster_id="c1", pool="gpu", master_url=MASTER, credentials=AnonymousCredentials(),
                       call_timeout_s=10, retry_base_s=0.01)
    t4 = "n1-standard-8 + 2x nvidia-tesla-t4"
    assert {(o.instance_type, o.slots, o.spot) for o in prov.offers()} == {
        (t4, 2, True), (t4, 2, False), ("g2-standard-8", 1, True), ("g2-standard-8", 1, False)}

    result = prov.launch(_typed_specs(("m-1", ((t4, True),)), ("m-2", (("g2-standard-8", False),))))

    assert result.error is None
    first, second = (fake.sent[i.id] for i in result.launched)
    assert first["machineType"].endswith("/n1-standard-8") and second["machineType"].endswith("/g2-standard-8")
    assert [a["acceleratorCount"] for a in first["guestAccelerators"]] == [2]
    assert "guestAccelerators" not in second or not second["guestAccelerators"]
    assert first["scheduling"].get("provisioningModel") == "SPOT"
    assert second["scheduling"].get("provisioningModel") in (None, "STANDARD")
    assert (first["labels"]["shipyard-capacity"], second["labels"]["shipyard-capacity"]) == ("spot", "on-demand")


@pytest.mark.integration
def test_the_four_a2_sizes_are_offered_with_their_bundled_gpus_and_launched_as_decided(fake: GceFake) -> None:
    """The pool of benchmarks/elastic_trace.py's family rows: A100 machines of 1, 2, 4 and 8 GPUs,
    known from the catalogue alone (no gpu_type or gpu_num), priced per GPU alike."""
    cfg = {k: v for k, v in base_cfg(api_endpoint=fake.endpoint).items()
           if k not in ("machine_type", "gpu_type", "gpu_num")}
    cfg["machine_types"] = [{"machine_type": f"a2-highgpu-{n}g"} for n in (1, 2, 4, 8)]
    prov = GcpProvider(GcpPoolConfig.from_dict(cfg), cluster_id="c1", pool="gpu", master_url=MASTER,
                       credentials=AnonymousCredentials(), call_timeout_s=10, retry_base_s=0.01)
    offers = sorted(prov.offers(), key=lambda o: o.slots)
    assert [(o.instance_type, o.slots, o.spot) for o in offers] == [
        (f"a2-highgpu-{n}g", n, False) for n in (1, 2, 4, 8)]
    assert all(o.usd_per_hour == pytest.approx(3.6734 * o.slots, abs=1e-3) for o in offers)

    from control_plane.core.scaling import PendingDemand, PoolLimits, decide
    from control_plane.loops.autoscaler.types import options_of

    limits = PoolLimits(0, 10, 8, options=options_of(prov))  # as the autoscaler gives them
    decision = decide([PendingDemand(2, 1), PendingDemand(1, 1)], [], limits, datetime.now(UTC))
    assert sum(p.option.slots * p.count for p in decision.launches) == 3  # no GPU paid for that nothing uses
    specs = _typed_specs(*((f"a-{i}", ((p.option.instance_type, False),))
                           for i, p in enumerate(p for p in decision.launches for _ in range(p.count))))
    result = prov.launch(specs)
    assert result.error is None
    sent = sorted(fake.sent[i.id]["machineType"].rsplit("/", 1)[1] for i in result.launched)
    assert sent == sorted(p.option.instance_type for p in decision.launches for _ in range(p.count))
    assert all("guestAccelerators" not in fake.sent[i.id] or not fake.sent[i.id]["guestAccelerators"]
               for i in result.launched)  # bundled: none attached


@pytest.mark.integration
def test_a_machine_type_out_of_capacity_in_every_zone_fails_over_to_the_next(fake: GceFake) -> None:
    fake.inject("insert", code="ZONE_RESOURCE_POOL_EXHAUSTED", machine_type="n1-standard-8", times=None)
    clock = _Clock()
    cfg = GcpPoolConfig.from_dict(_machines_cfg(api_endpoint=fake.endpoint))
    prov = GcpProvider(cfg, cluster_id="c1", pool="gpu", master_url=MASTER, credentials=AnonymousCredentials(),
                       call_timeout_s=10, retry_base_s=0.01, clock=clock)
    t4 = "n1-standard-8 + 2x nvidia-tesla-t4"
    choices = ((t4, False), ("g2-standard-8", False))

    first = prov.launch(_typed_specs(("e-1", choices)))

    assert first.error is None and [i.instance_type for i in first.launched] == ["g2-standard-8"]
    assert len(fake.calls_to("insert", zone=ZONE_A)) == 2 and len(fake.calls_to("insert", zone=ZONE_B)) == 1
    assert {(c.location, c.instance_type) for c in prov.capacity_cooldowns()} == {(ZONE_A, t4), (ZONE_B, t4)}
    from provisioners.base import LaunchChoice

    assert prov.out_of_capacity() == {LaunchChoice(t4, False)}  # the decider plans without it meanwhile

    second = prov.launch(_typed_specs(("e-2", choices)))

    # Every zone cools down for the first type: no insert of it, the next type at once.
    assert [i.instance_type for i in second.launched] == ["g2-standard-8"]
    assert len(fake.calls_to("insert")) == 4


def test_machine_types_config_problems_are_named() -> None:
    with pytest.raises(SettingsError) as info:
        GcpPoolConfig.from_dict({**_machines_cfg(), "machine_types": [
            {"machine_type": "n1-standard-8", "gpu_num": 2}, {"machine_type": "e2-standard-2"}]})
    assert dict(info.value.problems) == {"machine_types[0].gpu_type": "required when gpu_num is 2",
                                         "machine_types[1].instance_slots": "required for 'e2-standard-2' (no GPUs)"}
    with pytest.raises(SettingsError) as info:
        GcpPoolConfig.from_dict({**_machines_cfg(), "gpu_num": 1, "spot": False, "capacity": "spot"})
    assert dict(info.value.problems) == {
        "capacity": "contradicts spot: false (spot: true means capacity: spot; set one of them)",
        "gpu_num": "set it per entry of machine_types"}
