"""Log shipments written together: one transaction for the batches that arrive while the previous
one is being written (group commit).

Every trial's output reaches the master as `POST /api/v1/task/logs`, a few lines every couple of
seconds: the most frequent request a cluster sends. Written one by one, each costs a worker thread
hand-off, a transaction and a commit (on PostgreSQL a WAL flush). Here each process keeps one
writer per event loop: a shipment is queued and its request waits, holding no thread, connection
or admission slot, until the writer has stored it. The writer takes everything queued, checks
each shipment on its own (`services.logs.post_many`: its caller, its rights, its lines; a refusal
answers only its own request), inserts the lines of all in one statement and commits once; then
it answers them all. Nothing is acknowledged before its commit.

While one batch is written the next gathers, so a quiet master writes at once and a busy one
writes fewer, larger transactions. The queue is bounded (`MAX_QUEUED`): past it a shipment keeps
its admission slot while it waits, so the front door's lane throttles what comes next."""

from __future__ import annotations

import asyncio
import logging

from starlette.concurrency import run_in_threadpool

from control_plane.api.per_master import per_master
from control_plane.errors import DomainError
from control_plane.master import Master
from control_plane.services import logs as log_records

log = logging.getLogger("shipyard.api.log_batches")

MAX_QUEUED = 256  # shipments waiting without a slot, per process
MAX_BATCH = 200  # shipments per transaction


class LogBatches:
    def __init__(self, master: Master) -> None:
        self.master = master
        self.queued: list[tuple[log_records.Shipment, asyncio.Future[DomainError | None]]] = []
        self._task: asyncio.Task[None] | None = None
        self.batches = 0  # transactions written (for tests)

    def has_room(self) -> bool:
        return len(self.queued) < MAX_QUEUED

    async def post(self, shipment: log_records.Shipment) -> None:
        """Stored (committed) when this returns; a refusal raises its DomainError."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[DomainError | None] = loop.create_future()
        fut.add_done_callback(_retrieved)
        self.queued.append((shipment, fut))
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self._task = loop.create_task(self._write())
        # shielded: a client that hangs up does not unqueue lines the writer may be storing
        refusal = await asyncio.shield(fut)
        if refusal is not None:
            raise refusal

    async def _write(self) -> None:
        while self.queued:
            batch, self.queued = self.queued[:MAX_BATCH], self.queued[MAX_BATCH:]
            try:
                answers = await run_in_threadpool(log_records.post_many, self.master, [sh for sh, _ in batch])
            except Exception as e:
                if len(batch) == 1:
                    _answer(batch[0][1], e)
                    continue
                # The database refused the batch (nothing of it was stored): each alone, so that
                # one shipment the database cannot take does not fail the others.
                log.warning("event=log_batch_failed shipments=%d retry=one_by_one", len(batch), exc_info=True)
                for shipment, fut in batch:
                    try:
                        (answer,) = await run_in_threadpool(log_records.post_many, self.master, [shipment])
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


def _answer(fut: asyncio.Future[DomainError | None], answer: DomainError | Exception | None) -> None:
    if fut.done():
        return
    if answer is None or isinstance(answer, DomainError):
        fut.set_result(answer)
    else:
        fut.set_exception(answer)


of = per_master(LogBatches)
