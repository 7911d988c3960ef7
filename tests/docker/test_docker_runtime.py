"""The docker runtime (agent_bootstrap/agent/runtime/docker.py) against a real Docker engine."""

from __future__ import annotations

import os
import re
import signal
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from agent_bootstrap.agent.runtime import (
    ContainerLaunch,
    LaunchSpec,
    Mount,
    RuntimeOptions,
    RuntimeUnavailable,
    StartFailed,
    TaskHandle,
    create_runtime,
    stop_task,
)
from agent_bootstrap.agent.runtime.docker import DockerRuntime
from tests.docker.conftest import Engine

pytestmark = pytest.mark.integration


class Output:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def __call__(self, stream: str, text: str) -> None:
        with self._lock:
            self.lines.append((stream, text))

    def text(self, stream: str) -> str:
        with self._lock:
            return "".join(t for s, t in self.lines if s == stream)


@pytest.fixture
def runtime(docker_engine: Engine, tmp_path: Path) -> DockerRuntime:
    rt = create_runtime("docker", RuntimeOptions(work_dir=tmp_path, agent_id="rt-agent",
                                                 docker_host=docker_engine.socket_url))
    assert isinstance(rt, DockerRuntime)
    yield rt
    for c in docker_engine.containers("rt-agent"):
        docker_engine.client.api.remove_container(c["Id"], force=True)
    rt.close()


def launch(engine: Engine, tmp_path: Path, mounts: list[str], code: str, alloc: str = "a1",
           out: Output | None = None, **container: object) -> LaunchSpec:
    workdir = tmp_path / f"task-{alloc}"
    workdir.mkdir(exist_ok=True)
    binds = tuple(Mount(p, p, read_only=True) for p in mounts)
    c = ContainerLaunch(image=str(container.pop("image", engine.image)), task_id=f"task-{alloc}", mounts=binds,
                        **container)  # type: ignore[arg-type]
    return LaunchSpec(allocation_id=alloc, argv=["python3", "-c", code], env={"GREETING": "hi", "PYTHONUNBUFFERED": "1"},
                      workdir=workdir, output=out or Output(), image=c.image, container=c)


def test_a_task_runs_in_its_container_with_env_mounts_and_logs(docker_engine: Engine, runtime: DockerRuntime,
                                                               tmp_path: Path, mounts: list[str]) -> None:
    out = Output()
    code = ("import os, sys, socket; print(os.environ['GREETING'], os.getcwd()); "
            "open('written.txt', 'w').write('from inside'); "
            "print('shm', os.statvfs('/dev/shm').f_blocks * os.statvfs('/dev/shm').f_frsize); "
            "print('err line', file=sys.stderr); print('host', socket.gethostname()); "
            "print('bnd', [l.split()[1] for l in open('/proc/self/status') if l.startswith('CapBnd')][0])")
    spec = launch(docker_engine, tmp_path, mounts, code, out=out, shm_size_bytes=96 * 2**20)
    handle = runtime.start(spec)
    assert runtime.wait(handle) == 0
    # Labelled with the agent and the allocation, until release() removes it.
    (found,) = docker_engine.containers("rt-agent")
    assert found["Labels"]["shipyard.allocation"] == "a1" and found["Labels"]["shipyard.task"] == "task-a1"
    runtime.release(handle)
    assert docker_engine.containers("rt-agent") == []
    stdout = out.text("stdout")
    assert f"hi {spec.workdir}\n" in stdout  # the task directory is bound at its own path, and is the cwd
    assert (spec.workdir / "written.txt").read_text() == "from inside"
    assert f"shm {96 * 2**20}\n" in stdout
    assert f"host {os.uname().nodename}\n" in stdout  # host networking (the host's UTS name too)
    bounding = int(re.search(r"^bnd ([0-9a-f]+)$", stdout, re.M).group(1), 16)  # type: ignore[union-attr]
    assert bounding & (1 << 1) and not bounding & (1 << 13)  # Docker's defaults (CAP_DAC_OVERRIDE), less NET_RAW
    assert out.text("stderr") == "err line\n"
    assert runtime.exit_reason(handle) is None


