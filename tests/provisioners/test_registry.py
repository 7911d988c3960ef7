"""The provider registry: each type's module declares itself once, and the factory reads it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from provisioners import registry
from provisioners.base import UserDataKind
from provisioners.factory import PoolConfigError, build_provider


def test_every_registered_type_is_declared_by_its_module_under_its_name() -> None:
    assert registry.provider_types() == ("aws", "gcp", "local", "static")
    for name in registry.provider_types():
        declared = registry.get(name)
        assert declared.name == name and callable(declared.config.from_dict) and callable(declared.build)


def test_what_each_provider_hands_its_instances() -> None:
    kinds = {name: (registry.get(name).user_data, registry.get(name).user_data_limit)
             for name in registry.provider_types()}
    assert kinds == {
        "aws": (UserDataKind.CLOUD_INIT, 16 * 1024),
        "gcp": (UserDataKind.CLOUD_INIT, 256 * 1024),
        "local": (UserDataKind.TOKEN, None),
        "static": (UserDataKind.TOKEN, None),
    }


def test_a_module_registered_under_another_name_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(registry._MODULES, "copy", "provisioners.local")
    with pytest.raises(RuntimeError, match="declares provider type 'local', registered as 'copy'"):
        registry.get("copy")


def test_unknown_types_are_refused_naming_the_registered_ones(tmp_path: Path) -> None:
    with pytest.raises(PoolConfigError, match="type: must be one of aws, gcp, local, static"):
        build_provider({"type": "azure"}, pool="p", cluster_id="c", master_url="http://m:8080", state_dir=tmp_path)


def test_the_built_pool_carries_its_declaration(tmp_path: Path) -> None:
    pp = build_provider({"type": "local"}, pool="p", cluster_id="c", master_url="http://m:8080", state_dir=tmp_path)
    assert pp.provider_type is registry.get("local")


def test_slots_per_host_belongs_to_static_pools(tmp_path: Path) -> None:
    host = {"address": "10.0.0.1", "user": "ubuntu", "key_file": "/k",
            "host_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"}
    with pytest.raises(PoolConfigError, match="slots_per_host: must be an integer >= 1"):
        build_provider({"type": "static", "slots_per_host": 0, "hosts": [host]}, pool="p", cluster_id="c",
                       master_url="http://m:8080", state_dir=tmp_path)
    with pytest.raises(PoolConfigError, match="slots_per_host"):
        build_provider({"type": "local", "slots_per_host": 2}, pool="p", cluster_id="c",
                       master_url="http://m:8080", state_dir=tmp_path)


def test_reading_a_cloud_config_imports_no_cloud_sdk() -> None:
    # The master's API workers check every pool's section to show its effective settings: that must
    # not import boto3 or google-cloud-compute (memory and start-up time of every worker).
    code = (
        "import sys\n"
        "from provisioners import registry\n"
        "registry.get('aws').config.from_dict({'region': 'us-east-1', 'image_id': 'ami-1', 'instance_type': 'g5.xlarge'})\n"
        "registry.get('gcp').config.from_dict({'project': 'my-project', 'zones': ['us-central1-a'],"
        " 'machine_type': 'n1-standard-8', 'boot_disk_source_image': 'i', 'instance_slots': 1})\n"
        "from provisioners.gcp import GcpPoolConfig, label_value\n"
        "from provisioners.aws import AwsPoolConfig\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('boto3', 'botocore') or"
        " m.startswith(('google.cloud', 'google.api_core', 'google.auth')))\n"
        "print(loaded)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_provider_modules_come_with_their_first_use() -> None:
    from provisioners import aws, gcp

    assert aws.AwsProvider.__module__ == "provisioners.aws.provider"
    assert gcp.GcpProvider.__module__ == "provisioners.gcp.provider"
    assert gcp.classify_error.__module__ == "provisioners.gcp.errors"
    with pytest.raises(AttributeError, match="has no attribute 'Nope'"):
        gcp.Nope  # noqa: B018
