"""Every cgroup v1 controller the kernel enables, mounted on this host, as a standard cgroup v1 host
(systemd) has them, before a Docker engine starts here.

Why: the machines of the strict boots (tests/e2e/container_boot.py) run systemd, and the agent's
one a Docker engine of its own, with this host's /sys/fs/cgroup. Where this host leaves a
controller unmounted (this machine kind mounts cpu, cpuacct, cpuset, memory, devices, freezer,
blkio and pids, not hugetlb, net_cls/net_prio or perf_event), they mount it themselves, creating a
hierarchy that outlives them (the inner engine's `docker` cgroup in it). From then on every process
here is listed in that hierarchy's root (/proc/<pid>/cgroup), and containerd's shim, which looks
each listed controller up among this host's mounts, fails to load a container's cgroups
("cannot find cgroup mount destination"): it then watches no OOM, and Docker reports an OOM-killed
container as a plain exit 137 (`State.OOMKilled` false). Mounted here first, the machines find the
controllers mounted and use the same hierarchies. Nothing to do on a cgroup v2 host."""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path

from tests.locks import file_lock

log = logging.getLogger("tests.docker.cgroups")
ROOT = Path("/sys/fs/cgroup")


def _mounted() -> set[str]:
    """The controllers some cgroup v1 mount of this mount namespace carries."""
    found: set[str] = set()
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split(" - ", 1)[-1].split()
            if len(fields) >= 3 and fields[0] == "cgroup":
                found.update(fields[2].split(","))
    return found


def _wanted() -> list[list[str]]:
    """The enabled controllers, those sharing an existing hierarchy together (they mount as one)."""
    by_hierarchy: dict[str, list[str]] = {}
    singles = []
    with open("/proc/cgroups") as f:
        for line in f:
            if line.startswith("#"):
                continue
            name, hierarchy, _count, enabled = line.split()
            if enabled != "1":
                continue
            if hierarchy == "0":
                singles.append([name])
            else:
                by_hierarchy.setdefault(hierarchy, []).append(name)
    # Controllers no hierarchy holds yet: the pairs systemd mounts together, together (as it expects them).
    names = {group[0] for group in singles}
    for pair in (["cpu", "cpuacct"], ["net_cls", "net_prio"]):
        if set(pair) <= names:
            singles = [g for g in singles if g[0] not in pair] + [pair]
    return list(by_hierarchy.values()) + singles


def mount_all_v1_controllers() -> list[str]:
    """Mount the enabled v1 controllers this host has not mounted (a no-op elsewhere); the ones mounted now."""
    if not (ROOT / "memory").is_dir() or os.geteuid() != 0:  # cgroup v2 (or not ours to change)
        return []
    done = []
    with file_lock(Path("/tmp/shipyard-cgroup-mounts.lock")):
        have = _mounted()
        for group in _wanted():
            if set(group) <= have:
                continue
            name = ",".join(group)
            target = ROOT / name
            if not target.is_dir():
                if subprocess.run(["mount", "-o", "remount,rw", str(ROOT)], capture_output=True).returncode == 0:
                    target.mkdir(exist_ok=True)
            r = subprocess.run(["mount", "-t", "cgroup", "-o", name, "cgroup", str(target)], capture_output=True, text=True)
            if r.returncode == 0:
                done.append(name)
            else:
                log.warning("cannot mount the cgroup controller(s) %s at %s: %s", name, target, r.stderr.strip())
    return done
