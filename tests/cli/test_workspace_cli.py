"""Shipyard's own det: workspace, project and template commands, `det e create --project_id /
--template` and `det e move`, against a real master (both databases). No agents: experiments are
created paused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.conftest import Det, one_error_line
from tests.cli.test_experiment_cli import _config, _create, _describe, model_dir  # noqa: F401 (fixture)

pytestmark = pytest.mark.integration


def test_workspaces_projects_templates(admin_det: Det, tmp_path: Path, model_dir: Path) -> None:  # noqa: F811
    tag = tmp_path.name[-8:].replace("_", "")  # the package's master is shared: unique names
    ws = f"ws{tag}"
    r = admin_det("workspace", "create", ws, "--checkpoint-storage-config",
                  json.dumps({"type": "s3", "bucket": "ws-ckpts"}))
    assert r.code == 0 and ws in r.out and "ws-ckpts" in r.out, r.err
    listed = json.loads(admin_det("workspace", "list", "--json").out)
    assert {"Uncategorized", ws} <= {w["name"] for w in listed}
    assert "ws-ckpts" in admin_det("workspace", "describe", ws).out
    assert "already exists" in one_error_line(admin_det("workspace", "create", ws))
    assert "not found" in one_error_line(admin_det("workspace", "describe", f"{ws}-nope"))
    assert "defaultComputePool" in one_error_line(admin_det("workspace", "edit", ws, "--default-compute-pool", "x"))

    r = admin_det("project", "create", ws, "vision", "--key", f"V{tag[:4]}")
    assert r.code == 0 and "vision" in r.out, r.err
    assert admin_det("project", "create", ws, "audio").code == 0
    projects = json.loads(admin_det("project", "list", ws, "--json").out)
    ids = {p["name"]: p["id"] for p in projects}
    assert set(ids) == {"vision", "audio"}

    exp_id = _create(admin_det, tmp_path, model_dir, "in-vision", "--paused", "--project_id", str(ids["vision"]))
    exp = _describe(admin_det, exp_id)["experiment"]
    assert (exp["projectName"], exp["workspaceName"]) == ("vision", ws)
    described = admin_det("project", "describe", ws, "vision", "--json")
    assert [e["id"] for e in json.loads(described.out)["experiments"]] == [exp_id]
    r = admin_det("experiment", "move", exp_id, ws, "audio")
    assert r.code == 0, r.err
    assert _describe(admin_det, exp_id)["experiment"]["projectName"] == "audio"
    assert "still holds 1 experiments" in one_error_line(admin_det("project", "delete", ws, "audio", "--yes"))
    assert admin_det("project", "delete", ws, "vision", "--yes").code == 0

    tpl = tmp_path / "tpl.yaml"
    tpl.write_text("max_restarts: 6\nlabels: [team]\n")
    name = f"tpl{tag}"
    assert admin_det("template", "create", name, tpl, "-w", ws).code == 0
    assert name in admin_det("template", "list").out
    assert "max_restarts: 6" in admin_det("template", "describe", name).out
    templated = _create(admin_det, tmp_path, model_dir, "templated", "--paused", "--template", name)
    cfg = _describe(admin_det, templated)["experiment"]["config"]
    assert (cfg["max_restarts"], cfg["labels"]) == (6, ["team"])
    tpl.write_text("max_restarts: 1\n")
    assert admin_det("template", "set", name, tpl).code == 0
    assert admin_det("template", "describe", name).out.strip() == "max_restarts: 1"
    assert "templates" in one_error_line(admin_det("workspace", "delete", ws, "--yes"))  # holds a template
    assert admin_det("template", "remove", name).code == 0
    r = admin_det("experiment", "create", _config(tmp_path, "gone"), model_dir, "--template", name)
    assert f"no template named '{name}'" in one_error_line(r)


def test_master_config(admin_det: Det) -> None:
    r = admin_det("master", "config")
    assert r.code == 0, r.err
    assert "resource_pools:" in r.out and "token_ttl_hours: 168" in r.out, r.out

    assert admin_det("master", "cluster-message", "set", "-m", "back at 9", "-d", "1h").code == 0
    got = json.loads(admin_det("master", "cluster-message", "get", "--json").out)
    assert got["message"] == "back at 9" and got["endTime"], got
    assert "duration" in one_error_line(admin_det("master", "cluster-message", "set", "-m", "x", "-d", "5d"))
    assert admin_det("master", "cluster-message", "clear").code == 0
    assert admin_det("master", "cluster-message", "get").out.strip() == "No cluster message"
