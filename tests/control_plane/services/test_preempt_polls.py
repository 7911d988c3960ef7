"""The preemption long-polls waiting in a process, checked together (frontdoor/preempt_polls.py,
services.trials.stopping_among): on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio

from control_plane.db.engine import transaction
from control_plane.db.models import Allocation
from control_plane.frontdoor.preempt_polls import PreemptionPolls
from control_plane.loops import placement
from control_plane.services import lifecycle, trials
from tests.control_plane.services.test_agents import agent_principal, register, submit


def _running(master, n: int) -> list[str]:  # type: ignore[no-untyped-def]
    """n single-slot trials placed on n agents: their allocation ids."""
    for _ in range(n):
        submit(master)
    for i in range(n):
        register(master, agent_principal(master), agent_id=f"p{i}")
    placement.tick(master)
    with master.read_sessions() as s:
        ids = sorted(a.id for a in s.query(Allocation))
    assert len(ids) == n
    return ids


def test_stopping_among_names_what_must_stop_and_what_is_gone(master) -> None:  # type: ignore[no-untyped-def]
    allocs = _running(master, 3)
    with master.read_sessions() as s:
        assert trials.stopping_among(s, allocs) == set()
        assert trials.stopping_among(s, [*allocs, "no-such"]) == {"no-such"}
    with transaction(master.sessions) as s:
        assert lifecycle.request_preemption(s.get(Allocation, allocs[1]), master.clock())
    with master.read_sessions() as s:
        assert trials.stopping_among(s, allocs) == {allocs[1]}


def test_waiting_preemption_polls_are_answered_by_one_check_per_wake(master) -> None:  # type: ignore[no-untyped-def]
    allocs = _running(master, 4)
    hub = PreemptionPolls(master)

    async def scenario() -> tuple[list[bool], list[bool]]:
        waits = {a: asyncio.create_task(hub.wait(a, timeout=10)) for a in allocs}
        await asyncio.sleep(0.3)
        assert set(hub.waiting) == set(allocs)
        checks_before = hub.checks

        def preempt() -> None:
            with transaction(master.sessions) as s:
                lifecycle.request_preemption(s.get(Allocation, allocs[2]), master.clock())
                master.notify(s)

        await asyncio.to_thread(preempt)
        done, pending = await asyncio.wait(waits.values(), timeout=5, return_when=asyncio.FIRST_COMPLETED)
        assert hub.checks - checks_before <= 2  # one batch check for every waiting poll, not one each
        answered = [t.result() for t in done]
        for t in pending:
            t.cancel()
        # nothing happens to this one meanwhile: False at its timeout
        return answered, [await hub.wait(allocs[0], timeout=0.3)]

    answered, timed_out = asyncio.run(scenario())
    assert answered == [True]  # only the preempted allocation's poll
    assert timed_out == [False]
