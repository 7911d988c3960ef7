"""A clean cloud-like machine image for the strict boot (tests/e2e/container_boot.py), made here.

What a cloud's stock image has and nothing more: a minimal Debian root made by `debootstrap` from
the machine's own Debian mirror (read from its apt sources; no registry is named here) with the
interpreter, cloud-init, systemd as PID 1 and the CA certificates, as Ubuntu's and Debian's cloud
images carry them. Nothing of Shipyard and none of its Python dependencies are in it: what the
user-data needs beyond that, it must install itself. `bullseye` carries Python 3.9, the oldest
Python the agent supports (Ubuntu 22.04, the clouds' default agent image, has 3.10).

Image-level settings a cloud image makes for its own platform are made here for the container's:
cloud-init reads the NoCloud seed (the test writes the instance's user-data there, byte for byte as
the cloud holds it) and leaves the network alone (the container shares the host's).

The root is cached as a tar under ~/.cache/shipyard/cloud-images/, keyed by suite, packages and
this file's settings, and imported into the test session's Docker engine.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from tests.locks import file_lock

CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache"))) / "shipyard" / "cloud-images"
# python3-cffi-backend: debootstrap does not resolve the virtual packages python3-cryptography
# (which cloud-init needs) depends on.
# locales: cloud-init's locale module runs update-locale, as on every cloud image.
PACKAGES = ("python3", "cloud-init", "python3-cffi-backend", "systemd", "systemd-sysv", "ca-certificates",
            "iproute2", "locales")
# The platform settings a cloud image carries for its datasource, here for a container.
CLOUD_CFG = """\
datasource_list: [NoCloud, None]
network: {config: disabled}
"""
# Units that manage hardware or the host's network: nothing to do in a container, and some would
# touch the host's network namespace, which the container shares.
MASKED_UNITS = ("systemd-udevd.service", "systemd-udev-trigger.service", "systemd-networkd.service",
                "systemd-resolved.service", "systemd-timesyncd.service", "getty@tty1.service",
                "console-getty.service", "systemd-remount-fs.service", "sys-kernel-config.mount",
                "sys-kernel-debug.mount", "sys-kernel-tracing.mount")


class ImageUnavailable(Exception):
    pass


def apt_mirror() -> str:
    """The Debian mirror this machine's apt uses (deb822 sources or the one-line format)."""
    for path in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")):
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("URIs:") and "security" not in line:
                return line.split()[1]
    for path in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*.list"))]:
        if path.exists():
            for line in path.read_text(errors="replace").splitlines():
                m = re.match(r"\s*deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+\S+", line)
                if m and "security" not in m.group(1):
                    return m.group(1)
    raise ImageUnavailable("no Debian mirror in /etc/apt/sources.list(.d)")


def _key(suite: str) -> str:
    h = hashlib.sha256(f"{suite}\n{PACKAGES}\n{CLOUD_CFG}\n{MASKED_UNITS}\nv3".encode())
    for crt in sorted(Path("/usr/local/share/ca-certificates").glob("*.crt")):
        h.update(crt.read_bytes())
    return h.hexdigest()[:16]


def build_root(suite: str, dest: Path) -> None:
    """debootstrap `suite` into a fresh directory and pack it as `dest` (a tar)."""
    binary = shutil.which("debootstrap") or "/usr/sbin/debootstrap"
    if not Path(binary).exists():
        raise ImageUnavailable("debootstrap is not installed (apt-get install debootstrap)")
    work = Path(tempfile.mkdtemp(prefix=f"cloud-image-{suite}-", dir="/var/tmp"))
    root = work / "root"
    try:
        proc = subprocess.run(
            [binary, "--variant=minbase", f"--include={','.join(PACKAGES)}", suite, str(root), apt_mirror()],
            capture_output=True, text=True, timeout=1200, check=False)
        if proc.returncode != 0:
            raise ImageUnavailable(f"debootstrap {suite} failed: {(proc.stdout + proc.stderr)[-2000:]}")
        (root / "etc/cloud/cloud.cfg.d/90-container.cfg").write_text(CLOUD_CFG)
        # This machine's network: the certificate authorities it trusts beyond Debian's (a
        # network that inspects TLS on the way to the package index), trusted by the image too,
        # pip included, as any machine on that network must.
        extra = sorted(Path("/usr/local/share/ca-certificates").glob("*.crt"))
        if extra:
            dest_dir = root / "usr/local/share/ca-certificates"
            dest_dir.mkdir(parents=True, exist_ok=True)
            for crt in extra:
                shutil.copyfile(crt, dest_dir / crt.name)
            subprocess.run(["chroot", str(root), "update-ca-certificates"], capture_output=True, check=True,
                           timeout=120)
            (root / "etc/pip.conf").write_text("[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n")
        # The locale cloud-init sets by default, generated as cloud images ship it.
        (root / "etc/locale.gen").write_text("en_US.UTF-8 UTF-8\n")
        gen = subprocess.run(["chroot", str(root), "locale-gen"], capture_output=True, text=True, timeout=300,
                             check=False)
        if gen.returncode != 0:
            raise ImageUnavailable(f"locale-gen in the {suite} root failed: {gen.stdout + gen.stderr}")
        for unit in MASKED_UNITS:
            link = root / "etc/systemd/system" / unit
            link.unlink(missing_ok=True)
            link.symlink_to("/dev/null")
        # A machine id per boot (systemd makes one when the file is empty), as a fresh image has.
        (root / "etc/machine-id").write_text("")
        shutil.rmtree(root / "var/cache/apt/archives", ignore_errors=True)
        (root / "var/cache/apt/archives/partial").mkdir(parents=True, exist_ok=True)
        tmp = dest.with_suffix(".tmp")
        subprocess.run(["tar", "-C", str(root), "--numeric-owner", "-cf", str(tmp), "."], check=True,
                       capture_output=True, timeout=600)
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def ensure_image(client: Any, suite: str = "bullseye") -> str:
    """The image's reference in the engine of `client` (a docker.DockerClient), built or imported
    from the cache as needed."""
    key = _key(suite)
    ref = f"shipyard-cloud-{suite}:{key}"
    if client.api.images(name=ref):
        return ref
    tar = CACHE_DIR / f"{suite}-{key}.tar"
    with file_lock(CACHE_DIR / f"{suite}.lock"):
        if not tar.exists():
            build_root(suite, tar)
    with open(tar, "rb") as f:
        client.api.import_image_from_data(f, repository=f"shipyard-cloud-{suite}", tag=key,
                                          changes=['CMD ["/sbin/init"]'])
    return ref
