"""A lean asyncio HTTP/1.1 client for load generators: one keep-alive connection, plain HTTP, JSON.

A load generator on the master's own machine takes CPU from the master it measures: httpx spends
about 2 ms of CPU per request (on this 2-core machine a thousand simulated agents and five hundred
trials cost the generator 0.8 of a core), most of it in machinery a benchmark does not need
(connection pools, URL objects, header models, TLS layers, transports). This client writes the
request line and headers as bytes and reads back a Content-Length (or chunked) answer over an
asyncio stream: a tenth of the cost. It speaks just what the master's JSON routes answer and
raises on anything else, so a benchmark never mistakes a malformed answer for a good one.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlencode, urlsplit

import orjson


class ProtocolError(Exception):
    """The server's answer was not a well-formed HTTP/1.1 response."""


class Response:
    __slots__ = ("status_code", "headers", "content")

    def __init__(self, status_code: int, headers: dict[str, str], content: bytes) -> None:
        self.status_code = status_code
        self.headers = headers  # names in lower case
        self.content = content

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return orjson.loads(self.content)


class LeanClient:
    """Requests go one at a time over one connection (opened on demand, opened again after the
    server closes it or a request fails). `timeout` bounds a whole request: connect, send, answer."""

    def __init__(self, base_url: str, *, timeout: float = 30.0, user_agent: str = "shipyard-load") -> None:
        u = urlsplit(base_url)
        if u.scheme != "http" or not u.hostname:
            raise ValueError(f"{base_url}: only plain http:// URLs")
        self.host = u.hostname
        self.port = u.port or 80
        self.timeout = timeout
        self._fixed = f"Host: {u.netloc}\r\nUser-Agent: {user_agent}\r\nAccept: application/json\r\n".encode()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def request(self, method: str, path: str, *, headers: dict[str, str] | None = None, json: Any = None,
                      params: dict[str, Any] | None = None, timeout: float | None = None) -> Response:
        try:
            return await asyncio.wait_for(self._exchange(method, path, headers, json, params),
                                          self.timeout if timeout is None else timeout)
        except BaseException:
            self._drop()  # a request cut short leaves the connection in an unknown state
            raise

    async def _exchange(self, method: str, path: str, headers: dict[str, str] | None, json: Any,
                        params: dict[str, Any] | None) -> Response:
        if params:
            path = f"{path}?{urlencode(params)}"
        body = b"" if json is None else orjson.dumps(json)
        head = [f"{method} {path} HTTP/1.1\r\n".encode(), self._fixed]
        for name, value in (headers or {}).items():
            head.append(f"{name}: {value}\r\n".encode())
        if json is not None:
            head.append(b"Content-Type: application/json\r\n")
        if body or method in ("POST", "PUT", "PATCH"):
            head.append(f"Content-Length: {len(body)}\r\n".encode())
        head.append(b"\r\n")
        if self._writer is None or self._writer.is_closing():
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        assert self._reader is not None and self._writer is not None
        self._writer.write(b"".join(head) + body)
        return await self._read(self._reader)

    async def _read(self, reader: asyncio.StreamReader) -> Response:
        try:
            raw = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as e:
            raise ConnectionResetError("the server closed the connection") from e
        lines = raw[:-4].decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise ProtocolError(f"not an HTTP/1.1 status line: {lines[0][:80]!r}")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise ProtocolError(f"malformed header line: {line[:80]!r}")
            headers[name.strip().lower()] = value.strip()
        if "content-length" in headers:
            content = await reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            content = await self._chunked(reader)
        else:
            raise ProtocolError("an answer without Content-Length or chunked encoding")
        if headers.get("connection", "").lower() == "close":
            self._drop()
        return Response(int(parts[1]), headers, content)

    @staticmethod
    async def _chunked(reader: asyncio.StreamReader) -> bytes:
        out = bytearray()
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0].strip(), 16)
            if size == 0:
                await reader.readuntil(b"\r\n")  # no trailers are sent by the master
                return bytes(out)
            out += await reader.readexactly(size)
            await reader.readexactly(2)

    def _drop(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None

    async def aclose(self) -> None:
        self._drop()
