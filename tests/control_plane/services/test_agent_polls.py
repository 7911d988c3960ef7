"""Many waiting command long-polls checked at once (services.agents.agents_with_news, used by
frontdoor/agent_polls.py): the same answer as `has_news` for each agent, in three queries; the hub's
batch checks, arrivals and heartbeats."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from sqlalchemy import event

from control_plane import auth
from control_plane.core import states as st
from control_plane.db.engine import transaction
from control_plane.db.models import Agent
from control_plane.frontdoor.agent_polls import AgentPolls
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
    assert len([q for q in statements if q.lstrip().upper().startswith("SELECT")]) == 3


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


def test_a_credential_revoked_while_its_poll_waits_is_news(master) -> None:  # type: ignore[no-untyped-def]
    resp = register(master, agent_principal(master), agent_id="r1")
    p = credential(master, resp)
    polls = {"r1": (p, resp.session_id)}
    with master.read_sessions() as s:
        assert service.agents_with_news(s, master, polls) == set()
    with transaction(master.sessions) as s:
        auth.revoke_token(s, p.token_id, now=master.clock())
    with master.read_sessions() as s:
        assert service.agents_with_news(s, master, polls) == {"r1"}  # its full check answers 401
        assert service.agents_with_news(s, master, polls, verify=False) == set()  # a wake-up's check: commands only


def test_an_unchecked_arrival_is_checked_at_once(master) -> None:  # type: ignore[no-untyped-def]
    # A start was owed before the poll came: the poll skipped the full check (its credential was
    # known), so the hub checks it with the next batch of arrivals rather than at the next wake-up.
    resp = register(master, agent_principal(master), agent_id="u1")
    p = credential(master, resp)
    submit(master)
    placement.tick(master)
    hub = AgentPolls(master)

    async def scenario() -> bool:
        # A timeout under the hub's periodic re-check (RECHECK_S): only the arrival check can answer.
        return await hub.wait(p, "u1", resp.session_id, timeout=1.5, unchecked=True)

    assert asyncio.run(scenario()) is True
    assert hub.checks == 1


def test_waiting_polls_are_the_heartbeat_written_together(master) -> None:  # type: ignore[no-untyped-def]
    polls = {}
    for i in range(6):
        resp = register(master, agent_principal(master), agent_id=f"h{i}")
        polls[f"h{i}"] = (credential(master, resp), resp.session_id)
    long_ago = master.clock() - timedelta(minutes=5)
    with transaction(master.sessions) as s:
        for a in s.query(Agent):
            a.last_seen = long_ago
        s.get(Agent, "h5").state = st.AgentState.DISCONNECTED  # lost meanwhile: a heartbeat must not revive it
    hub = AgentPolls(master)
    statements: list[str] = []

    async def scenario() -> None:
        waits = [asyncio.create_task(hub.wait(p, aid, sid, timeout=10)) for aid, (p, sid) in polls.items()]
        await asyncio.sleep(0.1)
        hub.saw("h0", "an-old-session")  # a heartbeat for a replaced session moves nothing
        event.listen(master.engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
        await hub.flush_now()
        for t in waits:
            t.cancel()

    asyncio.run(scenario())
    with master.read_sessions() as s:
        seen = {a.id: a.last_seen for a in s.query(Agent)}
    assert all(seen[f"h{i}"] > long_ago for i in range(5)), seen
    assert seen["h5"] == long_ago
    assert len([q for q in statements if q.lstrip().upper().startswith("UPDATE")]) == 1  # one statement for all
    assert hub.flushes == 1


def test_a_second_poll_for_one_agent_answers_the_first_with_nothing(master) -> None:  # type: ignore[no-untyped-def]
    # The first poll answers at once, as "nothing yet" (the agent polls again), not as news: news
    # would send it to a full check and back to the hub, where it would displace the second, and
    # the two would take turns in full checks (write transactions on one row) until their timeouts.
    resp = register(master, agent_principal(master), agent_id="d1")
    p = credential(master, resp)
    hub = AgentPolls(master)

    async def scenario() -> tuple[bool, float, bool, int]:
        loop = asyncio.get_running_loop()
        first = asyncio.create_task(hub.wait(p, "d1", resp.session_id, timeout=10))
        await asyncio.sleep(0.1)
        started = loop.time()
        second = asyncio.create_task(hub.wait(p, "d1", resp.session_id, timeout=0.5))
        answer = await asyncio.wait_for(first, 5)
        took = loop.time() - started
        waiting = len(hub.waiting)
        return answer, took, await second, waiting

    answer, took, second, waiting = asyncio.run(scenario())
    assert answer is False and took < 5  # answered when the second came, not at its own timeout
    assert waiting == 1  # the hub holds the second one only
    assert second is False  # which waits out its own timeout: the agent has no news
