"""The web UI the master serves at `/`: server-rendered pages (routes.py, templates/), htmx for the
live parts, uPlot for the charts (static/vendor/, copied from ui/ by ui/build.sh)."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from control_plane.ui.routes import STATIC_DIR, router

STATIC_PATH = "/ui/static"


def install(app: FastAPI) -> None:
    """Mount the UI's pages and its static files on the app (api/app.py calls this)."""
    app.include_router(router)
    app.mount(STATIC_PATH, StaticFiles(directory=str(STATIC_DIR)), name="ui-static")
