"""Requests written together: one transaction for those that arrive while the previous one is
being written (group commit). frontdoor/log_batches.py (log shipments) and
frontdoor/metric_batches.py (single metric reports) are its two writers.

The most frequent requests a cluster sends are its trials' log shipments and metric reports, a
few each per trial every couple of seconds. Written one by one, each costs a worker thread
hand-off, a transaction and a commit (on PostgreSQL a WAL flush; on SQLite a pass through the
database-wide write lock). Here each process keeps one writer of each kind per event loop: an item
is queued and its request waits, holding no thread, connection or admission slot, until the
writer has stored it. The writer takes everything queued and hands it to `store_many`, which
checks each item on its own (its caller, its rights, its content: a refusal, a `DomainError`,
answers only its own request), writes those allowed and commits once; then it answers them all.
Nothing is acknowledged before its commit.

While one batch is written the next gathers, so a quiet master writes at once and a busy one
writes fewer, larger transactions: the more clients, the less each request costs. The queue is
bounded (`MAX_QUEUED`): past it a request keeps its admission slot while it waits, so the front
door's lane throttles what comes next. A batch the database refuses (nothing of it stored) is
written again item by item, so that one item the database cannot take fails alone."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from starlette.concurrency import run_in_threadpool
from starlette.types import Scope

from control_plane.errors import DomainError
from control_plane.frontdoor import admission
from control_plane.master import Master

log = logging.getLogger("shipyard.api.group_commit")

MAX_QUEUED = 256  # items waiting without a slot, per writer
MAX_BATCH = 200  # items per transaction

T = TypeVar("T")
# (master, items) -> one answer per item, in order: its refusal, or anything else (stored; the
# writer answers only stored or refused). Raises when the database refuses the batch: then
# nothing of it is stored.
StoreMany = Callable[[Master, list[T]], Sequence[DomainError | int | None]]


class GroupWriter(Generic[T]):
    name = "items"  # in log lines

    def __init__(self, master: Master, store_many: StoreMany[T]) -> None:
        self.master = master
        self.store_many = store_many
        self.queued: list[tuple[T, asyncio.Future[DomainError | None]]] = []
        self._task: asyncio.Task[None] | None = None
        self.batches = 0  # transactions written (for tests)

    def has_room(self) -> bool:
        return len(self.queued) < MAX_QUEUED

    async def submit(self, scope: Scope, item: T) -> None:
        """`post` for a request: its admission slot is given back while it waits, unless the queue
        is full (then it keeps it, and the front door's lane throttles what comes next)."""
        if self.has_room():
            admission.ticket(scope).release()
        await self.post(item)

    async def post(self, item: T) -> None:
        """Stored (committed) when this returns; a refusal raises its DomainError."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[DomainError | None] = loop.create_future()
        fut.add_done_callback(_retrieved)
        self.queued.append((item, fut))
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self._task = loop.create_task(self._write())
        # shielded: a client that hangs up does not unqueue an item the writer may be storing
        refusal = await asyncio.shield(fut)
        if refusal is not None:
            raise refusal

    async def _write(self) -> None:
        while self.queued:
            batch, self.queued = self.queued[:MAX_BATCH], self.queued[MAX_BATCH:]
            try:
                answers = await run_in_threadpool(self.store_many, self.master, [item for item, _ in batch])
            except Exception as e:
                if len(batch) == 1:
                    _answer(batch[0][1], e)
                    continue
                # The database refused the batch (nothing of it was stored): each alone, so that
                # one item the database cannot take does not fail the others.
                log.warning("event=group_commit_failed kind=%s items=%d retry=one_by_one", self.name, len(batch),
                            exc_info=True)
                for item, fut in batch:
                    try:
                        (answer,) = await run_in_threadpool(self.store_many, self.master, [item])
                    except Exception as alone:
                        _answer(fut, alone)
                    else:
                        _answer(fut, answer)
                continue
            self.batches += 1
            for (_, fut), answer in zip(batch, answers, strict=True):
                _answer(fut, answer)


def _retrieved(fut: asyncio.Future[DomainError | None]) -> None:
    """A request that left (its client hung up) does not read its answer: no "never retrieved" noise."""
    if not fut.cancelled():
        fut.exception()


def _answer(fut: asyncio.Future[DomainError | None], answer: DomainError | Exception | int | None) -> None:
    if fut.done():
        return
    if isinstance(answer, DomainError):
        fut.set_result(answer)
    elif isinstance(answer, Exception):
        fut.set_exception(answer)
    else:
        fut.set_result(None)
