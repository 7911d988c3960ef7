"""A TensorBoard task's entrypoint (issue 29): `python -m harness.tensorboard.serve`.

Reads its trials' event files where the harness wrote them (harness/tensorboard/sync.py): a
shared_fs storage's directory directly; an S3 or GCS storage's prefix copied to a local directory
before TensorBoard starts and again every SYNC_INTERVAL_S (through harness/storage, so no
TensorFlow and no second storage client). Starts the real `tensorboard` on a loopback port, each trial
a run named exp<E>-trial<T>, serving
under the master's proxy path (`--path_prefix /proxy/<task id>`). TensorBoard has no login of its
own, so what the master reaches is a gate on a free port of the host that forwards only requests
carrying the task's token (the master's proxy adds it, as for Jupyter; the browser never sees it).
Tells the master where the gate serves (shipyard_common/jupyter_launch.py's way) and waits for
TensorBoard, passing a stop signal on.

The master gives it SHIPYARD_PROXY_BASE, SHIPYARD_TASK_TOKEN and SHIPYARD_TENSORBOARD_SOURCES: a
JSON list of {"name": run name, "storage": checkpoint_storage config, "path": the trial's path in it}."""

from __future__ import annotations

import hmac
import http.client
import json
import logging
import os
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path, PurePosixPath
from typing import Any, Optional

from harness.storage import StorageError, from_config
from harness.storage.base import walk_tree
from shipyard_common.jupyter_launch import _address_towards, _free_port, _report

log = logging.getLogger("harness.tensorboard.serve")

SOURCES_ENV = "SHIPYARD_TENSORBOARD_SOURCES"
SYNC_INTERVAL_S = 30.0


class Source:
    """One trial's event files, at `local` = <scratch>/<run name> (TensorBoard's --logdir is the
    scratch directory, so each trial is one run named after it): a copy of a bucket's files, or a
    link to the shared_fs directory."""

    def __init__(self, name: str, storage: Mapping[str, Any], path: str, scratch: Path,
                 owner_uid: Optional[int] = None) -> None:
        parent, leaf = str(PurePosixPath(path).parent), PurePosixPath(path).name
        config = dict(storage)
        if config.get("type") == "shared_fs":  # the trial's directory itself
            config["storage_path"] = str(PurePosixPath(config.get("storage_path") or "", parent))
        else:  # the bucket's objects under prefix/parent/leaf, as a "checkpoint" named leaf
            config["prefix"] = "/".join(p for p in (config.get("prefix") or "", parent) if p)
        self.name, self.leaf = name, leaf
        self.storage = from_config(config)
        self.direct = self.storage.direct_path(leaf)
        self.copied = self.direct is None
        self.local = scratch / name
        # Where the agent gives task users uids of their own (agent/tensorboard_dirs.py), the uid the
        # experiment owner's trials run as: a shared_fs trial directory another uid owns was not
        # written by them, and is not shown.
        self.owner_uid = owner_uid
        self._told = False
        self._link()
        self._incoming = scratch / ".incoming" / name

    def _foreign_owner(self) -> Optional[int]:
        """The uid owning the trial's shared_fs directory when that is not its experiment owner's."""
        if self.direct is None or self.owner_uid is None:
            return None
        try:
            st = os.lstat(self.direct)
        except FileNotFoundError:
            return None  # not written yet: linked, and looked at again on every pass
        return None if stat.S_ISDIR(st.st_mode) and st.st_uid == self.owner_uid else st.st_uid

    def _link(self) -> None:
        """Link `local` to the shared_fs trial directory, or unlink it, after its owner."""
        if self.direct is None:
            return
        foreign = self._foreign_owner()
        if foreign is None and not self.local.is_symlink():
            self.local.symlink_to(self.direct, target_is_directory=True)
        elif foreign is not None and (self.local.is_symlink() or not self._told):
            self.local.unlink(missing_ok=True)
            print(f"{self.name} is left out: its event directory {self.direct} belongs to uid {foreign}, not to "
                  f"uid {self.owner_uid} its experiment's trials run as", flush=True)
        self._told = foreign is not None

    def sync(self) -> int:
        """Copy new or grown files of a bucket's trial into `local` (each replaced whole, by rename);
        the number copied. Nothing there yet is not an error: the next pass looks again. A shared_fs
        trial's link is checked again instead."""
        if not self.copied:
            self._link()
            return 0
        self.local.mkdir(parents=True, exist_ok=True)
        try:
            self.storage.download(self.leaf, self._incoming)
        except StorageError as e:
            log.info("event=tensorboard_sync_skipped run=%s reason=%r", self.name, str(e))
            return 0
        n = 0
        for entry in walk_tree(self._incoming):
            target = self.local / entry.relpath
            if entry.is_dir:
                target.mkdir(parents=True, exist_ok=True)
            elif not target.exists() or target.stat().st_size != entry.size:
                os.replace(entry.path, target)
                n += 1
        return n


