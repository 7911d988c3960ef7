"""SSH bootstrap of static hosts (agent_bootstrap/ssh.py) and the static provider
(provisioners/static.py), against an in-process SSH server (paramiko ServerInterface: exec runs the
command with subprocess under a temp HOME, SFTP serves the real file system) and, when the machine
has one and we are root, a real OpenSSH sshd on 127.0.0.1. The agents they start register with a
real master process in a static pool."""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import paramiko
import pytest
import yaml

from agent_bootstrap.ssh import SshBootstrapError, StaticHost, StepResult, bootstrap_host, stop_agent
from provisioners.base import CloudState, ErrorKind, LaunchSpec, ProviderError
from provisioners.static import StaticPoolConfig, StaticProvider
from tests.conftest import LiveMaster
from tests.e2e.boot import MARKER_ENV, processes_of
from tests.pg import free_port, missing_part

POOL = "static"


# ---- an in-process SSH server ------------------------------------------------------------------


class _Handle(paramiko.SFTPHandle):
    def stat(self) -> paramiko.SFTPAttributes | int:
        try:
            return paramiko.SFTPAttributes.from_stat(os.fstat(self.readfile.fileno()))
        except OSError as e:
            return paramiko.SFTPServer.convert_errno(e.errno)

    def chattr(self, attr: paramiko.SFTPAttributes) -> int:
        try:
            paramiko.SFTPServer.set_file_attr(self.filename, attr)
        except OSError as e:
            return paramiko.SFTPServer.convert_errno(e.errno)
        return paramiko.SFTP_OK


