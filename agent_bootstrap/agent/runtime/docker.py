"""DockerRuntime: the `docker` task runtime (runtime/base.py), a task as a container of the Docker
Engine, through the `docker` SDK (imported when the runtime is created, so that agents running
processes do not need it).

A container per allocation, made from LaunchSpec.container (the daemon chose the image and the
mounts):
  * the image pulled when missing, or always with `force_pull` (`environment.force_pull_image`),
    with the experiment's registry credentials;
  * host networking (rendezvous and the master's URL work as for a process), `init` (docker-init:
    signals reach the trial, zombies are reaped, a signal death is exit 128+N);
  * the task directory and the mounts bound at their paths, the Core API's environment as given;
  * GPUs by a device request for exactly the allocation's GPUs (none on CPU slots);
  * /dev/shm and memory limits; the agent's `container_user` (a numeric uid[:gid] is given the
    task directory, which the agent wrote as itself);
  * labels `shipyard.agent=<agent id>`, `shipyard.allocation=<id>` (+ task id, task dir), by which
    a restarted agent finds its containers;
  * json-file logs (bounded), followed by two threads (stdout, stderr) into the output callback.

Kill: stop_task's SIGTERM → grace → SIGKILL, through `docker kill --signal`. Exit: the container's
exit code; an OOM kill (State.OOMKilled) has its own reason. release() removes the container.

No orphans: containers outlive their agent (there is no pdeathsig for them). At start
(clean_up_leftovers) the agent removes its labelled containers that have ended or whose task
directory is gone, and keeps the running ones as leftovers(): the daemon reports them at
registration and the master keeps those it still wants (reattached: waited for, logs followed from
now on) and lists the others in `kill` (stopped and removed like any task).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent_bootstrap.agent import determined_env
from agent_bootstrap.agent.host_paths import outside_roots
from agent_bootstrap.agent.logship import LineAssembler
from agent_bootstrap.agent.runtime import accounts, harness_libs
from agent_bootstrap.agent.runtime.base import (
    LaunchSpec,
    LeftoverTask,
    OutputFn,
    RuntimeOptions,
    RuntimeUnavailable,
    StartFailed,
    Stream,
    TaskHandle,
    register_runtime,
)

log = logging.getLogger("shipyard.agent.runtime")

NAME = "docker"
LABEL_AGENT = "shipyard.agent"
LABEL_ALLOCATION = "shipyard.allocation"
LABEL_TASK = "shipyard.task"
LABEL_WORKDIR = "shipyard.taskdir"
DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"
# json-file logs are what the output threads follow; bounded so a chatty trial cannot fill the disk.
LOG_MAX_SIZE = "50m"
LOG_MAX_FILES = "2"
PROBE_TIMEOUT_S = 30  # asking an image's python3 for its version (harness_libs)

_NOT_FOUND = re.compile(r"executable file not found|no such file or directory", re.I)
_NOT_EXECUTABLE = re.compile(r"permission denied", re.I)
_NUMERIC_USER = re.compile(r"^(\d+)(?::(\d+))?$")


@dataclass(eq=False)
class _Container:
    """The runtime's data in a TaskHandle."""

    id: str
    readers: list[threading.Thread] = field(default_factory=list, repr=False)
    state: dict[str, Any] | None = None  # State of the container once it has ended
    memory_bytes: int | None = None
    released: bool = False
    signalled: bool = False  # the agent sent it a signal (a SIGKILL from us is no OOM kill)


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):g} {unit}"
    return f"{n} bytes"


def _cap(name: str) -> str:
    """A capability as Docker's API takes it (NET_ADMIN for CAP_NET_ADMIN)."""
    return name.upper().removeprefix("CAP_")


def _explanation(e: Exception) -> str:
    text = getattr(e, "explanation", None) or str(e)
    return text.decode(errors="replace") if isinstance(text, bytes) else str(text)


def _follow(stream: Stream, chunks: Any, output: OutputFn, allocation_id: str) -> None:
    assembler = LineAssembler()

    def deliver(lines: list[str]) -> None:
        for line in lines:
            try:
                output(stream, line)
            except Exception:  # a broken sink must not stop the reading
                log.exception("event=output_callback_failed allocation=%s", allocation_id)

    try:
        for chunk in chunks:
            deliver(assembler.feed(chunk))
    except Exception as e:  # the engine went away, the container was removed: the stream ends
        log.debug("event=container_log_stream_ended allocation=%s stream=%s error=%r", allocation_id, stream, str(e))
    deliver(assembler.finish())


