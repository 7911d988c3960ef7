"""The agents' command long-polls waiting in this process: checked together, heartbeats written
together, and a poll from a known agent answered without a thread, a connection or a slot.

A thousand agents polling every few seconds used to cost a thousand write transactions per round
(each poll marked its agent seen) plus, on every wake-up, one query per waiting poll; when the
master was saturated their polls were refused like any request, went unheard as heartbeats, and
agents were declared lost while they were polling. Here each process keeps one hub per event
loop that:

- remembers the credentials it has verified with a full check (`remember`), so that the next poll
  of the same agent skips the database on arrival: it waits on the hub at once;
- checks the arrivals in batches (`services.agents.agents_with_news`: is the credential still
  live, the session current, a command owed?), and on every wake-up (`master.notify()`, or another
  process's through db/wakebus.py, or every `RECHECK_S`) every waiting poll for commands, in one
  query; only the polls with news go on to the full check, which alone hands out commands (a
  credential revoked while its poll waits is refused at the agent's next poll, within its
  timeout);
- holds the heartbeats: an agent whose poll is waiting or arrived is alive, and the hub writes
  `last_seen` for all of them in one statement every `HEARTBEAT_FLUSH_S`
  (`services.agents.record_heartbeats`), so a poll is never refused for want of a slot and an
  agent is never lost because the master was busy.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass

from starlette.concurrency import run_in_threadpool

from control_plane.auth import Principal, TokenKind, token_digest
from control_plane.db.engine import transaction
from control_plane.frontdoor.per_master import per_master
from control_plane.master import Master
from control_plane.services import agents as service

log = logging.getLogger("shipyard.api.agent_polls")

RECHECK_S = 2.0  # a change nobody signalled (a clock-driven kill) is seen within this
HEARTBEAT_FLUSH_S = 2.0  # how often the seen agents' last_seen is written (well within the heartbeat timeout)
ARRIVAL_GAP_S = 0.05  # arrivals are checked together, at most this often
FULL_CHECK_GAP_S = 0.2  # a full check (every waiting poll) at most this often, however often wake-ups come
CREDENTIAL_TTL_S = 600.0  # a remembered credential is forgotten after this long without use
MAX_CREDENTIALS = 100_000


@dataclass(eq=False)
class _Poll:
    p: Principal
    session_id: str
    fut: asyncio.Future[bool]


class AgentPolls:
    def __init__(self, master: Master) -> None:
        self.master = master
        self.waiting: dict[str, _Poll] = {}
        self.arrived: set[str] = set()  # waiting polls not checked since they came
        self.seen: set[tuple[str, str]] = set()  # (agent id, session id): heartbeats to write
        self.credentials: dict[str, tuple[Principal, float]] = {}  # token digest -> (principal, last used)
        self._kick: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self.checks = 0  # batch checks run (for tests and benchmarks)
        self.flushes = 0  # heartbeat writes

    # -- credentials ------------------------------------------------------------------------
    def remembered(self, token: str | None, agent_id: str) -> Principal | None:
        """The agent's credential if a full check in this process verified it (the batch check
        re-verifies it while the poll waits)."""
        if not token:
            return None
        digest = token_digest(token)
        entry = self.credentials.get(digest)
        if entry is None or entry[0].agent_id != agent_id:
            return None
        self.credentials[digest] = (entry[0], time.monotonic())
        return entry[0]

    def remember(self, token: str, p: Principal) -> None:
        if p.kind is not TokenKind.AGENT_CREDENTIAL:
            return  # only an agent's own credential polls; anything else is refused by the full check
        if len(self.credentials) >= MAX_CREDENTIALS:
            self._prune(time.monotonic(), force=True)
        self.credentials[token_digest(token)] = (p, time.monotonic())

    def forget(self, token: str | None) -> None:
        if token:
            self.credentials.pop(token_digest(token), None)

    def _prune(self, now: float, force: bool = False) -> None:
        stale = [d for d, (_p, used) in self.credentials.items() if now - used > CREDENTIAL_TTL_S]
        for d in stale:
            del self.credentials[d]
        if force and len(self.credentials) >= MAX_CREDENTIALS:  # all fresh: drop the least recently used half
            for d, _ in sorted(self.credentials.items(), key=lambda kv: kv[1][1])[:MAX_CREDENTIALS // 2]:
                del self.credentials[d]

    # -- waiting ----------------------------------------------------------------------------
    def saw(self, agent_id: str, session_id: str) -> None:
        """A heartbeat of a verified agent, written with the next flush."""
        self.seen.add((agent_id, session_id))

    async def wait(self, p: Principal, agent_id: str, session_id: str, timeout: float, *,
                   unchecked: bool = False, gone: Awaitable[object] | None = None) -> bool:
        """True when the agent has news (a command or a refusal), False at the timeout, as soon as
        `gone` completes (the client closed the connection: a dead agent's poll stops counting as
        its heartbeat at once) or when another poll for the same agent takes its place. An
        `unchecked` poll (one that skipped the full check on arrival) is checked with the next
        batch of arrivals."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        previous = self.waiting.get(agent_id)
        if previous is not None and not previous.fut.done():
            # A second poll for one agent: the first answers now, with nothing (the newer poll is
            # the agent's; its arrival is checked as any). Not as news: the first would take a
            # full check, come back, displace the second, and the two would take turns in full
            # checks, each a write transaction on the agent's row, until their timeouts.
            previous.fut.set_result(False)
        self.waiting[agent_id] = _Poll(p, session_id, fut)
        self.saw(agent_id, session_id)
        self._ensure_checker(loop)
        if unchecked:
            self.arrived.add(agent_id)
            self._wake()
        watch = asyncio.ensure_future(gone) if gone is not None else None
        try:
            if watch is None:
                return await asyncio.wait_for(asyncio.shield(fut), timeout)
            await asyncio.wait({fut, watch}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            return fut.done() and fut.result()
        except TimeoutError:
            return False
        finally:
            if watch is not None and not watch.done():
                watch.cancel()
            if (entry := self.waiting.get(agent_id)) is not None and entry.fut is fut:
                del self.waiting[agent_id]
                self.arrived.discard(agent_id)

    def _wake(self) -> None:
        if self._kick is not None and not self._kick.done():
            self._kick.set_result(None)

    def _ensure_checker(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self._task = loop.create_task(self._run())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        last_full = last_check = now
        next_flush = now + HEARTBEAT_FLUSH_S
        while not self.master.stopping.is_set():
            self._kick = loop.create_future()
            notified = loop.create_task(self.master.wait_async(RECHECK_S))
            timeout = max(0.0, min(RECHECK_S - (time.monotonic() - last_full), next_flush - time.monotonic()))
            if not self.arrived:
                await asyncio.wait({notified, self._kick}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            notified.cancel()
            full = notified.done() and not notified.cancelled() or time.monotonic() - last_full >= RECHECK_S
            # Arrivals and wake-ups that come together are checked together.
            gap = (FULL_CHECK_GAP_S if full else ARRIVAL_GAP_S) - (time.monotonic() - (last_full if full else last_check))
            if gap > 0:
                await asyncio.sleep(gap)
            if full or self.arrived:
                arrivals = [a for a in self.arrived if a in self.waiting]
                self.arrived.clear()
                last_check = time.monotonic()
                if arrivals:  # verified: credential and session, then commands
                    await self._check_and_answer(arrivals, verify=True)
                if full:  # a wake-up: commands only (every waiting poll was verified when it came)
                    last_full = last_check
                    checked = set(arrivals)
                    rest = [a for a in self.waiting if a not in checked]
                    if rest:
                        await self._check_and_answer(rest, verify=False)
            if time.monotonic() >= next_flush:
                next_flush = time.monotonic() + HEARTBEAT_FLUSH_S
                await self._flush()
        for poll in list(self.waiting.values()):  # the master stops: answered empty, the agent polls again
            if not poll.fut.done():
                poll.fut.set_result(False)

    async def _check_and_answer(self, asked: list[str], *, verify: bool) -> None:
        snapshot = {aid: self.waiting[aid] for aid in asked if aid in self.waiting}
        polls = {aid: (poll.p, poll.session_id) for aid, poll in snapshot.items()}
        try:
            news = await run_in_threadpool(self._check, polls, verify)
        except Exception:  # a failed check: answer them all; each poll's full check says what is wrong
            log.warning("event=agent_poll_check_failed agents=%d", len(polls), exc_info=True)
            news = set(polls)
        self.checks += 1
        for aid in news:
            fut = snapshot[aid].fut
            if not fut.done():
                fut.set_result(True)

    def _check(self, polls: dict[str, tuple[Principal, str]], verify: bool) -> set[str]:
        with self.master.read_sessions() as s:
            return service.agents_with_news(s, self.master, polls, verify=verify)

    async def _flush(self) -> None:
        """Write the heartbeats of every agent seen since the last flush and of every poll still
        waiting (a waiting poll is a live agent)."""
        seen = self.seen
        self.seen = set()
        seen.update((aid, poll.session_id) for aid, poll in self.waiting.items())
        self._prune(time.monotonic())
        if not seen:
            return
        try:
            await run_in_threadpool(self._write, seen)
            self.flushes += 1
        except Exception:  # kept for the next flush: a heartbeat is not lost to one failed write
            log.warning("event=heartbeat_flush_failed agents=%d", len(seen), exc_info=True)
            self.seen |= seen

    def _write(self, seen: set[tuple[str, str]]) -> None:
        with transaction(self.master.sessions) as s:
            service.record_heartbeats(s, self.master, seen)

    async def flush_now(self) -> None:
        """Write the pending heartbeats at once (tests)."""
        await self._flush()


of = per_master(AgentPolls)
