"""det shell start|open|list|kill|logs (issue 29): an SSH server in a task, opened through the
master. `open` runs the local `ssh` with `-o ProxyCommand=` the tunnel (cli/tunnel.py), which
reaches the task over a WebSocket at the master's /proxy/<task id>/ with the user's session: the user
needs no network path to the agent. The key is the task's own (the master gives it to the owner);
it is written to a private temporary file for ssh and removed after."""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
import time
from typing import Any

from cli.commands import group
from cli.commands.task import _common, _config, _launch, _launch_args
from cli.errors import CliError
from cli.session import authed
from cli.tunnel import TOKEN_ENV

READY_TIMEOUT_S = 600.0


def register(sub: argparse._SubParsersAction) -> None:
    g = group(sub, "shell", "SSH shells in tasks, tunnelled through the master")
    p = g.add_parser("start", help="start a shell and open it (-d: print its id and return)")
    _launch_args(p)
    _open_args(p)
    p.set_defaults(func=start)
    p = g.add_parser("open", help="open a running shell: ssh through the master (-- COMMAND runs one command)")
    p.add_argument("task_id", metavar="ID")
    _open_args(p)
    p.set_defaults(func=open_shell)
    _common(g, "shell")


def _open_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ssh-opts", action="append", default=[], metavar="OPTS",
                   help="more ssh options, e.g. --ssh-opts='-L 8888:localhost:8888' (repeatable)")
    p.add_argument("remote", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...] to run instead of a login shell")


def start(args: Any) -> int:
    s, shell = _launch(args, "shell", _config(args))
    if args.detach:
        print(shell["id"])
        return 0
    print(f"Launched shell {shell['id']} ({shell['description']})", flush=True)
    return _open(s, shell["id"], args)


def open_shell(args: Any) -> int:
    return _open(authed(args), args.task_id, args)


def _ready(s: Any, task_id: str) -> dict[str, Any]:
    """The shell once its sshd listens (its get answer: the key and the login account)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        shell = s.get(f"/api/v1/shells/{task_id}")["shell"]
        if shell["state"] in ("STATE_TERMINATING", "STATE_TERMINATED"):
            raise CliError(f"shell {task_id} has ended ({shell.get('exitStatus') or shell['state']}); "
                           f"det shell logs {task_id}")
        if shell.get("isReady"):
            return shell
        if time.monotonic() > deadline:
            raise CliError(f"shell {task_id} is not ready after {READY_TIMEOUT_S:.0f}s ({shell['state']})")
        time.sleep(0.3)


def ssh_argv(master: str, shell: dict[str, Any], key_path: str, ssh_opts: list[str], remote: list[str],
             interactive: bool) -> list[str]:
    """The ssh command line: the tunnel as ProxyCommand, the task's key only, no host-key prompt
    (the host key is generated per task and reached only through the authenticated master)."""
    proxy = f"{shlex.quote(sys.executable)} -m cli.tunnel {shlex.quote(master)} {shlex.quote(shell['id'])}"
    user = (shell.get("agentUserGroup") or {}).get("user") or "root"
    argv = ["ssh", "-o", f"ProxyCommand={proxy}", "-o", "StrictHostKeyChecking=no", "-o",
            "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o", "IdentitiesOnly=yes", "-i", key_path]
    if interactive:
        argv.append("-tt")
    for opts in ssh_opts:
        argv.extend(shlex.split(opts))
    argv.append(f"{user}@{shell['id']}")
    if remote:
        argv.extend(["--", *remote])
    return argv


def _open(s: Any, task_id: str, args: Any) -> int:
    remote = list(args.remote)
    if remote and remote[0] == "--":
        remote = remote[1:]
    shell = _ready(s, task_id)
    if not shell.get("privateKey"):
        raise CliError(f"shell {task_id} belongs to another user: only its owner can open it")
    fd, key_path = tempfile.mkstemp(prefix="det-shell-", suffix=".key")
    try:
        with os.fdopen(fd, "w") as f:  # mkstemp's file is the caller's only (0600)
            f.write(shell["privateKey"])
        env = {**os.environ, TOKEN_ENV: s.token or ""}
        argv = ssh_argv(s.master, shell, key_path, args.ssh_opts, remote, interactive=not remote and sys.stdin.isatty())
        try:
            code = subprocess.run(argv, env=env).returncode
        except FileNotFoundError:
            raise CliError("ssh is not installed here (install openssh-client)") from None
    finally:
        os.unlink(key_path)
    if not remote:
        print(f"To reconnect: det shell open {task_id}", file=sys.stderr)
    return code
