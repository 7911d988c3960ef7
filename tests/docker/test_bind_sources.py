"""The docker runtime makes the writable directories it bind-mounts before the container starts
(Docker refuses a missing bind source: `bind source path does not exist: .../checkpoints`), and
`det deploy local up --runtime docker` starts its agents with the docker runtime. No engine needed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent_bootstrap.agent.config import load_config
from agent_bootstrap.agent.runtime import Mount
from agent_bootstrap.agent.runtime.base import StartFailed
from agent_bootstrap.agent.runtime.docker import make_bind_sources
from cli.deploy_local import agent_runtime_args
from cli.errors import CliError


def test_missing_writable_bind_sources_are_made_and_read_only_ones_left_alone(tmp_path: Path) -> None:
    ckpt = tmp_path / "shared" / "checkpoints"
    ro = tmp_path / "missing-read-only"
    make_bind_sources([Mount(str(ckpt), "/ckpt"), Mount(str(ro), str(ro), read_only=True)], None, [str(tmp_path)])
    assert ckpt.is_dir() and oct(ckpt.stat().st_mode & 0o777) == oct(0o755 & ~_umask())
    assert not ro.exists()
    make_bind_sources([Mount(str(ckpt), "/ckpt")], None, [])  # already there: nothing to do


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_a_numeric_container_user_gets_the_made_directory(tmp_path: Path) -> None:
    made = tmp_path / "ckpt"
    make_bind_sources([Mount(str(made), "/ckpt")], "1234:2345", [str(tmp_path)])
    assert (made.stat().st_uid, made.stat().st_gid) == (1234, 2345)


def test_a_bind_source_that_cannot_be_made_is_a_start_failure(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(StartFailed) as e:
        make_bind_sources([Mount(str(tmp_path / "file" / "ckpt"), "/ckpt")], None, [str(tmp_path)])
    assert "cannot create the bind source" in str(e.value)


def test_deploy_local_docker_runtime_reaches_the_agent_config(tmp_path: Path) -> None:
    assert agent_runtime_args("process") == []
    argv = ["--master-url", "http://127.0.0.1:8080", "--work-dir", str(tmp_path), *agent_runtime_args("docker")]
    cfg = load_config(argv, env={})
    assert cfg.runtime == "docker"
    assert cfg.container_image_cpu == cfg.container_image_cuda == "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"
    cfg = load_config([*argv, *agent_runtime_args("docker", "python:3.12-slim")], env={})
    assert cfg.container_image_cpu == "python:3.12-slim"
    with pytest.raises(CliError):
        agent_runtime_args("podman")


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current
