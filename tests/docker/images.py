"""The test image, made locally (no registry is reachable here) and cached between runs.

`shipyard-test:<key>` holds only what the host's Python needs from the system: the shared
libraries (ldd closure) of the interpreter, its extension modules and the venv's, the dynamic
loader, `sh`, openssh-server's `sshd` and `ssh-keygen` (shell tasks), /etc/passwd and /tmp. The interpreter, the venv and the repository are not in it: the
agent binds them read-only into each container at their own paths (its `container_mounts`), so the
harness runs inside an image of a few tens of MB that builds in seconds.

The root filesystem tar is cached under ~/.cache/shipyard/docker-images/, keyed by what went into
it, and imported into each test session's engine (`docker import`).
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache"))) / "shipyard" / "docker-images"
ROOT = Path(__file__).resolve().parents[2]
REPO = "shipyard-test"


def host_mounts() -> list[str]:
    """What the agent binds into the test containers: the interpreter's prefix, the venv, the repo."""
    paths = {os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix), str(ROOT)}
    return sorted(paths)


def image_path_env() -> str:
    return f"PATH={Path(sys.prefix) / 'bin'}:{Path(sys.base_prefix) / 'bin'}:/usr/bin:/bin"


def _shared_objects() -> list[Path]:
    roots = [Path(sys.base_prefix), Path(sys.prefix)]
    found = {Path(os.path.realpath(sys.executable))}
    for root in roots:
        for p in root.rglob("*.so*"):
            if p.is_file() and not p.is_symlink() and re.search(r"\.so(\.\d+)*$", p.name):
                found.add(p)
    found.update(Path(b) for b in SSH_BINARIES)
    return sorted(found)


# openssh-server's daemon and key tool, for shell tasks in a container (where the host has them).
SSH_BINARIES = [b for b in ("/usr/sbin/sshd", "/usr/bin/ssh-keygen") if os.path.exists(b)]


def _key(objects: list[Path]) -> str:
    h = hashlib.sha256(image_path_env().encode())
    h.update(Path("/etc/debian_version").read_bytes() if Path("/etc/debian_version").exists() else b"")
    for p in objects:
        st = p.stat()
        h.update(f"{p}:{st.st_size}:{int(st.st_mtime)}\n".encode())
    return h.hexdigest()[:16]


_LDD_LINE = re.compile(r"(?:=>\s*)?(/\S+)\s+\(0x")


def _closure(objects: list[Path], mounted: list[str]) -> set[str]:
    """System libraries the objects load (ldd resolves the whole closure), outside the mounts."""
    libs: set[str] = set()
    shell = os.path.realpath("/bin/sh")
    for i in range(0, len(objects) + 1, 200):
        batch = [str(p) for p in objects[i:i + 200]] + ([shell] if i == 0 else [])
        if not batch:
            continue
        out = subprocess.run(["ldd", *batch], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            m = _LDD_LINE.search(line)
            if m and not any(m.group(1).startswith(root + "/") for root in mounted):
                libs.add(m.group(1))
    return libs


def _add_file(tar: tarfile.TarFile, src: str, dest: str, seen: set[str]) -> None:
    if dest in seen:
        return
    seen.add(dest)
    info = tar.gettarinfo(os.path.realpath(src), arcname=dest.lstrip("/"))
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    with open(os.path.realpath(src), "rb") as f:
        tar.addfile(info, f)


def _dir(tar: tarfile.TarFile, name: str, mode: int = 0o755) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mode = tarfile.DIRTYPE, mode
    tar.addfile(info)


def _symlink(tar: tarfile.TarFile, name: str, target: str) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, target
    tar.addfile(info)


def build_rootfs(dest: Path) -> None:
    objects = _shared_objects()
    libs = _closure(objects, host_mounts())
    tmp = dest.with_suffix(".tmp")
    with tarfile.open(tmp, "w") as tar:
        for d in ("usr", "usr/bin", "usr/sbin", "usr/lib", "usr/lib64", "etc", "proc", "sys", "dev", "run", "run/sshd"):
            _dir(tar, d)
        _dir(tar, "tmp", 0o1777)
        # Debian's merged /usr: the paths ldd printed (/lib/..., /lib64/...) resolve through these.
        for link, target in (("lib", "usr/lib"), ("lib64", "usr/lib64"), ("bin", "usr/bin")):
            _symlink(tar, link, target)
        seen: set[str] = set()
        made: set[str] = {"usr", "usr/bin", "usr/sbin", "usr/lib", "usr/lib64"}
        for lib in sorted(libs):
            real_dir = os.path.realpath(os.path.dirname(lib))
            parts = real_dir.strip("/").split("/")
            for n in range(1, len(parts) + 1):
                d = "/".join(parts[:n])
                if d not in made:
                    made.add(d)
                    _dir(tar, d)
            _add_file(tar, lib, f"{real_dir}/{os.path.basename(lib)}", seen)
        _add_file(tar, os.path.realpath("/bin/sh"), "/usr/bin/sh", seen)
        for binary in SSH_BINARIES:
            _add_file(tar, binary, binary, seen)
        passwd = b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/sh\n"
        for name, data in (("etc/passwd", passwd), ("etc/group", b"root:x:0:\nnogroup:x:65534:\n")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    os.replace(tmp, dest)


def ensure_image(client: object) -> str:
    """The test image's tag in the engine of `client` (a docker.DockerClient), built or imported
    from the cache as needed."""
    objects = _shared_objects()
    tag = _key(objects)
    ref = f"{REPO}:{tag}"
    api = client.api  # type: ignore[attr-defined]
    if api.images(name=ref):
        return ref
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    rootfs = CACHE_DIR / f"{REPO}-{tag}.tar"
    if not rootfs.exists():
        build_rootfs(rootfs)
    api.import_image_from_file(str(rootfs), repository=REPO, tag=tag, changes=[f"ENV {image_path_env()}"])
    return ref
