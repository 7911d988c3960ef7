"""A pool's settings have one home: every reader reports the same effective values (issue 25).

The expected values are read from the settings models themselves (`ElasticSettings`,
`SchedulerConfig`, `ResourcePoolConfig`), never written here: a pool that sets nothing must show
those defaults in the API, in `det resource-pool describe`, on the web UI's cluster page, and be
what the autoscaler acts on — on SQLite and on PostgreSQL, against a real `det-master` process.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from html import unescape
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from control_plane.config import ResourcePoolConfig, SchedulerConfig, load_config
from control_plane.loops.autoscaler import Autoscaler
from control_plane.loops.autoscaler.decision import pool_limits
from control_plane.master import Master
from control_plane.services.pool_settings import UNSHOWN
from provisioners.factory import PoolConfigError, resolve
from shipyard_common.pool_settings import ElasticSettings
from shipyard_common.settings import SettingsError
from tests.conftest import ADMIN_PASSWORD, LiveMaster

BARE = "bare"  # `provider: {type: local}` and nothing else


def _default(model: type, name: str) -> Any:
    field = model.model_fields[name]
    return field.default_factory() if field.default_factory is not None else field.default


def expected_elastic() -> dict[str, Any]:
    """Every elastic setting's default, from the model; the list-miss grace is the one the provider
    decides when unset (a local pool's process list is consistent: 0)."""
    values = {name: _default(ElasticSettings, name) for name in ElasticSettings.model_fields if name != "type"}
    assert values.pop("list_miss_grace") is None
    values["list_miss_grace"] = timedelta(0)
    nested = values.pop("consolidation")  # a nested section is shown field by field
    values.update({f"consolidation_{k}": v for k, v in nested.model_dump().items()})
    return values


def wire(value: Any) -> Any:
    return value.total_seconds() if isinstance(value, timedelta) else value


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w.title() for w in rest)


@pytest.fixture
def master_with_bare_pool(db_url: str, tmp_path: Path) -> Iterator[LiveMaster]:
    config = tmp_path / "master.yaml"
    config.write_text(yaml.safe_dump({"resource_pools": [{"name": "default"}, {"name": BARE, "provider": {"type": "local"}}]}))
    m = LiveMaster(db_url, tmp_path / "state", config_path=config)
    m.start()
    yield m
    m.stop()


def _api_pool(m: LiveMaster) -> dict[str, Any]:
    r = httpx.get(f"{m.url}/api/v1/resource-pools/{BARE}", headers={"Authorization": f"Bearer {m.token()}"})
    assert r.status_code == 200, r.text
    return r.json()["resourcePool"]


