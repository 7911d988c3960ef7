"""The strict boot: every instance the cloud reports running boots as a clean machine.

`ContainerBootHarness` watches a cloud fake as `BootHarness` does (tests/e2e/boot.py), but an
instance is not emulated on this machine: it is a container of a clean cloud-like image
(tests/e2e/cloud_image.py: Debian with the interpreter, cloud-init and systemd, nothing else),
booted by systemd as PID 1. cloud-init itself reads the instance's user-data, byte for byte as the
cloud holds it (the NoCloud seed), installs its `packages` from the Debian mirror, writes its files,
runs its `runcmd`; the boot script starts the agent's systemd unit with `systemctl`. Nothing is
re-rooted, skipped or overridden: the script's default metadata address (169.254.169.254, and
metadata.google.internal resolving to it) is served by a `FakeMetadataServer` bound to that
address on this machine's loopback, which the container shares (host networking), as it shares
the way to the master and to the package index.

A container that stops by itself (the agent's power-off after losing its master) is a powered-off
VM, passed to the cloud; an instance the cloud reports gone is killed at once (SIGKILL), like a VM
switched off. Its removal (tens of seconds on Docker's vfs driver) goes on in the background, off
the test's time: `join_removals()` waits for them (a module's teardown; the engine's own teardown
removes whatever is left). One instance at a time: the metadata address serves one instance.
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from tests.e2e.boot import (
    BootError,
    BootHarness,
    Cloud,
    EmulatedInstance,
    FakeMetadataServer,
    parse_user_data,
)
from tests.locks import file_lock

log = logging.getLogger("tests.e2e.container_boot")

METADATA_IP = "169.254.169.254"
ROOT_KEY = "instance"
BOOT_TIMEOUT_S = 900

_removals: list[threading.Thread] = []
_removals_lock = threading.Lock()


def join_removals(timeout: float = 300) -> None:
    """Wait for the background removals of killed instances' containers (at most `timeout` seconds)."""
    deadline = time.monotonic() + timeout
    with _removals_lock:
        pending = list(_removals)
        _removals.clear()
    for t in pending:
        t.join(timeout=max(0.0, deadline - time.monotonic()))


def _remove_later(client: Any, container_id: str) -> None:
    def remove() -> None:
        with contextlib.suppress(Exception):
            client.api.remove_container(container_id, force=True)

    t = threading.Thread(target=remove, name=f"remove-{container_id[:12]}")
    with _removals_lock:
        _removals.append(t)
    t.start()


@contextlib.contextmanager
def metadata_address() -> Any:
    """The cloud's metadata address on this machine's loopback, served by a FakeMetadataServer at
    its root, for the duration of the block (one test at a time on this machine: a file lock)."""
    with file_lock(Path("/tmp/shipyard-metadata-address.lock")), _metadata_address() as server:
        yield server


@contextlib.contextmanager
def _metadata_address() -> Any:
    added = subprocess.run(["ip", "addr", "add", f"{METADATA_IP}/32", "dev", "lo"], capture_output=True,
                           text=True, check=False)
    if added.returncode != 0 and "File exists" not in added.stderr:
        raise RuntimeError(f"cannot add {METADATA_IP} to lo: {added.stderr.strip()}")
    server = FakeMetadataServer((METADATA_IP, 80), root_key=ROOT_KEY).start()
    try:
        yield server
    finally:
        server.stop()
        if added.returncode == 0:
            subprocess.run(["ip", "addr", "del", f"{METADATA_IP}/32", "dev", "lo"], capture_output=True, check=False)


