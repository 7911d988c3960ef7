"""AWS at the cloud edge: a real moto server over HTTP, and an EC2 fault proxy in front of it.

- `moto_server` (session): a moto server on 127.0.0.1 and a free port; yields its endpoint URL.
  Dummy credentials and region are set in the environment for the whole session.
- `aws_session` (session): a boto3 session created once those credentials are set.
- `moto_reset` (function): wipes moto's state (`POST /moto-api/reset`) before the test.
- `ec2_faults` (function): an `Ec2FaultProxy` in front of moto, cleared for the test. Point the code
  under test at `ec2_faults.url`; set up and inspect through `moto_server` directly so that only the
  calls of the code under test are recorded.

moto 5.2 has no way to make EC2 calls fail over HTTP (its `/moto-api/static/...` endpoints only seed
results of a few other services), so the proxy injects EC2 error responses itself. It also keeps
EC2's RunInstances ClientToken semantics, which moto does not implement: a repeated request with a
ClientToken that already succeeded gets the original response back instead of a second instance.
`hide(instance_id, times)` makes the next DescribeInstances answers leave out an instance that exists
(EC2's eventual consistency right after RunInstances): lists only, or lookups by id too.
"""

from __future__ import annotations

import http.client
import logging
import threading
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit
from xml.sax.saxutils import escape

import boto3
import pytest
import requests
from moto.server import ThreadedMotoServer

# Status codes EC2 answers these errors with (botocore's retries are off in the provider, so they
# only matter for realism).
_DEFAULT_STATUS = {
    "InsufficientInstanceCapacity": 500,
    "InsufficientHostCapacity": 500,
    "RequestLimitExceeded": 503,
    "InternalError": 500,
    "ServiceUnavailable": 503,
    "UnauthorizedOperation": 403,
    "AuthFailure": 401,
}

# Not copied from moto's response to the client: the proxy sends its own framing.
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "server", "date"}


@dataclass
class Fault:
    action: str
    code: str
    status: int
    message: str
    times: int | None  # None: every matching request, forever
    when: dict[str, str]  # request params that must all match, e.g. {"SubnetId": "subnet-1"}
    skip: int  # let this many matching requests through before failing
    after_forward: bool  # forward to moto first (the call lands), then answer with the error
    hits: int = 0


@dataclass
class RecordedCall:
    action: str
    params: dict[str, str]
    status: int = 0
    faulted: bool = False
    replayed: bool = False  # answered from the ClientToken cache
    hidden: list[str] = field(default_factory=list)  # instance ids left out of this answer (hide)


@dataclass
class Hide:
    instance_id: str
    times: int  # answers still to leave it out of
    by_id: bool  # also DescribeInstances calls naming instance ids (else lists only)


@dataclass
class _State:
    faults: list[Fault] = field(default_factory=list)
    calls: list[RecordedCall] = field(default_factory=list)
    tokens: dict[str, bytes] = field(default_factory=dict)  # RunInstances ClientToken -> response
    hides: list[Hide] = field(default_factory=list)


