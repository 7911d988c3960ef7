"""A fake instance metadata server for interruption notices: AWS IMDSv2 (session tokens required,
`spot/instance-action`, `events/recommendations/rebalance`) or GCE (`instance/preempted` with
`Metadata-Flavor: Google`, ETags and `wait_for_change` long-polls), one instance per server.

The notice is served from `announce()` on, or `after_s` seconds after the server starts; until then
AWS answers 404 and GCE `FALSE`, as the real services do. Every request is recorded in `hits`.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional
from urllib.parse import parse_qs, urlsplit


class SpotMetadataServer:
    def __init__(self, cloud: str, *, after_s: Optional[float] = None, warning_s: float = 120.0,
                 action: str = "terminate", rebalance_after_s: Optional[float] = None) -> None:
        assert cloud in ("aws", "gcp")
        self.cloud = cloud
        self.warning_s = warning_s
        self.action = action
        self._after_s = after_s
        self._rebalance_after_s = rebalance_after_s
        self._cond = threading.Condition()
        self._started = time.monotonic()
        self._notice_at: Optional[datetime] = None  # when the notice was issued (wall clock)
        self._rebalance_at: Optional[datetime] = None
        self._tokens: set[str] = set()
        self.hits: list[tuple[str, str, int]] = []  # (method, path, status)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True,
                                        name="fake-spot-metadata")

    def start(self) -> SpotMetadataServer:
        self._started = time.monotonic()
        self._thread.start()
        if self._after_s is not None:
            threading.Timer(self._after_s, self.announce).start()
        if self._rebalance_after_s is not None:
            threading.Timer(self._rebalance_after_s, self.recommend_rebalance).start()
        return self

    def stop(self) -> None:
        with self._cond:
            self._cond.notify_all()
        self._server.shutdown()
        self._server.server_close()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def announce(self) -> None:
        """Serve the interruption notice from now on (the instance goes `warning_s` from now)."""
        with self._cond:
            if self._notice_at is None:
                self._notice_at = datetime.now(timezone.utc)
            self._cond.notify_all()

    def recommend_rebalance(self) -> None:
        with self._cond:
            self._rebalance_at = self._rebalance_at or datetime.now(timezone.utc)
            self._cond.notify_all()

    @property
    def deadline(self) -> Optional[datetime]:
        return None if self._notice_at is None else self._notice_at + timedelta(seconds=self.warning_s)

    def served(self, path: str, status: int = 200) -> int:
        return sum(1 for _m, p, st in self.hits if p == path and st == status)

    # -- answers ----------------------------------------------------------------------------------

    def _aws(self, method: str, path: str, headers: dict[str, str]) -> tuple[int, str, dict[str, str]]:
        if path == "/latest/api/token":
            if method != "PUT" or not headers.get("x-aws-ec2-metadata-token-ttl-seconds", "").isdigit():
                return 400, "PUT with X-aws-ec2-metadata-token-ttl-seconds", {}
            token = uuid.uuid4().hex
            with self._cond:
                self._tokens.add(token)
            return 200, token, {}
        if method != "GET":
            return 405, "", {}
        with self._cond:
            if headers.get("x-aws-ec2-metadata-token", "") not in self._tokens:
                return 401, "", {}  # HttpTokens=required
            deadline, rebalance = self.deadline, self._rebalance_at
        if path == "/latest/meta-data/spot/instance-action":
            if deadline is None:
                return 404, "Not Found", {}
            stamp = deadline.strftime("%Y-%m-%dT%H:%M:%SZ")
            return 200, json.dumps({"action": self.action, "time": stamp}), {}
        if path == "/latest/meta-data/events/recommendations/rebalance":
            if rebalance is None:
                return 404, "Not Found", {}
            return 200, json.dumps({"noticeTime": rebalance.strftime("%Y-%m-%dT%H:%M:%SZ")}), {}
        return 404, "Not Found", {}

    def _gce(self, method: str, path: str, query: dict[str, list[str]],
             headers: dict[str, str]) -> tuple[int, str, dict[str, str]]:
        if headers.get("metadata-flavor") != "Google":
            return 403, "Missing Metadata-Flavor:Google header", {}
        if method != "GET" or path != "/computeMetadata/v1/instance/preempted":
            return 404, "not found", {}

        def current() -> tuple[str, str]:
            value = "TRUE" if self._notice_at is not None else "FALSE"
            return value, ("etag-true" if value == "TRUE" else "etag-false")

        with self._cond:
            value, etag = current()
            if query.get("wait_for_change", ["false"])[0] == "true":
                last = query.get("last_etag", [""])[0]
                timeout = float(query.get("timeout_sec", ["60"])[0])
                end = time.monotonic() + timeout
                while last == etag and time.monotonic() < end:
                    self._cond.wait(timeout=min(0.5, max(0.0, end - time.monotonic())))
                    value, etag = current()
            return 200, value, {"ETag": etag}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                parts = urlsplit(self.path)
                headers = {k.lower(): v for k, v in self.headers.items()}
                if fake.cloud == "aws":
                    status, body, extra = fake._aws(self.command, parts.path, headers)
                else:
                    status, body, extra = fake._gce(self.command, parts.path, parse_qs(parts.query), headers)
                fake.hits.append((self.command, parts.path, status))
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(data)))
                for k, v in extra.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_PUT = _serve  # noqa: N815

            def log_message(self, *_args: object) -> None:
                pass

        return Handler
