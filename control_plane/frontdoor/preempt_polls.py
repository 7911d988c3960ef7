"""The preemption long-polls waiting in this process, checked together.

Every running trial keeps one `GET /api/v1/allocations/{id}/signals/preemption` waiting (the
harness asks with a 60 s timeout). Each used to re-check its allocation on every wake-up and every
2 s, taking an admission slot and a worker thread each time: with 500 trials, 250 checks a second
queued behind the trials' own reports. Here each process keeps one checker per event loop that
asks `services.trials.stopping_among` once for every waiting poll, on each wake-up
(`master.notify()`, or another process's through db/wakebus.py) and every `RECHECK_S`; a poll
waits holding no slot, thread or connection, and is answered when its allocation must stop or at
its timeout."""

from __future__ import annotations

import asyncio
import logging
import time

from starlette.concurrency import run_in_threadpool

from control_plane.frontdoor.per_master import per_master
from control_plane.master import Master
from control_plane.services import trials

log = logging.getLogger("shipyard.api.preempt_polls")

RECHECK_S = 2.0  # a change nobody signalled is seen within this (as the per-poll re-check was)
CHECK_GAP_S = 0.2  # however often wake-ups come, at most this often


class PreemptionPolls:
    def __init__(self, master: Master) -> None:
        self.master = master
        self.waiting: dict[str, set[asyncio.Future[bool]]] = {}
        self._task: asyncio.Task[None] | None = None
        self.checks = 0  # batch checks run (for tests)

    async def wait(self, allocation_id: str, timeout: float) -> bool:
        """True as soon as the allocation must stop (or is gone), False at the timeout."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        self.waiting.setdefault(allocation_id, set()).add(fut)
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self._task = loop.create_task(self._run())
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout)
        except TimeoutError:
            return False
        finally:
            futs = self.waiting.get(allocation_id)
            if futs is not None:
                futs.discard(fut)
                if not futs:
                    del self.waiting[allocation_id]

    async def _run(self) -> None:
        last = 0.0
        while not self.master.stopping.is_set():
            await self.master.wait_async(RECHECK_S)
            gap = CHECK_GAP_S - (time.monotonic() - last)
            if gap > 0:
                await asyncio.sleep(gap)  # wake-ups that come together are checked together
            last = time.monotonic()
            if not self.waiting:
                continue
            snapshot = {aid: set(futs) for aid, futs in self.waiting.items()}
            try:
                stop = await run_in_threadpool(self._check, list(snapshot))
            except Exception:  # the polls keep waiting; the next check tries again
                log.warning("event=preemption_poll_check_failed polls=%d", len(snapshot), exc_info=True)
                continue
            self.checks += 1
            for aid in stop:
                for fut in snapshot.get(aid, ()):
                    if not fut.done():
                        fut.set_result(True)
        for futs in list(self.waiting.values()):  # the master stops: "no preemption yet", the harness asks again
            for fut in futs:
                if not fut.done():
                    fut.set_result(False)

    def _check(self, allocation_ids: list[str]) -> set[str]:
        with self.master.read_sessions() as s:
            return trials.stopping_among(s, allocation_ids)


of = per_master(PreemptionPolls)
