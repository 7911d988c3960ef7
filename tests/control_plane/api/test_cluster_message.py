"""`/api/v1/master/cluster_message` (Determined's Get/Set/DeleteClusterMessage, `det master
cluster-message get / set / clear`): admins set and clear, every signed-in user reads; the rules of
core/cluster_message.py with a clock the test moves. SQLite and PostgreSQL; the real 0.38.1 client
is in tests/compat/test_det_cli.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from control_plane.api.wire import ts
from control_plane.core.cluster_message import parse_go_duration
from tests.control_plane.api.test_experiments import make_user
from tests.ui.test_ui_http import ui_login

PATH = "/api/v1/master/cluster_message"


def test_go_durations() -> None:
    assert parse_go_duration("1h30m") == timedelta(minutes=90)
    assert parse_go_duration("1.5h") == timedelta(minutes=90)
    assert parse_go_duration("300ms") == timedelta(milliseconds=300)
    assert parse_go_duration("-2s") == timedelta(seconds=-2) and parse_go_duration("0") == timedelta(0)
    for bad in ("5d", "2w", "", "h", "1h 30m", "10"):
        with pytest.raises(ValueError, match="Go duration"):
            parse_go_duration(bad)


def test_set_get_clear(client, admin_headers, master) -> None:  # type: ignore[no-untyped-def]
    now = [datetime.now(UTC).replace(microsecond=0)]
    master.clock = lambda: now[0]
    bob = make_user(client, admin_headers, "bob")
    assert client.get(PATH, headers=bob).json() == {}
    assert client.get(PATH).status_code == 401
    assert client.put(PATH, headers=bob, json={"message": "mine"}).status_code == 403
    assert client.delete(PATH, headers=bob).status_code == 403

    r = client.put(PATH, headers=admin_headers, json={"message": "maintenance at 18:00 <b>", "duration": "1h"})
    assert r.status_code == 200, r.text
    assert client.get(PATH, headers=bob).json() == {"clusterMessage": {
        "message": "maintenance at 18:00 <b>", "startTime": ts(now[0]), "endTime": ts(now[0] + timedelta(hours=1)),
        "createdTime": ts(now[0])}}
    assert ui_login(client, "bob", "bob-password-1").status_code == 303
    banner = '<div class="cluster-message" role="status">maintenance at 18:00 &lt;b&gt;</div>'
    assert banner in client.get("/").text  # the web UI's banner, escaped

    def refused(body: dict[str, str], field: str, reason: str) -> None:
        r = client.put(PATH, headers=admin_headers, json=body)
        assert r.status_code == 400 and r.json()["details"][0]["field"] == field, (body, r.text)
        assert reason in r.json()["message"], r.text

    later = now[0] + timedelta(hours=2)
    refused({"message": "x" * 251}, "message", "at most 250 characters")
    refused({"message": "m", "endTime": ts(later), "duration": "1h"}, "duration", "mutually exclusive")
    refused({"message": "m", "duration": "5d"}, "duration", "Go duration")
    refused({"message": "m", "duration": "-1h"}, "duration", "positive")
    refused({"message": "m", "startTime": ts(later), "endTime": ts(now[0] + timedelta(hours=1))}, "endTime",
            "after start time")
    refused({"message": "m", "startTime": ts(now[0] - timedelta(hours=3)), "endTime": ts(now[0] - timedelta(hours=1))},
            "endTime", "after current time")
    refused({"message": "m", "startTime": "tomorrow"}, "startTime", "RFC 3339")
    assert client.get(PATH, headers=bob).json()["clusterMessage"]["message"] == "maintenance at 18:00 <b>"

    # a new one replaces it (shown by `get` before it starts, as Determined), indefinitely
    now[0] += timedelta(minutes=1)
    r = client.put(PATH, headers=admin_headers, json={"message": "upgrade", "startTime": ts(later)})
    assert r.status_code == 200, r.text
    got = client.get(PATH, headers=bob).json()["clusterMessage"]
    assert (got["message"], got["startTime"], "endTime" in got) == ("upgrade", ts(later), False)
    assert "cluster-message" not in client.get("/").text  # not started: no banner yet
    assert client.delete(PATH, headers=admin_headers).status_code == 200
    assert client.get(PATH, headers=bob).json() == {}

    # one that ends is gone by itself
    assert client.put(PATH, headers=admin_headers, json={"message": "brief", "duration": "10m"}).status_code == 200
    now[0] += timedelta(minutes=11)
    assert client.get(PATH, headers=admin_headers).json() == {}
