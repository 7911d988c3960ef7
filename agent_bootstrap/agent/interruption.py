"""Spot/preemptible interruption notices, read from the cloud's instance metadata.

AWS (`interruption_watch: aws`): the two-minute warning at `GET /latest/meta-data/spot/instance-action`
(404 while there is none; 200 with `{"action": "terminate"|"stop"|"hibernate", "time": "<UTC>"}`),
and the earlier, softer rebalance recommendation at
`GET /latest/meta-data/events/recommendations/rebalance` (404, or 200 with `{"noticeTime": ...}`).
Both polled every `interruption_poll_s` (AWS suggests 5 s), with an IMDSv2 session token
(`PUT /latest/api/token`), falling back to IMDSv1 where the token is refused.

GCP (`interruption_watch: gcp`): `GET /computeMetadata/v1/instance/preempted` with
`Metadata-Flavor: Google` reads `TRUE` once the instance is being preempted (spot VMs and
preemptible ones get about 30 s). Read once, then long-polled with `wait_for_change=true` and the
last ETag, so the notice arrives as soon as the metadata server has it.

The parsing (`parse_*`, `kill_at`) is pure and separate from the I/O (`InterruptionWatcher`).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Literal, Optional

import httpx

log = logging.getLogger("shipyard.agent.interruption")

Cloud = Literal["aws", "gcp"]
Action = Literal["terminate", "stop", "hibernate", "preempt", "rebalance"]

AWS_WARNING_S = 120.0  # the spot two-minute warning (used when a notice's time cannot be read)
GCE_WARNING_S = 30.0  # GCE's preemption notice precedes the stop by about 30 s
DEFAULT_METADATA_URL = {"aws": "http://169.254.169.254", "gcp": "http://metadata.google.internal"}
AWS_TOKEN_PATH = "/latest/api/token"
AWS_ACTION_PATH = "/latest/meta-data/spot/instance-action"
AWS_REBALANCE_PATH = "/latest/meta-data/events/recommendations/rebalance"
GCE_PREEMPTED_PATH = "/computeMetadata/v1/instance/preempted"
AWS_TOKEN_TTL_S = 21600


@dataclass(frozen=True)
class Notice:
    """An interruption the cloud announced. `deadline`: when the instance goes (None for a
    rebalance recommendation, which names no time)."""

    cloud: Cloud
    action: Action
    seen_at: datetime
    deadline: Optional[datetime]
    detail: str = ""

    @property
    def final(self) -> bool:
        """A notice that the instance goes (a rebalance recommendation only says it may)."""
        return self.action != "rebalance"

    def describe(self) -> str:
        when = f" at {self.deadline.isoformat()}" if self.deadline else ""
        return f"{self.cloud} {self.action}{when}"


def _utc(text: object) -> Optional[datetime]:
    if not isinstance(text, str) or not text.strip():
        return None
    try:
        value = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


def _json_object(body: str) -> dict[str, object]:
    try:
        parsed = json.loads(body)
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def parse_aws_instance_action(status: int, body: str, now: datetime) -> Optional[Notice]:
    """The spot instance-action document: None while there is no notice (404, or an empty
    answer). A 200 is a notice even when its body cannot be read: then it is a terminate two
    minutes from now, the worst case AWS documents."""
    if status != 200 or not body.strip():
        return None
    doc = _json_object(body)
    action = str(doc.get("action", "terminate")).lower()
    if action not in ("terminate", "stop", "hibernate"):
        action = "terminate"
    deadline = _utc(doc.get("time")) or now + timedelta(seconds=AWS_WARNING_S)
    return Notice("aws", action, now, deadline, body.strip()[:300])  # type: ignore[arg-type]


def parse_aws_rebalance(status: int, body: str, now: datetime) -> Optional[Notice]:
    """The rebalance recommendation: an early hint that the spot instance is at elevated risk."""
    if status != 200 or not body.strip():
        return None
    return Notice("aws", "rebalance", now, None, body.strip()[:300])


def parse_gce_preempted(status: int, body: str, now: datetime) -> Optional[Notice]:
    """GCE's `instance/preempted`: `TRUE` once the instance is being preempted."""
    if status != 200 or body.strip().upper() != "TRUE":
        return None
    return Notice("gcp", "preempt", now, now + timedelta(seconds=GCE_WARNING_S), "instance/preempted=TRUE")


def kill_at(notice: Notice, margin_s: float) -> Optional[datetime]:
    """When the agent stops (SIGTERM) a task still running after a final notice: the notice's
    deadline less the margin, never before the notice was seen. None for a rebalance hint."""
    if not notice.final or notice.deadline is None:
        return None
    return max(notice.seen_at, notice.deadline - timedelta(seconds=margin_s))


def _now() -> datetime:
    return datetime.now(timezone.utc)


