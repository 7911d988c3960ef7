"""Container settings, without an engine: the experiment config's fields (expconf), what the master
puts in the task spec (core/containers.py), how the agent chooses the image (daemon), and the
agent's container options."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from agent_bootstrap.agent.config import AgentConfig, ConfigError, load_config
from agent_bootstrap.agent.daemon import Agent, _SetupError, container_environment
from agent_bootstrap.agent.devices import Slot
from agent_bootstrap.agent.runtime import Mount, ProcessRuntime
from control_plane.core.containers import container_spec
from control_plane.core.expconf import ConfigInvalid, byte_size, parse_experiment_config
from shipyard_common.agent_protocol import ContainerSpec, StartCommand, TaskSpec

BASE = {
    "entrypoint": "python3 train.py",
    "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 1}},
    "checkpoint_storage": {"type": "shared_fs", "host_path": "/mnt/ckpt"},
}


def parse(**extra: Any):  # type: ignore[no-untyped-def]
    return parse_experiment_config(yaml.safe_dump({**BASE, **extra}))[0]


def errors(**extra: Any) -> dict[str, str]:
    with pytest.raises(ConfigInvalid) as e:
        parse(**extra)
    return {err.path: err.reason for err in e.value.errors}


@pytest.mark.parametrize(("text", "expected"), [
    (4096, 4096), ("512m", 512 << 20), ("4G", 4 << 30), ("1.5GiB", 3 << 29), ("64 MB", 64 << 20), ("100", 100),
])
def test_sizes_read_as_docker_reads_them(text: Any, expected: int) -> None:
    assert byte_size(text) == expected


def test_container_fields_are_validated_with_their_path() -> None:
    assert errors(resources={"shm_size": "lots"}) == {
        "resources.shm_size": "'lots' is not a size (bytes, or a number with k, m, g or t, e.g. 4G)"}
    assert "resources.memory" in errors(resources={"memory": "-1g"})
    assert "environment.registry_auth.user" in errors(environment={"registry_auth": {"user": "x"}})
    assert "environment.image" in errors(environment={"image": ["a", "b"]})
    assert "environment.force_pull_image" in errors(environment={"force_pull_image": "yes"})


def test_the_master_sends_the_image_of_the_agents_device_type_and_the_mounts() -> None:
    cfg = parse(
        environment={"image": {"cpu": "team/cpu:1", "cuda": "team/cuda:1"}, "force_pull_image": True,
                     "registry_auth": {"username": "u", "password": "s3cret", "serveraddress": "reg.example:5000"}},
        resources={"shm_size": "1g", "memory": "8G"},
        bind_mounts=[{"host_path": "/data", "container_path": "/data", "read_only": True}],
    )
    cpu = container_spec(cfg, "cpu")
    assert (cpu.image, container_spec(cfg, "cuda").image, container_spec(cfg, "rocm").image) == (
        "team/cpu:1", "team/cuda:1", None)
    assert cpu.force_pull and cpu.registry_auth == {"username": "u", "password": "s3cret", "serveraddress": "reg.example:5000"}
    assert (cpu.shm_size_bytes, cpu.memory_bytes) == (1 << 30, 8 << 30)
    assert [(m.host_path, m.container_path, m.read_only) for m in cpu.mounts] == [
        ("/mnt/ckpt", "/mnt/ckpt", False), ("/data", "/data", True)]
    # On the wire and back (camelCase), the credentials never in a repr.
    spec = TaskSpec(allocation_id="a", entrypoint=["x"], container=cpu)
    again = StartCommand.model_validate({"type": "start", "allocationId": "a", "spec": spec.to_wire()})
    assert again.spec.container == cpu and "registryAuth" in spec.to_wire()["container"]
    assert "s3cret" not in repr(cpu) and "s3cret" not in repr(spec)
    # A master without container settings: no image, nothing else.
    assert container_spec(parse(), "cpu") == ContainerSpec(mounts=cpu.mounts[:1], checkpoint_path="/mnt/ckpt")
    # The directory the harness writes checkpoints into: the agent makes it for its task users.
    assert cpu.checkpoint_path == "/mnt/ckpt"


def test_capabilities_and_devices_in_both_spellings_reach_the_agents_launch(tmp_path: Path) -> None:
    """environment.add_capabilities / drop_capabilities and resources.devices (what the master lets
    through with allow_task_host_access): typed at submit, sent, and in the docker launch."""
    cfg = parse(environment={"add_capabilities": ["CAP_NET_ADMIN"], "drop_capabilities": ["MKNOD"]},
                resources={"devices": ["/dev/fuse", "/dev/null:/dev/quiet:rw",
                                       {"host_path": "/dev/zero", "container_path": "/dev/z"}]})
    sent = container_spec(cfg, "cpu")
    assert (sent.cap_add, sent.cap_drop) == (["CAP_NET_ADMIN"], ["MKNOD"])
    assert [(d.host_path, d.container_path, d.mode) for d in sent.devices] == [
        ("/dev/fuse", "/dev/fuse", "mrw"), ("/dev/null", "/dev/quiet", "rw"), ("/dev/zero", "/dev/z", "mrw")]
    wire = TaskSpec(allocation_id="a", entrypoint=["x"], container=sent).to_wire()
    rt = ImageRuntime()
    try:
        launch = agent(tmp_path, rt, CPU, container_image_cpu="base/cpu:1")._container_launch(
            TaskSpec.model_validate(wire), CPU)
        assert launch is not None
        assert (launch.cap_add, launch.cap_drop, launch.devices) == (
            ("CAP_NET_ADMIN",), ("MKNOD",), ("/dev/fuse:/dev/fuse:mrw", "/dev/null:/dev/quiet:rw", "/dev/zero:/dev/z:mrw"))
    finally:
        rt.close()
    assert errors(resources={"devices": ["dev/fuse"]}) == {
        "resources.devices[0]": "host_path must be an absolute path, got 'dev/fuse'"}
    assert errors(resources={"devices": ["/dev/a:/dev/b:rwx"]}) == {
        "resources.devices[0]": "mode must be made of r, w and m, got 'rwx'"}
    assert errors(environment={"add_capabilities": ["net admin"]}) == {
        "environment.add_capabilities[0]": "'net admin' is not a capability name (e.g. SYS_PTRACE, CAP_NET_ADMIN)"}


CPU = [Slot(id="0", type="cpu", brand="cpu")]
GPUS = [Slot(id="0", type="cuda", brand="A10G", uuid="GPU-aaa", index=0),
        Slot(id="1", type="cuda", brand="A10G", uuid="GPU-bbb", index=1)]


class ImageRuntime(ProcessRuntime):
    """Only the attributes the daemon reads to choose: a runtime that runs images."""

    name = "docker"
    runs_images = True


def agent(tmp_path: Path, runtime: Any, slots: list[Slot], **cfg: Any) -> Agent:
    config = AgentConfig(master_url="http://127.0.0.1:9", agent_id="agent-1", work_dir=tmp_path / "work", **cfg)
    return Agent(config, "agent-secret", slots, runtime, base_env={"PATH": "/host/bin", "HOME": "/root"})


def spec(**container: Any) -> TaskSpec:
    return TaskSpec(allocation_id="a1", task_id="t1", entrypoint=["python3", "train.py"], env={"DET_TRIAL_ID": "1"},
                    container=ContainerSpec(**container))


def test_a_process_agent_refuses_an_image_with_the_reason(tmp_path: Path) -> None:
    rt = ProcessRuntime()
    try:
        a = agent(tmp_path, rt, CPU)
        assert a._container_launch(spec(), CPU) is None  # no image: a process, as before
        with pytest.raises(_SetupError) as e:
            a._container_launch(spec(image="team/cpu:1"), CPU)
        assert e.value.message == (
            "the experiment asks for image 'team/cpu:1' (environment.image) but agent agent-1 runs tasks as "
            "processes (runtime: process); run it in a pool whose agents have runtime: docker, or remove "
            "environment.image")
    finally:
        rt.close()


def test_a_docker_agent_chooses_the_image_gpus_and_mounts(tmp_path: Path) -> None:
    rt = ImageRuntime()
    try:
        a = agent(tmp_path, rt, GPUS, container_image_cpu="base/cpu:1", container_mounts=["/opt/env", "/srv/a:/a"])
        with pytest.raises(_SetupError, match="no container image for cuda slots: the experiment sets no "
                                              "environment.image and agent agent-1 has no container_image_cuda"):
            a._container_launch(spec(), GPUS)
        launch = a._container_launch(spec(image="team/cuda:1", shm_size_bytes=5, memory_bytes=7,
                                          mounts=[{"hostPath": "/ck", "containerPath": "/ck"}]), GPUS[1:])
        assert launch is not None
        assert (launch.image, launch.gpus, launch.shm_size_bytes, launch.memory_bytes, launch.task_id) == (
            "team/cuda:1", ("GPU-bbb",), 5, 7, "t1")
        assert launch.mounts[:3] == (Mount("/ck", "/ck"), Mount("/opt/env", "/opt/env", True), Mount("/srv/a", "/a", True))
        cpu_launch = a._container_launch(spec(), CPU)
        assert cpu_launch is not None and (cpu_launch.image, cpu_launch.gpus) == ("base/cpu:1", ())
        # The container gets the task's environment, not the agent host's.
        env = container_environment(spec(), GPUS[1:], "agent-1")
        assert env["CUDA_VISIBLE_DEVICES"] == "GPU-bbb" and "PATH" not in env and "HOME" not in env
    finally:
        rt.close()


def test_agent_container_options_from_every_layer(tmp_path: Path) -> None:
    cfg = load_config(["--runtime", "docker", "--container-mounts", "/opt/py, /work/repo"],
                      env={"DET_AGENT_DOCKER_HOST": "unix:///run/d.sock", "DET_AGENT_CONTAINER_USER": "1000:1000"})
    assert (cfg.runtime, cfg.docker_host, cfg.container_user, cfg.container_mounts) == (
        "docker", "unix:///run/d.sock", "1000:1000", ["/opt/py", "/work/repo"])
    with pytest.raises(ConfigError, match="container_mounts: 'relative/path' must be an absolute path"):
        load_config(["--container-mounts", "relative/path"], env={})


def test_the_api_refuses_bad_container_settings_with_400_and_the_field(client, admin_headers) -> None:  # type: ignore[no-untyped-def]
    for extra, field in (({"resources": {"shm_size": "huge"}}, "config.resources.shm_size"),
                         ({"environment": {"registry_auth": {"token": "x"}}}, "config.environment.registry_auth.token")):
        r = client.post("/api/v1/experiments", headers=admin_headers,
                        json={"config": yaml.safe_dump({**BASE, **extra}), "modelDefinition": []})
        assert r.status_code == 400, r.text
        assert field in [d["field"] for d in r.json()["details"]], r.json()
