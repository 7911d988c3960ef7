from __future__ import annotations

from datetime import timedelta

import pytest

from provisioners.factory import PoolConfigError, build_provider, elastic_settings
from shipyard_common.settings import parse_duration


def build(cfg, tmp_path):  # type: ignore[no-untyped-def]
    return build_provider(cfg, pool="p", cluster_id="c", master_url="http://m:8080", state_dir=tmp_path)


def test_durations() -> None:
    assert parse_duration(90) == timedelta(seconds=90)
    assert parse_duration("5m") == timedelta(minutes=5)
    assert parse_duration("1.5h") == timedelta(minutes=90)
    for bad in ("soon", -1, True, "5 parsecs"):
        with pytest.raises(ValueError, match="duration|negative"):
            parse_duration(bad)


@pytest.mark.parametrize("cfg, needle", [
    ({"type": "aws", "min_instances": 3, "max_instances": 1}, "min_instances (3) is greater than max_instances (1)"),
    ({"type": "kubernetes"}, "type: must be one of"),
    ({"type": "local", "max_instances": -1}, "max_instances"),
    ({"type": "local", "max_idle_agent_period": "forever"}, "max_idle_agent_period"),
    ({"type": "local", "arrival_window": "lately"}, "arrival_window"),
    ({"type": "local", "slots_per_instance": 0}, "slots_per_instance"),
    ({"type": "local", "bogus": 1}, "bogus"),
    ({"type": "aws", "region": "us-east-1", "image_id": "ami-1", "instance_type": "g5.xlarge", "subnet_ids": []},
     "subnet_ids"),
    ({"type": "gcp", "project": "my-project", "zones": [], "machine_type": "n1", "boot_disk_source_image": "i",
      "instance_slots": 1}, "zones"),
    ({"type": "aws", "region": "us-east-1", "image_id": "ami-1", "instance_type": "g5.xlarge", "instance_slots": 1,
      "startup_script": "echo hi\n" * 3000}, "over the aws limit"),
    ({"type": "aws", "region": "us-east-1", "image_id": "ami-1", "instance_type": "g5.xlarge", "instance_slots": 1,
      "agent": {"no_such_option": 1}}, "agent:"),
    ({"type": "static", "hosts": []}, "hosts"),
])
def test_bad_pool_configs_name_the_field(cfg, needle, tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(PoolConfigError) as e:
        build(cfg, tmp_path)
    assert needle in str(e.value)


def test_static_pool_keeps_all_hosts_by_default(tmp_path) -> None:
    cfg = {"type": "static", "slots_per_host": 4, "hosts": [
        {"address": "10.0.0.1", "user": "ubuntu", "key_file": "/k", "host_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"},
        {"address": "10.0.0.2", "user": "ubuntu", "key_file": "/k", "host_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"},
    ]}
    pp = build(cfg, tmp_path)
    assert (pp.settings.min_instances, pp.settings.max_instances, pp.slots_per_instance) == (2, 2, 4)


def test_local_pool(tmp_path) -> None:
    pp = build({"type": "local", "max_instances": 3, "slots_per_instance": 2, "max_idle_agent_period": "30s"}, tmp_path)
    assert pp.slots_per_instance == 2 and pp.settings.max_idle_agent_period == timedelta(seconds=30)
    assert elastic_settings({"type": "local"}).min_instances == 0


def test_arrival_window_is_a_duration_and_zero_turns_it_off() -> None:
    assert elastic_settings({"type": "local"}).arrival_window == timedelta(minutes=30)
    assert elastic_settings({"type": "local", "arrival_window": "10m"}).arrival_window == timedelta(minutes=10)
    assert not elastic_settings({"type": "local", "arrival_window": 0}).arrival_window
