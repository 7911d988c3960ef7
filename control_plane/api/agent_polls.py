"""The agents' command long-polls waiting in this process, checked together.

A wake-up (`master.notify()`, or another process's through db/wakebus.py) used to make every
waiting long-poll re-check the database on its own: with a thousand agents waiting, one trial's
event cost a thousand queries. Here each process keeps one checker per event loop: on a wake-up
(or every `RECHECK_S`) it asks `services.agents.agents_with_news` once for all waiting agents and
answers only those with news; the others keep waiting without costing anything."""

from __future__ import annotations

import asyncio
import contextlib
import weakref

from starlette.concurrency import run_in_threadpool

from control_plane.auth import Principal
from control_plane.master import Master
from control_plane.services import agents as service

RECHECK_S = 2.0  # a change nobody signalled (a clock-driven kill) is seen within this


class AgentPolls:
    def __init__(self, master: Master) -> None:
        self.master = master
        self.waiting: dict[str, tuple[Principal, str, asyncio.Future[bool]]] = {}
        self._task: asyncio.Task[None] | None = None
        self.checks = 0  # batch checks run (for tests and benchmarks)

    async def wait(self, p: Principal, agent_id: str, session_id: str, timeout: float) -> bool:
        """True when the agent has news (a command or a refusal), False at the timeout."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        previous = self.waiting.get(agent_id)
        if previous is not None and not previous[2].done():
            previous[2].set_result(True)  # a second poll for one agent: the first answers now
        self.waiting[agent_id] = (p, session_id, fut)
        self._ensure_checker(loop)
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout)
        except TimeoutError:
            return False
        finally:
            if (entry := self.waiting.get(agent_id)) is not None and entry[2] is fut:
                del self.waiting[agent_id]

    def _ensure_checker(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self._task = loop.create_task(self._run())

    async def _run(self) -> None:
        while not self.master.stopping.is_set():
            await self.master.wait_async(RECHECK_S)
            if not self.waiting:
                continue
            snapshot = dict(self.waiting)
            polls = {aid: (p, sid) for aid, (p, sid, _f) in snapshot.items()}
            with contextlib.suppress(Exception):  # a failed check: the polls time out and come again
                news = await run_in_threadpool(self._check, polls)
                self.checks += 1
                for aid in news:
                    fut = snapshot[aid][2]
                    if not fut.done():
                        fut.set_result(True)

    def _check(self, polls: dict[str, tuple[Principal, str]]) -> set[str]:
        with self.master.read_sessions() as s:
            return service.agents_with_news(s, self.master, polls)


_HUBS: weakref.WeakKeyDictionary[Master, AgentPolls] = weakref.WeakKeyDictionary()


def of(master: Master) -> AgentPolls:
    hub = _HUBS.get(master)
    if hub is None:
        hub = _HUBS[master] = AgentPolls(master)
    return hub
