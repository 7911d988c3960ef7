"""`det-master` / `python -m control_plane`: run the master, or `db upgrade`."""

from __future__ import annotations

import argparse
import logging
import os
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
    worker = sub.add_parser("api-worker", help=argparse.SUPPRESS)  # started by `serve`, never by hand
    worker.add_argument("--fd", type=int, required=True)
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
    if args.command == "api-worker":
        return serve_worker(config, args.fd)
    options = [f"--{name.replace('_', '-')}={value}" for name, value in
               (("config", args.config), ("host", args.host), ("port", args.port), ("db", args.db_url),
                ("state_dir", args.state_dir)) if value is not None]
    return serve(config, wrap_provider=wrap_provider, options=options)


def serve(config, *, wrap_provider: ProviderWrapper | None = None, options: list[str] | None = None) -> int:  # type: ignore[no-untyped-def]
    """One process (api_workers: 1), or a control process that runs the loops while it holds the
    leadership lease and supervises `worker_processes` API workers sharing its listening socket.
    `options`: the command line's global options, handed to the workers so they load the same config."""
    if config.worker_processes <= 1:
        return _serve_single(config, wrap_provider)
    return _serve_split(config, wrap_provider, options or [])


def _uvicorn_config(app, config, **where):  # type: ignore[no-untyped-def]
    import uvicorn

    from control_plane.api.splice import SpliceHttpToolsProtocol

    # keep-alive longer than clients back off after a 503 (up to 15 s), so a client coming back
    # does not race the server closing its idle connection (a reset instead of an answer).
    # proxy_headers off: uvicorn would believe X-Forwarded-For from loopback; the app believes it
    # from config.trusted_proxies only (api/app.py).
    # security.tls: HTTPS on the same port (uvicorn loads the pair once, at start).
    # http: uvicorn's httptools protocol, plus zero-copy bodies for the task proxy (api/splice.py).
    tls = config.security.tls
    if tls.cert is not None:
        where = {**where, "ssl_certfile": str(tls.cert), "ssl_keyfile": str(tls.key)}
    return uvicorn.Config(app, log_level=config.log_level, access_log=False, timeout_graceful_shutdown=5,
                          log_config=None, timeout_keep_alive=75, proxy_headers=False,
                          http=SpliceHttpToolsProtocol, **where)


def _prepared(config):  # type: ignore[no-untyped-def]
    from control_plane.master import Master

    master = Master(config)
    try:
        master.prepare()
    except Exception as e:  # refuse to start with one clear line
        log.exception("event=startup_failed")
        print(f"det-master: cannot start: {e}", file=sys.stderr)
        return None
    return master


def _serve_single(config, wrap_provider: ProviderWrapper | None) -> int:  # type: ignore[no-untyped-def]
    import uvicorn

    from control_plane import workers
    from control_plane.api.app import create_app
    from control_plane.loops import start_background

    master = _prepared(config)
    if master is None:
        return 1
    master.serving_since = None  # until uvicorn has started (Master.serving_since)
    stop_recording = _record_logs(master, "master")
    start_background(master, wrap_provider=wrap_provider)
    server = uvicorn.Server(_uvicorn_config(create_app(master), config, host=config.host, port=config.port))
    workers.when_serving(lambda: bool(server.started), master.mark_serving, master.stopping)

    def _term(_sig, _frm):  # type: ignore[no-untyped-def]
        server.should_exit = True

    signal.signal(signal.SIGTERM, _term)
    log.info("event=master_listening url=%s://%s:%s cluster_id=%s processes=1", config.scheme, config.host,
             config.port, master.cluster_id)
    workers.settle_heap()
    try:
        server.run()
    finally:
        stop_recording()
        master.stop()
    return 0


def _record_logs(master, process: str):  # type: ignore[no-untyped-def]
    """This process's log lines into the shared record `det master logs` reads (services/master_logs.py)."""
    from control_plane.services import master_logs

    return master_logs.record(master.sessions, process, level=master.config.log_level)


def _serve_split(config, wrap_provider: ProviderWrapper | None, options: list[str]) -> int:  # type: ignore[no-untyped-def]
    from control_plane import workers

    # Before anything imports prometheus_client (control_plane.telemetry): it chooses its
    # multiprocess mode once, at import.
    multiproc = workers.prepare_metrics_dir(config.state_dir)
    from control_plane.loops import start_background

    try:
        sock = workers.listen(config.host, config.port)
    except OSError as e:
        print(f"det-master: cannot listen on {config.host}:{config.port}: {e.strerror}", file=sys.stderr)
        return 1
    master = _prepared(config)
    if master is None:
        return 1
    master.serving_since = None  # until an API worker answers (Master.serving_since)
    stop_recording = _record_logs(master, "leader")
    start_background(master, wrap_provider=wrap_provider, shared=True)
    workers.when_serving(workers.answers(config.scheme, config.host, sock.getsockname()[1]), master.mark_serving,
                         master.stopping)
    supervisor = workers.Supervisor(
        [sys.executable, "-m", "control_plane", *options, "api-worker", "--fd", str(sock.fileno())],
        count=config.worker_processes, fd=sock.fileno(), metrics_dir=multiproc, master_id=master.master_id)

    def _term(_sig, _frm):  # type: ignore[no-untyped-def]
        supervisor.stopping.set()

    signal.signal(signal.SIGTERM, _term)
    signal.signal(signal.SIGINT, _term)
    log.info("event=master_listening url=%s://%s:%s cluster_id=%s processes=%d+1", config.scheme, config.host,
             config.port, master.cluster_id, config.worker_processes)
    workers.settle_heap()
    try:
        supervisor.run()
    finally:
        supervisor.stop()
        stop_recording()
        master.stop()
        sock.close()
    return 0


def serve_worker(config, fd: int) -> int:  # type: ignore[no-untyped-def]
    """An API worker: serves /api/v1 and the UI on the control process's socket; runs no loop."""
    import uvicorn

    from control_plane import workers
    from control_plane.api.app import create_app
    from control_plane.loops import autoscaler, start_wakebus
    from control_plane.master import Master

    workers.die_with_parent()
    master = Master(config, master_id=os.environ.get(workers.MASTER_ID_ENV))
    master.attach()
    master.autoscaler = autoscaler.Autoscaler(master)  # for pool teardown/enable requests
    start_wakebus(master, shared=True)
    stop_recording = _record_logs(master, f"worker-{os.getpid()}")
    server = uvicorn.Server(_uvicorn_config(create_app(master), config, fd=fd))

    def _term(_sig, _frm):  # type: ignore[no-untyped-def]
        server.should_exit = True

    signal.signal(signal.SIGTERM, _term)
    workers.settle_heap()
    try:
        server.run()
    finally:
        stop_recording()
        master.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
