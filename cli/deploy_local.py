"""`det deploy local up|status|down`: a master and agents as background processes, with pid and
log files in a state directory."""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cli import session
from cli.errors import CliError
from shipyard_common import host_env, passwords, private_files
from shipyard_common.processes import pid_alive, start_session, stop_process_group

# httpx is imported where a request is made, as in cli.session: ~100 ms that `det deploy local status`
# need not pay.


def default_state_dir() -> Path:
    return Path(os.environ.get("SHIPYARD_LOCAL_DIR") or os.path.expanduser("~/.shipyard/local"))


@dataclass
class LocalCluster:
    state_dir: Path

    @property
    def run_file(self) -> Path:
        return self.state_dir / "cluster.json"

    def read(self) -> dict[str, Any]:
        try:
            return json.loads(self.run_file.read_text())
        except (OSError, ValueError):
            return {}

    def write(self, data: dict[str, Any]) -> None:
        private_files.write_private(self.run_file, json.dumps(data, indent=2).encode())


def alive(pid: int | None) -> bool:
    return bool(pid) and pid_alive(int(pid))  # type: ignore[arg-type]


def _spawn(cmd: list[str], log: Path, env: dict[str, str]) -> int:
    return start_session(cmd, log, env).pid


def _wait_http(url: str, timeout: float, pid: int, log: Path) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive(pid):
            tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
            raise CliError(f"the master exited during start-up; see {log}\n{tail}")
        try:
            if httpx.get(url + "/info", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise CliError(f"the master did not answer at {url} within {timeout:.0f}s; see {log}")


def agent_runtime_args(runtime: str, image: str | None = None) -> list[str]:
    """The agents' task runtime: `docker` runs trials in containers (a trial's environment.image, else
    `image`; the agent makes the writable directories it bind-mounts, e.g. a shared_fs checkpoint
    storage's host_path)."""
    if runtime == "process":
        return []
    if runtime != "docker":
        raise CliError(f"--runtime: {runtime!r} is not process or docker")
    from infra.settings import CPU_ENV_IMAGE, GPU_ENV_IMAGE

    return ["--runtime", "docker", "--container-image-cpu", image or CPU_ENV_IMAGE,
            "--container-image-cuda", image or GPU_ENV_IMAGE]


def _master_config(state_dir: Path, pool_config: Path | None) -> Path:
    """The master's config: the given one, with checkpoints by default in <state_dir>/checkpoints
    rather than the master's default <state_dir>/master/checkpoints, which trials, running as
    their own users (agent/identity.py), cannot reach."""
    import yaml

    data: dict[str, Any] = {}
    if pool_config:
        try:
            data = yaml.safe_load(pool_config.read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise CliError(f"--config: cannot read {pool_config}: {e}") from None
        if not isinstance(data, dict):
            raise CliError(f"--config: {pool_config} is not a mapping")
    data.setdefault("checkpoint_storage", {"type": "shared_fs", "host_path": str(state_dir / "checkpoints")})
    path = state_dir / "master-config.yaml"
    private_files.write_private(path, yaml.safe_dump(data).encode())
    return path


def up(state_dir: Path, *, agents: int, port: int, db: str | None, slots: int, pool_config: Path | None,
       timeout: float = 60, runtime: str = "process", image: str | None = None) -> dict[str, Any]:
    runtime_args = agent_runtime_args(runtime, image)
    cluster = LocalCluster(state_dir)
    current = cluster.read()
    if current and alive(current.get("master_pid")):
        raise CliError(f"a local cluster is already running at {current['master_url']} (det deploy local down first)")
    url = f"http://127.0.0.1:{port}"
    # A master that died (crashed, killed) leaves its agents running, still retrying it: those that
    # will find the new master (same URL) are kept, with their trials, instead of starting a second
    # agent of the same id beside them (which exited, leaving a dead pid on record and the live
    # agent unrecorded, so `down` missed it); the others are stopped.
    survivors = _adopt_agents(state_dir, current, url, agents)
    # Traverse-only (0711): trials, which run as other users (agent/identity.py), reach their task
    # directories under agents/<id>/tasks through it, and can neither list it nor read what it holds:
    # the admin password and the agent token are 0600, the master's state (database, token key)
    # in master/ 0700, the logs 0600.
    private_files.private_dir(state_dir)
    os.chmod(state_dir, 0o711)
    private_files.private_dir(state_dir / "master")
    pw_file = state_dir / "admin-password"
    if pw_file.exists():
        password = pw_file.read_text().strip()
        new_password = False
    else:
        password = passwords.generate(15)
        private_files.write_private(pw_file, password.encode())
        new_password = True
    env = dict(os.environ, SHIPYARD_ADMIN_PASSWORD=password)
    cmd = [sys.executable, "-m", "control_plane", "--port", str(port), "--state-dir", str(state_dir / "master")]
    if db:
        cmd += ["--db", db]
    cmd[3:3] = ["--config", str(_master_config(state_dir, pool_config))]
    master_log = state_dir / "master.log"
    master_pid = _spawn(cmd, master_log, env)
    data: dict[str, Any] = {"master_url": url, "master_pid": master_pid, "master_log": str(master_log),
                            "agents": [], "state_dir": str(state_dir)}
    cluster.write(data)
    try:
        _wait_http(url, timeout, master_pid, master_log)
        token = session.login(url, "admin", password)
        s = session.Session(url, token)
        # `down` disabled the elastic pools so that nothing launched while the cluster stopped; a
        # cluster brought up again on the same state directory launches again.
        for pool in s.get("/api/v1/resource-pools")["resourcePools"]:
            if pool.get("provider"):
                s.post(f"/api/v1/resource-pools/{pool['name']}/enable", {})
        agent_token = s.post("/api/v1/agents/tokens", {"resourcePool": "default"})["token"]
        token_file = state_dir / "agent-token"
        private_files.write_private(token_file, agent_token.encode())
        private_files.private_dir(state_dir / "agents")
        os.chmod(state_dir / "agents", 0o711)
        # As a local pool's agents (provisioners/local.py): an allowlist of this environment, so
        # nothing of the user's shell (cloud keys, a database URL, the admin password) reaches them.
        agent_env = host_env.for_agent(os.environ)
        for i in range(agents):
            agent_id = f"local-{i}"
            log = state_dir / "agents" / f"{agent_id}.log"
            if agent_id in survivors:
                data["agents"].append({"id": agent_id, "pid": survivors[agent_id], "log": str(log)})
                cluster.write(data)
                continue
            pid = _spawn(
                [sys.executable, "-m", "agent_bootstrap.agent", "--master-url", url, "--resource-pool", "default",
                 "--agent-id", agent_id, "--token-file", str(token_file), "--work-dir",
                 str(state_dir / "agents" / agent_id), "--slots", str(slots), "--slot-type", "auto",
                 *runtime_args],
                log, agent_env)
            data["agents"].append({"id": agent_id, "pid": pid, "log": str(log)})
            cluster.write(data)
        _wait_agents(s, [a["id"] for a in data["agents"]], timeout, data)
    except BaseException:
        down(state_dir, quiet=True)
        raise
    data["new_admin_password"] = new_password
    data["warnings"] = _task_python_warnings(runtime)
    return data


def _task_python_warnings(runtime: str) -> list[str]:
    """What a root cluster on the process runtime should know before its first trial: trials run as
    their users' own uids (agent/identity.py), which cannot run a Python under /root (pyenv, conda)."""
    from agent_bootstrap.agent.identity import unreachable_interpreter

    if runtime != "process" or not hasattr(os, "geteuid") or os.geteuid() != 0:
        return []
    blocked = unreachable_interpreter(sys.executable, sys.prefix)
    if blocked is None:
        return []
    return [f"this Python ({os.path.realpath(sys.executable)}) is under {blocked}, which other users cannot "
            f"traverse: trials run as their users' own uids and get the system's python3, without this "
            f"environment's packages. Install Shipyard in a Python outside {blocked} (e.g. /opt, /usr/local), "
            f"or use --runtime docker"]


def agent_processes(state_dir: Path) -> dict[str, int]:
    """The live agents of this cluster, found by their command lines (their --work-dir is under
    `state_dir`/agents), whatever the run file says: agent id -> pid. Linux (/proc); else none."""
    root = str(state_dir.resolve() / "agents")
    found: dict[str, int] = {}
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if "agent_bootstrap.agent" not in argv or "--work-dir" not in argv or "--agent-id" not in argv:
            continue
        work_dir = argv[argv.index("--work-dir") + 1] if argv.index("--work-dir") + 1 < len(argv) else ""
        if work_dir and str(Path(work_dir).resolve().parent) == root and alive(int(entry.name)):
            found[argv[argv.index("--agent-id") + 1]] = int(entry.name)
    return found


def _adopt_agents(state_dir: Path, current: dict[str, Any], url: str, agents: int) -> dict[str, int]:
    """Agents still running from the cluster's last run: those this `up` keeps (same master URL, an
    id it would start), by id; the rest are stopped."""
    live = agent_processes(state_dir)
    for a in current.get("agents", []):  # recorded ones too (a platform without /proc)
        if alive(a.get("pid")):
            live.setdefault(a["id"], int(a["pid"]))
    wanted = {f"local-{i}" for i in range(agents)}
    keep = {i: pid for i, pid in live.items() if i in wanted and current.get("master_url") == url}
    for agent_id, pid in live.items():
        if agent_id not in keep:
            _stop(pid, grace=20)
    return keep


def _wait_agents(s: Any, ids: list[str], timeout: float, data: dict[str, Any]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        connected = {a["id"] for a in s.get("/api/v1/agents")["agents"] if a.get("connected")}
        if set(ids) <= connected:
            return
        for a in data["agents"]:
            if not alive(a["pid"]):
                tail = Path(a["log"]).read_text(errors="replace")[-1500:]
                raise CliError(f"agent {a['id']} exited during start-up; see {a['log']}\n{tail}")
        time.sleep(0.2)
    raise CliError(f"agents did not register within {timeout:.0f}s")


def _stop(pid: int, grace: float) -> None:
    stop_process_group(pid, grace)


def down(state_dir: Path, quiet: bool = False) -> int:
    cluster = LocalCluster(state_dir)
    data = cluster.read()
    if not data:
        if not quiet:
            print("No local cluster found in", state_dir)
        return 0
    stopped = 0
    # Instances of elastic pools first (through the master, which knows them by their tags),
    # then agents (they stop their trials), then the master.
    if alive(data.get("master_pid")):
        _teardown_pools(data["master_url"], state_dir)
    stopped += _stop_local_instances(state_dir)
    # The recorded agents, and any other agent of this cluster still running (found by its command line).
    pids = {int(a["pid"]) for a in data.get("agents", []) if alive(a.get("pid"))}
    pids |= set(agent_processes(state_dir).values())
    for pid in sorted(pids):
        _stop(pid, grace=20)
        stopped += 1
    if alive(data.get("master_pid")):
        _stop(data["master_pid"], grace=15)
        stopped += 1
    cluster.run_file.unlink(missing_ok=True)
    if not quiet:
        print(f"Stopped the local cluster ({stopped} processes)")
    return 0


def _teardown_pools(url: str, state_dir: Path) -> None:
    import httpx

    try:
        password = (state_dir / "admin-password").read_text().strip()
        token = httpx.post(url + "/api/v1/auth/login", json={"username": "admin", "password": password},
                           timeout=10).json()["token"]
        headers = {"Authorization": f"Bearer {token}"}
        for pool in httpx.get(url + "/api/v1/resource-pools", headers=headers, timeout=10).json()["resourcePools"]:
            if pool.get("provider"):  # every pool with a provider is elastic (the master's registry)
                httpx.post(f"{url}/api/v1/resource-pools/{pool['name']}/teardown", headers=headers, timeout=120)
    except (OSError, httpx.HTTPError, KeyError, ValueError):
        pass  # the master is not answering: the local fallback below still stops local instances


def _stop_local_instances(state_dir: Path) -> int:
    """Agents a local pool launched are process groups recorded under the master's state dir."""
    stopped = 0
    for rec in (state_dir / "master" / "local-instances").glob("*/local-*.json"):
        try:
            pid = int(json.loads(rec.read_text())["pid"])
        except (OSError, ValueError, KeyError):
            continue
        if alive(pid):
            _stop(pid, grace=20)
            stopped += 1
        rec.unlink(missing_ok=True)
    return stopped


def status(state_dir: Path) -> dict[str, Any]:
    data = LocalCluster(state_dir).read()
    if not data:
        return {}
    data["master_alive"] = alive(data.get("master_pid"))
    for a in data.get("agents", []):
        a["alive"] = alive(a.get("pid"))
    return data
