"""`det deploy local up` on a cluster whose master died, then `down`: no agent is left behind
(issue 27, item 8). The agents outlive a killed master; `up` used to start a second agent of each id
beside them (it exited at once), recording its dead pid in place of the live one, so `down` missed
the live agent."""

from __future__ import annotations

import pytest

from cli import deploy_local
from shipyard_common.processes import pid_alive


@pytest.mark.integration
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_up_after_the_master_died_keeps_the_live_agents_and_down_stops_every_one(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    c = cluster_factory(agents=2)
    agents = {a["id"]: a["pid"] for a in c.data["agents"]}
    assert deploy_local.agent_processes(c.state) == agents  # found by their command lines
    c.kill_master()
    assert all(pid_alive(pid) for pid in agents.values())  # the agents outlive their master

    port = int(c.url.rsplit(":", 1)[1])
    data = deploy_local.up(c.state, agents=2, port=port, db=c.db_url, slots=1, pool_config=c.state / "master.yaml")
    assert {a["id"]: a["pid"] for a in data["agents"]} == agents  # kept (and reconnected), not started twice
    assert deploy_local.agent_processes(c.state) == agents
    assert pid_alive(data["master_pid"])

    # A run file that lost track of an agent (as the old `up` left it): `down` still finds it.
    data["agents"][0]["pid"] = 2**22 + 12345
    deploy_local.LocalCluster(c.state).write(data)
    deploy_local.down(c.state, quiet=True)
    assert not any(pid_alive(pid) for pid in agents.values())
    assert deploy_local.agent_processes(c.state) == {}
    assert not pid_alive(data["master_pid"])