def _cli_settings(m: LiveMaster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                  capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    from cli.main import main

    monkeypatch.setenv("SHIPYARD_CLI_DIR", str(tmp_path / "cli-home"))
    monkeypatch.setenv("COLUMNS", "240")
    assert main(["-m", m.url, "user", "login", "admin", "--password", ADMIN_PASSWORD]) == 0
    capsys.readouterr()
    assert main(["-m", m.url, "resource-pool", "describe", BARE]) == 0
    out = capsys.readouterr().out
    section = out.split("Settings", 1)[1].split("\n\n", 1)[0]
    rows = dict(re.findall(r"^\s*([a-z_]+)\s+(\S+)\s*$", section, re.MULTILINE))
    assert rows, out
    return rows


def _ui_settings(m: LiveMaster) -> dict[str, str]:
    with httpx.Client(base_url=m.url) as ui:
        csrf = re.search(r'name="csrf" value="([^"]+)"', ui.get("/login").text)
        assert csrf is not None
        r = ui.post("/login", data={"username": "admin", "password": ADMIN_PASSWORD, "csrf": csrf.group(1), "next": "/"})
        assert r.status_code in (200, 303), r.text
        page = ui.get("/cluster")
        assert page.status_code == 200
    pool = page.text.split(f'id="pool-{BARE}"', 1)[1].split("</section>", 1)[0]
    return {name: unescape(value) for name, value in
            re.findall(r'<tr class="setting" data-name="([a-z_]+)" data-value="([^"]*)"', pool)}


def _shown(value: Any) -> str:
    """How the CLI and the UI print a wire value (null: unset; seconds as `%g`)."""
    if value is None:
        return "unset"
    return f"{value:g}" if isinstance(value, float) else str(value)


@pytest.mark.integration
def test_a_pool_that_sets_nothing_shows_the_models_defaults_everywhere(
        master_with_bare_pool: LiveMaster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    m = master_with_bare_pool
    expected = expected_elastic()
    shown = {k: v for k, v in expected.items() if k not in UNSHOWN}

    # The API: every shown setting, and Determined's fields that carry the same ones.
    pool = _api_pool(m)
    assert pool["settings"] == {camel(k): wire(v) for k, v in shown.items()}
    assert (pool["minAgents"], pool["maxAgents"]) == (expected["min_instances"], expected["max_instances"])
    assert pool["maxIdleAgentPeriod"] == wire(expected["max_idle_agent_period"])
    assert pool["maxAgentStartingPeriod"] == wire(expected["max_agent_starting_period"])
    assert pool["schedulerType"] == "SCHEDULER_TYPE_" + _default(SchedulerConfig, "type").upper()
    assert pool["preemptible"] is _default(SchedulerConfig, "preemption")
    assert pool["schedulerFittingPolicy"] == "FITTING_POLICY_" + _default(SchedulerConfig, "fitting_policy").upper()
    assert pool["provider"] == "local" and pool["error"] is None

    # The CLI and the web UI print the same values.
    as_text = {k: _shown(wire(v)) for k, v in shown.items()}
    assert _cli_settings(m, tmp_path, monkeypatch, capsys) == as_text
    assert _ui_settings(m) == as_text

    # The autoscaler acts on the same settings, and hands the decider limits built from them.
    master = Master(load_config(env={}, db_url=m.db_url, state_dir=str(tmp_path / "reader"),
                                admin_password=ADMIN_PASSWORD,
                                resource_pools=[{"name": "default"}, {"name": BARE, "provider": {"type": "local"}}]))
    try:
        scaler = Autoscaler(master)
        pp = scaler.pool_provider(BARE)
        assert pp is not None
        assert {k: getattr(pp.settings, k) for k in expected if not k.startswith("consolidation_")} == {
            k: v for k, v in expected.items() if not k.startswith("consolidation_")}
        assert pp.settings.consolidation.model_dump() == {
            k.removeprefix("consolidation_"): v for k, v in expected.items() if k.startswith("consolidation_")}
        limits = pool_limits(pp)
        assert (limits.min_instances, limits.max_instances) == (expected["min_instances"], expected["max_instances"])
        assert limits.max_idle_agent_period == expected["max_idle_agent_period"]
        assert limits.max_agent_starting_period == expected["max_agent_starting_period"]
        assert limits.max_disconnected_period == expected["max_disconnected_period"]
        assert limits.arrival_window == expected["arrival_window"]
        assert limits.max_launch_per_decision == expected["max_launch_per_decision"]
    finally:
        master.stop()


def test_every_reader_goes_through_the_one_resolver() -> None:
    """The pool model's own reader is the factory's: same values, and no reader keeps a default."""
    cfg = ResourcePoolConfig(name="p", provider={"type": "local"})
    assert cfg.settings() == resolve({"type": "local"})
    assert ResourcePoolConfig(name="q").settings() is None
    assert _default(ResourcePoolConfig, "container_runtime") == "process"
    assert ElasticSettings(type="local").max_instances == 5  # the documented value of an unset max_instances


def test_every_problem_of_a_pool_section_is_named_with_its_path() -> None:
    with pytest.raises(PoolConfigError) as e:
        resolve({"type": "local", "max_instances": "7", "max_idle_agent_period": "forever", "min_instances": -1})
    paths = [path for path, _ in e.value.problems]
    assert paths == ["min_instances", "max_instances", "max_idle_agent_period"], e.value.problems
    assert "max_instances: must be a valid integer, got '7'" in str(e.value)
    assert isinstance(e.value, SettingsError) and e.value.under("provider").problems[0][0] == "provider.min_instances"


def test_a_bad_pool_section_is_an_error_of_that_pool_everywhere(tmp_path: Path) -> None:
    from control_plane.services.pool_settings import effective_pool

    cfg = ResourcePoolConfig(name="p", provider={"type": "local", "max_instances": -2})
    ep = effective_pool(cfg)
    assert ep.elastic is None and ep.provider == "local" and (ep.min_instances, ep.max_instances) == (0, 0)
    assert ep.error is not None and "max_instances" in ep.error
