"""A TCP load balancer for tests: what sits in front of several masters in production.

Each new connection goes to the first backend (in order) that accepts it within a short timeout,
so a dead master (connection refused) is skipped; established connections are piped both ways
and close when either side closes. `disabled` backends are skipped like dead ones (a health check
that has marked a paused master out)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading


class TcpBalancer:
    def __init__(self, backends: list[int], host: str = "127.0.0.1") -> None:
        self.host = host
        self.backends = list(backends)
        self.disabled: set[int] = set()
        self.loop = asyncio.new_event_loop()
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        self.routed: dict[int, int] = {}
        self._server: asyncio.base_events.Server | None = None
        self._thread = threading.Thread(target=self._run, daemon=True, name="tcp-balancer")
        started = threading.Event()
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(started), self.loop)
        assert started.wait(5)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    async def _start(self, started: threading.Event) -> None:
        self._server = await asyncio.start_server(self._handle, sock=self.sock)
        started.set()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for port in list(self.backends):
            if port in self.disabled:
                continue
            try:
                up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(self.host, port), 0.5)
            except (OSError, TimeoutError):
                continue
            self.routed[port] = self.routed.get(port, 0) + 1
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
            return
        writer.close()

    @staticmethod
    async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        except (OSError, ConnectionError):
            pass
        finally:
            with contextlib.suppress(Exception):
                dst.close()

    def close(self) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
