"""Request-body memory: a large body is spooled to disk as it arrives and counts against the
caller's and the host's budgets until its request has been answered.

Six concurrent 150 MB bodies took a master from 714 MB to 2.4 GB: each body sat in memory as it
arrived (the read chunks, then their join), then again as the parsed JSON and its decoded
content. Now a body over `body_spool_bytes` (1 MiB) takes this path (frontdoor/limits.py sends it
here; smaller bodies, nearly all requests, never do):

1. Its caller is resolved from its credential (a user counts once whatever token or login they
   use; an allocation, an agent; without a valid credential, the client address).
2. A share of two budgets is taken before a byte of it is read: the caller's
   (`body_budget_per_caller_bytes`) and the host's (`body_budget_bytes`), counted together by every
   master process on the host (db/quotas.py), of the declared Content-Length (a chunked body takes
   its share in steps as it grows). One that does not fit is refused at once, body unread, with
   Retry-After: **429** when the caller's own bodies fill its budget (its own doing; the others'
   requests go on), **503** when the host's is full (the master is busy, as admission's 503).
3. It is written to a temporary file in `<state_dir>/request-bodies` (0700) as it arrives, in 1 MiB
   writes from a worker thread, so a slow upload holds no memory and the event loop never waits
   on the disk; the file is deleted as soon as it is read back.
4. Read back as one bytes object (no chunk list, no join), it is handed to the application as one
   message and dropped here, so it is freed as soon as the route is done with it.
5. The shares are given back when the response is done (or the client left).

The host's budget bounds what every master process holds of large bodies at once, so the master's
memory stays within a bound of its budget times what a route makes of a body (docs/PERFORMANCE.md,
benchmarks/body_memory.py).
"""

from __future__ import annotations

import logging
import math
import socket
import tempfile
from pathlib import Path
from typing import IO, Any

import anyio.to_thread
from starlette.requests import cookie_parser
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from control_plane.auth import resolve_token
from control_plane.db.quotas import Claim, Lease, QuotaFull
from control_plane.frontdoor.error_shape import error_json
from control_plane.master import Master
from control_plane.services.logs import caller_key
from shipyard_common import private_files

log = logging.getLogger("shipyard.api.limits")

WRITE_BYTES = 1024 * 1024  # what is gathered in memory before one write to the spool file
# Retry-After for a refusal: about the time a body this size takes to arrive and be handled
# elsewhere, so a client told to come back does not come back into the same full budget at once.
RETRY_BYTES_PER_S = 64 * 1024 * 1024
_TOKEN_HEADERS = (b"authorization", b"grpc-metadata-x-allocation-token")


