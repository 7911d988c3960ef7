"""The CLI side of issue 10, items 5 and 7, against a real `det-master` process on both databases:
`det resource-pool describe` lists the subnets an AWS pool skips after capacity errors (the
master's autoscaler launches through the EC2 fault proxy); `det experiment create` refuses a shape
no instance can host in one line; `det trial describe` and `det experiment describe` say why a
queued trial can no longer be placed (here: the only agent that joined its pool is too small)."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import yaml
from sqlalchemy.orm import sessionmaker

from control_plane.db.engine import make_engine, transaction
from control_plane.db.models import Agent
from tests.cli.conftest import Result, one_error_line
from tests.conftest import ADMIN_PASSWORD, LiveMaster

if TYPE_CHECKING:
    from tests.provisioners.conftest import Ec2FaultProxy

pytestmark = pytest.mark.integration

SUBNETS = ["subnet-0ccccccccccccccc1", "subnet-0ddddddddddddddd2"]
EXPERIMENT = """\
name: {name}
entrypoint: python3 train.py
searcher: {{name: single, metric: loss, smaller_is_better: true, max_length: {{batches: 10}}}}
resources: {{slots_per_trial: {slots}, resource_pool: {pool}}}
"""


def _master_yaml(path: Path, proxy_url: str) -> None:
    path.write_text(yaml.safe_dump({"resource_pools": [
        {"name": "default"},
        # No instance is ever launched here (max 0): only its instance size matters.
        {"name": "gpu8", "provider": {"type": "local", "slots_per_instance": 8, "max_instances": 0}},
        {"name": "aws", "provider": {
            "type": "aws", "region": "us-east-1", "image_id": "ami-12345678", "instance_type": "p3.2xlarge",
            "instance_slots": 1, "root_device_name": "/dev/xvda", "subnet_ids": SUBNETS, "endpoint_url": proxy_url,
            "max_instances": 1}},
    ]}))


def test_describe_and_refusals_through_the_cli(db_url: str, tmp_path: Path, ec2_faults: Ec2FaultProxy,
                                               capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from cli.main import main

    monkeypatch.setenv("SHIPYARD_CLI_DIR", str(tmp_path / "cli-home"))
    for name in ("DET_MASTER", "DET_USER", "DET_PASS", "SHIPYARD_DEBUG"):
        monkeypatch.delenv(name, raising=False)
    ec2_faults.inject("RunInstances", "InsufficientInstanceCapacity", times=None)
    config = tmp_path / "master.yaml"
    _master_yaml(config, ec2_faults.url)
    model = tmp_path / "model"
    model.mkdir()
    (model / "train.py").write_text("print('training')\n")
    master = LiveMaster(db_url, tmp_path / "state", config_path=config)

    def det(*argv: object) -> Result:
        capsys.readouterr()
        code = main(["-m", master.url, *(str(a) for a in argv)])
        out = capsys.readouterr()
        return Result(code, out.out, out.err)

    def experiment(name: str, slots: int, pool: str) -> Result:
        cfg = tmp_path / f"{name}.yaml"
        cfg.write_text(EXPERIMENT.format(name=name, slots=slots, pool=pool))
        return det("experiment", "create", cfg, model)

    master.start()
    try:
        assert det("user", "login", "admin", "--password", ADMIN_PASSWORD).code == 0
        line = one_error_line(experiment("too-big", 16, "gpu8"))
        assert "config.resources.slots_per_trial" in line and "'gpu8'" in line and "8 slots" in line
        # Accepted: the default pool has no provider and no agent yet, so nothing says it cannot.
        waits = experiment("waits", 8, "default")
        assert waits.code == 0, waits.err
        exp_id = int(waits.out.split()[2])
        assert experiment("on-aws", 1, "aws").code == 0

        # The master's autoscaler tries both subnets, both answer no capacity: they cool down.
        deadline = time.monotonic() + 30
        while True:
            described = det("resource-pool", "describe", "aws")
            if "Capacity cool-downs" in described.out or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        assert described.code == 0, described.err
        assert "Capacity cool-downs" in described.out, described.out
        assert all(s in described.out for s in SUBNETS)
        assert "p3.2xlarge" in described.out and "InsufficientInstanceCapacity" in described.out

        # Only a 2-slot agent joins the default pool: the queued 8-slot trial says why it waits.
        now = datetime.now(UTC)
        engine = make_engine(db_url)
        with transaction(sessionmaker(engine)) as s:
            s.add(Agent(id="small-agent", pool="default", state="connected", session_id="s-small",
                        slots=[{"id": "0", "type": "cpu"}, {"id": "1", "type": "cpu"}], registered_at=now,
                        last_seen=now))
        engine.dispose()
        trial_id = json.loads(det("experiment", "describe", exp_id, "--json").out)["experiment"]["trialIds"][0]
        trial = det("trial", "describe", trial_id)
        assert trial.code == 0, trial.err
        [why] = [x for x in trial.out.splitlines() if x.startswith("Cannot be placed")]
        assert "'default'" in why and "2 slots" in why
        assert "Cannot be placed" in det("experiment", "describe", exp_id).out
    finally:
        master.stop()