class _Sftp(paramiko.SFTPServerInterface):
    """The real file system; relative paths are under the session's HOME (like OpenSSH's)."""

    def __init__(self, server: paramiko.ServerInterface, home: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(server, *args, **kwargs)
        self.home = home

    def _real(self, path: str) -> str:
        return os.path.normpath(path if path.startswith("/") else os.path.join(self.home, path))

    def canonicalize(self, path: str) -> str:
        return self._real(path)

    def _wrap(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except OSError as e:
            return paramiko.SFTPServer.convert_errno(e.errno)

    def list_folder(self, path: str) -> Any:
        real = self._real(path)

        def ls() -> list[paramiko.SFTPAttributes]:
            out = []
            for name in os.listdir(real):
                attr = paramiko.SFTPAttributes.from_stat(os.lstat(os.path.join(real, name)))
                attr.filename = name
                out.append(attr)
            return out

        return self._wrap(ls)

    def stat(self, path: str) -> Any:
        return self._wrap(lambda: paramiko.SFTPAttributes.from_stat(os.stat(self._real(path))))

    def lstat(self, path: str) -> Any:
        return self._wrap(lambda: paramiko.SFTPAttributes.from_stat(os.lstat(self._real(path))))

    def open(self, path: str, flags: int, attr: paramiko.SFTPAttributes) -> Any:
        real = self._real(path)

        def op() -> _Handle:
            mode = getattr(attr, "st_mode", None) or 0o666
            fd = os.open(real, flags, mode & 0o7777)
            if flags & os.O_CREAT and attr is not None:
                attr._flags &= ~attr.FLAG_PERMISSIONS
                paramiko.SFTPServer.set_file_attr(real, attr)
            if flags & os.O_WRONLY:
                fstr = "ab" if flags & os.O_APPEND else "wb"
            elif flags & os.O_RDWR:
                fstr = "a+b" if flags & os.O_APPEND else "r+b"
            else:
                fstr = "rb"
            f = os.fdopen(fd, fstr)
            handle = _Handle(flags)
            handle.filename = real
            handle.readfile = f
            handle.writefile = f
            return handle

        return self._wrap(op)

    def remove(self, path: str) -> Any:
        return self._wrap(lambda: (os.remove(self._real(path)), paramiko.SFTP_OK)[1])

    def rename(self, oldpath: str, newpath: str) -> Any:
        return self._wrap(lambda: (os.rename(self._real(oldpath), self._real(newpath)), paramiko.SFTP_OK)[1])

    def posix_rename(self, oldpath: str, newpath: str) -> Any:
        return self._wrap(lambda: (os.replace(self._real(oldpath), self._real(newpath)), paramiko.SFTP_OK)[1])

    def mkdir(self, path: str, attr: paramiko.SFTPAttributes) -> Any:
        return self._wrap(lambda: (os.mkdir(self._real(path)), paramiko.SFTP_OK)[1])

    def rmdir(self, path: str) -> Any:
        return self._wrap(lambda: (os.rmdir(self._real(path)), paramiko.SFTP_OK)[1])

    def chattr(self, path: str, attr: paramiko.SFTPAttributes) -> Any:
        return self._wrap(lambda: (paramiko.SFTPServer.set_file_attr(self._real(path), attr), paramiko.SFTP_OK)[1])


class _ServerInterface(paramiko.ServerInterface):
    def __init__(self, ssh: InProcessSshd) -> None:
        self.ssh = ssh

    def check_channel_request(self, kind: str, chanid: int) -> int:
        if kind == "session":
            return paramiko.OPEN_SUCCEEDED
        return paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        ok = username == self.ssh.user and key == self.ssh.authorized_key
        return paramiko.AUTH_SUCCESSFUL if ok else paramiko.AUTH_FAILED

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        if self.ssh.refuse_execs > 0:  # a session that breaks: the client's exec_command raises
            self.ssh.refuse_execs -= 1
            return False
        self.ssh.commands.append(command.decode())
        threading.Thread(target=self.ssh.execute, args=(channel, command.decode()), daemon=True).start()
        return True


@dataclass
class InProcessSshd:
    home: Path
    user: str = "shipyard"
    host_key: paramiko.RSAKey = field(default_factory=lambda: paramiko.RSAKey.generate(2048))
    client_key: paramiko.RSAKey = field(default_factory=lambda: paramiko.RSAKey.generate(2048))
    commands: list[str] = field(default_factory=list)
    port: int = 0
    refuse_execs: int = 0  # refuse this many exec requests from now on

    def __post_init__(self) -> None:
        self.authorized_key = self.client_key
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self.port = self._sock.getsockname()[1]
        self._transports: list[paramiko.Transport] = []
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True, name="sshd").start()

    @property
    def host_key_line(self) -> str:
        return f"{self.host_key.get_name()} {self.host_key.get_base64()}"

    def env(self) -> dict[str, str]:
        # The "login" environment; the marker lets the test kill whatever a session left running.
        return {"HOME": str(self.home), "USER": self.user, "LANG": "C.UTF-8",
                "PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/bin:/usr/bin:/bin"]),
                MARKER_ENV: str(self.home)}

    def execute(self, channel: paramiko.Channel, command: str) -> None:
        try:
            proc = subprocess.Popen(command, shell=True, cwd=self.home, env=self.env(), stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            out, err = proc.communicate(timeout=600)
            channel.sendall(out)
            channel.sendall_stderr(err)
            channel.send_exit_status(proc.returncode)
            # EOF, then wait for the client to close its end, as OpenSSH does. This thread runs
            # while the transport's thread is still about to answer the exec request; a CLOSE sent
            # before that answer makes the client's exec_command fail with "Channel closed".
            channel.shutdown_write()
            channel.settimeout(30)
            with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
                while channel.recv(4096):
                    pass
        finally:
            channel.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            # Each handshake on its own thread, as sshd forks: a connection that stalls (a client
            # that went quiet, a port probe from another test) must not hold up the next one.
            threading.Thread(target=self._serve, args=(conn,), daemon=True, name="sshd-conn").start()

    def _serve(self, conn: socket.socket) -> None:
        t = paramiko.Transport(conn)
        t.add_server_key(self.host_key)
        t.set_subsystem_handler("sftp", paramiko.SFTPServer, _Sftp, str(self.home))
        self._transports.append(t)
        with contextlib.suppress(paramiko.SSHException, EOFError):
            t.start_server(server=_ServerInterface(self))

    def host(self, key_file: Path, **kw: Any) -> StaticHost:
        args: dict[str, Any] = dict(address="127.0.0.1", port=self.port, user=self.user, key_file=str(key_file),
                                    host_key=self.host_key_line, python=sys.executable, agent_id="static-host-1")
        args.update(kw)
        return StaticHost(**args)

    def kill_leftovers(self) -> None:
        for pid in processes_of(self.home):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def close(self) -> None:
        self._stop.set()
        self._sock.close()
        for t in self._transports:
            t.close()
        self.kill_leftovers()


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[InProcessSshd]:
    home = tmp_path / "home"
    home.mkdir()
    server = InProcessSshd(home)
    yield server
    server.close()


@pytest.fixture
def key_file(sshd: InProcessSshd, tmp_path: Path) -> Path:
    path = tmp_path / "id_rsa"
    sshd.client_key.write_private_key_file(str(path))
    return path


@pytest.fixture(scope="module")
def static_master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveMaster]:
    """A real master with a static pool (the pool's hosts are bootstrapped by the tests)."""
    d = tmp_path_factory.mktemp("master")
    cfg = d / "master.yaml"
    cfg.write_text(yaml.safe_dump({"resource_pools": [{"name": POOL, "provider": {"type": "static", "hosts": []}}],
                                   "default_resource_pool": POOL}))
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    m = LiveMaster(f"sqlite:///{d / 'shipyard.db'}", d / "state", config_path=cfg, extra_env={"PATH": path})
    m.start()
    yield m
    m.stop()


