"""The task proxy's HTTP/1.1 client (api/proxy.py): a request to a task's server and its answer,
as sent (no decoding), over pooled keep-alive connections, parsed by httptools (C).

Why not httpx/httpcore: they read 64 KiB at a time through h11 (pure Python) and add ~0.5 ms per
request; here a read is whatever the event loop received (up to 256 KiB with uvloop), handed on
together with what else arrived while the caller was sending (one ASGI message instead of many),
and reading pauses while more than PAUSE_BYTES wait for the caller (backpressure to the task).
benchmarks/notebook_proxy.py measures it against a direct connection."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httptools

# Reading from the task pauses while this much of its answer waits to be sent on.
PAUSE_BYTES = 4 << 20
# An answer's status line and headers may take this much at most (h11's default is 16 KiB).
MAX_HEAD_BYTES = 64 << 10
# Idle keep-alive connections kept per task address.
IDLE_PER_ADDRESS = 16
CONNECT_TIMEOUT_S = 30.0


class UpstreamError(Exception):
    """The task refused the connection, closed it early, or answered something that is not HTTP."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection; one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._writable: asyncio.Future[None] | None = None
        self._reset()

    def _reset(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.chunks: list[bytes] = []
        self.buffered = 0
        self.body_bytes = 0  # of this answer's body, parsed
        self.received = False  # any byte of this answer
        self.head_bytes = 0
        self.head_done = False
        self.keep_alive = False  # the answer lets the connection serve another request
        self.done = False
        self.error: Exception | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False
        self.stopped: asyncio.Future[None] | None = None  # done when the answer is abandoned (splice)

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.received = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._fail(UpstreamError(f"not an HTTP answer: {e}"))
            return
        if not self.head_done:  # a head that never ends must not grow the master's memory
            self.head_bytes += len(data)
            if self.head_bytes > MAX_HEAD_BYTES:
                self._fail(UpstreamError(f"the answer's headers exceed {MAX_HEAD_BYTES >> 10} KiB"))
                return
        if self.buffered > PAUSE_BYTES and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        framed = any(k in (b"content-length", b"transfer-encoding") for k, _ in self.headers)
        if self.head_done and exc is None and not framed:  # a body that ends when the connection does
            self.done = True
            self._wake()
        elif not self.done:
            self._fail(UpstreamError(f"the task closed the connection{f': {exc}' if exc else ''}"))
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    def pause_writing(self) -> None:
        self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._writable = None

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        if 100 <= self.status < 200:  # an interim answer (100 Continue): the real one follows
            self.headers = []
            return
        self.head_done = True
        # Asked here: once the message is complete, llhttp has cleared what it knew of its framing.
        self.keep_alive = self.parser.should_keep_alive()
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)
        self.body_bytes += len(body)
        self._wake()

    def on_message_complete(self) -> None:
        if self.head_done:
            self.done = True
            self._wake()

    def _fail(self, error: Exception) -> None:
        self.error = error
        self.closed = True
        if self.stopped is not None and not self.stopped.done():
            self.stopped.set_result(None)
        if self.transport is not None:
            self.transport.close()
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def _wait(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        await self._waiter
        self._waiter = None

    async def drain(self) -> None:
        if self._writable is not None:
            await self._writable
        if self.closed:
            raise self.error or UpstreamError("the task closed the connection")

    async def head(self) -> None:
        while not self.head_done:
            if self.error is not None:
                raise self.error
            await self._wait()

    async def body(self) -> AsyncIterator[bytes]:
        """The answer's body as it arrives: whatever is buffered, joined, at each step."""
        while True:
            if self.chunks:
                data = self.chunks[0] if len(self.chunks) == 1 else b"".join(self.chunks)
                self.chunks.clear()
                self.buffered = 0
                if self._paused and self.transport is not None:
                    self._paused = False
                    self.transport.resume_reading()
                yield data
                continue
            if self.done:
                return
            if self.error is not None:
                raise self.error
            await self._wait()

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def take_rest(self, least: int) -> tuple[bytes, int, int] | None:
        """For a splice (api/splice.py): when at least `least` bytes of a Content-Length body are
        still to come, stop reading them and answer (the body parsed so far, the socket's descriptor,
        the bytes still in it); else None."""
        length = next((v for k, v in self.headers if k == b"content-length"), None)
        if (self.done or self.error is not None or self.transport is None or length is None or not length.isdigit()
                or any(k == b"transfer-encoding" for k, _ in self.headers)):
            return None
        rest = int(length) - self.body_bytes
        sock = self.transport.get_extra_info("socket")
        if rest < least or sock is None:
            return None
        self.transport.pause_reading()  # what is left stays in the kernel, for splice(2)
        self._paused = True
        self.stopped = asyncio.get_running_loop().create_future()
        data = b"".join(self.chunks)
        self.chunks.clear()
        self.buffered = 0
        return data, sock.fileno(), rest

    def spliced(self, whole: bool) -> None:
        """After take_rest: the rest of the body went (the connection can serve another request),
        or not (it is closed)."""
        if whole:
            self.done = True
        else:
            self.abort()


class Answer:
    """A task's answer: status, headers (names lowercased), and its body to iterate once; `release`
    gives the connection back to the pool (or closes it when the answer was not read to the end)."""

    def __init__(self, pool: Pool, address: str, conn: _Connection, head_only: bool) -> None:
        self._pool, self._address, self._conn, self._head_only = pool, address, conn, head_only
        self.status, self.headers = conn.status, conn.headers

    def body(self) -> AsyncIterator[bytes]:
        if self._head_only:
            return _empty()
        return self._conn.body()

    @property
    def complete(self) -> bool:
        return self._conn.done and not self._conn.chunks

    def abort(self) -> None:
        self._conn.abort()
        self._conn._fail(UpstreamError("the caller left"))

    def take_rest(self, least: int) -> tuple[bytes, int, int] | None:
        return None if self._head_only else self._conn.take_rest(least)

    @property
    def stopped(self) -> asyncio.Future[None] | None:
        return self._conn.stopped

    def spliced(self, whole: bool) -> None:
        self._conn.spliced(whole)

    def release(self) -> None:
        conn = self._conn
        # After HEAD the answer ends with its head (its parser, which did not know, is replaced in put).
        if (conn.done or self._head_only) and not conn.chunks and not conn.closed and conn.keep_alive:
            self._pool.put(self._address, conn)
        else:
            conn.abort()


async def _empty() -> AsyncIterator[bytes]:
    return
    yield


class Pool:
    """Keep-alive connections by task address (host:port), for one event loop."""

    def __init__(self) -> None:
        self._idle: dict[str, list[_Connection]] = {}

    def put(self, address: str, conn: _Connection) -> None:
        idle = self._idle.setdefault(address, [])
        if len(idle) < IDLE_PER_ADDRESS:
            paused = conn._paused
            conn._reset()
            if paused and conn.transport is not None:  # after a splice: a close is noticed while idle
                conn.transport.resume_reading()
            idle.append(conn)
        else:
            conn.abort()

    async def _connect(self, address: str) -> _Connection:
        host, _, port = address.rpartition(":")
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(loop.create_connection(_Connection, host, int(port)),
                                             timeout=CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError, ValueError) as e:
            raise UpstreamError(f"cannot connect to {address}: {e or type(e).__name__}") from e
        return conn

    async def request(self, address: str, head: bytes, body: bytes | AsyncIterator[bytes], *,
                      head_only: bool = False) -> Answer:
        """Send `head` (request line and headers, ending in a blank line) and `body`; the answer once
        its headers have arrived. A reused connection the task had closed meanwhile is retried once
        on a new one when nothing came back and the body can be sent again (bytes)."""
        idle = self._idle.get(address)
        while idle:
            conn = idle.pop()
            if conn.closed:
                continue
            try:
                return await self._exchange(address, conn, head, body, head_only)
            except UpstreamError:
                if conn.received or not isinstance(body, bytes):
                    raise
            break
        return await self._exchange(address, await self._connect(address), head, body, head_only)

    async def _exchange(self, address: str, conn: _Connection, head: bytes, body: bytes | AsyncIterator[bytes],
                        head_only: bool) -> Answer:
        assert conn.transport is not None
        try:
            if isinstance(body, bytes):
                conn.transport.write(head + body if len(body) < 65536 else head)
                if len(body) >= 65536:
                    conn.transport.write(body)
            else:
                conn.transport.write(head)
                async for chunk in body:
                    conn.transport.write(b"%x\r\n%b\r\n" % (len(chunk), chunk) if self._chunked(head) else chunk)
                    await conn.drain()
                if self._chunked(head):
                    conn.transport.write(b"0\r\n\r\n")
            await conn.head()
        except BaseException:
            conn.abort()
            raise
        return Answer(self, address, conn, head_only)

    @staticmethod
    def _chunked(head: bytes) -> bool:
        return b"\r\ntransfer-encoding: chunked\r\n" in head

    def close(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.abort()
        self._idle.clear()