class InterruptionWatcher(threading.Thread):
    """Watches the metadata server and calls `on_notice` once per kind of notice (a rebalance
    hint, then the final notice, after which it stops). Errors reaching the metadata server are
    logged (the first and every 20th) and retried; they never stop the agent."""

    def __init__(self, cloud: Cloud, base_url: Optional[str], on_notice: Callable[[Notice], None], *,
                 poll_s: float = 5.0, stop: Optional[threading.Event] = None, timeout_s: float = 5.0) -> None:
        super().__init__(name="interruption-watch", daemon=True)
        self.cloud = cloud
        self.base_url = (base_url or DEFAULT_METADATA_URL[cloud]).rstrip("/")
        self._on_notice = on_notice
        self._poll_s = poll_s
        self._stop_event = stop or threading.Event()
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout_s, trust_env=False)
        self._aws_token: Optional[str] = None
        self._aws_token_until = 0.0
        self._gce_etag: Optional[str] = None
        self._seen: set[str] = set()
        self.failures = 0

    def close(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        log.info("event=interruption_watch_started cloud=%s metadata=%s", self.cloud, self.base_url)
        try:
            while not self._stop_event.is_set():
                try:
                    notices = self._poll_aws() if self.cloud == "aws" else self._poll_gce()
                    self.failures = 0
                except httpx.HTTPError as e:
                    self.failures += 1
                    if self.failures == 1 or self.failures % 20 == 0:
                        log.warning("event=interruption_watch_failed cloud=%s failures=%d error=%r", self.cloud,
                                    self.failures, f"{type(e).__name__}: {e}")
                    self._stop_event.wait(self._poll_s)
                    continue
                for notice in notices:
                    kind = "final" if notice.final else "rebalance"
                    if kind in self._seen:
                        continue
                    self._seen.add(kind)
                    log.warning("event=interruption_notice cloud=%s action=%s deadline=%s", notice.cloud,
                                notice.action, notice.deadline.isoformat() if notice.deadline else None)
                    self._on_notice(notice)
                if "final" in self._seen:
                    return
                if self.cloud == "aws":
                    self._stop_event.wait(self._poll_s)
        finally:
            self._http.close()

    # -- AWS --------------------------------------------------------------------------------------

    def _aws_headers(self) -> dict[str, str]:
        if self._aws_token is None or time.monotonic() >= self._aws_token_until:
            resp = self._http.put(AWS_TOKEN_PATH, headers={"X-aws-ec2-metadata-token-ttl-seconds": str(AWS_TOKEN_TTL_S)})
            if resp.status_code == 200 and resp.text.strip():
                self._aws_token = resp.text.strip()
                self._aws_token_until = time.monotonic() + AWS_TOKEN_TTL_S - 60
            else:  # IMDSv1 only: ask without a token
                self._aws_token, self._aws_token_until = None, time.monotonic() + 300
        return {"X-aws-ec2-metadata-token": self._aws_token} if self._aws_token else {}

    def _aws_get(self, path: str) -> httpx.Response:
        resp = self._http.get(path, headers=self._aws_headers())
        if resp.status_code == 401:  # the token expired early (the metadata service restarted)
            self._aws_token = None
            resp = self._http.get(path, headers=self._aws_headers())
        return resp

    def _poll_aws(self) -> list[Notice]:
        out = []
        resp = self._aws_get(AWS_ACTION_PATH)
        notice = parse_aws_instance_action(resp.status_code, resp.text, _now())
        if notice is not None:
            out.append(notice)
        if "rebalance" not in self._seen and notice is None:
            resp = self._aws_get(AWS_REBALANCE_PATH)
            hint = parse_aws_rebalance(resp.status_code, resp.text, _now())
            if hint is not None:
                out.append(hint)
        return out

    # -- GCP --------------------------------------------------------------------------------------

    def _poll_gce(self) -> list[Notice]:
        params: dict[str, str] = {}
        timeout = None
        if self._gce_etag is not None:  # the first read is plain: the value may be TRUE already
            wait = max(1, int(self._poll_s * 12))
            params = {"wait_for_change": "true", "last_etag": self._gce_etag, "timeout_sec": str(wait)}
            timeout = httpx.Timeout(5.0, read=wait + 10.0)
        resp = self._http.get(GCE_PREEMPTED_PATH, params=params, headers={"Metadata-Flavor": "Google"},
                              **({"timeout": timeout} if timeout else {}))
        if resp.status_code != 200:
            self._stop_event.wait(self._poll_s)  # not served here (yet): ask again later
            return []
        notice = parse_gce_preempted(resp.status_code, resp.text, _now())
        self._gce_etag = resp.headers.get("etag")
        if notice is None and self._gce_etag is None:
            self._stop_event.wait(self._poll_s)  # no ETag to long-poll with: plain reads, spaced
        return [notice] if notice is not None else []
