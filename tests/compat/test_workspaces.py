"""Workspaces, projects and templates with the real determined==0.38.1 CLI and SDK (issue 30):
`det workspace create|list|describe|list-pools`, `det project create|list|describe|list-experiments`,
`det e create --project_id` lands there, `det e move`, `det template create|list|describe|set|remove`
and `det e create --template` merged as Determined merges them; `det master config` (secrets
hidden); `det master logs --tail`; the SDK's workspaces and projects. Experiments are created paused: nothing here needs a
trial to run."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from tests.compat.conftest import MODEL_DIR, CompatCluster, Det, experiment_config
from tests.conftest import ADMIN_PASSWORD


def _create(det: Det, cfg: Path, *flags: str) -> int:
    out = det.ok("experiment", "create", "--paused", *flags, cfg, MODEL_DIR)
    return int(re.search(r"Created experiment (\d+)", out).group(1))  # type: ignore[union-attr]


def test_workspaces_projects_and_moves(det: Det, compat_cluster: CompatCluster, tmp_path: Path) -> None:
    # Below the cluster's own root (deploy_local's <state>/checkpoints): no host access needed.
    storage = {"type": "shared_fs", "host_path": str(compat_cluster.state / "checkpoints"), "storage_path": "team-ckpts"}
    out = det.ok("workspace", "create", "compat-team", "--default-compute-pool", "default",
                 "--checkpoint-storage-config", json.dumps(storage), "--json")
    ws = json.loads(out)
    assert (ws["name"], ws["defaultComputePool"], ws["checkpointStorageConfig"]) == ("compat-team", "default", storage)
    listed = det.ok("workspace", "list")
    assert re.search(r"^\s*1 \| Uncategorized", listed, re.M) and "compat-team" in listed, listed
    described = det.ok("workspace", "describe", "compat-team")
    assert "compat-team" in described and "team-ckpts" in described, described
    pools = det.ok("workspace", "list-pools", "compat-team")
    assert re.search(r"compat-team\s+\| default", pools), pools
    r = det("workspace", "create", "compat-team")
    assert r.code != 0 and "already exists" in (r.out + r.err), (r.out, r.err)

    out = det.ok("project", "create", "compat-team", "vision", "--description", "boxes and masks")
    assert re.search(r"\| VISIO\s+\| vision\s+\| boxes and masks", out), out
    det.ok("project", "create", "compat-team", "audio")
    projects = det.ok("project", "list", "compat-team")
    assert "vision" in projects and "audio" in projects, projects
    vision = compat_cluster.get(f"/api/v1/workspaces/{ws['id']}/projects", name="vision")["projects"][0]

    cfg = tmp_path / "exp.yaml"
    cfg.write_text(yaml.safe_dump(experiment_config("compat-in-project")))
    exp_id = _create(det, cfg, "--project_id", vision["id"])
    exp = compat_cluster.experiment(exp_id)
    assert (exp["projectId"], exp["workspaceName"]) == (vision["id"], "compat-team")
    assert exp["config"]["checkpoint_storage"]["host_path"] == storage["host_path"]  # the workspace's storage
    described = det.ok("project", "describe", "compat-team", "vision")
    assert re.search(rf"^\s*{exp_id} \|", described, re.M), described

    out = det.ok("experiment", "move", exp_id, "compat-team", "audio")
    assert 'Moved experiment' in out, out
    assert compat_cluster.experiment(exp_id)["projectName"] == "audio"
    listed = det.ok("project", "list-experiments", "compat-team", "audio")
    assert re.search(rf"^\s*{exp_id} \| admin\s+\| compat-in-project", listed, re.M), listed
    det.ok("project", "delete", "compat-team", "vision", "--yes")
    r = det("project", "delete", "compat-team", "audio", "--yes")
    assert r.code != 0 and "still holds 1 experiments" in (r.out + r.err), (r.out, r.err)
    det.ok("experiment", "move", exp_id, "Uncategorized", "Uncategorized")
    det.ok("project", "archive", "compat-team", "audio")
    r = det("experiment", "move", exp_id, "compat-team", "audio")
    assert r.code != 0 and "archived" in (r.out + r.err), (r.out, r.err)
    det.ok("experiment", "kill", exp_id)


def test_templates_with_e_create(det: Det, compat_cluster: CompatCluster, tmp_path: Path) -> None:
    tpl = tmp_path / "tpl.yaml"
    tpl.write_text(yaml.safe_dump({"description": "from the template", "labels": ["team"], "max_restarts": 4,
                                   "resources": {"priority": 9}}))
    det.ok("template", "create", "compat-base", tpl)
    listed = det.ok("template", "list")
    assert "compat-base" in listed and "Uncategorized" in listed, listed
    assert "max_restarts: 4" in det.ok("template", "describe", "compat-base")

    cfg = experiment_config("compat-templated", labels=["mine"])
    cfg.pop("max_restarts")
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(cfg))
    exp_id = _create(det, path, "--template", "compat-base")
    merged = compat_cluster.experiment(exp_id)["config"]
    assert (merged["max_restarts"], merged["resources"]["priority"], merged["description"]) == (4, 9, "from the template")
    assert merged["labels"] == ["mine", "team"]

    tpl.write_text(yaml.safe_dump({"max_restarts": 2}))
    det.ok("template", "set", "compat-base", tpl)
    assert compat_cluster.get("/api/v1/templates/compat-base")["template"]["config"] == {"max_restarts": 2}
    det.ok("template", "remove", "compat-base")
    r = det("experiment", "create", "--paused", "--template", "compat-base", path, MODEL_DIR)
    assert r.code != 0 and "no template named 'compat-base'" in (r.out + r.err), (r.out, r.err)
    det.ok("experiment", "kill", exp_id)


def test_master_config_shows_no_secret(det: Det) -> None:
    out = det.ok("master", "config")
    assert "resource_pools:" in out and "cluster_name:" in out, out
    assert ADMIN_PASSWORD not in out, out


def test_master_logs_tail_and_format(det: Det, compat_cluster: CompatCluster) -> None:
    # The master's own lines (services/master_logs.py), as 0.38.1 prints them: `TS [LEVEL]: message`.
    out = det.ok("master", "logs", "--tail", "3")
    lines = out.strip().splitlines()
    assert len(lines) == 3, out
    assert all(re.match(r"^\d{4}-\d\d-\d\dT\S+Z \[(INFO|WARNING|ERROR)\]: logger=", line) for line in lines), out
    assert "event=master_listening" in det.ok("master", "logs"), "the whole log starts with the master's start"


def test_sdk_workspaces_and_projects(sdk: Any) -> None:
    got = sdk("""
        ws = client.create_workspace("compat-sdk-ws")
        p = ws.create_project("sdk-proj", description="from the SDK")
        p.add_note("readme", "hello")
        p.set_description("changed")
        p.reload()
        names = [w.name for w in client.list_workspaces()]
        projects = [(q.name, q.description, q.notes) for q in client.get_workspace("compat-sdk-ws").list_projects()]
        ws.delete_project("sdk-proj")
        client.delete_workspace("compat-sdk-ws")
        print(json.dumps({"names": names, "projects": projects,
                          "after": [w.name for w in client.list_workspaces()]}))
    """)
    assert {"Uncategorized", "compat-sdk-ws"} <= set(got["names"])
    assert got["projects"] == [["sdk-proj", "changed", [{"name": "readme", "contents": "hello"}]]]
    assert "compat-sdk-ws" not in got["after"]
