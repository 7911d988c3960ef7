"""harness/tensorboard/serve.py's sources: a trial's event files as the harness uploaded them
(TensorboardSync, the trial side) are what the TensorBoard task reads: a shared_fs directory
linked in place; an S3 (moto's server) or GCS (the emulator) prefix copied, and a grown file copied
again on the next pass while an unchanged one is left alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.storage import from_config
from harness.tensorboard.serve import Source, tensorboard_argv
from harness.tensorboard.sync import TensorboardSync, sync_path
from harness.tensorboard.writer import EventFileWriter
from tests.harness.test_tensorboard_events import read_scalars


@pytest.mark.parametrize("kind", ["shared_fs", "s3", "gcs"])
def test_a_trials_uploaded_event_files_reach_the_tensorboard(kind: str, tmp_path: Path,
                                                             request: pytest.FixtureRequest) -> None:
    storage: dict[str, Any] = ({"type": "shared_fs", "host_path": str(tmp_path / "ckpts")} if kind == "shared_fs"
                               else request.getfixturevalue(f"{kind}_bucket"))
    written = tmp_path / "trial-side"
    writer = EventFileWriter(written)
    writer.add_scalar("Determined/loss", 0.5, 1)
    writer.flush()
    path = sync_path("cluster-1", 7, 42)
    upload = TensorboardSync(from_config(storage), written, path)
    assert upload.sync_once() == 1
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    source = Source("exp7-trial42", storage, path, scratch)
    assert source.local == scratch / "exp7-trial42"
    assert source.sync() == (1 if kind != "shared_fs" else 0)
    assert read_scalars(source.local) == [("Determined/loss", 0.5, 1)]
    writer.add_scalar("Determined/loss", 0.25, 2)
    writer.flush()
    assert upload.sync_once() == 1
    assert source.sync() == (1 if kind != "shared_fs" else 0)
    assert read_scalars(source.local) == [("Determined/loss", 0.5, 1), ("Determined/loss", 0.25, 2)]
    assert source.sync() == 0  # nothing new
    argv = tensorboard_argv(scratch, 6006, "/proxy/t-1/")
    assert argv[argv.index("--logdir") + 1] == str(scratch) and argv[argv.index("--path_prefix") + 1] == "/proxy/t-1"


def test_the_gate_forwards_only_requests_with_the_tasks_token(tmp_path: Path) -> None:
    """What the master reaches: TensorBoard's answers (bytes and headers as sent) for the proxy's
    token, 403 for anyone else on the network; the token itself never reaches TensorBoard."""
    import gzip
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import httpx

    from harness.tensorboard.serve import gate

    seen: list[dict[str, str]] = []

    class Upstream(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            seen.append({k.lower(): v for k, v in self.headers.items()})
            body = gzip.compress(b'{"run": ["Determined/loss"]}')
            self.send_response(200)
            self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    upstream = ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    front = gate("s3cret", upstream.server_address[1])
    for server in (upstream, front):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{front.server_address[1]}/proxy/t/data/plugin/scalars/tags?x=1"
        assert httpx.get(url).status_code == 403
        assert httpx.get(url, headers={"Authorization": "token wrong"}).status_code == 403
        r = httpx.get(url, headers={"Authorization": "token s3cret", "X-Seen": "yes"})
        assert r.status_code == 200 and r.headers["content-encoding"] == "gzip"
        assert r.json() == {"run": ["Determined/loss"]}
        (headers,) = seen
        assert headers["x-seen"] == "yes" and "authorization" not in headers
    finally:
        front.shutdown()
        upstream.shutdown()


def test_a_trial_whose_storage_cannot_be_read_is_left_out_with_why(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from harness.tensorboard.serve import SOURCES_ENV, sources_from_env

    good = {"name": "exp1-trial1", "storage": {"type": "shared_fs", "host_path": str(tmp_path / "c")},
            "path": sync_path("c", 1, 1)}
    bad = {"name": "exp2-trial2", "storage": {"type": "shared_fs", "host_path": "relative/dir"},
           "path": sync_path("c", 2, 2)}
    found = sources_from_env({SOURCES_ENV: json.dumps([good, bad])}, tmp_path)
    assert [s.name for s in found] == ["exp1-trial1"]
    assert "exp2-trial2 is left out: its checkpoint storage cannot be read" in capsys.readouterr().out
