"""A shell task's entrypoint (issue 29): an SSH server for the task's owner, reached only through
the master's tunnel (`det shell open`). It generates a host key for this task, writes an
sshd_config that accepts only the task's public key (SHIPYARD_SSH_PUBLIC_KEY, the master's per-task
key pair; no passwords), starts `sshd -D -e -f <config>` unprivileged as the task's user on a free
port, tells the master where it listens (`POST /api/v1/allocations/{id}/proxy_address` with
`user@host:port`: the account sshd logs in, which the client names), then waits for it, passing a
stop signal on.

Standard library only, and run as `python3 -c <this file's text>` by the master's task spec, like
jupyter_launch.py (whose port choice and address reporting it shares: that file's text is its first argument)."""

import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

# The DET_* variables a shell's sessions see (sshd gives a session a fresh environment).
_SESSION_ENV_PREFIXES = ("DET_",)


def _sshd():
    path = shutil.which("sshd") or "/usr/sbin/sshd"
    if not os.path.isabs(path) or not os.access(path, os.X_OK):
        print("shell: sshd is not installed on this agent (install openssh-server)", file=sys.stderr, flush=True)
        sys.exit(127)
    return path


def _quote(value):
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def sshd_config(workdir, port, user, env):
    """The per-task sshd_config: this task's host key and authorized key only, no passwords."""
    lines = [
        f"Port {port}", "ListenAddress 0.0.0.0", f"HostKey {workdir}/host_key", f"PidFile {workdir}/sshd.pid",
        f"AuthorizedKeysFile {workdir}/authorized_keys", "PubkeyAuthentication yes", "PasswordAuthentication no",
        "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no", f"AllowUsers {user}", "PrintMotd no",
        "PermitRootLogin prohibit-password", "Subsystem sftp internal-sftp",
    ]
    pairs = [f"{key}={_quote(env[key])}" for key in sorted(env)
             if key.startswith(_SESSION_ENV_PREFIXES) and "\n" not in env[key]]
    if pairs:  # one line: sshd takes the first SetEnv only
        lines.append("SetEnv " + " ".join(pairs))
    return "\n".join(lines) + "\n"


def _listening(port, child):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and child.poll() is None:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
        except OSError:
            time.sleep(0.1)
    return False


def main():
    env = os.environ
    helpers = {"__name__": "jupyter_launch"}
    exec(sys.argv[1], helpers)  # jupyter_launch.py's text: its _free_port, _address_towards, _report
    sshd = _sshd()
    user = pwd.getpwuid(os.getuid()).pw_name
    workdir = tempfile.mkdtemp(prefix="shipyard-shell-")
    try:  # the task's host key is removed however this ends
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", f"{workdir}/host_key"], check=True)
        with open(f"{workdir}/authorized_keys", "w") as f:
            f.write(env["SHIPYARD_SSH_PUBLIC_KEY"].strip() + "\n")
        os.chmod(f"{workdir}/authorized_keys", 0o600)
        port = helpers["_free_port"]()
        with open(f"{workdir}/sshd_config", "w") as f:
            f.write(sshd_config(workdir, port, user, env))
        child = subprocess.Popen([sshd, "-D", "-e", "-f", f"{workdir}/sshd_config"])
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda s, _f: child.send_signal(s))
        if not _listening(port, child):
            print(f"shell: sshd did not listen on port {port}", file=sys.stderr, flush=True)
            child.kill()
            sys.exit(child.wait() or 1)
        address = helpers["_address_towards"](env["DET_MASTER"])
        helpers["_report"](env["DET_MASTER"], env["DET_ALLOCATION_ID"], env["DET_SESSION_TOKEN"],
                           f"{user}@{address}:{port}")
        print(f"shell: sshd listening on port {port} for {user}", flush=True)
        code = child.wait()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    sys.exit(code)


if __name__ == "__main__":
    main()