class Ec2FaultProxy:
    """An HTTP proxy that forwards EC2 query-protocol requests to moto, unless a queued fault matches."""

    def __init__(self, upstream_url: str) -> None:
        parts = urlsplit(upstream_url)
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self._lock = threading.Lock()
        self._state = _State()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="ec2-fault-proxy", daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def clear(self) -> None:
        with self._lock:
            self._state = _State()

    def inject(
        self,
        action: str,
        code: str,
        *,
        status: int | None = None,
        message: str = "",
        times: int | None = 1,
        when: dict[str, str] | None = None,
        skip: int = 0,
        after_forward: bool = False,
    ) -> None:
        """Answer the next `times` matching `action` requests (None: all of them) with EC2 error `code`."""
        with self._lock:
            self._state.faults.append(
                Fault(
                    action=action,
                    code=code,
                    status=status or _DEFAULT_STATUS.get(code, 400),
                    message=message or f"injected {code}",
                    times=times,
                    when=dict(when or {}),
                    skip=skip,
                    after_forward=after_forward,
                )
            )

    def hide(self, instance_id: str, *, times: int = 1, by_id: bool = False) -> None:
        """Leave `instance_id` out of the next `times` successful DescribeInstances answers: the
        listing ones (filters, no InstanceId), or with `by_id` also those naming instance ids (an
        instance EC2 "does not know yet" is then simply absent; moto answers a filter-less lookup
        of an unknown id with InvalidInstanceID.NotFound, which this does not imitate)."""
        with self._lock:
            self._state.hides.append(Hide(instance_id, times, by_id))

    def calls(self, action: str | None = None) -> list[RecordedCall]:
        with self._lock:
            return [c for c in self._state.calls if action is None or c.action == action]

    # -- request handling -----------------------------------------------------------------

    def _match(self, action: str, params: dict[str, str]) -> Fault | None:
        for fault in self._state.faults:
            if fault.action != action or any(params.get(k) != v for k, v in fault.when.items()):
                continue
            if fault.skip > 0:
                fault.skip -= 1
                return None
            if fault.times is not None and fault.hits >= fault.times:
                continue
            fault.hits += 1
            return fault
        return None

    def _forward(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(*self._upstream, timeout=30)
        try:
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.getheaders(), resp.read()
        finally:
            conn.close()

    def handle(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        params = dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True)) if body else {}
        action = params.get("Action", "")
        call = RecordedCall(action=action, params=params)
        with self._lock:
            self._state.calls.append(call)
            fault = self._match(action, params) if action else None
            token = params.get("ClientToken") if action == "RunInstances" else None
            cached = self._state.tokens.get(token) if token else None
        if fault is not None and not fault.after_forward:
            call.status, call.faulted = fault.status, True
            return fault.status, [("Content-Type", "text/xml")], _ec2_error_body(fault.code, fault.message)
        # The request reaches "EC2": a ClientToken that already succeeded gets its first answer back.
        if cached is not None:
            status, resp_headers, resp_body = 200, [("Content-Type", "text/xml")], cached
            call.replayed = True
        else:
            status, resp_headers, resp_body = self._forward(method, path, headers, body)
            if token and status == 200:
                with self._lock:
                    self._state.tokens.setdefault(token, resp_body)
        if fault is not None:  # after_forward: the call landed, its answer is lost
            call.status, call.faulted = fault.status, True
            return fault.status, [("Content-Type", "text/xml")], _ec2_error_body(fault.code, fault.message)
        if action == "DescribeInstances" and status == 200:
            resp_body = self._apply_hides(call, params, resp_body)
        call.status = status
        return status, resp_headers, resp_body

    def _apply_hides(self, call: RecordedCall, params: dict[str, str], body: bytes) -> bytes:
        by_id = any(k.startswith("InstanceId.") for k in params)
        with self._lock:
            hides = [h for h in self._state.hides if h.times > 0 and (h.by_id or not by_id)]
            if not hides:
                return body
            root = ET.fromstring(body)
            ns = root.tag[: root.tag.index("}") + 1] if root.tag.startswith("{") else ""
            reservations = root.find(f"{ns}reservationSet")
            for reservation in list(reservations) if reservations is not None else []:
                instances = reservation.find(f"{ns}instancesSet")
                for item in list(instances) if instances is not None else []:
                    hide = next((h for h in hides if h.instance_id == item.findtext(f"{ns}instanceId")), None)
                    if hide is None or hide.times <= 0:
                        continue
                    assert instances is not None and reservations is not None
                    instances.remove(item)
                    hide.times -= 1
                    call.hidden.append(hide.instance_id)
                if instances is not None and len(instances) == 0 and reservations is not None:
                    reservations.remove(reservation)
        if not call.hidden:
            return body
        if ns:
            ET.register_namespace("", ns[1:-1])
        return ET.tostring(root, encoding="utf-8", xml_declaration=True)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = {
                    k: v for k, v in self.headers.items() if k.lower() not in ("connection", "keep-alive")
                }
                status, resp_headers, resp_body = proxy.handle(self.command, self.path, headers, body)
                self.send_response(status)
                for key, value in resp_headers:
                    if key.lower() not in _HOP_BY_HOP:
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(resp_body)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(resp_body)
                self.close_connection = True

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _serve

            def log_message(self, format: str, *args: object) -> None:
                pass  # quiet: the recorded calls are the log

        return Handler


def _ec2_error_body(code: str, message: str) -> bytes:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Response><Errors><Error><Code>{escape(code)}</Code><Message>{escape(message)}</Message>"
        f"</Error></Errors><RequestID>{uuid.uuid4()}</RequestID></Response>"
    ).encode()


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    """A moto server for the session; yields its endpoint URL (http://127.0.0.1:<port>)."""
    with pytest.MonkeyPatch.context() as mp:
        # Dummy credentials: boto3 must never find real ones, and must not need a config file.
        for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
            mp.delenv(var, raising=False)
        mp.setenv("AWS_ACCESS_KEY_ID", "testing")
        mp.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
        mp.setenv("AWS_CONFIG_FILE", "/dev/null")
        mp.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
        mp.setenv("AWS_EC2_METADATA_DISABLED", "true")
        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        try:
            yield f"http://{host}:{port}"
        finally:
            server.stop()


@pytest.fixture(scope="session")
def aws_session(moto_server: str) -> boto3.Session:
    """One boto3 session for the run, made after the dummy credentials are in place. Reusing it
    keeps client creation cheap (a fresh session loads the service model again)."""
    return boto3.Session(region_name="us-east-1")


@pytest.fixture
def moto_reset(moto_server: str) -> str:
    """Fresh moto state for this test; returns the moto endpoint URL."""
    requests.post(f"{moto_server}/moto-api/reset", timeout=10).raise_for_status()
    return moto_server


@pytest.fixture(scope="session")
def _ec2_fault_proxy(moto_server: str) -> Iterator[Ec2FaultProxy]:
    proxy = Ec2FaultProxy(moto_server)
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.fixture
def ec2_faults(_ec2_fault_proxy: Ec2FaultProxy, moto_reset: str) -> Ec2FaultProxy:
    """The fault proxy with no faults, calls or ClientTokens left from earlier tests; moto is reset."""
    _ec2_fault_proxy.clear()
    return _ec2_fault_proxy
