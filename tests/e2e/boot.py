"""Emulated boot of cloud instances: the user-data the master wrote, run on this machine.

A `BootHarness` watches a cloud fake (the moto server, or the GCE fake) and "boots" every instance
of this cluster that the cloud reports running, as the instance's cloud-init would:

- the user-data is read back from the cloud (moto: DescribeInstanceAttribute userData; GCE:
  the `user-data` metadata item) and parsed as `#cloud-config`;
- `write_files` are written under a sandbox directory (one per instance), permissions honoured;
- `packages` are skipped: the instance's Python is the test run's (SHIPYARD_PYTHON=sys.executable,
  and its directory comes first on PATH, so `python3` is that interpreter too);
- `runcmd` runs as written (paths of written files re-rooted into the sandbox) with
  SHIPYARD_ROOT=sandbox and SHIPYARD_METADATA_URL pointing at `FakeMetadataServer`, which serves
  this instance's id (AWS IMDSv2, session token required) or name (GCE, Metadata-Flavor required);
- the systemd unit the boot script wrote is started by running its ExecStart (with its
  Environment=) as a subprocess instead of `systemctl`.

When the cloud reports the instance terminated or deleted, every process of that instance (boot
script, agent, the agent's tasks) is killed at once, like a VM going away. `systemctl` and
`shutdown` are shims on the instance's PATH: a power-off request (the agent's on_connection_lost)
is recorded and passed to the cloud (the AWS provider launches with shutdown behaviour
`terminate`; a GCE VM that powers off is TERMINATED).
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal, Protocol

import yaml

log = logging.getLogger("tests.e2e.boot")

# Every process of an emulated instance carries this variable (value: its sandbox), so the
# harness can find and kill the whole instance, tasks included.
MARKER_ENV = "SHIPYARD_EMULATED_INSTANCE"
UNIT_DIR = "etc/systemd/system"
# cloud-config keys the harness knows how to run (or deliberately skips).
KNOWN_KEYS = {"package_update", "package_upgrade", "packages", "write_files", "runcmd"}

#: "stopped": powered off but still the cloud's (AWS stopped, GCE TERMINATED); it can be started
#: again, and then only its systemd units start (cloud-init's runcmd ran on the first boot only).
CloudState = Literal["pending", "running", "stopped", "gone"]


# ---- fake metadata service -------------------------------------------------------------------


@dataclass
class MetadataHit:
    key: str
    method: str
    path: str
    status: int


class FakeMetadataServer:
    """AWS IMDSv2 and GCE metadata for many instances on one port: instance `key`'s service is at
    `url_for(key)` (a path prefix), as SHIPYARD_METADATA_URL."""

    def __init__(self, address: tuple[str, int] = ("127.0.0.1", 0), *, root_key: str | None = None) -> None:
        """`root_key`: the instance whose service is at the root of the address (the real
        endpoint's paths, for a boot that is not told where its metadata is)."""
        self._lock = threading.Lock()
        self._ids: dict[str, tuple[str, str]] = {}  # key -> (provider, instance id / name)
        self._tokens: dict[str, str] = {}  # IMDSv2 session token -> key
        self.root_key = root_key
        # AWS: the instance profile's role and the credentials IMDS hands out for it (role name,
        # access key id, secret key), as an instance launched with one gets; None: no profile.
        self.instance_role: tuple[str, str, str] | None = None
        self.hits: list[MetadataHit] = []
        self.on_hit: Callable[[MetadataHit], None] | None = None
        self._server = ThreadingHTTPServer(address, self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True,
                                        name="fake-metadata")

    def start(self) -> FakeMetadataServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def register(self, key: str, provider: str, instance_id: str) -> str:
        with self._lock:
            self._ids[key] = (provider, instance_id)
        return self.url_for(key)

    def url_for(self, key: str) -> str:
        return f"{self.url}/{key}"

    def hits_for(self, key: str) -> list[MetadataHit]:
        with self._lock:
            return [h for h in self.hits if h.key == key]

    def _answer(self, method: str, path: str, headers: dict[str, str]) -> tuple[int, str, str]:
        """(status, key, body) for one request."""
        if self.root_key is not None:
            key, rest = self.root_key, path
        else:
            key, _, rest = path.lstrip("/").partition("/")
            rest = "/" + rest
        with self._lock:
            entry = self._ids.get(key)
        if entry is None:
            return 404, key, "unknown instance"
        provider, ident = entry
        if provider == "aws":
            if rest == "/latest/api/token":
                if method != "PUT":
                    return 405, key, "IMDSv2: PUT only"
                if not headers.get("x-aws-ec2-metadata-token-ttl-seconds", "").isdigit():
                    return 400, key, "missing X-aws-ec2-metadata-token-ttl-seconds"
                token = uuid.uuid4().hex
                with self._lock:
                    self._tokens[token] = key
                return 200, key, token
            if rest == "/latest/meta-data/instance-id" and method == "GET":
                with self._lock:
                    ok = self._tokens.get(headers.get("x-aws-ec2-metadata-token", "")) == key
                # HttpTokens=required: IMDSv1 (no session token) is refused.
                return (200, key, ident) if ok else (401, key, "IMDSv2 session token required")
            return self._aws_role_credentials(method, rest, headers, key)
        if rest == "/computeMetadata/v1/instance/name" and method == "GET":
            if headers.get("metadata-flavor") != "Google":
                return 403, key, "Missing Metadata-Flavor:Google header"
            return 200, key, ident
        return 404, key, "not found"

    def _aws_role_credentials(self, method: str, rest: str, headers: dict[str, str], key: str) -> tuple[int, str, str]:
        """IMDS's iam/security-credentials/[ROLE] (what boto3's default chain reads on an instance)."""
        prefix = "/latest/meta-data/iam/security-credentials/"
        role = self.instance_role
        if method != "GET" or not rest.startswith(prefix) or role is None:
            return 404, key, "not found"
        with self._lock:
            if self._tokens.get(headers.get("x-aws-ec2-metadata-token", "")) != key:
                return 401, key, "IMDSv2 session token required"
        name, access_key, secret_key = role
        if rest == prefix:
            return 200, key, name
        if rest != prefix + name:
            return 404, key, "not found"
        now = datetime.datetime.now(datetime.timezone.utc)
        return 200, key, json.dumps({
            "Code": "Success", "Type": "AWS-HMAC", "AccessKeyId": access_key, "SecretAccessKey": secret_key,
            "Token": "", "LastUpdated": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "Expiration": (now + datetime.timedelta(hours=6)).strftime("%Y-%m-%dT%H:%M:%SZ")})

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                headers = {k.lower(): v for k, v in self.headers.items()}
                status, key, body = server._answer(self.command, self.path, headers)
                hit = MetadataHit(key, self.command, self.path, status)
                with server._lock:
                    server.hits.append(hit)
                if server.on_hit is not None:
                    server.on_hit(hit)
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_PUT = do_POST = _serve

            def log_message(self, format: str, *args: object) -> None:
                pass

        return Handler


# ---- the clouds, as the harness sees them ------------------------------------------------------


@dataclass(frozen=True)
class CloudView:
    id: str
    state: CloudState


class Cloud(Protocol):
    provider: str

    def instances(self) -> list[CloudView]:
        """Instances carrying Shipyard's managed-by tag/label, in every state the cloud still reports."""
        ...

    def user_data(self, instance_id: str) -> str: ...

    def power_off(self, instance_id: str) -> None: ...


_AWS_STATES: dict[str, CloudState] = {"pending": "pending", "running": "running", "stopping": "stopped",
                                      "stopped": "stopped"}


class MotoCloud:
    provider = "aws"

    def __init__(self, endpoint_url: str, region: str = "us-east-1") -> None:
        import boto3

        self.ec2 = boto3.Session(region_name=region).client("ec2", region_name=region, endpoint_url=endpoint_url)

    def instances(self) -> list[CloudView]:
        resp = self.ec2.describe_instances(Filters=[{"Name": "tag:shipyard:managed-by", "Values": ["shipyard"]}])
        return [
            CloudView(i["InstanceId"], _AWS_STATES.get(i["State"]["Name"], "gone"))
            for r in resp["Reservations"]
            for i in r["Instances"]
        ]

    def user_data(self, instance_id: str) -> str:
        attr = self.ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
        value = attr.get("UserData", {}).get("Value")
        return base64.b64decode(value).decode() if value else ""

    def power_off(self, instance_id: str) -> None:
        # InstanceInitiatedShutdownBehavior=terminate: powering off ends the instance.
        self.ec2.terminate_instances(InstanceIds=[instance_id])


_GCE_STATES: dict[str, CloudState] = {"PROVISIONING": "pending", "STAGING": "pending", "RUNNING": "running",
                                      "STOPPING": "stopped", "TERMINATED": "stopped"}


class GceFakeCloud:
    provider = "gcp"

    def __init__(self, fake: Any) -> None:  # tests.fakes.gce.GceFake
        self.fake = fake

    def instances(self) -> list[CloudView]:
        return [
            CloudView(i["name"], _GCE_STATES.get(i.get("status", ""), "gone"))
            for i in self.fake.instances
            if i.get("labels", {}).get("shipyard-managed-by") == "shipyard"
        ]

    def user_data(self, instance_id: str) -> str:
        items = self.fake.instance(instance_id).get("metadata", {}).get("items", [])
        return next((it["value"] for it in items if it["key"] == "user-data"), "")

    def power_off(self, instance_id: str) -> None:
        self.fake.set_status(instance_id, "TERMINATED")


# ---- cloud-init, emulated -----------------------------------------------------------------------


class BootError(Exception):
    pass


def parse_user_data(text: str) -> dict[str, Any]:
    if not text.startswith("#cloud-config\n"):
        raise BootError("user-data is not a #cloud-config document")
    doc = yaml.safe_load(text)
    if not isinstance(doc, dict):
        raise BootError("user-data: the top level must be a mapping")
    unknown = sorted(set(doc) - KNOWN_KEYS)
    if unknown:
        # Never skip a step silently: a key the harness does not run would go untested.
        raise BootError(f"user-data has cloud-config keys the harness cannot emulate: {unknown}")
    return doc


def rooted(sandbox: Path, path: str) -> Path:
    if not path.startswith("/"):
        raise BootError(f"write_files path must be absolute: {path!r}")
    return sandbox / path.lstrip("/")


def write_files(doc: dict[str, Any], sandbox: Path) -> dict[str, Path]:
    """Write `write_files` under the sandbox; returns {path as written in user-data: sandbox path}."""
    written: dict[str, Path] = {}
    for entry in doc.get("write_files") or []:
        target = rooted(sandbox, entry["path"])
        target.parent.mkdir(parents=True, exist_ok=True)
        content = entry.get("content", "")
        encoding = entry.get("encoding", "text/plain")
        data = base64.b64decode(content) if encoding in ("b64", "base64") else content.encode()
        with open(target, "ab" if entry.get("append") else "wb") as f:
            f.write(data)
        os.chmod(target, int(str(entry.get("permissions", "0644")), 8))
        written[entry["path"]] = target
    return written


@dataclass
class UnitFile:
    path: Path
    exec_start: list[str]
    environment: dict[str, str]
    settings: dict[str, str]


def parse_unit(path: Path) -> UnitFile:
    section = ""
    env: dict[str, str] = {}
    settings: dict[str, str] = {}
    exec_start: list[str] = []
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        if section != "Service":
            continue
        if key == "Environment":
            for item in shlex.split(value):
                k, _, v = item.partition("=")
                env[k] = v
        elif key == "ExecStart":
            exec_start = shlex.split(value)
        else:
            settings[key] = value
    if not exec_start:
        raise BootError(f"{path}: no ExecStart")
    return UnitFile(path, exec_start, env, settings)


def processes_of(sandbox: Path) -> list[int]:
    """Pids whose environment marks them as processes of this emulated instance."""
    marker = f"{MARKER_ENV}={sandbox}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if marker in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


_SHIM = """#!/bin/sh
# Emulated instance: a power-off request is recorded for the harness, which ends the instance.
echo "$0 $*" >> "${SHIPYARD_EMULATED_INSTANCE:?}/poweroff-requested"
"""


@dataclass
class EmulatedInstance:
    id: str
    sandbox: Path
    state: Literal["booting", "running", "stopped", "failed", "gone"] = "booting"
    error: str | None = None
    user_data: str = ""
    doc: dict[str, Any] = field(default_factory=dict)
    unit: UnitFile | None = None
    agent: subprocess.Popen[bytes] | None = None
    boot_returncode: int | None = None
    powered_off: bool = False
    starts: int = 0  # how many times its unit was started (1 after the first boot)
    #: What makes the sandbox this instance's machine (its root, its Python, its metadata address):
    #: the boot's scripts see it, and so does an ExecStartPre that runs the boot script again.
    machine_env: dict[str, str] = field(default_factory=dict)

    @property
    def boot_log(self) -> str:
        p = self.sandbox / "boot.log"
        return p.read_text(errors="replace") if p.exists() else ""

    @property
    def agent_log(self) -> str:
        p = self.sandbox / "agent.log"
        return p.read_text(errors="replace") if p.exists() else ""


class BootHarness:
    def __init__(self, cloud: Cloud, root: Path, *, python: str = sys.executable,
                 metadata: FakeMetadataServer | None = None, poll_interval: float = 0.25) -> None:
        self.cloud = cloud
        self.root = root
        self.python = python
        self.metadata = metadata or FakeMetadataServer().start()
        self._own_metadata = metadata is None
        self.poll_interval = poll_interval
        self.instances: dict[str, EmulatedInstance] = {}
        self.skipped: dict[str, str] = {}  # instance id -> why it was not booted
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True, name="boot-harness")
        self._boot_threads: list[threading.Thread] = []
        self.root.mkdir(parents=True, exist_ok=True)

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> BootHarness:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        with self._lock:
            instances = list(self.instances.values())
        for inst in instances:
            self._kill(inst)
        for t in self._boot_threads:
            t.join(timeout=10)
        if self._own_metadata:
            self.metadata.stop()

    def wait_for(self, pred: Callable[[], Any], timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = pred()
            if value:
                return value
            failed = [i for i in self.instances.values() if i.state == "failed"]
            if failed:
                f = failed[0]
                raise AssertionError(f"instance {f.id} failed to boot: {f.error}\n{f.boot_log[-3000:]}")
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}; instances: "
                             f"{ {i.id: i.state for i in self.instances.values()} }")

    # -- the watch loop --------------------------------------------------------------------------
    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                self._poll()
            except Exception:  # a transient fake hiccup must not end the watch
                log.exception("event=boot_harness_poll_failed")
            self._stop.wait(self.poll_interval)

    def _poll(self) -> None:
        seen = {v.id: v.state for v in self.cloud.instances()}
        with self._lock:
            known = dict(self.instances)
        for instance_id, state in seen.items():
            inst = known.get(instance_id)
            if inst is None and state == "running" and instance_id not in self.skipped:
                self._start_boot(instance_id)
            elif inst is not None and state == "gone" and inst.state != "gone":
                self._vanish(inst)
            elif inst is not None and state == "stopped" and inst.state == "running":
                self._power_down(inst)
            elif inst is not None and state == "running" and inst.state == "stopped":
                self._restart(inst)
        for instance_id, inst in known.items():
            if instance_id not in seen and inst.state != "gone":
                self._vanish(inst)
            elif inst.state == "running" and not inst.powered_off and (inst.sandbox / "poweroff-requested").exists():
                inst.powered_off = True
                log.info("event=emulated_poweroff instance_id=%s", instance_id)
                self.cloud.power_off(instance_id)

    def _start_boot(self, instance_id: str) -> None:
        text = self.cloud.user_data(instance_id)
        if not text.startswith("#cloud-config"):
            # e.g. an instance made by hand in a test (the orphan): nothing to boot.
            self.skipped[instance_id] = "no #cloud-config user-data"
            return
        inst = EmulatedInstance(instance_id, self.root / instance_id, user_data=text)
        with self._lock:
            self.instances[instance_id] = inst
        t = threading.Thread(target=self._boot, args=(inst,), daemon=True, name=f"boot-{instance_id}")
        self._boot_threads.append(t)
        t.start()

    def _power_down(self, inst: EmulatedInstance) -> None:
        """A stop: systemd sends its services SIGTERM and, after their stop timeout, SIGKILL; the
        sandbox (the instance's disk) stays."""
        log.info("event=emulated_instance_stopped instance_id=%s", inst.id)
        inst.state = "stopped"
        for pid in processes_of(inst.sandbox):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while processes_of(inst.sandbox) and time.monotonic() < deadline:
            time.sleep(0.1)
        self._kill(inst)

    def _restart(self, inst: EmulatedInstance) -> None:
        """A start after a stop: the enabled unit starts again, ExecStartPre first."""
        log.info("event=emulated_instance_started_again instance_id=%s", inst.id)
        inst.state = "booting"
        t = threading.Thread(target=self._boot, args=(inst, True), daemon=True, name=f"restart-{inst.id}")
        self._boot_threads.append(t)
        t.start()

    def _vanish(self, inst: EmulatedInstance) -> None:
        log.info("event=emulated_instance_gone instance_id=%s", inst.id)
        inst.state = "gone"
        self._kill(inst)

    # -- one boot ----------------------------------------------------------------------------------
    def _base_env(self, inst: EmulatedInstance) -> dict[str, str]:
        shims = inst.sandbox / ".shims"
        return {
            "PATH": os.pathsep.join([str(shims), str(Path(self.python).parent),
                                     "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]),
            "HOME": str(inst.sandbox / "root"),
            "LANG": "C.UTF-8",
            MARKER_ENV: str(inst.sandbox),
        }

    def _boot(self, inst: EmulatedInstance, again: bool = False) -> None:
        try:
            if again:
                self._start_unit(inst)
            else:
                self._run_boot(inst)
        except Exception as e:
            if inst.state != "gone":
                inst.state = "failed"
                inst.error = f"{type(e).__name__}: {e}"
                log.error("event=emulated_boot_failed instance_id=%s error=%s", inst.id, inst.error)

    def _run_boot(self, inst: EmulatedInstance) -> None:
        inst.doc = parse_user_data(inst.user_data)
        sandbox = inst.sandbox
        (sandbox / "root").mkdir(parents=True, exist_ok=True)
        shims = sandbox / ".shims"
        shims.mkdir(exist_ok=True)
        for name in ("systemctl", "shutdown", "poweroff"):
            (shims / name).write_text(_SHIM)
            (shims / name).chmod(0o755)
        written = write_files(inst.doc, sandbox)
        env = self._base_env(inst)
        inst.machine_env = dict(SHIPYARD_ROOT=str(sandbox), SHIPYARD_PYTHON=self.python,
                                SHIPYARD_METADATA_URL=self.metadata.register(inst.id, self.cloud.provider, inst.id))
        env.update(inst.machine_env)
        with open(sandbox / "boot.log", "ab") as out:
            for cmd in inst.doc.get("runcmd") or []:
                argv = ([str(written.get(a, a)) for a in cmd] if isinstance(cmd, list) else ["sh", "-c", cmd])
                proc = subprocess.run(argv, env=env, cwd=sandbox, stdout=out, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, timeout=240, check=False)
                inst.boot_returncode = proc.returncode
                if inst.state == "gone":
                    return
                if proc.returncode != 0:
                    raise BootError(f"runcmd {argv} exited {proc.returncode}")
        units = sorted((sandbox / UNIT_DIR).glob("*.service"))
        if not units:
            raise BootError("the boot wrote no systemd unit")
        inst.unit = parse_unit(units[0])
        self._start_unit(inst, pre=False)  # the boot script installed what ExecStartPre would

    def _start_unit(self, inst: EmulatedInstance, pre: bool = True) -> None:
        """Start the instance's unit as systemd does: ExecStartPre (if any) must succeed, then
        ExecStart runs with the unit's environment."""
        assert inst.unit is not None
        env = self._base_env(inst)
        env.update(inst.unit.environment)
        with open(inst.sandbox / "agent.log", "ab") as out:
            pre_cmd = inst.unit.settings.get("ExecStartPre")
            if pre and pre_cmd:
                proc = subprocess.run(shlex.split(pre_cmd.lstrip("-+!@:")), env={**env, **inst.machine_env},
                                      cwd="/", stdout=out,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=240,
                                      check=False)
                if proc.returncode != 0 and not pre_cmd.startswith("-"):
                    raise BootError(f"ExecStartPre {pre_cmd} exited {proc.returncode}")
            if inst.state in ("gone", "stopped"):
                return
            inst.agent = subprocess.Popen(inst.unit.exec_start, env=env, cwd="/", stdout=out,
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          start_new_session=True)
        inst.starts += 1
        inst.state = "running"
        log.info("event=emulated_agent_started instance_id=%s pid=%s", inst.id, inst.agent.pid)

    def _kill(self, inst: EmulatedInstance) -> None:
        """Everything of the instance dies at once (SIGKILL), like a VM that is switched off."""
        for _ in range(3):
            pids = processes_of(inst.sandbox)
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
        if inst.agent is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                inst.agent.wait(timeout=5)