def test_the_configs_capabilities_and_devices_are_the_containers(docker_engine: Engine, runtime: DockerRuntime,
                                                                   tmp_path: Path, mounts: list[str]) -> None:
    """environment.add_capabilities / drop_capabilities and resources.devices (allowed by the
    master's allow_task_host_access) are what Docker gives the container."""
    out = Output()
    code = ("import os; print([l.split()[1] for l in open('/proc/self/status') if l.startswith('CapBnd')][0]); "
            "print(os.path.exists('/dev/quiet'), open('/dev/quiet', 'w').write('x'))")
    spec = launch(docker_engine, tmp_path, mounts, code, out=out, alloc="caps", cap_add=("CAP_NET_ADMIN", "NET_RAW"),
                  cap_drop=("CHOWN",), devices=("/dev/null:/dev/quiet:rw",))
    handle = runtime.start(spec)
    assert runtime.wait(handle) == 0, out.text("stderr")
    runtime.release(handle)
    bounding_hex, device = out.text("stdout").splitlines()
    bounding = int(bounding_hex, 16)
    assert bounding & (1 << 12) and bounding & (1 << 13)  # NET_ADMIN added; NET_RAW back because asked for
    assert not bounding & (1 << 0) and bounding & (1 << 1)  # CHOWN dropped; the other defaults kept
    assert device == "True 1"


def test_an_optional_mount_whose_source_is_missing_is_left_out(docker_engine: Engine, runtime: DockerRuntime,
                                                                tmp_path: Path, mounts: list[str]) -> None:
    """A TensorBoard's trial event directories are optional read-only mounts: one the agent lacks
    (the trial wrote no events there) is left out instead of Docker refusing the container."""
    present, missing = tmp_path / "events-1", tmp_path / "events-2"
    present.mkdir()
    (present / "e.txt").write_text("event")
    out = Output()
    spec = launch(docker_engine, tmp_path, mounts, "import os, sys; print(sorted(os.listdir(sys.argv[1])), "
                  "os.path.exists(sys.argv[2]))", out=out)
    spec = replace(spec, argv=[*spec.argv, str(present), str(missing)], container=replace(spec.container, mounts=(
        *spec.container.mounts, *(Mount(str(p), str(p), read_only=True, optional=True) for p in (present, missing)))))
    handle = runtime.start(spec)
    assert runtime.wait(handle) == 0, out.text("stderr")
    runtime.release(handle)
    assert out.text("stdout") == "['e.txt'] False\n"
    assert not missing.exists()  # not made on the host either


def test_exit_codes_and_an_oom_kill_have_readable_reasons(docker_engine: Engine, runtime: DockerRuntime,
                                                          tmp_path: Path, mounts: list[str]) -> None:
    h = runtime.start(launch(docker_engine, tmp_path, mounts, "import sys; sys.exit(3)", alloc="exit3"))
    assert runtime.wait(h) == 3 and runtime.exit_reason(h) is None
    runtime.release(h)

    h = runtime.start(launch(docker_engine, tmp_path, mounts, "x = bytearray(400 * 2**20); x[::4096] = b'1' * len(x[::4096])",
                             alloc="oom", memory_bytes=64 * 2**20))
    assert runtime.wait(h) == 137
    reason = runtime.exit_reason(h)
    assert reason is not None and "out of memory" in reason and "64 MiB" in reason, reason
    runtime.release(h)

    with pytest.raises(StartFailed) as e:
        runtime.start(launch(docker_engine, tmp_path, mounts, "pass", alloc="noimage", image="no-such/image:1"))
    assert e.value.exit_code == 125 and "cannot pull image 'no-such/image:1'" in e.value.message

    spec = launch(docker_engine, tmp_path, mounts, "", alloc="noexec")
    spec = LaunchSpec(allocation_id="noexec", argv=["/no/such/binary"], env={}, workdir=spec.workdir,
                      output=spec.output, image=spec.image, container=spec.container)
    h = runtime.start(spec)
    assert runtime.wait(h) == 127
    runtime.release(h)
    assert docker_engine.containers("rt-agent") == []