class Refused(Exception):
    def __init__(self, status: int, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry_after_s = retry_after_s


class BodyBudget:
    def __init__(self, master: Master) -> None:
        cfg = master.config
        self.master = master
        self.spool_bytes = cfg.body_spool_bytes
        self.per_caller = cfg.body_budget_per_caller_bytes
        self.total = cfg.body_budget_bytes
        self.retry_floor_s = cfg.retry_after_s
        self.retry_cap_s = cfg.retry_after_max_s
        self.spool_dir = Path(cfg.state_dir) / "request-bodies"
        self.host = socket.gethostname()[:64]

    @property
    def enabled(self) -> bool:
        return self.total > 0

    def wants(self, scope: Scope, declared: int | None) -> bool:
        """Does this request's body take the budgeted path? Over the spool size, or of unknown size."""
        if declared is not None:
            return declared > self.spool_bytes
        return any(k == b"transfer-encoding" and b"chunked" in v.lower() for k, v in scope.get("headers", []))

    # -- who, and how much ------------------------------------------------------------------------
    def caller(self, scope: Scope) -> str:
        """Whose budget a body counts against (a database read: call from a worker thread)."""
        token = _token(scope)
        if token:
            with self.master.read_sessions() as s:
                p = resolve_token(s, token, now=self.master.clock())
            if p is not None:
                return caller_key(p)
        client = scope.get("client")
        return f"addr:{client[0] if client else ''}"

    def claims(self, caller: str) -> list[Claim]:
        return [Claim(f"body:{self.host}:{caller}", self.per_caller), Claim(f"body:{self.host}:all", self.total)]

    def reserve(self, caller: str, amount: int, lease: Lease | None = None) -> Lease:
        """Take `amount` more bytes of both budgets (a worker thread: the database), or Refused."""
        try:
            return self.master.quotas.take(self.claims(caller), amount, into=lease)
        except QuotaFull as e:
            retry = min(self.retry_cap_s, max(self.retry_floor_s, math.ceil(amount / RETRY_BYTES_PER_S)))
            if e.claim.cap == self.per_caller and e.claim.key.endswith(f":{caller}"):
                raise Refused(429, f"your request bodies in progress hold {e.used} bytes; with this one's {amount} "
                                   f"they would pass the {self.per_caller} bytes one caller may have in flight "
                                   "(body_budget_per_caller_bytes); retry when one has been answered", retry) from None
            raise Refused(503, f"the master is holding as many large request bodies as its memory budget allows "
                               f"(body_budget_bytes: {self.total}); retry later", retry) from None

    def spool_file(self) -> IO[bytes]:
        private_files.private_dir(self.spool_dir)
        return tempfile.SpooledTemporaryFile(max_size=self.spool_bytes, dir=self.spool_dir)  # noqa: SIM115


async def spooled(app: ASGIApp, budget: BodyBudget, scope: Scope, receive: Receive, send: Send, *,
                  limit: int, declared: int | None, too_large: Any) -> None:
    """Read the body to the spool within its budget share, then run `app` on it (see the module)."""
    caller = await anyio.to_thread.run_sync(budget.caller, scope)
    held = _Held(budget, caller)
    try:
        spool: IO[bytes] | None = None
        try:
            if declared:
                await held.grow(declared)
            spool = budget.spool_file()
            body = await _receive_to(spool, receive, held, limit=limit)
        except Refused as r:
            log.info("event=request_body_refused status=%d caller=%s method=%s path=%s bytes=%s", r.status, caller,
                     scope["method"], scope["path"], declared)
            await _send_refusal(send, r)
            return
        except _Over:
            await too_large(send, limit)
            return
        finally:
            if spool is not None:
                spool.close()  # the temporary file is gone
        if body is None:  # the client left
            return
        box: list[bytes] = [body]
        del body
        await app(scope, _once(box, receive), held.releasing(send))
    finally:
        if held.lease is not None:  # not answered (an error, the client left)
            held.lease.give_back()  # on the event loop: the quotas' own thread deletes the rows


class _Over(Exception):
    pass


class _Held:
    """The request's share of the budgets so far."""

    def __init__(self, budget: BodyBudget, caller: str) -> None:
        self.budget = budget
        self.caller = caller
        self.lease: Lease | None = None
        self.amount = 0

    async def grow(self, more: int) -> None:
        self.lease = await anyio.to_thread.run_sync(self.budget.reserve, self.caller, more, self.lease)
        self.amount += more

    def releasing(self, send: Send) -> Send:
        """`send`, giving the share back (in the database) before the answer's last part leaves:
        the route is done with the body, and a client that sends its next body as soon as it has
        the answer finds its share free."""

        async def sending(msg: Message) -> None:
            if msg["type"] == "http.response.body" and not msg.get("more_body", False) and self.lease is not None:
                lease, self.lease = self.lease, None
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(lease.give_back)
            await send(msg)

        return sending


async def _receive_to(spool: IO[bytes], receive: Receive, held: _Held, *, limit: int) -> bytes | None:
    """The whole body (None if the client left), spooled; a chunked body grows its share as it comes."""
    size = 0
    pending = bytearray()
    while True:
        msg = await receive()
        if msg["type"] != "http.request":
            return None
        chunk = msg.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _Over()
        if size > held.amount:  # chunked: double the share (within the limit) each time it is passed
            await held.grow(min(limit, max(2 * held.amount, 2 * held.budget.spool_bytes, size)) - held.amount)
        pending += chunk
        done = not msg.get("more_body", False)
        if len(pending) >= min(WRITE_BYTES, held.budget.spool_bytes) or (done and spool.tell()):
            data = bytes(pending)
            pending.clear()
            await anyio.to_thread.run_sync(spool.write, data)
            del data
        if done:
            break
    if not spool.tell():
        return bytes(pending)
    return await anyio.to_thread.run_sync(_read_all, spool)


def _read_all(spool: IO[bytes]) -> bytes:
    spool.seek(0)
    return spool.read()


def _once(box: list[bytes], receive: Receive) -> Receive:
    """The body as one message; this side keeps no reference to it once delivered."""

    async def replayed() -> Message:
        if box:
            return {"type": "http.request", "body": box.pop(), "more_body": False}
        return await receive()  # after the body: the disconnect, when it comes

    return replayed


def _token(scope: Scope) -> str | None:
    """The credential as api/deps.py's bearer_token reads it: a Bearer header, else the UI's cookie."""
    headers = scope.get("headers", [])
    for name, value in headers:
        if name in _TOKEN_HEADERS and value[:7].lower() == b"bearer ":
            return value[7:].decode("latin-1").strip() or None
    for name, value in headers:
        if name == b"cookie":
            return cookie_parser(value.decode("latin-1")).get("auth") or None
    return None


async def _send_refusal(send: Send, r: Refused) -> None:
    body = error_json(r.status, r.message, [])
    await send({"type": "http.response.start", "status": r.status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"retry-after", str(r.retry_after_s).encode()), (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
