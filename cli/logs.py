"""A trial's logs from the master's NDJSON stream: `det trial logs`, `det experiment logs` and
`det experiment create --follow`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from cli.errors import CliError


def stream_results(s: Any, path: str, params: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The `result` objects of one of the master's NDJSON streams, as they arrive."""
    # httpx is imported where a request is made, as in cli.session: ~100 ms that `det --help` need not pay.
    import httpx

    try:
        with s.request("GET", path, params=params, stream=True) as r:
            if r.status_code >= 400:
                r.read()
                s.check(r)
            for line in r.iter_lines():
                if not line.strip():
                    continue
                try:
                    msg = json.loads(line)
                except ValueError:
                    raise CliError(f"the master sent a malformed stream line: {line[:200]!r}") from None
                if "error" in msg and "result" not in msg:
                    err = msg["error"] or {}
                    raise CliError(f"the master ended the stream: {err.get('message') or err}")
                yield msg.get("result") or {}
    except httpx.ConnectError:
        raise CliError(f"cannot reach the master at {s.master} (is it running? set -m or DET_MASTER)") from None
    except httpx.HTTPError as e:
        raise CliError(f"the stream from {s.master} broke: {type(e).__name__}: {e}") from None


def _line(entry: dict[str, Any]) -> str:
    return str(entry.get("message") or entry.get("log") or "").rstrip("\n")


def print_logs(s: Any, trial_id: int, *, follow: bool, tail: int | None = None) -> None:
    print_stream(s, f"/api/v1/trials/{trial_id}/logs", follow=follow, tail=tail)


def print_stream(s: Any, path: str, *, follow: bool, tail: int | None = None) -> None:
    """A log stream (a trial's, a task's). With `tail`, the last N lines first (newest-first query,
    printed oldest first); following then skips every line up to the newest one already printed."""
    last_id = -1
    if tail is not None:
        if tail < 0:
            raise CliError("--tail must be >= 0")
        lines = list(stream_results(s, path, {"orderBy": "ORDER_BY_DESC", "limit": tail})) if tail else []
        for entry in reversed(lines):
            print(_line(entry), flush=True)
        if lines:
            last_id = int(lines[0]["id"])
        elif not follow:
            return
        if not follow:
            return
        if not lines:
            # Nothing printed yet, but the tail request must not turn into the whole history.
            last_id = _newest_id(s, path)
    for entry in stream_results(s, path, {"follow": "true"} if follow else {}):
        if last_id >= 0 and int(entry.get("id") or 0) <= last_id:
            continue
        print(_line(entry), flush=True)


def _newest_id(s: Any, path: str) -> int:
    newest = list(stream_results(s, path, {"orderBy": "ORDER_BY_DESC", "limit": 1}))
    return int(newest[0]["id"]) if newest else -1
