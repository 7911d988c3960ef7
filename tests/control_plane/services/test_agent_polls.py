"""Many waiting command long-polls checked at once (services.agents.agents_with_news, used by
api/agent_polls.py): the same answer as `has_news` for each agent, in two queries."""

from __future__ import annotations

import asyncio

from sqlalchemy import event

from control_plane.api.agent_polls import AgentPolls
from control_plane.loops import placement
from control_plane.services import agents as service
from tests.control_plane.services.test_agents import agent_principal, credential, register, submit


def test_batch_check_agrees_with_has_news_per_agent(master) -> None:  # type: ignore[no-untyped-def]
    submit(master)  # one single-slot trial: placed on one of the agents below
    polls = {}
    for i in range(5):
        resp = register(master, agent_principal(master), agent_id=f"a{i}")
        polls[f"a{i}"] = (credential(master, resp), resp.session_id)
    placement.tick(master)
    polls["a3"] = (polls["a3"][0], "a-stale-session")  # refused: news too
    polls["a4"] = (polls["a0"][0], polls["a4"][1])  # another agent's credential: refused
    with master.read_sessions() as s:
        expected = {aid for aid, (p, sid) in polls.items() if service.has_news(s, master, p, aid, sid)}
    statements: list[str] = []
    event.listen(master.engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    with master.read_sessions() as s:
        got = service.agents_with_news(s, master, polls)
    assert got == expected
    assert {"a3", "a4"} <= got and len(got - {"a3", "a4"}) == 1  # the agent the trial was placed on
    assert len([q for q in statements if q.lstrip().upper().startswith("SELECT")]) == 2


def test_waiting_polls_are_answered_by_one_check_per_wake(master) -> None:  # type: ignore[no-untyped-def]
    polls = {}
    for i in range(20):
        resp = register(master, agent_principal(master), agent_id=f"w{i}")
        polls[f"w{i}"] = (credential(master, resp), resp.session_id)
    hub = AgentPolls(master)

    async def scenario() -> list[bool]:
        waits = [asyncio.create_task(hub.wait(p, aid, sid, timeout=10)) for aid, (p, sid) in polls.items()]
        await asyncio.sleep(0.2)
        assert len(hub.waiting) == 20
        submit(master)
        await asyncio.to_thread(placement.tick, master)  # places the trial and notifies
        done, pending = await asyncio.wait(waits, timeout=5, return_when=asyncio.FIRST_COMPLETED)
        answered = [t.result() for t in done]
        for t in pending:
            t.cancel()
        return answered

    answered = asyncio.run(scenario())
    assert answered == [True]  # only the agent given the trial was answered
    assert 1 <= hub.checks <= 3  # one batch check per wake-up, not one per waiting poll
