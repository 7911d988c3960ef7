"""`GET /api/v1/agent/package`: the agent's own code, for the hosts the master boots (see
agent_bootstrap/package.py)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response

from agent_bootstrap.package import MEDIA_TYPE, agent_package
from control_plane.api import deps
from control_plane.auth import Principal

router = APIRouter()


@router.get(
    "/api/v1/agent/package",
    response_class=Response,
    responses={
        200: {"description": "the agent package (tar.gz)", "content": {MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}}},
        304: {"description": "the package matches If-None-Match"},
    },
)
def get_agent_package(request: Request, _p: Principal = Depends(deps.agent)) -> Response:
    pkg = agent_package()
    etag = f'"{pkg.sha256}"'
    headers = {
        "ETag": etag,
        "X-Shipyard-Agent-Sha256": pkg.sha256,
        "Content-Disposition": 'attachment; filename="shipyard-agent.tar.gz"',
        "Cache-Control": "no-store",  # behind a bearer token: never cached by proxies
    }
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers=headers)
    return Response(content=pkg.data, media_type=MEDIA_TYPE, headers=headers)
