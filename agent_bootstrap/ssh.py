"""SSH bootstrap of static hosts: make a machine you already have into a Shipyard agent.

`bootstrap_host` connects with paramiko and walks a fixed list of steps, each reported as a
`StepResult`. Every step looks first and acts only on a difference, so running it again is safe
and reports what was already in place:

  connect        SSH with key auth; the host key must be known (host_key, known_hosts, or the
                 master user's ~/.ssh/known_hosts): an unknown or changed key is refused
  check_python   python3 >= 3.9 with httpx, pyyaml, pydantic 2 and tenacity; if the system's lacks
                 them, a venv (system packages visible) with the versions of the agent's
                 constraints file (agent_bootstrap/constraints.txt, uploaded as constraints.txt)
  upload_agent   the agent package the master serves (control_plane/api/agent_package.py), by
                 SFTP, unpacked into <remote_dir>/agent; skipped when its digest is already there
  write_config   <remote_dir>/agent.yaml (master URL, pool, work dir, reconnect settings)
  write_token    <remote_dir>/agent-token, mode 0600 (the credential never goes on a command line)
  install_service  a systemd unit (root on a systemd host), else nothing to install
  start_agent    (re)start through systemd, or `nohup setsid` with a pidfile; a running agent is
                 left alone unless its code, config or credential changed
  verify_agent   the agent process is alive a moment later (else the log's tail is reported)

Layout on the host (`remote_dir`, default ~/.shipyard): agent/ (code), agent.yaml, agent-token,
work/, agent.pid, agent.log, venv/ and constraints.txt (only if needed), instance.json (which cluster/pool/launch this
host serves: what `provisioners.static` lists).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import logging
import posixpath
import random
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import paramiko
import yaml

log = logging.getLogger("shipyard.ssh_bootstrap")

StepStatus = Literal["done", "already", "ok", "failed"]
UNIT_NAME = "shipyard-agent.service"
SYSTEMD_UNIT_PATH = f"/etc/systemd/system/{UNIT_NAME}"
DEPS_CHECK = (
    "import sys, httpx, yaml, tenacity, pydantic; "
    "assert sys.version_info >= (3, 9), 'Python 3.9+ needed'; "
    "assert int(pydantic.VERSION.split('.')[0]) >= 2, 'pydantic 2 needed'; "
    "print(sys.version.split()[0])"
)
# A static host keeps trying for as long as it runs (it is not billed by the minute), and is never
# powered off: the agent's own defaults (no give-up limit, backoff capped by the master).
STATIC_AGENT_DEFAULTS: dict[str, Any] = {}


class SshBootstrapError(Exception):
    """A step failed; `kind` sorts it for the provider: auth, host_key, unreachable, invalid, failed."""

    def __init__(self, kind: str, message: str, results: list[StepResult] | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.results = list(results or [])  # the steps up to and including the failed one


@dataclass(frozen=True)
class StaticHost:
    address: str
    user: str
    port: int = 22
    key_file: str | None = None
    key: str | None = field(default=None, repr=False)  # private key text (PEM / OpenSSH)
    host_key: str | None = None  # "ssh-ed25519 AAAA..." as in known_hosts, without the host name
    known_hosts: str | None = None  # a known_hosts file
    agent_id: str | None = None  # default: the address (and port, if not 22)
    python: str = "python3"
    remote_dir: str | None = None  # default: ~/.shipyard of `user`

    @property
    def id(self) -> str:
        if self.agent_id:
            return self.agent_id
        return self.address if self.port == 22 else f"{self.address}-{self.port}"

    @classmethod
    def from_dict(cls, data: Any, path: str = "host") -> StaticHost:
        if not isinstance(data, dict):
            raise ValueError(f"{path}: must be a mapping")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{path}.{unknown[0]}: unknown field (known: {', '.join(sorted(known))})")
        for name in ("address", "user"):
            if not isinstance(data.get(name), str) or not data[name].strip():
                raise ValueError(f"{path}.{name}: required (a non-empty string)")
        port = data.get("port", 22)
        if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
            raise ValueError(f"{path}.port: must be a port number, got {port!r}")
        if bool(data.get("key_file")) == bool(data.get("key")):
            raise ValueError(f"{path}: give exactly one of key_file or key")
        for name in ("key_file", "key", "host_key", "known_hosts", "agent_id", "python", "remote_dir"):
            if name in data and data[name] is not None and (not isinstance(data[name], str) or not data[name]):
                raise ValueError(f"{path}.{name}: must be a non-empty string")
        if data.get("host_key") and len(str(data["host_key"]).split()) < 2:
            raise ValueError(f"{path}.host_key: expected '<key type> <base64 key>'")
        return cls(**{k: v for k, v in data.items() if v is not None})


@dataclass(frozen=True)
class StepResult:
    step: str
    status: StepStatus
    detail: str = ""


@dataclass
class _Remote:
    client: paramiko.SSHClient
    sftp: paramiko.SFTPClient
    timeout: float

    def run(self, command: str, timeout: float | None = None) -> tuple[int, str, str]:
        _, stdout, stderr = self.client.exec_command(command, timeout=timeout or self.timeout)
        try:
            out = stdout.read().decode("utf-8", "replace")
            err = stderr.read().decode("utf-8", "replace")
            return stdout.channel.recv_exit_status(), out, err
        finally:
            # Close our end now: the server frees the session only when both ends have closed, and
            # sshd allows few at once per connection (MaxSessions, 10 by default). Left to garbage
            # collection, a bootstrap's many commands can exhaust them ("Channel closed").
            stdout.channel.close()

    def read(self, path: str) -> bytes | None:
        try:
            with self.sftp.open(path, "rb") as f:
                return f.read()
        except OSError:
            return None

    def write(self, path: str, data: bytes, mode: int) -> None:
        """Write atomically (temp file + rename) with `mode` set before the content lands."""
        tmp = f"{path}.tmp"
        with self.sftp.open(tmp, "wb") as f:
            f.chmod(mode)
            f.write(data)
        self.sftp.chmod(tmp, mode)
        self.sftp.posix_rename(tmp, path)

    def mode(self, path: str) -> int | None:
        try:
            st = self.sftp.stat(path)
        except OSError:
            return None
        return (st.st_mode or 0) & 0o7777


def _load_key(host: StaticHost) -> paramiko.PKey:
    if host.key_file:
        return paramiko.PKey.from_path(Path(host.key_file).expanduser())
    assert host.key is not None
    errors = []
    for cls in (paramiko.Ed25519Key, paramiko.ECDSAKey, paramiko.RSAKey):
        try:
            return cls.from_private_key(io.StringIO(host.key))
        except (paramiko.SSHException, ValueError) as e:
            errors.append(f"{cls.__name__}: {e}")
    raise SshBootstrapError("invalid", "key: not a private key paramiko can read (" + "; ".join(errors) + ")")


def _host_key_name(host: StaticHost) -> str:
    return host.address if host.port == 22 else f"[{host.address}]:{host.port}"


CONNECT_ATTEMPTS = 3


def connect(host: StaticHost, timeout: float = 20.0) -> paramiko.SSHClient:
    """An SSH connection whose host key was checked against what the config trusts. A transient
    failure (reset, refused, no banner yet: sshd's MaxStartups, a host still booting) is retried
    a bounded number of times with jitter; a key or auth problem is final at once."""
    for attempt in range(CONNECT_ATTEMPTS):
        try:
            return _connect_once(host, timeout)
        except SshBootstrapError as e:
            if e.kind != "unreachable" or attempt == CONNECT_ATTEMPTS - 1:
                raise
            log.info("event=ssh_connect_retry host=%s attempt=%d error=%s", host.address, attempt + 1, e)
            time.sleep(min(5.0, 0.5 * 2**attempt) + random.random() * 0.5)
    raise AssertionError("unreachable")


def _connect_once(host: StaticHost, timeout: float) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    if host.host_key:
        kind, b64 = host.host_key.split()[:2]
        key = paramiko.PKey.from_type_string(kind, base64.b64decode(b64))
        client.get_host_keys().add(_host_key_name(host), key.get_name(), key)
    elif host.known_hosts:
        client.load_host_keys(str(Path(host.known_hosts).expanduser()))
    else:
        client.load_system_host_keys()
    # Never trust on first use: a host the config does not vouch for is refused.
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        client.connect(host.address, port=host.port, username=host.user, pkey=_load_key(host), timeout=timeout,
                       banner_timeout=timeout, auth_timeout=timeout, allow_agent=False, look_for_keys=False)
    except paramiko.BadHostKeyException as e:
        client.close()
        raise SshBootstrapError("host_key", f"host key of {host.address}:{host.port} does not match: {e}") from None
    except paramiko.AuthenticationException as e:
        client.close()
        raise SshBootstrapError("auth", f"{host.user}@{host.address}:{host.port} refused the key: {e}") from None
    except paramiko.SSHException as e:
        client.close()
        if "not found in known_hosts" in str(e):
            raise SshBootstrapError("host_key", f"host key of {host.address}:{host.port} is not known "
                                                "(set host_key or known_hosts)") from None
        raise SshBootstrapError("unreachable", f"{host.address}:{host.port}: {e}") from None
    except OSError as e:  # refused, unreachable, timed out (TimeoutError is an OSError)
        client.close()
        raise SshBootstrapError("unreachable", f"cannot reach {host.address}:{host.port}: {e}") from None
    return client


# What a session that broke midway raises: the connection dropped (EOF, reset), the server closed a
# channel or refused a new one, or a read timed out. Anything else (an SFTP permission error, say)
# is the host's answer, not the link's.
_SESSION_ERRORS = (paramiko.SSHException, EOFError, ConnectionError, TimeoutError)


def _session_error(host: StaticHost, e: BaseException) -> SshBootstrapError:
    return SshBootstrapError("unreachable", f"the SSH session to {host.address}:{host.port} broke: "
                                            f"{type(e).__name__}: {e}")


def _agent_config(master_url: str, pool: str, base: str, agent_options: dict[str, Any]) -> bytes:
    cfg: dict[str, Any] = {
        "master_url": master_url.rstrip("/"),
        "resource_pool": pool,
        "token_file": f"{base}/agent-token",
        "work_dir": f"{base}/work",
        **STATIC_AGENT_DEFAULTS,
    }
    cfg.update(agent_options)
    header = "# Shipyard agent configuration (written over SSH by the master). The credential is in token_file.\n"
    return (header + yaml.safe_dump(cfg, sort_keys=False)).encode()


def _agent_argv(python: str, base: str, host: StaticHost) -> list[str]:
    return [python, "-m", "agent_bootstrap.agent", "--config", f"{base}/agent.yaml",
            "--agent-id", host.id, "--instance-id", host.id]


def _unit(python: str, base: str, host: StaticHost, pool: str) -> bytes:
    argv = " ".join(shlex.quote(a) for a in _agent_argv(python, base, host))
    return (
        "[Unit]\n"
        f"Description=Shipyard agent (pool {pool})\n"
        "Wants=network-online.target\nAfter=network-online.target\n\n"
        "[Service]\nType=simple\n"
        f"Environment=PYTHONPATH={base}/agent\nEnvironment=PYTHONUNBUFFERED=1\n"
        f"ExecStart={argv}\n"
        # 2: bad config, 3: refused by the master; anything else (the master lost) is retried.
        "Restart=on-failure\nRestartSec=5\nRestartPreventExitStatus=2 3\n"
        "KillMode=mixed\nTimeoutStopSec=90\n\n"
        "[Install]\nWantedBy=multi-user.target\n"
    ).encode()


def _running_pid(r: _Remote, base: str) -> int | None:
    """The pid in the pidfile, if that process is alive and is this directory's agent (a reused pid
    is not mistaken for it)."""
    pattern = shlex.quote(f"agent_bootstrap.agent --config {base}/agent.yaml")
    cmd = (f'pid=$(cat {shlex.quote(base + "/agent.pid")} 2>/dev/null) && [ -n "$pid" ] && '
           f'kill -0 "$pid" 2>/dev/null && tr "\\0" " " < /proc/$pid/cmdline | grep -qF -- {pattern} && echo "$pid"')
    rc, out, _ = r.run(cmd)
    return int(out.strip()) if rc == 0 and out.strip().isdigit() else None


def _stop_nohup(r: _Remote, base: str, grace_s: float = 30.0) -> bool:
    pid = _running_pid(r, base)
    if pid is None:
        r.run(f"rm -f {shlex.quote(base + '/agent.pid')}")
        return False
    steps = max(1, int(grace_s / 0.2))
    r.run(f'kill -TERM {pid}; i=0; while kill -0 {pid} 2>/dev/null && [ $i -lt {steps} ]; do sleep 0.2; '
          f'i=$((i+1)); done; kill -KILL {pid} 2>/dev/null; rm -f {shlex.quote(base + "/agent.pid")}',
          timeout=grace_s + 30)
    return True


class _Steps:
    def __init__(self, host: StaticHost, on_step: Callable[[StepResult], None] | None) -> None:
        self.host = host
        self.results: list[StepResult] = []
        self.on_step = on_step

    def add(self, step: str, status: StepStatus, detail: str = "") -> None:
        result = StepResult(step, status, detail)
        self.results.append(result)
        log.info("event=ssh_bootstrap_step host=%s step=%s status=%s detail=%r", self.host.id, step, status, detail)
        if self.on_step is not None:
            self.on_step(result)

    def fail(self, step: str, kind: str, detail: str) -> SshBootstrapError:
        self.add(step, "failed", detail)
        return SshBootstrapError(kind, f"{step}: {detail}", self.results)


def _remote_base(r: _Remote, host: StaticHost) -> str:
    home = r.sftp.normalize(".")
    if not host.remote_dir:
        return posixpath.join(home, ".shipyard")
    return host.remote_dir if host.remote_dir.startswith("/") else posixpath.join(home, host.remote_dir)


def _python(r: _Remote, host: StaticHost, base: str, steps: _Steps) -> str:
    rc, out, err = r.run(f"{shlex.quote(host.python)} -c {shlex.quote(DEPS_CHECK)}")
    if rc == 0:
        steps.add("check_python", "ok", f"{host.python} {out.strip()}")
        return host.python
    venv_py = f"{base}/venv/bin/python"
    rc2, out2, _ = r.run(f"{shlex.quote(venv_py)} -c {shlex.quote(DEPS_CHECK)}")
    if rc2 == 0:
        steps.add("check_python", "already", f"{venv_py} {out2.strip()} (venv from an earlier run)")
        return venv_py
    from agent_bootstrap.cloud_init import constraints_text, pip_pins

    pins = " ".join(shlex.quote(p) for p in pip_pins())
    constraints = f"{base}/constraints.txt"
    r.write(constraints, constraints_text().encode(), 0o644)
    rc3, _, err3 = r.run(
        f"{shlex.quote(host.python)} -m venv --system-site-packages {shlex.quote(base + '/venv')} && "
        f"{shlex.quote(venv_py)} -m pip install --quiet --disable-pip-version-check "
        f"-c {shlex.quote(constraints)} {pins} && "
        f"{shlex.quote(venv_py)} -c {shlex.quote(DEPS_CHECK)}", timeout=600)
    if rc3 != 0:
        reason = (err.strip().splitlines() or ["?"])[-1]
        raise steps.fail("check_python", "invalid",
                         f"{host.python} cannot run the agent ({reason}) and a venv could not be made: "
                         f"{(err3.strip().splitlines() or ['?'])[-1]}; install python3 (3.9+) with "
                         "python3-httpx, python3-yaml, python3-pydantic (2.x) and python3-tenacity")
    steps.add("check_python", "done", f"created {base}/venv with {pins}")
    return venv_py


def bootstrap_host(
    host: StaticHost,
    master_url: str,
    pool: str,
    agent_token: str,
    *,
    agent_options: dict[str, Any] | None = None,
    package: bytes | None = None,
    instance_record: dict[str, Any] | None = None,
    connect_timeout: float = 20.0,
    verify_wait_s: float = 1.5,
    on_step: Callable[[StepResult], None] | None = None,
) -> list[StepResult]:
    """Make `host` an agent of `pool` at `master_url`. Idempotent; raises SshBootstrapError (with
    `.results`, the steps so far) when a step fails, and returns every step's result otherwise.

    `package`: the agent archive (default: the one this master serves). `instance_record`: extra
    facts written to <remote_dir>/instance.json (the static provider's cluster/pool/launch id)."""
    options, package = _checked_inputs(agent_token, agent_options, package)
    steps = _Steps(host, on_step)
    try:
        client = connect(host, timeout=connect_timeout)
    except SshBootstrapError as e:
        raise steps.fail("connect", e.kind, str(e)) from None
    try:
        r = _Remote(client, client.open_sftp(), timeout=max(connect_timeout, 60.0))
        base = _prepare_remote_dir(r, host, steps)
        python = _python(r, host, base, steps)
        changed = _upload_agent(r, base, python, package, steps)
        changed |= _write_config(r, base, _agent_config(master_url, pool, base, options), steps)
        changed |= _write_token(r, base, agent_token, steps)
        if instance_record is not None:
            _write_instance_record(r, host, base, instance_record)
        use_systemd = _start_agent(r, host, pool, python, base, changed, steps)
        time.sleep(verify_wait_s)
        _verify_agent(r, base, use_systemd, steps)
        return steps.results
    except _SESSION_ERRORS as e:
        err = _session_error(host, e)
        raise steps.fail("session", err.kind, str(err)) from None
    finally:
        client.close()


def _checked_inputs(agent_token: str, agent_options: dict[str, Any] | None,
                    package: bytes | None) -> tuple[dict[str, Any], bytes]:
    """The validated agent options and the agent archive (default: the one this master serves)."""
    from agent_bootstrap.cloud_init import validate_agent_options

    options = validate_agent_options(dict(agent_options or {}))
    if not agent_token or any(c.isspace() for c in agent_token):
        raise SshBootstrapError("invalid", "agent_token: empty or contains whitespace")
    if package is None:
        from agent_bootstrap.package import agent_package

        package = agent_package().data
    return options, package


def _prepare_remote_dir(r: _Remote, host: StaticHost, steps: _Steps) -> str:
    """The `connect` step: <remote_dir> and its work/ exist, private to the user; returns <remote_dir>."""
    base = _remote_base(r, host)
    steps.add("connect", "ok", f"{host.user}@{host.address}:{host.port} dir={base}")
    rc, _, err = r.run(f"mkdir -p {shlex.quote(base)}/work && chmod 0700 {shlex.quote(base)} {shlex.quote(base)}/work")
    if rc != 0:
        raise steps.fail("connect", "invalid", f"cannot create {base}: {err.strip()}")
    return base


def _upload_agent(r: _Remote, base: str, python: str, package: bytes, steps: _Steps) -> bool:
    """The `upload_agent` step: unpack `package` into <remote_dir>/agent unless its digest is there
    already, and check that it runs. Returns whether the code changed."""
    q = shlex.quote
    digest = hashlib.sha256(package).hexdigest()
    if (r.read(f"{base}/agent/.sha256") or b"").decode().strip() == digest:
        steps.add("upload_agent", "already", f"sha256 {digest[:12]}")
        return False
    r.write(f"{base}/agent.tar.gz", package, 0o600)
    rc, _, err = r.run(
        f"set -e; rm -rf {q(base)}/agent.new; mkdir {q(base)}/agent.new; "
        f"tar -xzf {q(base)}/agent.tar.gz -C {q(base)}/agent.new --no-same-owner; "
        f"echo {digest} > {q(base)}/agent.new/.sha256; rm -rf {q(base)}/agent.old; "
        f"if [ -e {q(base)}/agent ]; then mv {q(base)}/agent {q(base)}/agent.old; fi; "
        f"mv {q(base)}/agent.new {q(base)}/agent; rm -rf {q(base)}/agent.old {q(base)}/agent.tar.gz")
    if rc != 0:
        raise steps.fail("upload_agent", "failed", f"unpacking failed: {err.strip()[-300:]}")
    rc, _, err = r.run(f"PYTHONPATH={q(base)}/agent {q(python)} -m agent_bootstrap.agent --help >/dev/null")
    if rc != 0:
        raise steps.fail("upload_agent", "failed", f"the uploaded agent does not run: {err.strip()[-300:]}")
    steps.add("upload_agent", "done", f"{len(package)} bytes, sha256 {digest[:12]}")
    return True


def _write_config(r: _Remote, base: str, config: bytes, steps: _Steps) -> bool:
    """The `write_config` step: <remote_dir>/agent.yaml; returns whether it changed."""
    if r.read(f"{base}/agent.yaml") == config:
        steps.add("write_config", "already", f"{base}/agent.yaml")
        return False
    r.write(f"{base}/agent.yaml", config, 0o644)
    steps.add("write_config", "done", f"{base}/agent.yaml")
    return True


def _write_token(r: _Remote, base: str, agent_token: str, steps: _Steps) -> bool:
    """The `write_token` step: <remote_dir>/agent-token, mode 0600; returns whether it changed."""
    token_bytes = (agent_token + "\n").encode()
    if r.read(f"{base}/agent-token") == token_bytes and r.mode(f"{base}/agent-token") == 0o600:
        steps.add("write_token", "already", f"{base}/agent-token (0600)")
        return False
    r.write(f"{base}/agent-token", token_bytes, 0o600)
    steps.add("write_token", "done", f"{base}/agent-token (0600)")
    return True


def _write_instance_record(r: _Remote, host: StaticHost, base: str, instance_record: dict[str, Any]) -> None:
    """<remote_dir>/instance.json: which cluster/pool/launch this host serves (no step of its own)."""
    record = (json.dumps({"agent_id": host.id, **instance_record}, sort_keys=True) + "\n").encode()
    if r.read(f"{base}/instance.json") != record:
        r.write(f"{base}/instance.json", record, 0o644)


def _start_agent(r: _Remote, host: StaticHost, pool: str, python: str, base: str, changed: bool,
                 steps: _Steps) -> bool:
    """The `install_service` and `start_agent` steps, through systemd when root on a systemd host,
    else nohup; returns whether systemd runs it."""
    rc, _, _ = r.run('[ "$(id -u)" = 0 ] && [ -d /run/systemd/system ] && command -v systemctl >/dev/null')
    use_systemd = rc == 0
    if use_systemd:
        _systemd(r, host, pool, python, base, changed, steps)
    else:
        steps.add("install_service", "ok", "no systemd (or not root): nohup and a pidfile")
        _nohup(r, host, python, base, changed, steps)
    return use_systemd


def _verify_agent(r: _Remote, base: str, use_systemd: bool, steps: _Steps) -> None:
    """The `verify_agent` step: the agent is running, else the failure carries its log's tail."""
    if use_systemd:
        vrc, out, _ = r.run(f"systemctl is-active {UNIT_NAME}")
        alive = vrc == 0 and out.strip() == "active"
        logs_cmd = f"journalctl -u {UNIT_NAME} -n 20 --no-pager"
    else:
        alive = _running_pid(r, base) is not None
        logs_cmd = f"tail -n 20 {shlex.quote(base)}/agent.log"
    if not alive:
        _, tail, _ = r.run(logs_cmd)
        raise steps.fail("verify_agent", "failed", f"the agent is not running; last log lines:\n{tail.strip()}")
    steps.add("verify_agent", "ok", "agent process running")


def _systemd(r: _Remote, host: StaticHost, pool: str, python: str, base: str, changed: bool, steps: _Steps) -> None:
    unit = _unit(python, base, host, pool)
    if r.read(SYSTEMD_UNIT_PATH) == unit:
        steps.add("install_service", "already", SYSTEMD_UNIT_PATH)
    else:
        r.write(SYSTEMD_UNIT_PATH, unit, 0o644)
        r.run(f"systemctl daemon-reload && systemctl enable {UNIT_NAME}")
        steps.add("install_service", "done", SYSTEMD_UNIT_PATH)
        changed = True
    rc, out, _ = r.run(f"systemctl is-active {UNIT_NAME}")
    if rc == 0 and out.strip() == "active" and not changed:
        steps.add("start_agent", "already", f"{UNIT_NAME} active")
        return
    rc, _, err = r.run(f"systemctl restart {UNIT_NAME}")
    if rc != 0:
        raise steps.fail("start_agent", "failed", f"systemctl restart {UNIT_NAME}: {err.strip()}")
    steps.add("start_agent", "done", f"{UNIT_NAME} (re)started")


def _nohup(r: _Remote, host: StaticHost, python: str, base: str, changed: bool, steps: _Steps) -> None:
    q = shlex.quote
    pid = _running_pid(r, base)
    if pid is not None and not changed:
        steps.add("start_agent", "already", f"pid {pid}")
        return
    if pid is not None:
        _stop_nohup(r, base)  # new code, config or credential: restart on them
    argv = " ".join(q(a) for a in _agent_argv(python, base, host))
    # setsid: its own session, so it outlives this SSH session; every stream redirected, so the
    # channel closes as soon as the shell returns. The background job must be a simple command
    # (not `cd x && cmd &`): a backgrounded list runs in a subshell that keeps the session's
    # stdout open, and `$!` would be that subshell, not the agent.
    rc, out, err = r.run(
        f"cd {q(base)} || exit 1; PYTHONPATH={q(base)}/agent PYTHONUNBUFFERED=1 nohup setsid {argv} "
        f">> {q(base)}/agent.log 2>&1 < /dev/null & echo $! > {q(base)}/agent.pid; cat {q(base)}/agent.pid")
    if rc != 0 or not out.strip().isdigit():
        raise steps.fail("start_agent", "failed", f"could not start the agent: {err.strip()[-300:]}")
    steps.add("start_agent", "done", f"pid {out.strip()}" + (" (restarted)" if pid is not None else ""))


def stop_agent(host: StaticHost, *, connect_timeout: float = 20.0, forget: bool = True) -> list[StepResult]:
    """Stop the agent on `host` (systemd unit or pidfile). With `forget`, the credential and the
    instance record are removed too, so the host no longer counts as an instance. Idempotent."""
    steps = _Steps(host, None)
    try:
        client = connect(host, timeout=connect_timeout)
    except SshBootstrapError as e:
        raise steps.fail("connect", e.kind, str(e)) from None
    try:
        r = _Remote(client, client.open_sftp(), timeout=max(connect_timeout, 60.0))
        base = _remote_base(r, host)
        steps.add("connect", "ok", f"{host.user}@{host.address}:{host.port}")
        rc, _, _ = r.run(f"[ -f {SYSTEMD_UNIT_PATH} ] && command -v systemctl >/dev/null")
        if rc == 0:
            r.run(f"systemctl disable --now {UNIT_NAME}", timeout=150)
            steps.add("stop_agent", "done", f"{UNIT_NAME} stopped and disabled")
        elif _stop_nohup(r, base):
            steps.add("stop_agent", "done", "agent process stopped")
        else:
            steps.add("stop_agent", "already", "no agent running")
        if forget:
            r.run(f"rm -f {shlex.quote(base)}/agent-token {shlex.quote(base)}/instance.json")
        return steps.results
    except _SESSION_ERRORS as e:
        err = _session_error(host, e)
        raise steps.fail("session", err.kind, str(err)) from None
    finally:
        client.close()


def read_instance_record(host: StaticHost, *, connect_timeout: float = 10.0) -> tuple[dict[str, Any] | None, bool]:
    """(<remote_dir>/instance.json or None, agent running?) of one host. It only reads, so a session
    that breaks midway is tried once more on a new connection before the host counts as unreachable."""
    try:
        return _read_instance_record(host, connect_timeout)
    except _SESSION_ERRORS as e:
        log.info("event=ssh_probe_retry host=%s error=%s: %s", host.address, type(e).__name__, e)
    try:
        return _read_instance_record(host, connect_timeout)
    except _SESSION_ERRORS as e:
        raise _session_error(host, e) from None


def _read_instance_record(host: StaticHost, connect_timeout: float) -> tuple[dict[str, Any] | None, bool]:
    client = connect(host, timeout=connect_timeout)
    try:
        r = _Remote(client, client.open_sftp(), timeout=max(connect_timeout, 30.0))
        base = _remote_base(r, host)
        raw = r.read(f"{base}/instance.json")
        record = None
        if raw:
            try:
                record = json.loads(raw)
            except ValueError:
                record = None
        rc, _, _ = r.run(f"[ -f {SYSTEMD_UNIT_PATH} ] && systemctl is-active --quiet {UNIT_NAME}")
        running = rc == 0 or _running_pid(r, base) is not None
        return record, running
    finally:
        client.close()