class ContainerBootHarness(BootHarness):
    def __init__(self, cloud: Cloud, root: Path, *, client: Any, image: str, metadata: FakeMetadataServer,
                 poll_interval: float = 0.5) -> None:
        super().__init__(cloud, root, metadata=metadata, poll_interval=poll_interval)
        self.client = client
        self.image = image
        self.containers: dict[str, str] = {}  # instance id -> container id

    # -- one boot ----------------------------------------------------------------------------------
    def _run_boot(self, inst: EmulatedInstance) -> None:
        if self.asks_identity(inst) and any(
                i.id != inst.id and i.state in ("booting", "running") and self.asks_identity(i)
                for i in self.instances.values()):
            raise BootError("the strict boot serves one instance at a time (one metadata address)")
        inst.doc = parse_user_data(inst.user_data)
        seed = inst.sandbox / "seed"
        seed.mkdir(parents=True, exist_ok=True)
        (seed / "user-data").write_text(inst.user_data)
        (seed / "meta-data").write_text(f"instance-id: {inst.id}\nlocal-hostname: {inst.id[:60]}\n")
        self.metadata.register(ROOT_KEY, self.cloud.provider, inst.id)
        api = self.client.api
        # systemd as PID 1: its capabilities and the cgroup tree, not --privileged (which asks for
        # capabilities a sandboxed engine may not have to give).
        host_config = api.create_host_config(
            network_mode="host", cap_add=["SYS_ADMIN", "NET_ADMIN"],
            security_opt=["seccomp=unconfined", "apparmor=unconfined"],
            binds={str(seed): {"bind": "/var/lib/cloud/seed/nocloud", "mode": "ro"},
                   "/sys/fs/cgroup": {"bind": "/sys/fs/cgroup", "mode": "rw"}, **self.machine_binds(inst)},
            tmpfs={"/run": "", "/run/lock": "", "/tmp": ""},
            extra_hosts={"metadata.google.internal": METADATA_IP})
        container = api.create_container(self.image_for(inst), hostname=inst.id[:60], host_config=host_config,
                                         environment={"container": "docker"}, stop_signal="SIGRTMIN+3",
                                         labels={"shipyard.strict-boot": inst.id})
        self.containers[inst.id] = container["Id"]
        api.start(container["Id"])
        log.info("event=container_boot_started instance_id=%s container=%s", inst.id, container["Id"][:12])
        # cloud-init's own verdict on the boot: every module, the runcmd boot script included.
        rc, out = self.exec(inst.id, ["cloud-init", "status", "--wait", "--long"], timeout=BOOT_TIMEOUT_S)
        inst.boot_returncode = rc
        self.collect_logs(inst)
        if inst.state == "gone":
            return
        if rc != 0:
            raise BootError(f"cloud-init status {rc}: {out[-1500:]}")
        unit = self.unit_for(inst)
        rc, out = self.exec(inst.id, ["systemctl", "is-active", unit], timeout=30)
        if out.strip() != "active":
            raise BootError(f"{unit} is {out.strip()!r} after the boot")
        inst.state = "running"
        threading.Thread(target=self._watch_power, args=(inst,), daemon=True, name=f"power-{inst.id}").start()

    # -- what a subclass may vary per instance (tests/e2e/test_strict_master_boot.py) ---------------
    def image_for(self, inst: EmulatedInstance) -> str:
        """The machine image the instance boots."""
        return self.image

    def unit_for(self, inst: EmulatedInstance) -> str:
        """The systemd unit the boot must leave active."""
        return "shipyard-agent.service"

    def machine_binds(self, inst: EmulatedInstance) -> dict[str, dict[str, str]]:
        """Host paths mounted into the instance's machine (its stand-ins), beyond the seed."""
        return {}

    def asks_identity(self, inst: EmulatedInstance) -> bool:
        """Whether the instance reads its own identity from the metadata address (which serves one)."""
        return True

    def exec(self, instance_id: str, argv: list[str], timeout: float = 60) -> tuple[int, str]:
        """Run `argv` in the instance's container, at most `timeout` seconds: (exit code, output)."""
        api = self.client.api
        ex = api.exec_create(self.containers[instance_id], ["timeout", str(int(timeout)), *argv])
        out = api.exec_start(ex["Id"]).decode(errors="replace")
        return api.exec_inspect(ex["Id"])["ExitCode"], out

    def collect_logs(self, inst: EmulatedInstance) -> None:
        """cloud-init's output (the boot script's included) and the agent's journal, into the
        instance's sandbox as boot.log and agent.log."""
        if inst.id not in self.containers:
            return
        with contextlib.suppress(Exception):
            _, boot = self.exec(inst.id, ["cat", "/var/log/cloud-init-output.log"], timeout=30)
            (inst.sandbox / "boot.log").write_text(boot)
            _, agent = self.exec(inst.id, ["journalctl", "--no-pager", "-o", "cat", "-u", self.unit_for(inst)],
                                 timeout=30)
            (inst.sandbox / "agent.log").write_text(agent)

    def _watch_power(self, inst: EmulatedInstance) -> None:
        """The container's own stop is the VM powering off: the cloud is told."""
        api = self.client.api
        while not self._stop.is_set() and inst.state == "running":
            try:
                running = api.inspect_container(self.containers[inst.id])["State"]["Running"]
            except Exception:
                return
            if not running:
                inst.powered_off = True
                log.info("event=container_poweroff instance_id=%s", inst.id)
                self.cloud.power_off(inst.id)
                return
            time.sleep(0.5)

    def _kill(self, inst: EmulatedInstance) -> None:
        cid = self.containers.get(inst.id)
        if cid is None:
            return
        self.collect_logs(inst)
        with contextlib.suppress(Exception):
            self.client.api.kill(cid)  # switched off now; removed in the background
        _remove_later(self.client, cid)
