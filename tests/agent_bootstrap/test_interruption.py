"""The agent's interruption watcher: parsing the clouds' notices, and the watcher against a fake
metadata server (tests/fakes/metadata.py) speaking IMDSv2 and GCE's long-polled metadata."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

import pytest

from agent_bootstrap.agent import interruption as it
from agent_bootstrap.agent.config import ConfigError, load_config
from tests.fakes.metadata import SpotMetadataServer

NOW = datetime(2026, 11, 27, 17, 0, 0, tzinfo=timezone.utc)


def test_aws_instance_action_is_a_notice_only_when_served() -> None:
    assert it.parse_aws_instance_action(404, "Not Found", NOW) is None
    assert it.parse_aws_instance_action(200, "  ", NOW) is None
    n = it.parse_aws_instance_action(200, '{"action": "terminate", "time": "2026-11-27T17:02:00Z"}', NOW)
    assert n is not None and n.final and n.cloud == "aws" and n.action == "terminate"
    assert n.deadline == NOW + timedelta(minutes=2) and n.seen_at == NOW
    stop = it.parse_aws_instance_action(200, '{"action": "stop", "time": "2026-11-27T17:01:30+00:00"}', NOW)
    assert stop is not None and stop.action == "stop" and stop.deadline == NOW + timedelta(seconds=90)


def test_an_unreadable_aws_notice_is_the_worst_case_terminate() -> None:
    for body in ("not json", '{"action": "explode"}', '["terminate"]', '{"time": "yesterday"}'):
        n = it.parse_aws_instance_action(200, body, NOW)
        assert n is not None and n.action == "terminate", body
        assert n.deadline == NOW + timedelta(seconds=it.AWS_WARNING_S), body


def test_rebalance_is_a_hint_without_deadline() -> None:
    assert it.parse_aws_rebalance(404, "", NOW) is None
    n = it.parse_aws_rebalance(200, '{"noticeTime": "2026-11-27T16:59:00Z"}', NOW)
    assert n is not None and not n.final and n.deadline is None
    assert it.kill_at(n, 10) is None


def test_gce_preempted() -> None:
    assert it.parse_gce_preempted(200, "FALSE", NOW) is None
    assert it.parse_gce_preempted(503, "TRUE", NOW) is None
    n = it.parse_gce_preempted(200, "TRUE\n", NOW)
    assert n is not None and n.final and n.action == "preempt"
    assert n.deadline == NOW + timedelta(seconds=it.GCE_WARNING_S)


def test_kill_at_is_the_deadline_less_the_margin_never_before_the_notice() -> None:
    n = it.Notice("aws", "terminate", NOW, NOW + timedelta(seconds=120))
    assert it.kill_at(n, 10) == NOW + timedelta(seconds=110)
    assert it.kill_at(n, 500) == NOW


def test_config_names_the_bad_field() -> None:
    cfg = load_config(["--token", "x", "--interruption-watch", "gcp", "--metadata-url", "http://127.0.0.1:9/"], env={})
    assert cfg.interruption_watch == "gcp" and cfg.metadata_url == "http://127.0.0.1:9"
    assert load_config(["--token", "x"], env={}).interruption_watch == "off"
    with pytest.raises(ConfigError, match="metadata_url"):
        load_config(["--token", "x", "--metadata-url", "169.254.169.254"], env={})
    with pytest.raises(ConfigError, match="interruption_kill_margin_s"):
        load_config(["--token", "x", "--interruption-kill-margin-s", "-1"], env={})


def _watch(fake: SpotMetadataServer, poll_s: float = 0.1) -> tuple[it.InterruptionWatcher, list[it.Notice],
                                                                       threading.Event]:
    got: list[it.Notice] = []
    final = threading.Event()

    def on_notice(n: it.Notice) -> None:
        got.append(n)
        if n.final:
            final.set()

    w = it.InterruptionWatcher(fake.cloud, fake.url, on_notice, poll_s=poll_s)  # type: ignore[arg-type]
    w.start()
    return w, got, final


def test_aws_watcher_reads_the_notice_with_an_imdsv2_token() -> None:
    fake = SpotMetadataServer("aws", rebalance_after_s=0.2, after_s=0.6, warning_s=120).start()
    try:
        w, got, final = _watch(fake)
        assert final.wait(10)
        w.join(5)
        assert not w.is_alive()  # the final notice ends the watch
        assert [n.action for n in got] == ["rebalance", "terminate"]
        assert fake.deadline is not None
        assert abs((got[1].deadline - fake.deadline).total_seconds()) < 1  # type: ignore[operator]
        assert fake.served("/latest/api/token") >= 1
        assert not [h for h in fake.hits if h[2] == 401]  # every read carried the session token
    finally:
        fake.stop()


def test_gce_watcher_long_polls_for_the_preemption() -> None:
    fake = SpotMetadataServer("gcp", after_s=1.0).start()
    try:
        w, got, final = _watch(fake, poll_s=5.0)
        assert final.wait(10)
        w.join(5)
        assert [n.action for n in got] == ["preempt"]
        # One plain read, then a long-poll that the change answered: no polling loop.
        assert fake.served("/computeMetadata/v1/instance/preempted") <= 3
    finally:
        fake.stop()


def test_gce_watcher_sees_a_preemption_already_under_way() -> None:
    fake = SpotMetadataServer("gcp").start()
    fake.announce()
    try:
        _w, got, final = _watch(fake, poll_s=5.0)
        assert final.wait(5)
        assert got[0].action == "preempt"
    finally:
        fake.stop()


def test_watcher_survives_an_unreachable_metadata_server() -> None:
    fake = SpotMetadataServer("aws")
    url = fake.url
    fake._server.server_close()  # nothing listens there any more
    got: list[it.Notice] = []
    stop = threading.Event()
    w = it.InterruptionWatcher("aws", url, got.append, poll_s=0.05, stop=stop, timeout_s=0.5)
    w.start()
    deadline = datetime.now(timezone.utc) + timedelta(seconds=5)
    while w.failures < 3 and datetime.now(timezone.utc) < deadline:
        threading.Event().wait(0.05)
    assert w.failures >= 3 and w.is_alive() and got == []
    stop.set()
    w.join(5)
    assert not w.is_alive()


@pytest.mark.parametrize("provider", ["aws", "gcp"])
def test_cloud_instances_watch_their_clouds_notices_unless_the_pool_says_off(provider: str, tmp_path) -> None:
    from agent_bootstrap.cloud_init import CONFIG_PATH, render_user_data
    from tests.agent_bootstrap.test_cloud_init import files_of, params

    for options, expected in (({}, provider), ({"interruption_watch": "off"}, "off")):
        cfg_path = tmp_path / "agent.yaml"
        cfg_path.write_text(files_of(render_user_data(params(provider, agent_options=options)))[CONFIG_PATH]["content"])
        cfg = load_config(["--config", str(cfg_path)], env={})
        assert cfg.interruption_watch == expected
        assert cfg.metadata_url is None  # the cloud's own address