def test_stop_is_sigterm_then_sigkill_after_the_grace(docker_engine: Engine, runtime: DockerRuntime,
                                                      tmp_path: Path, mounts: list[str]) -> None:
    obeys = ("import signal, sys, time\nprint('ready', flush=True)\ntime.sleep(600)")
    ignores = ("import signal, time\nsignal.signal(signal.SIGTERM, lambda *a: print('got SIGTERM', flush=True))\n"
               "print('ready', flush=True)\nwhile True: time.sleep(0.05)")
    outs = {name: Output() for name in ("obeys", "ignores")}
    handles = {name: runtime.start(launch(docker_engine, tmp_path, mounts, code, alloc=name, out=outs[name]))
               for name, code in (("obeys", obeys), ("ignores", ignores))}
    for name in handles:
        _wait_for(lambda n=name: "ready" in outs[n].text("stdout"))
    assert stop_task(runtime, handles["obeys"], grace=30) == 128 + signal.SIGTERM
    assert stop_task(runtime, handles["ignores"], grace=1) == 128 + signal.SIGKILL
    assert "got SIGTERM" in outs["ignores"].text("stdout")
    for h in handles.values():
        runtime.release(h)
        runtime.signal(h, signal.SIGKILL)  # a released task: nothing to do, no error
    assert docker_engine.containers("rt-agent") == []


def test_a_restarted_runtime_keeps_running_containers_and_removes_the_rest(
        docker_engine: Engine, tmp_path: Path, mounts: list[str]) -> None:
    opts = RuntimeOptions(work_dir=tmp_path, agent_id="rt-agent", docker_host=docker_engine.socket_url)
    first = DockerRuntime(opts)
    code = "import time\nfor i in range(600):\n    print('tick', i, flush=True); time.sleep(0.1)"
    running = first.start(launch(docker_engine, tmp_path, mounts, code, alloc="keep"))
    gone_dir = first.start(launch(docker_engine, tmp_path, mounts, code, alloc="nodir"))
    ended = first.start(launch(docker_engine, tmp_path, mounts, "pass", alloc="ended"))
    assert first.wait(ended) == 0
    (tmp_path / "task-nodir").rename(tmp_path / "moved")
    first.close()  # the agent dies: its containers do not

    second = DockerRuntime(opts)
    assert second.clean_up_leftovers() == 2
    (left,) = second.leftovers()
    assert left.handle.allocation_id == "keep" and left.task_id == "task-keep"
    assert left.workdir == tmp_path / "task-keep"
    assert [c["Labels"]["shipyard.allocation"] for c in docker_engine.containers("rt-agent")] == ["keep"]
    out = Output()
    second.resume(left.handle, out)
    _wait_for(lambda: "tick" in out.text("stdout"))
    assert stop_task(second, left.handle, grace=5) == 128 + signal.SIGTERM
    second.release(left.handle)
    assert docker_engine.containers("rt-agent") == []
    assert isinstance(running, TaskHandle) and isinstance(gone_dir, TaskHandle)
    second.close()


def test_an_unreachable_engine_is_one_readable_error(tmp_path: Path) -> None:
    with pytest.raises(RuntimeUnavailable, match=r"runtime docker: no Docker engine answers at unix://"):
        DockerRuntime(RuntimeOptions(work_dir=tmp_path, agent_id="x", docker_host=f"unix://{tmp_path}/none.sock"))


def _wait_for(pred, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    import time

    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.05)


def test_a_numeric_container_user_owns_the_task_directory(docker_engine: Engine, tmp_path: Path,
                                                          mounts: list[str]) -> None:
    rt = DockerRuntime(RuntimeOptions(work_dir=tmp_path, agent_id="rt-agent", docker_host=docker_engine.socket_url,
                                      container_user="65534:65534"))
    try:
        spec = launch(docker_engine, tmp_path, mounts,
                      "import os; print(os.getuid(), os.getgid(), open('private.txt').read()); open('out', 'w')",
                      alloc="user", out=Output())
        private = spec.workdir / "private.txt"
        private.write_text("token")
        private.chmod(0o600)
        h = rt.start(spec)
        assert rt.wait(h) == 0, spec.output.text("stderr")  # type: ignore[attr-defined]
        rt.release(h)
        assert "65534 65534 token\n" in spec.output.text("stdout")  # type: ignore[attr-defined]
        assert (spec.workdir / "out").stat().st_uid == 65534
    finally:
        rt.close()
