"""The web UI the master serves at `/`: server-rendered pages (routes.py, templates/), live parts
refreshed by static/app.js (fragments morphed into place, so focus, selection and scroll survive;
polling stops when the page's experiment or trial is over), uPlot for the charts (static/vendor/,
copied from ui/ by ui/build.sh)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from control_plane.ui.routes import STATIC_DIR, not_found_page, router
from control_plane.ui.work_routes import router as work_router

STATIC_PATH = "/ui/static"
FAVICON = f"{STATIC_PATH}/favicon.svg"
# Paths only programs use: their errors stay Determined's JSON whatever they accept.
MACHINE_PREFIXES = ("/api/", "/agents", "/metrics", "/ui/data/", "/ui/fragments/")


def wants_page(request: Request) -> bool:
    """A browser navigating (it asks for HTML first-class), not an API client nor a page's fetch."""
    accept = request.headers.get("accept", "")
    return "text/html" in accept and not request.url.path.startswith(MACHINE_PREFIXES)


def install(app: FastAPI) -> None:
    """Mount the UI's pages and its static files on the app (api/app.py calls this), and answer a
    browser's request for an unknown path with a readable page (API clients keep the JSON error)."""
    app.include_router(router)
    app.include_router(work_router)
    app.mount(STATIC_PATH, StaticFiles(directory=str(STATIC_DIR)), name="ui-static")

    async def favicon() -> Response:
        return RedirectResponse(FAVICON, status_code=301)

    app.add_api_route("/favicon.ico", favicon, methods=["GET"], include_in_schema=False)
    json_handler: Any = app.exception_handlers.get(StarletteHTTPException)

    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 404 and request.method in ("GET", "HEAD") and wants_page(request):
            return not_found_page(request)
        assert json_handler is not None  # api/errors.py installs it before the UI
        response: Response = await json_handler(request, exc)
        return response

    app.add_exception_handler(StarletteHTTPException, http_error)

