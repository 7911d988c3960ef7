"""Static provider: "instances" are machines you already have, made agents over SSH.

Pool config:

    provider:
      type: static
      hosts:
        - {address: 10.0.0.5, user: ubuntu, key_file: ~/.ssh/id_ed25519, host_key: "ssh-ed25519 AAAA..."}
        - {address: gpu-2.lab, port: 2222, user: det, key: "-----BEGIN OPENSSH PRIVATE KEY-----...",
           known_hosts: /etc/shipyard/known_hosts, python: /usr/bin/python3.11}
      connect_timeout: 20
      slots_per_host: 4  # slots each host's agent brings (default 1)

There is no cloud: `launch` bootstraps free hosts (agent_bootstrap/ssh.py) with the spec's user
data as the agent credential, `terminate` stops the agent over SSH, and `list` asks each host
what it serves (<remote_dir>/instance.json: cluster, pool, launch id — the hosts' "tags"), so a
restarted master finds its instances again exactly as with the cloud providers.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import BeforeValidator

from agent_bootstrap.ssh import (
    SshBootstrapError,
    StaticHost,
    bootstrap_host,
    read_instance_record,
    stop_agent,
)
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
    ErrorScope,
    InstanceSummary,
    LaunchResult,
    LaunchSpec,
    ProviderContext,
    ProviderError,
    ProviderSettings,
    ProviderType,
    UserDataKind,
)
from shipyard_common.settings import check_all, integer

log = logging.getLogger("shipyard.provisioners.static")

_KIND_OF = {"auth": ErrorKind.AUTH, "host_key": ErrorKind.AUTH, "invalid": ErrorKind.INVALID,
            "unreachable": ErrorKind.UNKNOWN, "failed": ErrorKind.UNKNOWN}


def _hosts(value: Any) -> tuple[StaticHost, ...]:
    if not isinstance(value, list | tuple) or not value:
        raise ValueError("a static pool needs a non-empty list of hosts")
    hosts, problems = [], []
    for i, raw in enumerate(value):
        try:
            hosts.append(StaticHost.from_dict(raw, f"[{i}]"))
        except ValueError as e:  # "[i].field: reason", or "[i]: reason"
            path, _, reason = str(e).partition(": ")
            problems.append((path, reason))
    ids = [h.id for h in hosts]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        problems.append(("", f"the same agent id more than once: {dupes} (set agent_id)"))
    check_all(problems)
    return tuple(hosts)


def _seconds(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ValueError(f"must be a positive number of seconds, got {value!r}")
    return float(value)


def _agent_options(value: Any) -> Any:
    if value is not None and not isinstance(value, dict):
        raise ValueError("must be a mapping of agent options")
    return value


class StaticPoolConfig(ProviderSettings):
    TYPE = "static"

    hosts: Annotated[tuple[StaticHost, ...], BeforeValidator(_hosts)]
    connect_timeout: Annotated[float, BeforeValidator(_seconds)] = 20.0
    # The pool's `agent:` section (an elastic setting, so set by the build from the pool's options).
    agent: Annotated[dict[str, Any] | None, BeforeValidator(_agent_options)] = None
    slots_per_host: Annotated[int, integer(1)] = 1  # slots each host's agent brings

    def summary(self) -> InstanceSummary:
        return InstanceSummary(slots_per_instance=self.slots_per_host)


def _error(e: SshBootstrapError, host: StaticHost) -> ProviderError:
    return ProviderError(_KIND_OF.get(e.kind, ErrorKind.UNKNOWN), str(e), scope=ErrorScope.ZONE,
                         code=f"ssh_{e.kind}", location=host.id)


class StaticProvider:
    def __init__(self, cfg: StaticPoolConfig, *, cluster_id: str, pool: str, master_url: str,
                 package: bytes | None = None) -> None:
        self.cfg = cfg
        self.cluster_id = cluster_id
        self.pool = pool
        self.master_url = master_url
        self.package = package  # None: the archive this master serves
        self._by_id = {h.id: h for h in cfg.hosts}

    def _tags(self, launch_id: str) -> dict[str, str]:
        return {TAG_MANAGED_BY: MANAGED_BY_VALUE, TAG_CLUSTER: self.cluster_id, TAG_POOL: self.pool,
                TAG_MASTER: self.master_url, TAG_LAUNCH_ID: launch_id}

    def _instance(self, host: StaticHost, launch_id: str | None, state: CloudState,
                  launched_at: datetime) -> CloudInstance:
        return CloudInstance(id=host.id, state=state, launched_at=launched_at, launch_id=launch_id,
                             private_ip=host.address, location=host.address, instance_type="static",
                             tags=self._tags(launch_id or ""))

    # -- list ------------------------------------------------------------------------------------
    def _probe(self, host: StaticHost) -> CloudInstance | None:
        try:
            record, running = read_instance_record(host, connect_timeout=self.cfg.connect_timeout)
        except SshBootstrapError as e:
            log.warning("event=static_host_unreachable pool=%s host=%s error=%s", self.pool, host.id, e)
            raise _error(e, host) from None
        if not record or record.get("cluster_id") != self.cluster_id or record.get("pool") != self.pool:
            return None  # a configured host that serves nobody (yet): free
        try:
            launched_at = datetime.fromisoformat(record["launched_at"])
        except (KeyError, TypeError, ValueError):
            launched_at = datetime.now(UTC)
        # Installed but its agent is not running (crashed, host rebooted without systemd): not yet
        # capacity, like a booting cloud instance; the autoscaler's starting period applies.
        return self._instance(host, record.get("launch_id"), CloudState.RUNNING if running
                              else CloudState.PENDING, launched_at)

    def list(self) -> list[CloudInstance]:
        """Every configured host that carries this cluster's and pool's instance record."""
        with ThreadPoolExecutor(max_workers=min(8, len(self.cfg.hosts))) as pool:
            results = list(pool.map(self._probe_or_error, self.cfg.hosts))
        errors = [r for r in results if isinstance(r, ProviderError)]
        if errors:
            # A partial list would read as "instances gone": report the failure instead.
            raise errors[0]
        return [r for r in results if isinstance(r, CloudInstance)]

    def _probe_or_error(self, host: StaticHost) -> CloudInstance | ProviderError | None:
        try:
            return self._probe(host)
        except ProviderError as e:
            return e

    # -- launch ----------------------------------------------------------------------------------
    def launch(self, specs: Sequence[LaunchSpec]) -> LaunchResult:
        """Bootstrap one free host per spec; `user_data` is the agent credential. Idempotent per
        launch id: a host already serving that launch is returned as it is."""
        if not specs:
            return LaunchResult(())
        try:
            current = {ci.id: ci for ci in self.list()}
        except ProviderError as e:
            return LaunchResult((), e)
        by_launch = {ci.launch_id: ci for ci in current.values() if ci.launch_id}
        free = [h for h in self.cfg.hosts if h.id not in current]
        launched: list[CloudInstance] = []
        for spec in specs:
            if spec.launch_id in by_launch:
                launched.append(by_launch[spec.launch_id])
                continue
            if not free:
                return LaunchResult(tuple(launched), ProviderError(
                    ErrorKind.CAPACITY, f"all {len(self.cfg.hosts)} static hosts of pool {self.pool!r} are in use",
                    scope=ErrorScope.CLOUD, code="NoFreeHost"))
            host = free.pop(0)
            now = datetime.now(UTC)
            record = {"cluster_id": self.cluster_id, "pool": self.pool, "launch_id": spec.launch_id,
                      "master": self.master_url, "launched_at": now.isoformat()}
            try:
                steps = bootstrap_host(host, self.master_url, self.pool, spec.user_data.strip(),
                                       agent_options=self.cfg.agent, package=self.package, instance_record=record,
                                       connect_timeout=self.cfg.connect_timeout)
            except SshBootstrapError as e:
                log.warning("event=static_bootstrap_failed pool=%s host=%s error=%s", self.pool, host.id, e)
                return LaunchResult(tuple(launched), _error(e, host))
            log.info("event=static_host_bootstrapped pool=%s host=%s steps=%s", self.pool, host.id,
                     ",".join(f"{s.step}:{s.status}" for s in steps))
            launched.append(self._instance(host, spec.launch_id, CloudState.RUNNING, now))
        return LaunchResult(tuple(launched))

    # -- terminate -------------------------------------------------------------------------------
    def terminate(self, ids: Sequence[str]) -> None:
        """Stop the agents (the machines stay, of course). Unknown ids are skipped."""
        first: ProviderError | None = None
        for instance_id in dict.fromkeys(ids):
            host = self._by_id.get(instance_id)
            if host is None:
                continue
            try:
                stop_agent(host, connect_timeout=self.cfg.connect_timeout)
            except SshBootstrapError as e:
                log.warning("event=static_stop_failed pool=%s host=%s error=%s", self.pool, host.id, e)
                first = first or _error(e, host)
                continue
            log.info("event=static_agent_stopped pool=%s host=%s", self.pool, host.id)
        if first is not None:
            raise first


def _build(cfg: StaticPoolConfig, ctx: ProviderContext) -> BuiltProvider:
    cfg = cfg.model_copy(update={"agent": dict(ctx.agent_options) or cfg.agent})
    provider = StaticProvider(cfg, cluster_id=ctx.cluster_id, pool=ctx.pool, master_url=ctx.master_url)
    return BuiltProvider(provider, cfg.slots_per_host)


def _keep_every_host(section: Mapping[str, Any]) -> dict[str, Any]:
    """A static pool keeps all its hosts unless told otherwise."""
    hosts = section.get("hosts")
    n = len(hosts) if isinstance(hosts, list) else 0
    return {"min_instances": n, "max_instances": n}


# The SSH bootstrap takes the bootstrap token as the agent credential, not cloud-init.
PROVIDER_TYPE = ProviderType(name="static", config=StaticPoolConfig, build=_build, user_data=UserDataKind.TOKEN,
                             settings_defaults=_keep_every_host, consistent_list=True)
