"""`det-master` / `python -m control_plane`: run the master, or `db upgrade`."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from control_plane.loops.autoscaler import ProviderWrapper

log = logging.getLogger("shipyard.master")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="det-master", description="Shipyard master")
    p.add_argument("--config", "-c", help="path to master.yaml (or SHIPYARD_CONFIG)")
    p.add_argument("--host", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default 8080)")
    p.add_argument("--db", dest="db_url", help="database URL (default: SQLite in the state directory)")
    p.add_argument("--state-dir", help="state directory (default ~/.shipyard)")
    sub = p.add_subparsers(dest="command")
    sub.add_parser("serve", help="run the master (default)")
    db = sub.add_parser("db", help="database maintenance")
    db.add_argument("action", choices=["upgrade", "current"])
    return p


def main(argv: list[str] | None = None, *, wrap_provider: ProviderWrapper | None = None) -> int:
    """`wrap_provider`: see control_plane.loops.start_background (tests/e2e/crash_after_launch.py)."""
    args = build_parser().parse_args(argv)
    from control_plane.config import ConfigError, load_config
    from control_plane.logs import setup_logging

    try:
        config = load_config(args.config, host=args.host, port=args.port, db_url=args.db_url, state_dir=args.state_dir)
    except ConfigError as e:
        print(f"det-master: {e}", file=sys.stderr)
        return 2
    setup_logging(config.log_level)

    if args.command == "db":
        from control_plane.db import migrate
        from control_plane.db.engine import make_engine

        engine = make_engine(config.database_url)
        if args.action == "upgrade":
            migrate.upgrade(engine)
        print(migrate.current_revision(engine))
        return 0
    return serve(config, wrap_provider=wrap_provider)


def serve(config, *, wrap_provider: ProviderWrapper | None = None) -> int:  # type: ignore[no-untyped-def]
    import uvicorn

    from control_plane.api.app import create_app
    from control_plane.loops import start_background
    from control_plane.master import Master

    master = Master(config)
    try:
        master.prepare()
    except Exception as e:  # refuse to start with one clear line
        log.exception("event=startup_failed")
        print(f"det-master: cannot start: {e}", file=sys.stderr)
        return 1
    start_background(master, wrap_provider=wrap_provider)
    app = create_app(master)
    server = uvicorn.Server(
        # keep-alive longer than clients back off after a 503 (up to 15 s), so a client coming back
        # does not race the server closing its idle connection (a reset instead of an answer).
        uvicorn.Config(app, host=config.host, port=config.port, log_level=config.log_level, access_log=False,
                       timeout_graceful_shutdown=5, log_config=None, timeout_keep_alive=75)
    )

    def _term(_sig, _frm):  # type: ignore[no-untyped-def]
        server.should_exit = True

    signal.signal(signal.SIGTERM, _term)
    log.info("event=master_listening url=http://%s:%s cluster_id=%s", config.host, config.port, master.cluster_id)
    try:
        server.run()
    finally:
        master.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
