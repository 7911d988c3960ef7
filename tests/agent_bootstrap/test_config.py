"""Agent configuration: defaults < YAML < DET_AGENT_* environment < command line; backoff bounds."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent_bootstrap.agent.client import backoff_delay
from agent_bootstrap.agent.config import ConfigError, load_config


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_defaults(tmp_path: Path) -> None:
    cfg = load_config([], env={})
    assert cfg.master_url == "http://127.0.0.1:8080"
    assert cfg.resource_pool == "default"
    assert cfg.agent_id == socket.gethostname()
    # Agents never give up on the master unless told to (issue 9): no attempt or time limit.
    assert cfg.agent_reconnect_attempts is None and cfg.reconnect_give_up_s is None
    assert (cfg.agent_reconnect_backoff, cfg.agent_reconnect_backoff_max) == (1.0, 15.0)
    assert cfg.work_dir == Path.home() / ".shipyard-agent"
    assert cfg.slots is None and cfg.slot_type == "auto"
    assert cfg.on_connection_lost is None


def test_precedence_file_then_env_then_cli(tmp_path: Path) -> None:
    f = write(tmp_path / "agent.yaml", (
        "master_url: http://file:8080/\n"
        "resource_pool: from-file\n"
        "agent_reconnect_attempts: 3\n"
        "agent-reconnect-backoff: 2.5\n"          # dashed keys are accepted too
        "on_connection_lost: shutdown -h now\n"
        "work_dir: ~/agent-from-file\n"
    ))
    env = {"DET_AGENT_RESOURCE_POOL": "from-env", "DET_AGENT_AGENT_RECONNECT_ATTEMPTS": "4",
           "DET_AGENT_AGENT_ID": "env-agent"}
    cfg = load_config(["--config", str(f), "--agent-reconnect-attempts", "7", "--slots", "2"], env=env)
    assert cfg.master_url == "http://file:8080"          # file (trailing slash dropped)
    assert cfg.resource_pool == "from-env"               # env beats file
    assert cfg.agent_reconnect_attempts == 7             # cli beats env and file
    assert cfg.agent_reconnect_backoff == 2.5
    assert cfg.agent_id == "env-agent"
    assert cfg.slots == 2
    assert cfg.on_connection_lost == "shutdown -h now"
    assert cfg.work_dir == Path.home() / "agent-from-file"


def test_config_file_from_env(tmp_path: Path) -> None:
    f = write(tmp_path / "agent.yaml", "resource_pool: gpu\n")
    assert load_config([], env={"DET_AGENT_CONFIG": str(f)}).resource_pool == "gpu"


def test_token_from_the_highest_layer_wins(tmp_path: Path) -> None:
    tf = write(tmp_path / "token", "file-secret\n")
    f = write(tmp_path / "agent.yaml", "token: yaml-secret\n")
    assert load_config(["-c", str(f)], env={}).resolve_token() == "yaml-secret"
    assert load_config(["-c", str(f), "--token-file", str(tf)], env={}).resolve_token() == "file-secret"
    assert load_config(["-c", str(f)], env={"DET_AGENT_TOKEN": "env-secret"}).resolve_token() == "env-secret"
    cfg = load_config(["--token", "cli-secret", "--token-file", str(tf)], env={})
    assert cfg.resolve_token() == "cli-secret"
    assert "cli-secret" not in repr(cfg) and "cli-secret" not in str(cfg)


def test_missing_or_empty_token_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no agent token"):
        load_config([], env={}).resolve_token()
    empty = write(tmp_path / "empty", "\n")
    with pytest.raises(ConfigError, match="is empty"):
        load_config(["--token-file", str(empty)], env={}).resolve_token()
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(["--token-file", str(tmp_path / "nope")], env={}).resolve_token()


def test_bad_values_name_the_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="agent_reconnect_attempts"):
        load_config([], env={"DET_AGENT_AGENT_RECONNECT_ATTEMPTS": "zero"})
    with pytest.raises(ConfigError, match="slots"):
        load_config(["--slots", "0"], env={})
    with pytest.raises(ConfigError, match="surprise"):
        load_config(["-c", str(write(tmp_path / "a.yaml", "surprise: 1\n"))], env={})
    with pytest.raises(ConfigError, match="mapping"):
        load_config(["-c", str(write(tmp_path / "b.yaml", "- a\n"))], env={})
    with pytest.raises(ConfigError, match="agent_reconnect_backoff_max"):
        load_config(["--agent-reconnect-backoff", "10", "--agent-reconnect-backoff-max", "1"], env={})


def test_bare_host_gets_http() -> None:
    assert load_config(["--master-url", "master.internal:8080"], env={}).master_url == "http://master.internal:8080"


@given(attempt=st.integers(min_value=1, max_value=200), base=st.floats(min_value=0.01, max_value=30),
       extra=st.floats(min_value=0, max_value=300), rand=st.floats(min_value=0, max_value=1))
def test_backoff_is_bounded(attempt: int, base: float, extra: float, rand: float) -> None:
    cap = base + extra
    d = backoff_delay(attempt, base, cap, rand)
    assert base / 2 <= d <= cap
    # Exponential until the cap: never above base * 2^(attempt-1).
    assert d <= base * 2 ** (attempt - 1) + 1e-9


def test_backoff_grows_then_caps() -> None:
    no_jitter = [backoff_delay(n, 5, 60, 0.0) for n in range(1, 8)]
    assert no_jitter == [5, 10, 20, 40, 60, 60, 60]
    full_jitter = [backoff_delay(n, 5, 60, 0.999999) for n in range(1, 3)]
    assert full_jitter[0] == pytest.approx(2.5, rel=1e-3) and full_jitter[1] == pytest.approx(5, rel=1e-3)


def test_an_unknown_runtime_is_a_configuration_error(tmp_path: Path) -> None:
    assert load_config(["--runtime", "process"], env={}).runtime == "process"
    assert load_config([], env={"DET_AGENT_RUNTIME": "docker"}).runtime == "docker"  # checked at start-up
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-m", "agent_bootstrap.agent", "--runtime", "podman", "--token", "x",
         "--work-dir", str(tmp_path / "work")],
        capture_output=True, text=True, timeout=60, cwd=root, env=dict(os.environ, PYTHONPATH=str(root)))
    assert proc.returncode == 2  # EXIT_CONFIG
    assert "det-agent: runtime: no task runtime named 'podman' (known: docker, process)" in proc.stderr


def test_give_up_only_by_an_explicit_option() -> None:
    assert load_config(["--give-up-after", "90"], env={}).reconnect_give_up_s == 90
    assert load_config([], env={"DET_AGENT_RECONNECT_GIVE_UP_S": "30"}).reconnect_give_up_s == 30
    assert load_config(["--agent-reconnect-attempts", "4"], env={}).agent_reconnect_attempts == 4
    with pytest.raises(ConfigError, match="reconnect_give_up_s"):
        load_config(["--give-up-after", "0"], env={})
