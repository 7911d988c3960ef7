"""The tunnel `det shell open` gives ssh as its ProxyCommand: `python -m cli.tunnel MASTER TASK_ID`
connects to the master's WebSocket at /proxy/<task id>/ with the user's session (the token comes in
SHIPYARD_TUNNEL_TOKEN, not on the command line, where `ps` would show it) and pipes its stdin to the
WebSocket and the WebSocket to its stdout as binary messages: the bytes of the SSH connection, which
the master relays to the task's sshd. A refusal is one line on stderr and exit status 1."""

from __future__ import annotations

import argparse
import os
import sys
import threading
from typing import Any

TOKEN_ENV = "SHIPYARD_TUNNEL_TOKEN"
READ_BYTES = 1 << 16


def ws_url(master: str, task_id: str) -> str:
    base = master.rstrip("/")
    scheme, sep, rest = base.partition("://")
    if not sep:
        scheme, rest = "http", base
    return f"{'wss' if scheme == 'https' else 'ws'}://{rest}/proxy/{task_id}/"


def _write_all(data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(1, view):]


def _pump_up(ws: Any) -> None:
    """stdin to the WebSocket until ssh closes it."""
    try:
        while chunk := os.read(0, READ_BYTES):
            ws.send(chunk)
    except Exception:  # noqa: BLE001 (the connection ended: the other pump reports it)
        pass
    finally:
        ws.close()


def main(argv: list[str] | None = None) -> int:
    from websockets.exceptions import ConnectionClosed, InvalidStatus
    from websockets.sync.client import connect

    parser = argparse.ArgumentParser(prog="python -m cli.tunnel", description=__doc__)
    parser.add_argument("master")
    parser.add_argument("task_id")
    args = parser.parse_args(argv)
    token = os.environ.get(TOKEN_ENV, "")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        ws = connect(ws_url(args.master, args.task_id), additional_headers=headers, max_size=None,
                     open_timeout=30, compression=None)
    except InvalidStatus as e:
        code = e.response.status_code
        why = {401: "not logged in (det user login)", 404: "no such shell of yours, or it is not running"}
        print(f"det shell: the master refused the tunnel to {args.task_id}: {code} {why.get(code, '')}".rstrip(),
              file=sys.stderr)
        return 1
    except (OSError, TimeoutError) as e:
        print(f"det shell: cannot reach the master at {args.master}: {e}", file=sys.stderr)
        return 1
    threading.Thread(target=_pump_up, args=(ws,), daemon=True).start()
    try:
        for message in ws:
            _write_all(message if isinstance(message, bytes) else message.encode())
    except ConnectionClosed:
        pass
    except OSError:  # ssh went away
        ws.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
