"""Task logs: `POST /api/v1/task/logs`, streaming `GET /api/v1/trials/{id}/logs` and
`GET /api/v1/tasks/{taskId}/logs` (follow keeps the stream open until the task has ended)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response, StreamingResponse
from pydantic import Field
from sqlalchemy.orm import Session
from starlette.background import BackgroundTask

from control_plane.api import deps, serializers
from control_plane.api.streams import STREAM_BATCH, STREAM_MEDIA_TYPE, ndjson, stream_error
from control_plane.api.wire import INT32_MAX, Id, Int32, Int64, StrictWire, ts
from control_plane.auth import Principal
from control_plane.db.models import TaskLog
from control_plane.errors import bad_request
from control_plane.frontdoor import fastjson, log_batches
from control_plane.frontdoor.admission import Ticket
from control_plane.master import Master
from control_plane.services import access
from control_plane.services import logs as log_records
from control_plane.services.logs import LogFilter

log = logging.getLogger("shipyard.api.logs")
router = APIRouter(route_class=fastjson.FastRoute)

FOLLOW_POLL_S = 0.25


# -- ingest ----------------------------------------------------------------------------------------
class TaskLogIn(StrictWire):
    # A line's text is stored cleaned (NUL and lone surrogates as U+FFFD, services/logs.py), not
    # refused: an agent ships whatever a task printed.
    cleaned_text = frozenset({"log", "allocation_id", "agent_id", "container_id", "level", "stdtype", "source",
                              "timestamp"})

    task_id: str = Field(min_length=1, max_length=64)
    log: str
    allocation_id: str | None = Field(default=None, max_length=64)
    agent_id: str | None = Field(default=None, max_length=128)
    container_id: str | None = None
    rank_id: Int32 | None = None
    timestamp: str | None = None
    level: str | None = None
    stdtype: str | None = Field(default=None, max_length=16)
    source: str | None = Field(default=None, max_length=32)
    id: Int64 | None = None


class PostTaskLogsRequest(StrictWire):
    logs: list[TaskLogIn] = Field(max_length=100_000)


def _shipment(body: PostTaskLogsRequest) -> tuple[list[log_records.LogTarget], Callable[[], list[log_records.LogLine]]]:
    """What the lines are for (checked first) and how to build them (their 400s come after)."""
    targets = [log_records.LogTarget(e.task_id, e.allocation_id) for e in body.logs]

    def lines() -> list[log_records.LogLine]:
        return [
            log_records.LogLine(
                task_id=e.task_id, log=e.log, allocation_id=e.allocation_id, agent_id=e.agent_id, rank=e.rank_id,
                timestamp=serializers.parse_time(e.timestamp, f"logs[{i}].timestamp"), level=e.level,
                stdtype=e.stdtype, source=e.source,
            )
            for i, e in enumerate(body.logs)
        ]

    return targets, lines


async def _post_fast(request: Request) -> Response | None:
    """The fast path (frontdoor/fastjson.py): the body parsed from bytes, the shipment queued for
    this process's log writer (frontdoor/log_batches.py), which stores it with the others that came
    meanwhile in one transaction (`services/logs.post_many`, as FastAPI's handling does alone) and
    answers when it is committed; the answer by orjson. While it waits the request gives its
    admission slot back (unless the writer's queue is full). FastAPI's handling (`post_task_logs`)
    answers what it declines."""
    if not deps.bearer_token(request):
        return None
    body = await fastjson.parse_body(request, PostTaskLogsRequest)
    if body is None or not body.logs:
        return None
    master: Master = request.app.state.master

    def caller(s: Session) -> Principal:  # deps.principal, in the writer's session
        return deps.principal_in(s, request, master)

    await log_batches.of(master).submit(request.scope, (caller, *_shipment(body)))
    return fastjson.json_response({})


@router.post("/api/v1/task/logs")
@fastjson.fast_path(_post_fast)
def post_task_logs(
    body: PostTaskLogsRequest,
    p: Principal = Depends(deps.principal),
    master: Master = Depends(deps.get_master),
) -> dict[str, Any]:
    if not body.logs:
        return {}
    log_records.post(master, lambda _s: p, *_shipment(body))
    return {}


# -- streaming -------------------------------------------------------------------------------------
def _log_message(row: TaskLog) -> str:
    """Determined's flat form: `[timestamp] <container> [rank=N] || LEVEL: line`."""
    stamp = row.timestamp.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    rank = f" [rank={row.rank}]" if row.rank is not None else ""
    return f"[{stamp}] {' ' * 8}{rank} || {row.level}: {row.log}"


def _log_fields(row: TaskLog) -> dict[str, Any]:
    return {
        "id": str(row.id),
        "timestamp": ts(row.timestamp),
        "message": _log_message(row),
        "log": row.log,
        "level": f"LOG_LEVEL_{row.level}",
        "agentId": row.agent_id,
        "containerId": None,
        "rankId": row.rank,
        "stdtype": row.stdtype,
        "source": row.source,
    }


def _trial_log_json(row: TaskLog, trial_id: int) -> dict[str, Any]:
    return {"trialId": trial_id, **_log_fields(row)}


def _task_log_json(row: TaskLog) -> dict[str, Any]:
    return {"taskId": row.task_id, "allocationId": row.allocation_id, **_log_fields(row)}


def _log_stream(
    master: Master,
    task_id: str,
    trial_id: int | None,
    flt: LogFilter,
    render: Callable[[TaskLog], dict[str, Any]],
    *,
    follow: bool,
    limit: int,
    desc: bool,
    slot: Ticket,
) -> StreamingResponse:
    """Pages through a task's logs by id. With follow, polls for new lines until the task is over
    and one more poll after that found nothing (lines shipped just before the end still arrive).

    The stream holds an admission slot (frontdoor/admission.py) only while it reads a page: not
    while it waits between polls, nor while a slow client takes its lines."""

    async def gen() -> AsyncIterator[bytes]:
        slot.release()
        cursor: int | None = None
        sent = 0
        over_seen = False
        while True:

            def fetch(cursor: int | None = cursor) -> tuple[list[dict[str, Any]], int | None, int, bool]:
                with master.read_sessions() as s:
                    over = log_records.task_over(s, task_id, trial_id) if follow else False
                    page = log_records.log_page(s, task_id, flt, cursor, desc=desc, batch=STREAM_BATCH)
                    return [render(r) for r in page.rows], page.cursor, page.fetched, over

            await slot.take_turn()
            try:
                lines, cursor, fetched, over = await run_in_threadpool(fetch)
            except Exception:
                log.exception("event=log_stream_error task_id=%s", task_id)
                yield stream_error("internal error")
                return
            finally:
                slot.release()
            for line in lines:
                yield ndjson({"result": line})
                sent += 1
                if limit and sent >= limit:
                    return
            if fetched == STREAM_BATCH:
                continue
            if not follow or (over_seen and fetched == 0):
                return
            # `over` is read before the rows, so every line written before the task ended is in
            # this poll or a later one; after the end, keep going until a poll finds nothing
            # (lines the agent ships just after the process exited still arrive).
            over_seen = over_seen or over
            await asyncio.sleep(FOLLOW_POLL_S / 5 if over_seen else FOLLOW_POLL_S)

    return StreamingResponse(gen(), media_type=STREAM_MEDIA_TYPE)


def _log_params(
    follow: bool = False,
    limit: Annotated[int, Query(ge=0, le=INT32_MAX)] = 0,
    orderBy: str | None = None,
    levels: Annotated[list[str], Query()] = [],  # noqa: B006
    stdtypes: Annotated[list[str], Query()] = [],  # noqa: B006
    sources: Annotated[list[str], Query()] = [],  # noqa: B006
    agentIds: Annotated[list[str], Query()] = [],  # noqa: B006
    rankIds: Annotated[list[Int32], Query()] = [],  # noqa: B006
    containerIds: Annotated[list[str], Query()] = [],  # noqa: B006
    allocationIds: Annotated[list[str], Query()] = [],  # noqa: B006
    searchText: str | None = None,
    enableRegex: bool = False,
    timestampAfter: str | None = None,
    timestampBefore: str | None = None,
) -> tuple[LogFilter, bool, int, bool]:
    serializers.reject_nul(stdtypes=stdtypes, sources=sources, agentIds=agentIds, allocationIds=allocationIds,
                           searchText=searchText)
    desc = serializers.parse_order(orderBy)
    if follow and desc:
        raise bad_request("follow cannot be combined with ORDER_BY_DESC", "orderBy")
    flt = LogFilter(
        levels=[log_records.normalize_level(v, "levels") for v in levels],
        stdtypes=stdtypes, sources=sources, agent_ids=agentIds, rank_ids=rankIds, allocation_ids=allocationIds,
        after=serializers.parse_time(timestampAfter, "timestampAfter"),
        before=serializers.parse_time(timestampBefore, "timestampBefore"),
        search_text=searchText, enable_regex=enableRegex,
    )
    return flt, follow, limit, desc


@router.get("/api/v1/trials/{trialId}/logs")
def trial_logs(
    trialId: Id,
    p: Principal = Depends(deps.principal),
    master: Master = Depends(deps.get_master),
    params: tuple[LogFilter, bool, int, bool] = Depends(_log_params),
    slot: Ticket = Depends(deps.ticket),
) -> StreamingResponse:
    with master.read_sessions() as db:
        trial = access.get_trial(db, trialId)
        access.require_read_trial(p, trial)
    flt, follow, limit, desc = params
    lease = log_records.search_slot(master.quotas, p, flt)
    return _released(lease, _log_stream(master, trial.task_id, trialId, flt, lambda r: _trial_log_json(r, trialId),
                                        follow=follow, limit=limit, desc=desc, slot=slot))


@router.get("/api/v1/tasks/{taskId}/logs")
def task_logs(
    taskId: str,
    p: Principal = Depends(deps.principal),
    master: Master = Depends(deps.get_master),
    params: tuple[LogFilter, bool, int, bool] = Depends(_log_params),
    slot: Ticket = Depends(deps.ticket),
) -> StreamingResponse:
    serializers.reject_nul(taskId=taskId)
    with master.read_sessions() as db:
        trial_id = log_records.readable_task(db, p, taskId)
    flt, follow, limit, desc = params
    lease = log_records.search_slot(master.quotas, p, flt)
    return _released(lease, _log_stream(master, taskId, trial_id, flt, _task_log_json, follow=follow, limit=limit,
                                        desc=desc, slot=slot))


def _released(lease: log_records.SearchLease, resp: StreamingResponse) -> StreamingResponse:
    """Hold the caller's search slot while the stream runs. The generator's `finally` frees it
    however the stream ends (finished, failed, client gone: the event loop closes abandoned async
    generators); the background task covers a response whose body was never started."""
    inner = resp.body_iterator

    async def body() -> AsyncIterator[Any]:
        try:
            async for chunk in inner:
                yield chunk
        finally:
            lease.release()

    resp.body_iterator = body()
    resp.background = BackgroundTask(lease.release)
    return resp
