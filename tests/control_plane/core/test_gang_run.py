"""The run of a gang across agents (control_plane/core/gang_run.py): pure rules."""

from __future__ import annotations

from control_plane.core import gang_run as g


def _gang(n: int = 3) -> list[g.Part]:
    return g.new_parts((f"a{i}", [str(i)]) for i in range(n))


def test_the_allocation_is_as_far_along_as_its_least_advanced_part() -> None:
    parts = _gang(2)
    assert g.progress(parts) == "assigned" and g.to_start(parts, False) == ["a0", "a1"]
    parts = g.advance(parts, "a0", "running")
    assert parts is not None and g.progress(parts) == "assigned" and g.to_start(parts, False) == ["a1"]
    assert g.advance(parts, "a0", "starting") is None  # late event: no change
    assert g.advance(parts, "nobody", "running") is None
    parts = g.advance(parts, "a1", "running")
    assert parts is not None and g.progress(parts) == "running" and g.to_start(parts, False) == []


def test_a_worker_failure_stops_the_others_and_is_the_outcome() -> None:
    parts = _gang(3)
    for a in ("a0", "a1", "a2"):
        parts = g.advance(parts, a, "running") or parts
    after = g.exited(parts, "a2", 1, "exited with code 1", at=100.0)
    assert after is not None and g.over(after)
    assert g.to_kill(after, False, now=100.0, grace_s=30) == ["a0", "a1"]  # a failure: at once
    assert g.to_start(after, False) == []
    assert g.outcome(after) is None  # the others still run
    after = g.exited(after, "a0", -15, "killed") or after
    after = g.exited(after, "a1", -15, "killed") or after
    end = g.outcome(after)
    assert end == g.Outcome(None, 1, "rank 2 (agent a2): exited with code 1")
    assert g.exited(after, "a2", 1, "again") is None  # a repeated exit changes nothing


def test_a_worker_that_finishes_first_does_not_end_the_gang_the_chief_does() -> None:
    parts = _gang(2)
    after = g.exited(parts, "a1", 0, "exited with code 0")
    assert after is not None and not g.over(after) and g.to_kill(after, False) == []
    after = g.exited(after, "a0", 0, "done")
    assert after is not None and g.outcome(after) == g.Outcome(None, 0, "done")
    # The chief finishing first gives the workers a grace to finish, then stops them; their kill
    # is not a failure.
    parts = g.exited(_gang(2), "a0", 0, "done", at=100.0)
    assert parts is not None and g.to_kill(parts, False, now=110.0, grace_s=30) == []
    assert g.to_kill(parts, False, now=131.0, grace_s=30) == ["a1"]
    parts = g.exited(parts, "a1", -9, "killed")
    assert parts is not None and g.outcome(parts) == g.Outcome(None, 0, "done")


def test_a_part_gone_with_its_agent_ends_the_gang_with_that_cause() -> None:
    parts = g.exited(_gang(2), "a1", None, "agent a1 stopped answering", gone="agent_lost")
    assert parts is not None and g.to_kill(parts, False) == ["a0"]
    parts = g.exited(parts, "a0", -15, "killed")
    end = g.outcome(parts or [])
    assert end is not None and end.gone == "agent_lost" and "rank 1 (agent a1)" in (end.reason or "")


def test_a_kill_from_the_master_is_owed_to_every_running_part() -> None:
    parts = g.advance(_gang(2), "a0", "running") or []
    assert g.to_kill(parts, True) == ["a0", "a1"] and g.to_start(parts, True) == []


def test_rendezvous_and_port() -> None:
    parts = _gang(2)
    info = g.rendezvous(parts, {"a0": ["10.0.0.1", "fe80::1"], "a1": ["10.0.0.2"]}, "a1")
    assert info == {"addresses": ["10.0.0.1", "10.0.0.2"], "rank": 1, "slots": [1, 1]}
    assert g.rendezvous(parts, {}, "a9") is None
    port = g.c10d_port("alloc-1")
    assert port == g.c10d_port("alloc-1") and g.C10D_PORT_BASE <= port < g.C10D_PORT_BASE + g.C10D_PORT_SPAN
    assert len({g.c10d_port(f"alloc-{i}") for i in range(50)}) > 40
    # Determined's ZMQ broadcast ports (this one and the next) sit below the c10d range.
    comm = g.comm_port("alloc-1")
    assert comm == g.comm_port("alloc-1") and g.COMM_PORT_BASE <= comm and comm + 1 < g.C10D_PORT_BASE
