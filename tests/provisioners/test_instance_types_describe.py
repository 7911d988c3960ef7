"""A pool of several instance types end to end (issue 28): the autoscaler decides on the offers of
the real AWS provider (moto behind the EC2 fault proxy), launches the cheapest that fits, fails over
when that type's spot capacity is out, records what launched, and `det resource-pool describe`
(the API's answer and the CLI's tables) shows the types, their prices and the chosen launch."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from fastapi.testclient import TestClient

from cli.commands.resource_pool import _types_tables, decision_lines
from control_plane.api.app import create_app
from control_plane.loops.autoscaler import Autoscaler
from shipyard_common import clouds
from tests.conftest import login
from tests.control_plane.loops.conftest import ELASTIC, FakeClock, add_allocation, make_master

if TYPE_CHECKING:
    from tests.provisioners.conftest import Ec2FaultProxy



@pytest.mark.integration
def test_cheapest_type_fails_over_and_describe_shows_types_prices_and_launch(
        db_url: str, tmp_path: Path, ec2_faults: Ec2FaultProxy, capsys: pytest.CaptureFixture[str]) -> None:
    ec2_faults.inject("RunInstances", "InsufficientInstanceCapacity",
                      when={"InstanceType": "g4dn.xlarge", "InstanceMarketOptions.MarketType": "spot"}, times=None)
    provider = {"type": "aws", "region": "us-east-1", "image_id": "ami-12345678",
                "instance_types": ["g4dn.xlarge", "g4dn.12xlarge"], "capacity": "spot-then-on-demand",
                "root_device_name": "/dev/xvda", "endpoint_url": ec2_faults.url,
                "max_instances": 2}
    master = make_master(db_url, tmp_path / "state", FakeClock(), provider)
    try:
        add_allocation(master, "wants-one", slots=1)
        Autoscaler(master).tick()

        calls = [(c.params["InstanceType"], c.params.get("InstanceMarketOptions.MarketType"))
                 for c in ec2_faults.calls("RunInstances")]
        # The cheapest that fits (g4dn.xlarge spot), out of capacity: the next cheapest, on demand.
        assert calls == [("g4dn.xlarge", "spot"), ("g4dn.xlarge", None)]

        with TestClient(create_app(master)) as client:
            pool = client.get(f"/api/v1/resource-pools/{ELASTIC}", headers=login(client)).json()["resourcePool"]
        price = clouds.regional_price("aws", "us-east-1", "g4dn.xlarge")
        assert price is not None
        assert pool["capacity"] == "spot-then-on-demand"
        assert {(o["instanceType"], o["capacity"], o["slots"]) for o in pool["instanceTypes"]} == {
            ("g4dn.xlarge", "spot", 1), ("g4dn.xlarge", "on-demand", 1),
            ("g4dn.12xlarge", "spot", 4), ("g4dn.12xlarge", "on-demand", 4)}
        assert {o["usdPerHour"] for o in pool["instanceTypes"] if o["instanceType"] == "g4dn.xlarge"} == {
            price.on_demand, price.spot}
        (launch,) = pool["lastDecision"]["launches"]
        assert (launch["instance_type"], launch["capacity"], launch["count"]) == ("g4dn.xlarge", "spot", 1)
        assert launch["fallbacks"][0] == "g4dn.xlarge (on-demand)"
        (inst,) = pool["instances"]
        assert (inst["instanceType"], inst["capacity"]) == ("g4dn.xlarge", "on-demand")

        _types_tables(pool)
        out = capsys.readouterr().out
        assert "Instance types (capacity: spot-then-on-demand)" in out and "g4dn.12xlarge" in out
        assert f"Chosen launch (est. ${price.spot:.4g}/h)" in out
        assert not any(line.strip().startswith(("offers:", "launches:")) for line in decision_lines(pool["lastDecision"]))
    finally:
        master.stop()
