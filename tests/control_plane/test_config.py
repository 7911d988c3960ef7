from __future__ import annotations

import pytest

from control_plane.config import ConfigError, load_config


def test_defaults() -> None:
    cfg = load_config(env={})
    assert cfg.port == 8080 and cfg.database_url.startswith("sqlite:///")
    assert cfg.database_url.endswith("shipyard.db")
    assert [p.name for p in cfg.resource_pools] == ["default"]
    assert cfg.default_checkpoint_storage["type"] == "shared_fs"


def test_yaml_then_env_then_flags(tmp_path) -> None:
    path = tmp_path / "master.yaml"
    path.write_text("port: 9000\nlog_level: debug\nresource_pools:\n  - name: gpu\n    description: A100s\n"
                    "default_resource_pool: gpu\n")
    cfg = load_config(path, env={"SHIPYARD_PORT": "9100", "SHIPYARD_DB_URL": "postgresql://x/y"})
    assert cfg.port == 9100 and cfg.log_level == "debug" and cfg.db_url == "postgresql://x/y"
    assert cfg.pool("gpu") is not None and cfg.pool("gpu").description == "A100s"
    assert load_config(path, env={"SHIPYARD_PORT": "9100"}, port=9200).port == 9200


@pytest.mark.parametrize("text, needle", [
    ("port: [", "malformed YAML"),
    ("- 1\n- 2", "top level must be a mapping"),
    ("port: -1", "port"),
    ("bogus: 1", "bogus"),
    ("resource_pools: []", "at least one pool"),
    ("resource_pools:\n  - name: a\n  - name: a\n", "duplicate pool"),
    ("default_resource_pool: nope", "default_resource_pool"),
    ("trusted_proxies: [10.0.0.0/8, proxy.example]", "trusted_proxies"),
])
def test_bad_config_is_one_clear_error(tmp_path, text: str, needle: str) -> None:
    path = tmp_path / "master.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_config(path, env={})
    assert needle in str(e.value)


def test_trusted_proxies_default_to_none(tmp_path) -> None:
    assert load_config(env={}).trusted_proxies == []
    path = tmp_path / "master.yaml"
    path.write_text("trusted_proxies: [10.0.0.0/8, 192.0.2.7, '2001:db8::/32']\n")
    assert load_config(path, env={}).trusted_proxies == ["10.0.0.0/8", "192.0.2.7", "2001:db8::/32"]


def test_missing_file(tmp_path) -> None:
    with pytest.raises(ConfigError, match="cannot read master config"):
        load_config(tmp_path / "nope.yaml", env={})


@pytest.mark.parametrize("policy", ["fairshare", "round_robin", "lottery"])
def test_scheduler_type_must_be_a_registered_policy(tmp_path, policy: str) -> None:
    path = tmp_path / "master.yaml"
    path.write_text(f"resource_pools:\n  - name: default\n    scheduler:\n      type: {policy}\n")
    with pytest.raises(ConfigError) as e:
        load_config(path, env={})
    message = str(e.value)
    assert "resource_pools[0].scheduler.type" in message
    assert f"unknown scheduler type {policy!r}; expected one of: priority, fair_share" in message


def test_scheduler_type_defaults_to_the_registered_default(tmp_path) -> None:
    path = tmp_path / "master.yaml"
    path.write_text("resource_pools:\n  - name: default\n  - name: gpu\n    scheduler:\n      type: priority\n")
    cfg = load_config(path, env={})
    assert [p.scheduler.type for p in cfg.resource_pools] == ["priority", "priority"]