def admin(master: LiveMaster) -> dict[str, str]:
    return {"Authorization": f"Bearer {master.token()}"}


def agent_token(master: LiveMaster) -> str:
    r = httpx.post(master.url + "/api/v1/agents/tokens", json={"resourcePool": POOL}, headers=admin(master))
    r.raise_for_status()
    return r.json()["token"]


def wait_for(pred: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def connected(master: LiveMaster, agent_id: str) -> dict[str, Any] | None:
    r = httpx.get(f"{master.url}/api/v1/agents/{agent_id}", headers=admin(master))
    if r.status_code != 200:
        return None
    agent = r.json()["agent"]
    return agent if agent.get("state") == "connected" or agent.get("connected") else None


def statuses(results: list[StepResult]) -> dict[str, str]:
    return {r.step: r.status for r in results}


def pid_of(home: Path) -> int:
    return int((home / ".shipyard/agent.pid").read_text())


# ---- config --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("hosts", "message"),
    [
        ([], "hosts: a static pool needs a non-empty list"),
        ([{"address": "h", "key_file": "k"}], r"hosts\[0\]\.user: required"),
        ([{"address": "h", "user": "u"}], r"hosts\[0\]: give exactly one of key_file or key"),
        ([{"address": "h", "user": "u", "key_file": "k", "key": "x"}], "exactly one of key_file or key"),
        ([{"address": "h", "user": "u", "key_file": "k", "port": 70000}], r"hosts\[0\]\.port"),
        ([{"address": "h", "user": "u", "key_file": "k", "password": "x"}], r"hosts\[0\]\.password: unknown field"),
        ([{"address": "h", "user": "u", "key_file": "k"}, {"address": "h", "user": "v", "key_file": "k"}],
         "the same agent id more than once"),
    ],
)
def test_static_pool_config_is_checked_naming_the_field(hosts: list[Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        StaticPoolConfig.from_dict({"type": "static", "hosts": hosts})


# ---- bootstrap -----------------------------------------------------------------------------------


# A trial that completes its searcher operation over plain HTTP (a clean exit before that would
# not be a success), with nothing but the standard library.
STATIC_TRIAL = """\
import json, os, urllib.request
print("static trial ran", flush=True)
req = urllib.request.Request(
    os.environ["DET_MASTER"] + "/api/v1/trials/" + os.environ["DET_TRIAL_ID"] + "/searcher/completed_operation",
    data=json.dumps({"op": {"length": 1}, "searcherMetric": 0.0}).encode(), method="POST",
    headers={"Authorization": "Bearer " + os.environ["DET_SESSION_TOKEN"], "Content-Type": "application/json"})
urllib.request.urlopen(req, timeout=30).read()
"""


@pytest.mark.integration
def test_bootstrap_is_idempotent_and_the_agent_runs_a_trial(sshd: InProcessSshd, key_file: Path,
                                                            static_master: LiveMaster) -> None:
    token = agent_token(static_master)
    host = sshd.host(key_file)
    first = bootstrap_host(host, static_master.url, POOL, token)
    assert [r.step for r in first] == ["connect", "check_python", "upload_agent", "write_config", "write_token",
                                       "install_service", "start_agent", "verify_agent"]
    assert statuses(first) == {"connect": "ok", "check_python": "ok", "upload_agent": "done", "write_config": "done",
                               "write_token": "done", "install_service": "ok", "start_agent": "done",
                               "verify_agent": "ok"}
    base = sshd.home / ".shipyard"
    assert stat.S_IMODE((base / "agent-token").stat().st_mode) == 0o600
    assert (base / "agent-token").read_text().strip() == token
    assert not any(token in c for c in sshd.commands)  # the credential never went on a command line
    pid = pid_of(sshd.home)
    wait_for(lambda: connected(static_master, host.id), 30, "the static agent registered")

    # Again: everything is in place, nothing is redone, the same agent process keeps running.
    second = bootstrap_host(host, static_master.url, POOL, token)
    assert statuses(second) == {"connect": "ok", "check_python": "ok", "upload_agent": "already",
                                "write_config": "already", "write_token": "already", "install_service": "ok",
                                "start_agent": "already", "verify_agent": "ok"}
    assert pid_of(sshd.home) == pid and Path(f"/proc/{pid}").exists()

    # The agent it started runs a trial of the static pool.
    files = [{"path": "train.py", "type": 48, "mode": 0o644, "mtime": "0", "uid": 0, "gid": 0,
              "content": base64.b64encode(STATIC_TRIAL.encode()).decode()}]
    config = ("name: static\nentrypoint: python3 train.py\nsearcher:\n  name: single\n  metric: loss\n"
              "  max_length:\n    batches: 1\nresources:\n  slots_per_trial: 1\nmax_restarts: 0\n")
    r = httpx.post(static_master.url + "/api/v1/experiments", headers=admin(static_master),
                   json={"config": config, "modelDefinition": files, "activate": True})
    assert r.status_code == 200, r.text
    trial_id = r.json()["experiment"]["trialIds"][0]

    def trial_state() -> str:
        return httpx.get(f"{static_master.url}/api/v1/trials/{trial_id}", headers=admin(static_master)).json()["trial"]["state"]

    wait_for(lambda: trial_state() == "STATE_COMPLETED", 60, "the trial completed on the static agent")

    # A new credential is written and the agent restarted on it; stop_agent stops it for good.
    third = bootstrap_host(host, static_master.url, POOL, agent_token(static_master))
    assert statuses(third)["write_token"] == "done" and statuses(third)["upload_agent"] == "already"
    assert statuses(third)["start_agent"] == "done" and pid_of(sshd.home) != pid
    new_pid = pid_of(sshd.home)
    assert statuses(stop_agent(host))["stop_agent"] == "done"
    wait_for(lambda: not Path(f"/proc/{new_pid}").exists() or "Z" in Path(f"/proc/{new_pid}/stat").read_text()
             .rsplit(")", 1)[-1][:3], 30, "the agent stopped")
    assert not (base / "agent-token").exists()
    assert statuses(stop_agent(host))["stop_agent"] == "already"


@pytest.mark.integration
def test_unknown_or_wrong_host_key_is_refused(sshd: InProcessSshd, key_file: Path, tmp_path: Path) -> None:
    other = paramiko.RSAKey.generate(2048)
    with pytest.raises(SshBootstrapError) as e:
        bootstrap_host(sshd.host(key_file, host_key=f"{other.get_name()} {other.get_base64()}"),
                       "http://127.0.0.1:1", POOL, "t" * 32)
    assert e.value.kind == "host_key"
    assert [(r.step, r.status) for r in e.value.results] == [("connect", "failed")]
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    # The in-process server can drop a handshake under heavy load; only a host-key refusal counts.
    for _ in range(3):
        with pytest.raises(SshBootstrapError) as e2:
            bootstrap_host(sshd.host(key_file, host_key=None, known_hosts=str(empty)), "http://127.0.0.1:1",
                           POOL, "t" * 32)
        if e2.value.kind != "unreachable":
            break
    assert e2.value.kind == "host_key" and "is not known" in str(e2.value)
    # The same host listed in a known_hosts file is accepted.
    empty.write_text(f"[127.0.0.1]:{sshd.port} {sshd.host_key_line}\n")
    assert stop_agent(sshd.host(key_file, host_key=None, known_hosts=str(empty)))[0].status == "ok"
    assert sshd.commands  # only the last attempt ran anything


@pytest.mark.integration
def test_wrong_client_key_is_an_auth_error(sshd: InProcessSshd, tmp_path: Path) -> None:
    stranger = paramiko.RSAKey.generate(2048)
    path = tmp_path / "stranger"
    stranger.write_private_key_file(str(path))
    with pytest.raises(SshBootstrapError) as e:
        bootstrap_host(sshd.host(path), "http://127.0.0.1:1", POOL, "t" * 32)
    assert e.value.kind == "auth" and sshd.commands == []


@pytest.mark.integration
def test_a_host_without_the_agents_python_fails_clearly(sshd: InProcessSshd, key_file: Path, tmp_path: Path) -> None:
    fake_python = tmp_path / "python3"
    fake_python.write_text("#!/bin/sh\necho 'ModuleNotFoundError: No module named httpx' >&2\nexit 1\n")
    fake_python.chmod(0o755)
    with pytest.raises(SshBootstrapError) as e:
        bootstrap_host(sshd.host(key_file, python=str(fake_python)), "http://127.0.0.1:1", POOL, "t" * 32)
    assert e.value.kind == "invalid"
    failed = e.value.results[-1]
    assert failed.step == "check_python" and failed.status == "failed" and "python3-httpx" in failed.detail


# ---- the static provider ---------------------------------------------------------------------------


@pytest.mark.integration
def test_static_provider_launch_list_terminate(sshd: InProcessSshd, key_file: Path, static_master: LiveMaster) -> None:
    host_cfg = {"address": "127.0.0.1", "port": sshd.port, "user": sshd.user, "key_file": str(key_file),
                "host_key": sshd.host_key_line, "python": sys.executable, "agent_id": "static-provider-host"}
    cfg = StaticPoolConfig.from_dict({"type": "static", "hosts": [host_cfg]})
    provider = StaticProvider(cfg, cluster_id="c-static", pool=POOL, master_url=static_master.url)
    assert provider.list() == []
    launch_id = uuid.uuid4().hex
    result = provider.launch([LaunchSpec(launch_id, agent_token(static_master))])
    assert result.error is None
    [inst] = result.launched
    assert inst.id == "static-provider-host" and inst.launch_id == launch_id
    [listed] = provider.list()
    assert listed.id == inst.id and listed.launch_id == launch_id and listed.state == CloudState.RUNNING
    wait_for(lambda: connected(static_master, inst.id), 30, "the provider's agent registered")
    # The same launch again is the same host (idempotent); one more launch finds no free host.
    pid = pid_of(sshd.home)
    again = provider.launch([LaunchSpec(launch_id, "ignored-token-0123456789")])
    assert [i.id for i in again.launched] == [inst.id] and again.error is None and pid_of(sshd.home) == pid
    more = provider.launch([LaunchSpec(uuid.uuid4().hex, agent_token(static_master))])
    assert more.launched == () and more.error is not None and more.error.kind is ErrorKind.CAPACITY
    # Another cluster's provider does not see this host as its instance.
    stranger = StaticProvider(cfg, cluster_id="c-other", pool=POOL, master_url=static_master.url)
    assert stranger.list() == []
    provider.terminate([inst.id, "not-a-host"])
    assert provider.list() == []
    wait_for(lambda: not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()
             .rsplit(")", 1)[-1][:3], 30, "the agent stopped")


@pytest.mark.integration
def test_a_session_that_breaks_is_a_provider_error_and_a_probe_tries_once_more(
        sshd: InProcessSshd, key_file: Path) -> None:
    host_cfg = {"address": "127.0.0.1", "port": sshd.port, "user": sshd.user, "key_file": str(key_file),
                "host_key": sshd.host_key_line, "python": sys.executable, "agent_id": "broken-session-host"}
    provider = StaticProvider(StaticPoolConfig.from_dict({"type": "static", "hosts": [host_cfg]}),
                              cluster_id="c-static", pool=POOL, master_url="http://127.0.0.1:1")
    # One refused command: the probe reads again on a new connection and gets its answer.
    sshd.refuse_execs = 1
    assert provider.list() == [] and sshd.refuse_execs == 0 and sshd.commands
    # Every command refused: the provider's kind of error, naming the host, never paramiko's own.
    sshd.refuse_execs = 100
    with pytest.raises(ProviderError) as e:
        provider.list()
    assert e.value.code == "ssh_unreachable" and e.value.location == "broken-session-host"
    assert "session" in str(e.value) and "broke" in str(e.value)
    with pytest.raises(ProviderError) as e:
        provider.terminate(["broken-session-host"])
    assert e.value.code == "ssh_unreachable"
    with pytest.raises(SshBootstrapError) as e2:
        stop_agent(sshd.host(key_file))
    assert e2.value.kind == "unreachable" and e2.value.results[-1].step == "session"


# ---- a real OpenSSH server -------------------------------------------------------------------------


@pytest.fixture
def real_sshd(tmp_path: Path) -> Iterator[tuple[int, Path, str]]:
    sshd_bin = shutil.which("sshd") or ("/usr/sbin/sshd" if Path("/usr/sbin/sshd").exists() else None)
    keygen = shutil.which("ssh-keygen")
    if sshd_bin is None or keygen is None:
        missing_part("OpenSSH server not installed (apt-get install openssh-server)")
    if os.geteuid() != 0:
        pytest.skip("a throwaway sshd needs root here (it logs in as the current user via privilege separation)")
    d = tmp_path / "sshd"
    d.mkdir()
    os.chmod(d, 0o700)
    subprocess.run([keygen, "-q", "-t", "ed25519", "-N", "", "-f", str(d / "host_key")], check=True)
    subprocess.run([keygen, "-q", "-t", "ed25519", "-N", "", "-f", str(d / "client_key")], check=True)
    (d / "authorized_keys").write_text((d / "client_key.pub").read_text())
    os.chmod(d / "authorized_keys", 0o600)
    Path("/run/sshd").mkdir(exist_ok=True)  # privilege separation directory
    port = free_port()
    (d / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d / 'host_key'}\nPidFile {d / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {d / 'authorized_keys'}\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "PubkeyAuthentication yes\nPermitRootLogin prohibit-password\nStrictModes no\nUsePAM no\n"
        "Subsystem sftp internal-sftp\n")
    proc = subprocess.Popen([sshd_bin, "-D", "-e", "-f", str(d / "sshd_config")], stdout=subprocess.DEVNULL,
                            stderr=open(d / "sshd.log", "wb"))
    try:
        wait_for(lambda: _port_open(port) or proc.poll() is not None, 15, "sshd listening")
        if proc.poll() is not None:
            missing_part(f"sshd did not start: {(d / 'sshd.log').read_text()[-500:]}")
        host_key = " ".join((d / "host_key.pub").read_text().split()[:2])
        yield port, d / "client_key", host_key
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.integration
def test_bootstrap_through_a_real_sshd(real_sshd: tuple[int, Path, str], tmp_path: Path, static_master: LiveMaster) -> None:
    port, client_key, host_key = real_sshd
    import pwd

    remote = tmp_path / "remote"
    host = StaticHost(address="127.0.0.1", port=port, user=pwd.getpwuid(os.getuid()).pw_name,
                      key_file=str(client_key), host_key=host_key, python=sys.executable,
                      agent_id="static-real-sshd", remote_dir=str(remote))
    token = agent_token(static_master)
    try:
        first = bootstrap_host(host, static_master.url, POOL, token)
        assert statuses(first)["upload_agent"] == "done" and statuses(first)["start_agent"] == "done"
        wait_for(lambda: connected(static_master, host.id), 30, "the agent behind sshd registered")
        second = bootstrap_host(host, static_master.url, POOL, token)
        assert {s: st for s, st in statuses(second).items() if st not in ("ok",)} == {
            "upload_agent": "already", "write_config": "already", "write_token": "already", "start_agent": "already"}
    finally:
        with contextlib.suppress(SshBootstrapError):
            stop_agent(host)