class DockerRuntime:
    name = NAME
    runs_images = True

    def __init__(self, options: RuntimeOptions, poll_interval: float = 0.1) -> None:
        try:
            import docker  # the SDK: only agents running containers need it
        except ImportError:
            raise RuntimeUnavailable("runtime docker: the `docker` Python package is not installed "
                                     "(pip install docker, or apt-get install python3-docker)") from None
        self._sdk = docker
        self.agent_id = options.agent_id
        if not self.agent_id:
            raise ValueError("the docker runtime needs the agent's id (its containers are labelled with it)")
        self.user = options.container_user
        self.work_dir = options.work_dir
        self.poll_interval = poll_interval
        self.base_url = options.docker_host or os.environ.get("DOCKER_HOST") or DEFAULT_DOCKER_HOST
        try:
            # Asks the engine its API version, so an engine that does not answer fails here.
            self.client = docker.DockerClient(base_url=self.base_url, timeout=120)
            self.client.ping()
        except Exception as e:
            raise RuntimeUnavailable(f"runtime docker: no Docker engine answers at {self.base_url}: "
                                     f"{_explanation(e)}") from None
        self._leftovers: list[LeftoverTask] = []
        self.harness_libs = harness_libs.HarnessLibs(options.work_dir / "harness-libs") if options.harness_libs else None
        self._pythons: dict[Any, Any] = {}  # (image id, PATH, read-only mounts) → its python3's (major, minor)
        self._etc: dict[str, tuple[str, str]] = {}  # image id → its /etc/passwd and /etc/group
        self.etc_root = options.work_dir / "task-etc"  # the account files bound into containers (root's)

    # -- starting --------------------------------------------------------------------------------

    def _ensure_image(self, spec: LaunchSpec) -> None:
        c = spec.container
        assert c is not None
        errors = self._sdk.errors
        if not c.force_pull:
            try:
                self.client.images.get(c.image)
                return
            except errors.ImageNotFound:
                pass
            except errors.APIError as e:
                raise StartFailed(125, f"cannot inspect image {c.image!r}: {_explanation(e)}") from None
        spec.output("stderr", f"[shipyard-agent] pulling image {c.image}\n")
        repo, tag = _split_image(c.image)
        try:
            self.client.images.pull(repo, tag=tag, auth_config=c.registry_auth or None)
        except errors.APIError as e:
            raise StartFailed(125, f"cannot pull image {c.image!r}: {_explanation(e)}") from None
        except Exception as e:  # connection errors: the registry or the engine
            raise StartFailed(125, f"cannot pull image {c.image!r}: {e}") from None

    def start(self, spec: LaunchSpec) -> TaskHandle:
        c = spec.container
        if c is None or not c.image:
            raise StartFailed(125, "the docker runtime needs an image (environment.image or the agent's default)")
        argv = list(spec.argv)
        if not argv or not argv[0]:
            raise StartFailed(127, "entrypoint is empty")
        self._ensure_image(spec)
        # run_as: the daemon gave the task its directory already (agent/identity.py).
        user = f"{spec.run_as.uid}:{spec.run_as.gid}" if spec.run_as is not None else self.user
        if spec.run_as is None:
            self._give_task_dir(spec.workdir)
        make_bind_sources(c.mounts, user, (c.storage_root, str(self.work_dir)))
        types = self._sdk.types
        mounts = [types.Mount(target=str(spec.workdir), source=str(spec.workdir), type="bind")]
        mounts += [types.Mount(target=m.container_path, source=m.host_path, type="bind", read_only=m.read_only)
                   for m in c.mounts if not (m.optional and not os.path.exists(m.host_path))]
        env = dict(spec.env)
        if spec.run_as is not None:
            mounts += self._account_mounts(c.image, spec)
        if self.harness_libs is not None:
            mounts, env = self._with_harness_libs(spec, mounts, env)
        kwargs: dict[str, Any] = dict(
            image=c.image, entrypoint=argv, environment=env, working_dir=str(spec.workdir),
            network_mode="host", init=True, detach=True, stdin_open=False, tty=False, mounts=mounts,
            name=f"shipyard-{re.sub(r'[^A-Za-z0-9_.-]', '_', spec.allocation_id)[:80]}-{secrets.token_hex(3)}",
            labels={LABEL_AGENT: self.agent_id, LABEL_ALLOCATION: spec.allocation_id, LABEL_TASK: c.task_id,
                    LABEL_WORKDIR: str(spec.workdir)},
            log_config=types.LogConfig(type="json-file", config={"max-size": LOG_MAX_SIZE, "max-file": LOG_MAX_FILES}),
        )
        if user:
            kwargs["user"] = user
        added = [_cap(x) for x in c.cap_add]
        if spec.run_as is not None:
            # Unprivileged (issue 27): never privileged, no capabilities but those the config adds
            # (allow_task_host_access), no setuid way back.
            kwargs.update(privileged=False, cap_drop=["ALL"], security_opt=["no-new-privileges"])
        else:
            # The image's or container_user's own user keeps Docker's default capabilities (an
            # image's root installs packages), but not raw sockets (unless the config adds them): on
            # the host's network they would read every connection of the host, other tasks' tokens
            # to the master included.
            dropped = ["NET_RAW", *(_cap(x) for x in c.cap_drop)]
            kwargs.update(privileged=False, cap_drop=[x for x in dict.fromkeys(dropped) if x not in added])
        if added:
            kwargs["cap_add"] = added
        if c.devices:
            kwargs["devices"] = list(c.devices)
        if c.shm_size_bytes:
            kwargs["shm_size"] = c.shm_size_bytes
        if c.memory_bytes:
            kwargs["mem_limit"] = c.memory_bytes
            kwargs["memswap_limit"] = c.memory_bytes  # no swap on top: over the limit is an OOM kill
        if c.gpus:
            kwargs["device_requests"] = [types.DeviceRequest(device_ids=list(c.gpus), capabilities=[["gpu"]])]
        errors = self._sdk.errors
        try:
            container = self.client.containers.create(**kwargs)
        except errors.APIError as e:
            raise StartFailed(125, f"cannot create the container from {c.image!r}: {_explanation(e)}") from None
        try:
            container.start()
        except errors.APIError as e:
            with contextlib.suppress(Exception):
                container.remove(force=True)
            text = _explanation(e)
            if _NOT_FOUND.search(text):
                raise StartFailed(127, f"entrypoint not found in image {c.image!r}: {argv[0]!r} ({text})") from None
            if _NOT_EXECUTABLE.search(text):
                raise StartFailed(126, f"entrypoint is not executable: {argv[0]!r} ({text})") from None
            raise StartFailed(125, f"cannot start the container: {text}") from None
        data = _Container(id=container.id, memory_bytes=c.memory_bytes)
        handle = TaskHandle(id=container.id[:12], allocation_id=spec.allocation_id, runtime=NAME,
                            pid=self._pid(container.id), data=data)
        self._follow_logs(handle, spec.output, since=None)
        log.info("event=task_container_started allocation=%s container=%s image=%r gpus=%d", spec.allocation_id,
                 handle.id, c.image, len(c.gpus))
        return handle

    def _with_harness_libs(self, spec: LaunchSpec, mounts: list[Any], env: dict[str, str]) -> tuple[list[Any], dict[str, str]]:
        """The harness bound at its host path (unless a mount is there already) and, for the image's
        Python, the directory of the harness's libraries (runtime/harness_libs.py) at CONTAINER_PATH,
        named in the environment for the task's sitecustomize. Where the image has no python3 or pip
        fails, the task starts without them (one line in its log says why)."""
        assert self.harness_libs is not None and spec.container is not None
        types = self._sdk.types
        mounts = list(mounts)
        root = str(determined_env.PACKAGE_ROOT)
        if (determined_env.PACKAGE_ROOT / "harness").is_dir() and all(m["Target"] != root for m in mounts):
            mounts.append(types.Mount(target=root, source=root, type="bind", read_only=True))
        python = self._image_python(spec.container.image, [m for m in mounts if m.get("ReadOnly")], env.get("PATH"))
        if python is None:
            spec.output("stderr", f"[shipyard-agent] image {spec.container.image} has no python3 that answers: "
                                  "the harness's libraries are not added\n")
            return mounts, env
        try:
            path, built = self.harness_libs.ensure(python)
        except harness_libs.HarnessLibsUnavailable as e:
            spec.output("stderr", f"[shipyard-agent] the harness's libraries are not added: {e}\n")
            return mounts, env
        if built:
            spec.output("stderr", f"[shipyard-agent] installed {', '.join(self.harness_libs.requirements)} for "
                                  f"Python {python[0]}.{python[1]} (used where the image lacks them)\n")
        log.info("event=harness_libs allocation=%s python=%d.%d built=%s", spec.allocation_id, *python, built)
        mounts.append(types.Mount(target=harness_libs.CONTAINER_PATH, source=str(path), type="bind", read_only=True))
        return mounts, {**env, harness_libs.ENV: harness_libs.CONTAINER_PATH}

    def _image_python(self, image: str, mounts: list[Any], path: str | None) -> tuple[int, int] | None:
        """The (major, minor) of the `python3` the task would run in `image` (its PATH, the task's
        read-only mounts), asked once per image: as nobody, no capabilities, no network, at most
        PROBE_TIMEOUT_S. Only an answer is remembered (an engine error is asked again next time)."""
        try:
            image_id = self.client.api.inspect_image(image)["Id"]
        except Exception:
            image_id = image
        key = (image_id, path, tuple(sorted((m["Target"], m["Source"]) for m in mounts)))
        if key in self._pythons:
            return self._pythons[key]
        container = None
        try:
            container = self.client.containers.create(
                image, entrypoint=["python3", "-c", harness_libs.PROBE], network_mode="none", mounts=mounts,
                environment={"PATH": path} if path else None, user="65534:65534", privileged=False,
                cap_drop=["ALL"], security_opt=["no-new-privileges"],
                # Ours, empty: an image's own shipyard.* labels must not make it a task's leftover.
                labels=dict.fromkeys((LABEL_AGENT, LABEL_ALLOCATION, LABEL_TASK, LABEL_WORKDIR), ""))
            container.start()
            container.wait(timeout=PROBE_TIMEOUT_S)
            version = harness_libs.parse_version(container.logs(stdout=True, stderr=False).decode(errors="replace"))
        except Exception as e:
            log.warning("event=image_python_unknown image=%r error=%r", image, _explanation(e))
            return None
        finally:
            if container is not None:
                with contextlib.suppress(Exception):
                    container.remove(force=True)
        if version is not None:
            self._pythons[key] = version
        return version

    def _account_mounts(self, image: str, spec: LaunchSpec) -> list[Any]:
        """/etc/passwd and /etc/group with the task's user and group (runtime/accounts.py), bound
        read-only over the image's where it lacks them; written by the agent (root-owned, 0644) under
        its own work directory, named by their content (never in the task's directory, which the
        task's user owns). An image whose files cannot be read gets none."""
        assert spec.run_as is not None
        try:
            image_id = self.client.api.inspect_image(image)["Id"]
            if image_id not in self._etc:
                self._etc[image_id] = (self._image_file(image, "/etc/passwd"), self._image_file(image, "/etc/group"))
        except Exception as e:
            log.warning("event=image_accounts_unknown image=%r error=%r", image, _explanation(e))
            return []
        uid, gid = spec.run_as.uid, spec.run_as.gid
        try:
            import pwd

            name = pwd.getpwuid(uid).pw_name
        except (ImportError, KeyError):
            name = "task"
        files = accounts.with_task_account(*self._etc[image_id], name=name, uid=uid, gid=gid, home=str(spec.workdir))
        out = []
        for target, text in zip(("/etc/passwd", "/etc/group"), files):
            if text is None:
                continue
            path = accounts.write_file(self.etc_root, Path(target).name, text)
            out.append(self._sdk.types.Mount(target=target, source=str(path), type="bind", read_only=True))
        return out

    def _image_file(self, image: str, path: str) -> str:
        """A text file of the image ("" when it has none), read from a created, never started, container."""
        import io
        import tarfile

        container = self.client.api.create_container(image, command=["true"], network_disabled=True)
        try:
            stream, _stat = self.client.api.get_archive(container["Id"], path)
            with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
                member = tar.next()
                if member is not None and member.size > accounts.MAX_FILE_BYTES:
                    raise ValueError(f"{path} is {member.size} bytes")
                f = tar.extractfile(member) if member is not None else None
                return f.read().decode("utf-8", errors="replace") if f is not None else ""
        except self._sdk.errors.NotFound:
            return ""
        finally:
            with contextlib.suppress(Exception):
                self.client.api.remove_container(container["Id"], force=True)

    def _give_task_dir(self, workdir: Path) -> None:
        """A numeric `container_user` gets the task directory (the code, the private info files with
        the task's token): the agent wrote it as itself, the trial runs as that user."""
        m = _NUMERIC_USER.match(self.user or "")
        if not m:
            return
        uid = int(m.group(1))
        gid = int(m.group(2)) if m.group(2) else uid
        try:
            for root, dirs, names in os.walk(workdir):
                os.chown(root, uid, gid)
                for name in dirs + names:
                    os.lchown(os.path.join(root, name), uid, gid)
        except OSError as e:
            raise StartFailed(125, f"cannot give the task directory to container_user {self.user}: {e.strerror}") from None

    def _pid(self, cid: str) -> int | None:
        try:
            pid = self.client.api.inspect_container(cid)["State"].get("Pid")
        except Exception:
            return None
        return int(pid) if pid else None

    def _follow_logs(self, handle: TaskHandle, output: OutputFn, since: int | None) -> None:
        data = _task(handle)
        for stream in ("stdout", "stderr"):
            kw: dict[str, Any] = {"stdout": stream == "stdout", "stderr": stream == "stderr"}
            if since is not None:
                kw["since"] = since
            chunks = self.client.api.logs(data.id, stream=True, follow=True, **kw)
            t = threading.Thread(target=_follow, args=(stream, chunks, output, handle.allocation_id),
                                 name=f"task-{stream}-{handle.allocation_id}", daemon=True)
            t.start()
            data.readers.append(t)

    # -- running ---------------------------------------------------------------------------------

    def signal(self, handle: TaskHandle, sig: int) -> None:
        data = _task(handle)
        if data.released or data.state is not None:
            return
        data.signalled = True
        try:
            self.client.api.kill(data.id, signal=int(sig))
        except self._sdk.errors.NotFound:
            pass
        except self._sdk.errors.APIError as e:
            if e.status_code != 409:  # 409: not running any more
                raise

    def _state(self, data: _Container) -> dict[str, Any] | None:
        """The container's State once it has ended (cached), else None."""
        if data.state is not None:
            return data.state
        try:
            state = self.client.api.inspect_container(data.id)["State"]
        except self._sdk.errors.NotFound:
            data.state = {"ExitCode": 137, "Error": "the container was removed behind the agent's back"}
            return data.state
        if state.get("Running") or state.get("Status") in ("created", "restarting"):
            return None
        data.state = state = self._settle_oom(data, state)
        return state

    #: How long a SIGKILLed container's State may lag its OOM kill: containerd can deliver the OOM
    #: event after the exit event (its shim sends them on separate paths), and dockerd sets
    #: State.OOMKilled only when the OOM event arrives, so an inspect right after the exit can read
    #: OOMKilled false for a kill by the kernel.
    OOM_SETTLE_S = 3.0

    def _settle_oom(self, data: _Container, state: dict[str, Any]) -> dict[str, Any]:
        """The ended State, re-read for up to OOM_SETTLE_S while it says "killed (137), not by the
        OOM killer" for a container with a memory limit that the agent never signalled: only then
        can the OOM flag still be on its way."""
        if (int(state.get("ExitCode", 0)) != 137 or state.get("OOMKilled") or not data.memory_bytes
                or data.signalled):
            return state
        deadline = time.monotonic() + self.OOM_SETTLE_S
        while time.monotonic() < deadline:
            time.sleep(0.1)
            try:
                state = self.client.api.inspect_container(data.id)["State"]
            except self._sdk.errors.NotFound:
                break
            if state.get("OOMKilled"):
                break
        return state

    def wait(self, handle: TaskHandle, timeout: float | None = None) -> int | None:
        data = _task(handle)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            state = self._state(data)
            if state is not None:
                return int(state.get("ExitCode", 0))
            if deadline is not None and time.monotonic() >= deadline:
                return None
            time.sleep(self.poll_interval if deadline is None else
                       max(0.0, min(self.poll_interval, deadline - time.monotonic())))

    def exit_reason(self, handle: TaskHandle) -> str | None:
        data = _task(handle)
        state = data.state
        if state is None:
            return None
        code = int(state.get("ExitCode", 0))
        if state.get("OOMKilled"):
            limit = (f"the container's memory limit of {_size(data.memory_bytes)} (resources.memory)"
                     if data.memory_bytes else "the memory available to the container")
            return f"killed: out of memory (the trial used more than {limit}), exit code {code}"
        if state.get("Error"):
            return f"exited with code {code}: {state['Error']}"
        return None

    def release(self, handle: TaskHandle, output_timeout: float = 5.0) -> None:
        data = _task(handle)
        if data.released:
            return
        for t in data.readers:
            t.join(output_timeout)
            if t.is_alive():
                log.warning("event=task_output_still_open allocation=%s thread=%s", handle.allocation_id, t.name)
        data.released = True
        self._remove(data.id)

    def _remove(self, cid: str) -> None:
        try:
            self.client.api.remove_container(cid, force=True)
        except self._sdk.errors.NotFound:
            pass
        except self._sdk.errors.APIError as e:
            if e.status_code != 409:  # 409: removal already in progress
                raise

    # -- restarts --------------------------------------------------------------------------------

    def clean_up_leftovers(self) -> int:
        """Remove this agent's containers that cannot be reattached to (ended, no task directory);
        keep the running ones for leftovers()."""
        removed = 0
        self._leftovers = []
        found = self.client.api.containers(all=True, filters={"label": f"{LABEL_AGENT}={self.agent_id}"})
        for summary in found:
            cid = summary["Id"]
            labels = summary.get("Labels") or {}
            alloc = labels.get(LABEL_ALLOCATION, "")
            workdir = labels.get(LABEL_WORKDIR, "")
            if summary.get("State") == "running" and alloc and workdir and Path(workdir).is_dir():
                token = None
                with contextlib.suppress(Exception):
                    env = self.client.api.inspect_container(cid)["Config"].get("Env") or []
                    token = next((e.split("=", 1)[1] for e in env if e.startswith("DET_SESSION_TOKEN=")), None)
                handle = TaskHandle(id=cid[:12], allocation_id=alloc, runtime=NAME, pid=self._pid(cid),
                                    data=_Container(id=cid))
                self._leftovers.append(LeftoverTask(handle=handle, task_id=labels.get(LABEL_TASK, ""),
                                                    token=token, workdir=Path(workdir)))
                log.info("event=leftover_container_found allocation=%s container=%s", alloc, cid[:12])
                continue
            self._remove(cid)
            removed += 1
            log.warning("event=leftover_container_removed allocation=%s container=%s state=%s", alloc, cid[:12],
                        summary.get("State"))
        return removed

    def leftovers(self) -> list[LeftoverTask]:
        return list(self._leftovers)

    def resume(self, handle: TaskHandle, output: OutputFn) -> None:
        # Lines written while no agent was there are not shipped again (the previous agent shipped
        # those it had read); from now on everything is.
        self._follow_logs(handle, output, since=int(time.time()))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.close()