def sources_from_env(env: Mapping[str, str], scratch: Path) -> list[Source]:
    """Each trial's source; one whose storage cannot be read is left out, with a line saying why."""
    out = []
    for s in json.loads(env[SOURCES_ENV]):
        try:
            uid = s.get("uid")
            out.append(Source(s["name"], s["storage"], s["path"], scratch, uid if isinstance(uid, int) else None))
        except StorageError as e:
            print(f"{s['name']} is left out: its checkpoint storage cannot be read ({e})", flush=True)
    return out


def tensorboard_argv(scratch: Path, port: int, base: str) -> list[str]:
    return [sys.executable, "-m", "tensorboard.main", "--logdir", str(scratch), "--host", "127.0.0.1",
            "--port", str(port), "--path_prefix", base.rstrip("/"), "--reload_interval", "5"]


# Not passed between the gate and TensorBoard (hop-by-hop, the token, and lengths the gate sets).
_DROP = frozenset({"authorization", "connection", "keep-alive", "host", "transfer-encoding", "content-length",
                   "proxy-authorization", "te", "trailer", "upgrade"})


def gate(token: str, upstream_port: int, port: int = 0) -> ThreadingHTTPServer:
    """An HTTP server on every interface that forwards requests with `Authorization: token <token>`
    to 127.0.0.1:upstream_port (answers whole, as sent: TensorBoard's are small) and refuses the
    rest (403). Serve it with `serve_forever` in a thread."""
    expected = "token " + token

    class Gate(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _forward(self) -> None:
            if not hmac.compare_digest(self.headers.get("Authorization", "").encode(), expected.encode()):
                self.send_error(403, "this task is reached through the master's proxy")
                return
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _DROP}
            upstream = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=120)
            try:
                upstream.request(self.command, self.path, body=body, headers=headers)
                answer = upstream.getresponse()
                data = answer.read()
            except OSError as e:
                self.send_error(502, f"TensorBoard did not answer: {e}")
                return
            finally:
                upstream.close()
            self.send_response(answer.status, answer.reason)
            for k, v in answer.getheaders():
                if k.lower() not in _DROP:
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        do_GET = do_POST = do_HEAD = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = _forward

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
            pass

    server = ThreadingHTTPServer(("0.0.0.0", port), Gate)
    server.daemon_threads = True
    return server


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _sync_all(sources: list[Source]) -> None:
    for s in sources:
        try:
            s.sync()
        except Exception as e:  # noqa: BLE001 (a failed pass is retried by the next one)
            print(f"could not copy the event files of {s.name}: {e}", flush=True)


def main(env: Optional[Mapping[str, str]] = None) -> int:
    env = os.environ if env is None else env
    base = env["SHIPYARD_PROXY_BASE"]
    scratch = Path(tempfile.mkdtemp(prefix="tensorboard-logs-", dir=os.getcwd()))
    sources = sources_from_env(env, scratch)
    _sync_all(sources)
    port = _free_port()
    child = subprocess.Popen(tensorboard_argv(scratch, port, base))
    front = gate(env["SHIPYARD_TASK_TOKEN"], port)
    threading.Thread(target=front.serve_forever, name="tensorboard-gate", daemon=True).start()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, _f: child.send_signal(s))
    while child.poll() is None and not _answers(f"http://127.0.0.1:{port}{base}data/environment"):
        time.sleep(0.2)
    if child.poll() is None:
        _report(env["DET_MASTER"], env["DET_ALLOCATION_ID"], env["DET_SESSION_TOKEN"],
                f"{_address_towards(env['DET_MASTER'])}:{front.server_address[1]}")
        print(f"TensorBoard is ready for {len(sources)} trial(s); the master proxies it at {base}", flush=True)
    next_sync = time.monotonic() + SYNC_INTERVAL_S
    while child.poll() is None:
        time.sleep(0.5)
        if time.monotonic() >= next_sync:
            _sync_all(sources)
            next_sync = time.monotonic() + SYNC_INTERVAL_S
    return child.wait()


if __name__ == "__main__":
    sys.exit(main())
