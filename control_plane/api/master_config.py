"""`GET /api/v1/master/config` (Determined's GetMasterConfig: `det master config`) and
`GET /api/v1/master/logs` (MasterLogs: `det master logs [-f] [--tail N]`), admins only: the
effective master configuration with its secrets hidden (services/master_config.py), and the
master's own log lines from all its processes (services/master_logs.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse

from control_plane.api import deps
from control_plane.api.streams import STREAM_BATCH, STREAM_MEDIA_TYPE, ndjson, stream_error
from control_plane.api.wire import INT32_MAX
from control_plane.auth import Principal
from control_plane.master import Master
from control_plane.services import master_logs
from control_plane.services.master_config import shown_config

log = logging.getLogger("shipyard.api.master")
router = APIRouter()

FOLLOW_POLL_S = 0.5


@router.get("/api/v1/master/config")
def get_master_config(_p: Principal = Depends(deps.admin), master: Master = Depends(deps.get_master)) -> dict[str, Any]:
    return {"config": shown_config(master.config)}


@router.get("/api/v1/master/logs", response_class=StreamingResponse)
def get_master_logs(
    _p: Principal = Depends(deps.admin),
    master: Master = Depends(deps.get_master),
    follow: bool = False,
    limit: Annotated[int, Query(ge=0, le=INT32_MAX, description="0: no limit")] = 0,
    offset: Annotated[int | None, Query(ge=-INT32_MAX, le=INT32_MAX,
                                        description="skip this many lines; negative: the last N lines")] = None,
) -> StreamingResponse:
    """Newline-delimited `{"result": {"logEntry": …}}`, oldest first; with follow, new lines as
    they are written (about once a second per process) until the client goes away."""

    def newest() -> int:
        with master.read_sessions() as s:
            return master_logs.newest_id(s)

    async def gen() -> AsyncIterator[bytes]:
        after: int | None = None
        sent = 0
        while True:
            def page(after: int | None = after) -> list[master_logs.Entry]:
                with master.read_sessions() as s:
                    return master_logs.entries(s, offset=offset if after is None else None, after=after,
                                               limit=STREAM_BATCH)
            try:
                rows = await run_in_threadpool(page)
            except Exception:
                log.exception("event=master_log_stream_error")
                yield stream_error("internal error")
                return
            for entry in rows:
                yield ndjson({"result": {"logEntry": entry.to_wire()}})
                sent += 1
                if limit and sent >= limit:
                    return
            if rows:
                after = rows[-1].id
            if len(rows) == STREAM_BATCH:
                continue
            if not follow:
                return
            if after is None:  # nothing (or nothing past `offset`) yet: what is written from now on
                after = await run_in_threadpool(newest)
            await asyncio.sleep(FOLLOW_POLL_S)

    return StreamingResponse(gen(), media_type=STREAM_MEDIA_TYPE)