def make_bind_sources(mounts: Any, user: str | None, roots: Sequence[str | None]) -> None:
    """Docker refuses a bind mount whose source is missing (`bind source path does not exist`): the
    writable ones (a shared_fs checkpoint storage's host_path) are made here, 0755, and given to a
    numeric `container_user` as the task directory is, but only under `roots` (host_paths.py); a
    missing one elsewhere, like a missing read-only source, stays an error."""
    m = _NUMERIC_USER.match(user or "")
    for mount in mounts:
        if mount.read_only or mount.optional or os.path.exists(mount.host_path):
            continue
        refused = outside_roots(mount.host_path, roots)
        if refused is not None:
            raise StartFailed(125, f"cannot bind {mount.host_path}: {refused}")
        try:
            os.makedirs(mount.host_path, mode=0o755, exist_ok=True)
            if m:
                uid = int(m.group(1))
                os.chown(mount.host_path, uid, int(m.group(2)) if m.group(2) else uid)
        except OSError as e:
            raise StartFailed(125, f"cannot create the bind source {mount.host_path}: {e.strerror}") from None


def _split_image(image: str) -> tuple[str, str | None]:
    """`repo[:tag][@digest]` → (repo, tag or digest) as images.pull takes them (a registry port is no tag)."""
    if "@" in image:
        repo, digest = image.split("@", 1)
        return repo, digest
    slash = image.rfind("/")
    colon = image.rfind(":")
    if colon > slash:
        return image[:colon], image[colon + 1:]
    return image, "latest"


def _task(handle: TaskHandle) -> _Container:
    if handle.runtime != NAME or not isinstance(handle.data, _Container):
        raise ValueError(f"handle {handle.id} of allocation {handle.allocation_id} is not a docker task")
    return handle.data


def _create(options: RuntimeOptions) -> DockerRuntime:
    return DockerRuntime(options)


register_runtime(NAME, _create)
