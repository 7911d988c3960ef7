"""The FastAPI application: routers, error shape, and request-size limits (frontdoor/limits.py)."""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sqlalchemy.exc import TimeoutError as PoolTimeout
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from control_plane.api import (
    agent_package,
    agents,
    checkpoints,
    cluster_messages,
    compat,
    experiments,
    groups,
    jobs,
    logs,
    master_config,
    metrics,
    models,
    ntsc,
    pool_bindings,
    pools,
    prometheus,
    proxy,
    rbac,
    tasks,
    templates,
    trials,
    users,
    workspaces,
)
from control_plane.api.errors import install_error_handlers
from control_plane.api.users import master_info
from control_plane.frontdoor.access_log import RequestTelemetry
from control_plane.frontdoor.admission import Admission, AdmissionControl
from control_plane.frontdoor.error_shape import error_body
from control_plane.frontdoor.express import ExpressLane
from control_plane.frontdoor.limits import BodyLimits
from control_plane.master import Master
from control_plane.ui import install as install_ui

log = logging.getLogger("shipyard.api")


class ShipyardApp(FastAPI):
    """FastAPI behind a front door (frontdoor/admission.py's AdmissionControl): every request meets
    admission control first, before any middleware or routing runs."""

    front: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await (self.front or super().__call__)(scope, receive, send)


def create_app(master: Master, extra_routers: list[Any] | None = None) -> FastAPI:
    app = ShipyardApp(
        title="Shipyard",
        version=__import__("control_plane").__version__,
        description="Elastic control plane for deep-learning training; Determined-compatible /api/v1.",
        docs_url="/docs",
        # Determined's client (0.38.1) posts JSON bodies without a Content-Type: read them as JSON.
        # Admission (the front door, ShipyardApp) and body limits (frontdoor/limits.py) still run first.
        strict_content_type=False,
    )
    app.state.master = master
    install_error_handlers(app)
    for module in (users, experiments, trials, metrics, logs, checkpoints, agents, tasks, ntsc, proxy, pools, models,
                   agent_package, compat):
        app.include_router(module.router)
    app.include_router(jobs.router)  # the job queue (api/jobs.py)
    app.include_router(workspaces.router)  # workspaces and projects (api/workspaces.py)
    app.include_router(templates.router)  # config templates (api/templates.py)
    app.include_router(groups.router)  # user groups (api/groups.py)
    app.include_router(rbac.router)  # roles and their assignments (api/rbac.py)
    app.include_router(pool_bindings.router)  # pools bound to workspaces (api/pool_bindings.py)
    app.include_router(master_config.router)  # GET /api/v1/master/config (api/master_config.py)
    app.include_router(cluster_messages.router)  # /api/v1/master/cluster_message (api/cluster_messages.py)
    if master.config.metrics_enabled:
        app.include_router(prometheus.router)  # GET /metrics (api/prometheus.py)
    for router in extra_routers or []:
        app.include_router(router)
    install_ui(app)  # the web UI at / (control_plane/ui), beside /api/v1
    app.add_middleware(BodyLimits, config=master.config, master=master)
    _install_admission(app, master)
    return app


# Answered from memory on the event loop by the front door, outside admission and before any
# middleware or routing: they must answer, and fast, at saturation. (Their routes remain, for the
# OpenAPI document.)
HEALTH_PATHS = frozenset({"/health", "/info", "/api/v1/master"})
# Worker threads beyond the admitted requests (each uses at most one at a time), so a thread is
# always free for an admitted request; the exit of a generator dependency runs outside this limit.
THREAD_SLACK = 4


def _install_admission(app: FastAPI, master: Master) -> None:
    cfg = master.config
    admission = Admission(limit=cfg.request_limit, queue=cfg.request_queue, wait_s=cfg.request_queue_wait_s,
                          retry_after_s=cfg.retry_after_s, retry_after_max_s=cfg.retry_after_max_s)
    # The cluster's lane keeps its Retry-After within half the heartbeat timeout (config.py).
    cluster_retry_max_s = min(cfg.retry_after_max_s, int(cfg.agent_heartbeat_timeout_s // 2))
    cluster = Admission(limit=cfg.cluster_concurrent_requests, queue=cfg.request_queue,
                        wait_s=cfg.cluster_queue_wait_s, retry_after_s=cfg.retry_after_s,
                        retry_after_max_s=cluster_retry_max_s, name="cluster")
    app.state.admission = admission
    app.state.cluster_admission = cluster

    async def health() -> dict[str, str]:
        return {"status": "ok"}

    app.add_api_route("/health", health, methods=["GET"], tags=["health"])

    async def _pool_timeout(_req: Request, _exc: Exception) -> JSONResponse:
        # A connection the pool could not give in time: the master is saturated, which is the
        # client's cue to retry, not a server bug.
        log.warning("event=db_pool_timeout")
        # Not a lane's queue (admission kept requests below the pool): the floor.
        return JSONResponse(error_body(503, "the master is busy; retry later", []), status_code=503,
                            headers={"Retry-After": str(cfg.retry_after_s)})

    app.add_exception_handler(PoolTimeout, _pool_timeout)
    # Outermost: a request over the limit is refused before its body is read or anything runs.
    info = partial(master_info, master)
    # Behind admission: the hot report routes' fast paths straight from the front door (frontdoor/express.py).
    express = ExpressLane(app, partial(FastAPI.__call__, app), cfg)
    front = AdmissionControl(
        express, admission=admission, cluster=cluster, exempt=HEALTH_PATHS,
        threads=admission.limit + cluster.limit + THREAD_SLACK,
        health={"/health": lambda: {"status": "ok"}, "/info": info, "/api/v1/master": info})
    # Around the front door: refusals and health count and log too (frontdoor/access_log.py).
    # A proxied request whose target is cached goes to its task ahead of admission (api/proxy.py).
    outermost: Any = RequestTelemetry(proxy.ProxyFront(front, app.state), fixed_paths=HEALTH_PATHS)
    if cfg.trusted_proxies:
        # Behind reverse proxies: the client and scheme they forward, believed from them only
        # (config.trusted_proxies), for everything inside (the login throttle, the access log).
        outermost = ProxyHeadersMiddleware(outermost, trusted_hosts=cfg.trusted_proxies)
    app.front = outermost  # type: ignore[attr-defined]
