"""Shells (issue 29, `det shell`): a task that runs an SSH server for its owner
(shipyard_common/shell_launch.py), reached through the master's tunnel (api/proxy.py relays a
WebSocket at /proxy/<task id>/ to the task's sshd), so the user needs no network path to the agent.

The task's key pair is the master's: an Ed25519 key derived from the master's secret and the task id
(`Master.derived_token`), so it is re-derived on each request rather than stored in the database. The
public key goes to the task (its sshd's only authorized key); the private key goes to the task's
owner only, in the launch and get answers (Determined's `privateKey`), and is never logged. The
task reports `user@host:port` as its proxy address: the account its sshd logs in and where it listens.
Idle shells are not culled (as Determined)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from control_plane.auth import Principal, TokenKind
from control_plane.db.models import Task
from control_plane.master import Master

_COMMON = Path(__file__).resolve().parents[2] / "shipyard_common"
KIND = "shell"


def key_pair(master: Master, task_id: str) -> tuple[str, str]:
    """(private key in OpenSSH PEM form, public key as an authorized_keys line) of the task."""
    seed = hashlib.sha256(master.derived_token(f"ssh-key:{task_id}").encode()).digest()
    key = Ed25519PrivateKey.from_private_bytes(seed)
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption()).decode()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return private, f"{public.decode()} shell-{task_id}"


def launch_spec(master: Master, task_id: str) -> tuple[list[str], dict[str, str]]:
    """The shell task's argv (the launcher, given jupyter_launch.py's helpers) and its extra env."""
    argv = ["python3", "-c", (_COMMON / "shell_launch.py").read_text(), (_COMMON / "jupyter_launch.py").read_text()]
    return argv, {"SHIPYARD_SSH_PUBLIC_KEY": key_pair(master, task_id)[1]}


def split_address(address: str) -> tuple[str, str]:
    """A shell's reported `user@host:port` as (user, host:port); ("", address) without a user."""
    user, at, hostport = address.rpartition("@")
    return (user, hostport) if at else ("", address)


def shell_fields(master: Master, p: Principal, task: Task, *, with_key: bool) -> dict[str, Any]:
    """What Determined's v1Shell adds to a task: the login account (`agentUserGroup.user`, known once
    sshd listens) and, for the owner when asked, the key pair the client connects with."""
    user = split_address(task.proxy_address)[0] if task.proxy_address else ""
    out: dict[str, Any] = {"agentUserGroup": {"user": user or None}}
    if with_key and p.kind is TokenKind.USER and p.user_id == task.owner_id:
        out["privateKey"], out["publicKey"] = key_pair(master, task.id)
    return out
