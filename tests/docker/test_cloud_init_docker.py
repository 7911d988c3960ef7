"""cloud-init for pools with `container_runtime: docker` (agent_bootstrap/cloud_init.py): the engine
installed and started before the agent, NVIDIA's container toolkit on GPU instances, the agent
configured to run containers."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent_bootstrap.agent.config import load_config
from agent_bootstrap.cloud_init import (
    BOOT_SCRIPT_PATH,
    CONFIG_PATH,
    DOCKER_SETUP_PATH,
    BootstrapParams,
    pip_pins,
    render_user_data,
)
from control_plane.config import ConfigError
from control_plane.config import load_config as load_master_config
from tests.pg import missing_part

TOKEN = "bootstrap-SECRET-token-0123456789abcdef"


def params(**kw: Any) -> BootstrapParams:
    base: dict[str, Any] = dict(master_url="http://10.0.0.2:8080", pool="gpu", bootstrap_token=TOKEN,
                                provider="aws", launch_id="5f0c2a9e1d4b4e7f8a6b3c2d1e0f9a8b", container_runtime="docker")
    base.update(kw)
    return BootstrapParams(**base)


def files_of(text: str) -> dict[str, dict[str, Any]]:
    return {f["path"]: f for f in yaml.safe_load(text)["write_files"]}


@pytest.mark.parametrize("provider", ["aws", "gcp"])
def test_docker_user_data_passes_cloud_init_schema(provider: str, tmp_path: Path) -> None:
    if shutil.which("cloud-init") is None:
        missing_part("the cloud-init binary is not installed (apt-get install cloud-init)")
    path = tmp_path / "user-data"
    text = render_user_data(params(provider=provider, startup_script="echo prepare\n"))
    path.write_text(text)
    proc = subprocess.run(["cloud-init", "schema", "--config-file", str(path)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(text.encode()) < 16 * 1024  # AWS's cap on user-data


def test_docker_pools_install_the_engine_before_the_agent_and_run_containers(tmp_path: Path) -> None:
    text = render_user_data(params())
    doc = yaml.safe_load(text)
    assert {"docker.io", "python3-docker", "python3"} <= set(doc["packages"])
    assert doc["runcmd"] == [[DOCKER_SETUP_PATH], [BOOT_SCRIPT_PATH]]
    files = files_of(text)
    assert files[DOCKER_SETUP_PATH]["permissions"] == "0755"
    cfg_path = tmp_path / "agent.yaml"
    cfg_path.write_text(files[CONFIG_PATH]["content"])
    loaded = load_config(["--config", str(cfg_path)], env={})
    assert loaded.runtime == "docker" and loaded.container_harness_libs  # unmodified images get the harness
    assert any(pin.startswith("docker") for pin in pip_pins("docker")) and not any(
        pin.startswith("docker") for pin in pip_pins())
    # A pool that runs processes gets none of it.
    plain = render_user_data(params(container_runtime="process"))
    assert DOCKER_SETUP_PATH not in plain and "docker.io" not in plain and "runtime: docker" not in plain
    assert "container_harness_libs" not in plain
    with pytest.raises(ValueError, match="container_runtime: must be one of process, docker"):
        params(container_runtime="podman")


def test_the_pool_config_names_the_container_runtime(tmp_path: Path) -> None:
    cfg = tmp_path / "master.yaml"
    cfg.write_text("resource_pools:\n  - name: gpu\n    container_runtime: docker\n  - name: default\n")
    master = load_master_config(cfg, env={})
    assert master.pool("gpu").container_runtime == "docker" and master.pool("default").container_runtime == "process"
    cfg.write_text("resource_pools:\n  - name: gpu\n    container_runtime: lxc\n")
    with pytest.raises(ConfigError, match="container_runtime"):
        load_master_config(cfg, env={})


def _stubs(bin_dir: Path, calls: Path, gpus: bool) -> None:
    bin_dir.mkdir()
    stub = "#!/bin/bash\necho \"$(basename \"$0\") $*\" >> " + str(calls) + "\n"
    scripts = {
        "docker": stub + "exit 0\n",
        "dockerd": stub + "exit 0\n",
        "nvidia-smi": stub + ("echo 'GPU 0: NVIDIA A10G (UUID: GPU-1)'\n" if gpus else "exit 9\n"),
        # The image's apt sources have the toolkit: installing it brings nvidia-ctk.
        "apt-get": stub + f"printf '#!/bin/bash\\necho \"nvidia-ctk $*\" >> {calls}\\n' > {bin_dir}/nvidia-ctk\n"
                          f"chmod +x {bin_dir}/nvidia-ctk\n",
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)


@pytest.mark.parametrize("gpus", [True, False])
def test_the_setup_script_adds_nvidias_toolkit_only_on_gpu_instances(gpus: bool, tmp_path: Path) -> None:
    script = tmp_path / "setup"
    script.write_text(files_of(render_user_data(params()))[DOCKER_SETUP_PATH]["content"])
    calls = tmp_path / "calls"
    calls.touch()
    _stubs(tmp_path / "bin", calls, gpus)
    pidfile = tmp_path / "docker.pid"
    pidfile.write_text(str(os.getpid() + 10_000_000))  # no such process: the HUP fails harmlessly
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "SHIPYARD_DOCKER_PIDFILE": str(pidfile)}
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "event=docker_ready" in proc.stderr
    seen = calls.read_text()
    if gpus:
        assert "apt-get install -y -q nvidia-container-toolkit" in seen
        assert "nvidia-ctk runtime configure --runtime=docker" in seen
    else:
        assert "nvidia" not in seen.replace("nvidia-smi", "") and "event=no_gpus" in proc.stderr


def test_the_autoscaler_renders_the_pools_container_runtime(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from control_plane.config import MasterConfig
    from control_plane.loops.autoscaler import Autoscaler
    from provisioners.base import UserDataKind
    from provisioners.factory import ElasticSettings

    config = MasterConfig(state_dir=tmp_path, resource_pools=[
        {"name": "gpu", "container_runtime": "docker"}, {"name": "default"}])
    scaler = Autoscaler(SimpleNamespace(config=config))  # type: ignore[arg-type]
    pp = SimpleNamespace(provider_type=SimpleNamespace(user_data=UserDataKind.CLOUD_INIT),
                         settings=ElasticSettings(type="aws"))
    gpu = scaler.default_user_data("gpu", "5f0c2a9e1d4b4e7f8a6b3c2d1e0f9a8b", TOKEN, pp)  # type: ignore[arg-type]
    plain = scaler.default_user_data("default", "5f0c2a9e1d4b4e7f8a6b3c2d1e0f9a8b", TOKEN, pp)  # type: ignore[arg-type]
    assert DOCKER_SETUP_PATH in gpu and DOCKER_SETUP_PATH not in plain
