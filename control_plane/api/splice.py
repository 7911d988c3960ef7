"""Zero-copy response bodies for the task proxy (issue 29): the bytes of a large answer move from the
task's socket to the caller's in the kernel (splice(2) through a pipe), never through Python.

ASGI hands an application neither socket, so the master serves HTTP with `SpliceHttpToolsProtocol`,
uvicorn's httptools protocol plus one extension in each request's scope:

    await scope["extensions"]["shipyard.splice"](src_fd, count, stop=None) -> bytes moved

After the response's head (with a Content-Length) and any body already sent through `send`, it
moves the next `count` bytes of the body from the socket `src_fd` to the caller, counting them
against the Content-Length as `send` would; the application then ends the response with an empty
`http.response.body` as usual. Fewer bytes than `count` means the transfer failed (either side
went away, or `stop` was done first): the caller's connection is closed and later `send`s do
nothing.

It is offered only where it can work: Linux (os.splice), a plain-TCP caller (TLS needs the bytes in
user space), a response framed by Content-Length. Middleware in between must not rewrite bodies
(the master's only count and log them).

benchmarks/notebook_proxy.py: the master's CPU per proxied GiB fell from 0.98 s (the body through
ASGI messages) to 0.35 s. A copy through one reused 1 MiB buffer in user space cost the master
0.44 s and moved the same MiB/s on this 2-core host: there the bound is the three parties' CPU
together (task, master, client), not the relay."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import functools
import os
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.protocols.utils import is_ssl

EXTENSION = "shipyard.splice"
SUPPORTED = hasattr(os, "splice")
# The pipe between the two sockets (Linux's default is 64 KiB; 1 MiB is the unprivileged maximum).
PIPE_BYTES = 1 << 20
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_F_GETPIPE_SZ = getattr(fcntl, "F_GETPIPE_SZ", 1032)
# A transfer that moves nothing for this long is abandoned (a stalled task or caller).
IDLE_TIMEOUT_S = 300.0
# The relay lets the event loop serve others after this many bytes when neither side ever blocks.
YIELD_BYTES = 16 << 20


class SpliceError(OSError):
    """A side closed or failed before `count` bytes moved."""


class SpliceHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, offering `shipyard.splice` to plain-TCP requests."""

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        cycle = self.cycle
        if SUPPORTED and cycle is not None and cycle.scope is self.scope and not is_ssl(self.transport):
            self.scope.setdefault("extensions", {})[EXTENSION] = functools.partial(_splice_body, self, cycle)  # type: ignore[typeddict-item]


async def _splice_body(protocol: HttpToolsProtocol, cycle: RequestResponseCycle, src_fd: int, count: int,
                       stop: asyncio.Future[Any] | None = None) -> int:
    if not cycle.response_started or cycle.response_complete or cycle.chunked_encoding is not False:
        raise RuntimeError("shipyard.splice needs a started response framed by Content-Length")
    if count > cycle.expected_content_length:
        raise RuntimeError("Response content longer than Content-Length")
    transport = protocol.transport
    moved = 0
    try:
        if not cycle.disconnected and await _flushed(transport, stop):  # what `send` wrote goes first
            moved = await relay(src_fd, transport.get_extra_info("socket").fileno(), count, stop=stop)
    finally:
        cycle.expected_content_length -= moved
        if moved < count:  # the response cannot be completed: the caller's connection goes
            cycle.disconnected = True
            cycle.keep_alive = False
            transport.close()
    return moved


async def _flushed(transport: Any, stop: asyncio.Future[Any] | None) -> bool:
    """Whether the transport's write buffer emptied (polled, backing off to 50 ms: a caller that
    stops reading costs a few wake-ups a second); False once it closes, `stop` is done, or after
    IDLE_TIMEOUT_S."""
    delay, waited = 0.0005, 0.0
    while transport.get_write_buffer_size():
        if transport.is_closing() or (stop is not None and stop.done()) or waited >= IDLE_TIMEOUT_S:
            return False
        await asyncio.sleep(delay)
        waited += delay
        delay = min(delay * 2, 0.05)
    return not transport.is_closing()


async def relay(src_fd: int, dst_fd: int, count: int, *, stop: asyncio.Future[Any] | None = None) -> int:
    """Move `count` bytes from socket `src_fd` to socket `dst_fd` (both non-blocking) through a pipe,
    waiting on the event loop for either side; the number moved (less than `count` only when a side
    closed or failed, `stop` was done, or nothing moved for IDLE_TIMEOUT_S). The descriptors are duplicated: the
    transports that own them stay registered with the loop, untouched."""
    loop = asyncio.get_running_loop()
    r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    src = dst = -1
    try:
        with contextlib.suppress(OSError):
            fcntl.fcntl(w, _F_SETPIPE_SZ, PIPE_BYTES)
        capacity = fcntl.fcntl(w, _F_GETPIPE_SZ)
        src = os.dup(src_fd)
        dst = os.dup(dst_fd)
        moved = queued = 0  # delivered to dst; in the pipe
        next_yield = YIELD_BYTES
        flags = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK
        while moved < count:
            src_blocked = dst_blocked = False
            want = min(capacity - queued, count - moved - queued)
            if want > 0:
                try:
                    n = os.splice(src, w, want, flags=flags)
                except BlockingIOError:
                    src_blocked = True
                except OSError:
                    return moved
                else:
                    if n == 0:  # the task closed before its Content-Length
                        return moved
                    queued += n
            if queued:
                more = os.SPLICE_F_MORE if moved + queued < count else 0
                try:
                    m = os.splice(r, dst, queued, flags=flags | more)
                except BlockingIOError:
                    dst_blocked = True
                except OSError as e:  # the caller went away (EPIPE, ECONNRESET)
                    if e.errno not in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN, errno.EBADF):
                        raise
                    return moved
                else:
                    queued -= m
                    moved += m
                    if moved >= next_yield:  # a fast pair of sockets never blocks: let the loop run
                        next_yield = moved + YIELD_BYTES
                        await asyncio.sleep(0)
                    continue
            if src_blocked or dst_blocked:
                # Wait for what can make progress: the source while the pipe has room, the caller
                # while the pipe holds bytes.
                read = src if src_blocked and queued < capacity and moved + queued < count else None
                write = dst if queued else None
                if not await _ready(loop, read, write, stop):
                    return moved
    finally:
        for fd in (r, w, src, dst):
            if fd >= 0:
                os.close(fd)
    return moved


async def _ready(loop: asyncio.AbstractEventLoop, read: int | None, write: int | None,
                 stop: asyncio.Future[Any] | None) -> bool:
    """True once `read` is readable or `write` writable; False once `stop` is done or after IDLE_TIMEOUT_S."""
    ready: asyncio.Future[bool] = loop.create_future()

    def wake(result: bool = True) -> None:
        if not ready.done():
            ready.set_result(result)

    def stopped(_: Any) -> None:
        wake(False)

    if stop is not None:
        if stop.done():
            return False
        stop.add_done_callback(stopped)

    if read is not None:
        loop.add_reader(read, wake)
    if write is not None:
        loop.add_writer(write, wake)
    timer = loop.call_later(IDLE_TIMEOUT_S, wake, False)
    try:
        return await ready
    finally:
        timer.cancel()
        if stop is not None:
            stop.remove_done_callback(stopped)
        if read is not None:
            loop.remove_reader(read)
        if write is not None:
            loop.remove_writer(write)

