"""Local provider: "instances" are agent processes on the master's machine.

Each instance is a process group plus a small JSON record in the pool's state directory (its
"tags"), so `list()` rebuilds the picture from disk after a master restart, exactly as the cloud
providers rebuild it from tags. This is the embedded default that lets `make demo` show a pool
scaling from zero with its demand and back."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator

from provisioners.base import (
    MANAGED_BY_VALUE,
    TAG_CLUSTER,
    TAG_LAUNCH_ID,
    TAG_MANAGED_BY,
    TAG_MASTER,
    TAG_POOL,
    BuiltProvider,
    CloudInstance,
    CloudState,
    ErrorKind,
    InstanceSummary,
    LaunchResult,
    LaunchSpec,
    ProviderContext,
    ProviderError,
    ProviderSettings,
    ProviderType,
    UserDataKind,
)
from shipyard_common import host_env, private_files
from shipyard_common.processes import pid_alive, start_session, stop_process_group
from shipyard_common.settings import integer, text

log = logging.getLogger("shipyard.provisioners.local")


def _slot_type(value: Any) -> Any:
    if value not in ("cpu", "auto"):
        raise ValueError(f"must be cpu or auto, got {value!r}")
    return value


class LocalPoolConfig(ProviderSettings):
    TYPE = "local"

    slots_per_instance: Annotated[int, integer(1)] = 1
    slot_type: Annotated[str, BeforeValidator(_slot_type)] = "cpu"
    work_dir: Annotated[str | None, text(optional=True)] = None  # default: <state_dir>/local-instances/<pool>
    python: Annotated[str | None, text(optional=True)] = None  # interpreter for the agents; default: the master's

    def summary(self) -> InstanceSummary:
        return InstanceSummary(slots_per_instance=self.slots_per_instance)


class LocalProvider:
    def __init__(self, cfg: LocalPoolConfig, *, cluster_id: str, pool: str, master_url: str, state_dir: Path) -> None:
        self.cfg = cfg
        self.cluster_id = cluster_id
        self.pool = pool
        self.master_url = master_url
        self.dir = Path(cfg.work_dir) if cfg.work_dir else state_dir / "local-instances" / pool
        private_files.private_dir(self.dir)  # holds the instances' bootstrap tokens
        self._children: dict[int, subprocess.Popen[bytes]] = {}

    def _record(self, instance_id: str) -> Path:
        return self.dir / f"{instance_id}.json"

    def launch(self, specs: Sequence[LaunchSpec]) -> LaunchResult:
        launched: list[CloudInstance] = []
        for spec in specs:
            instance_id = f"local-{spec.launch_id[:12]}"
            rec = self._record(instance_id)
            if rec.exists():  # idempotent: the same launch id is the same instance
                existing = self._load(rec)
                if existing is not None:
                    launched.append(existing)
                    continue
            home = self.dir / instance_id
            token_file = home / "bootstrap-token"
            # for local instances the "user data" is the credential
            private_files.write_private(token_file, spec.user_data.encode())
            cmd = [self.cfg.python or sys.executable, "-m", "agent_bootstrap.agent",
                   "--master-url", self.master_url, "--resource-pool", self.pool,
                   "--agent-id", instance_id, "--instance-id", instance_id,
                   "--token-file", str(token_file), "--work-dir", str(home / "work"),
                   "--slots", str(self.cfg.slots_per_instance), "--slot-type", self.cfg.slot_type,
                   "--agent-reconnect-backoff", "1"]
            try:
                proc = start_session(cmd, home / "agent.log", _agent_env())
            except OSError as e:
                return LaunchResult(tuple(launched), ProviderError(ErrorKind.INVALID, f"cannot start agent: {e}"))
            self._children[proc.pid] = proc
            now = datetime.now(UTC)
            tags = {TAG_MANAGED_BY: MANAGED_BY_VALUE, TAG_CLUSTER: self.cluster_id, TAG_POOL: self.pool,
                    TAG_MASTER: self.master_url, TAG_LAUNCH_ID: spec.launch_id}
            private_files.write_private(rec, json.dumps({"id": instance_id, "pid": proc.pid,
                                                         "launched_at": now.isoformat(), "tags": tags}).encode())
            log.info("event=local_instance_launched pool=%s instance_id=%s pid=%s", self.pool, instance_id, proc.pid)
            launched.append(CloudInstance(id=instance_id, state=CloudState.RUNNING, launched_at=now,
                                          launch_id=spec.launch_id, private_ip="127.0.0.1", location="local",
                                          instance_type="local", tags=tags))
        return LaunchResult(tuple(launched))

    def _load(self, rec: Path) -> CloudInstance | None:
        try:
            data = json.loads(rec.read_text())
        except (OSError, ValueError):
            return None
        tags = data.get("tags") or {}
        if tags.get(TAG_CLUSTER) != self.cluster_id or tags.get(TAG_POOL) != self.pool:
            return None
        self._reap()
        try:
            pid, instance_id = int(data["pid"]), str(data["id"])
            launched_at = datetime.fromisoformat(data["launched_at"])
        except (KeyError, TypeError, ValueError):
            # Written atomically, so this is not a torn write: someone edited it. Keep it for them.
            log.warning("event=local_record_malformed pool=%s path=%s", self.pool, rec)
            return None
        if not pid_alive(pid):
            rec.unlink(missing_ok=True)
            return None
        return CloudInstance(id=instance_id, state=CloudState.RUNNING, launched_at=launched_at,
                             launch_id=tags.get(TAG_LAUNCH_ID), private_ip="127.0.0.1", location="local",
                             instance_type="local", tags=tags)

    def list(self) -> list[CloudInstance]:
        out = []
        for rec in sorted(self.dir.glob("local-*.json")):
            inst = self._load(rec)
            if inst is not None:
                out.append(inst)
        return out

    def terminate(self, ids: Sequence[str]) -> None:
        for instance_id in ids:
            rec = self._record(instance_id)
            try:
                pid = int(json.loads(rec.read_text())["pid"])
            except (OSError, ValueError, KeyError):
                continue
            stop_process_group(pid)
            rec.unlink(missing_ok=True)
            # The instance is gone: so are its credentials (its log stays for whoever debugs it).
            home = self.dir / instance_id
            for secret in (home / "bootstrap-token", home / "work" / "state" / "agent-credential"):
                secret.unlink(missing_ok=True)
            log.info("event=local_instance_terminated pool=%s instance_id=%s", self.pool, instance_id)
        self._reap()

    def _reap(self) -> None:
        for pid, proc in list(self._children.items()):
            if proc.poll() is not None:
                del self._children[pid]


def _agent_env() -> dict[str, str]:
    """The master's environment as far as an agent may see it (shipyard_common/host_env.py): never
    the master's own secrets (SHIPYARD_DB_URL, SHIPYARD_ADMIN_PASSWORD, its cloud keys)."""
    return host_env.for_agent(os.environ)


def _build(cfg: LocalPoolConfig, ctx: ProviderContext) -> BuiltProvider:
    provider = LocalProvider(cfg, cluster_id=ctx.cluster_id, pool=ctx.pool, master_url=ctx.master_url,
                             state_dir=ctx.state_dir)
    return BuiltProvider(provider, cfg.slots_per_instance)


# Local agents are started with their credential on the command line's token file, never with
# cloud-init, and take no `agent:` options.
PROVIDER_TYPE = ProviderType(name="local", config=LocalPoolConfig, build=_build, user_data=UserDataKind.TOKEN,
                             takes_agent_options=False, consistent_list=True)
