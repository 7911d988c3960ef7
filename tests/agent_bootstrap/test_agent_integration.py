"""`det-agent` processes against a real `det-master` process (tests/conftest.py's LiveMaster)."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import LiveMaster

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
EXIT_REFUSED = 3
EXIT_CONNECTION_LOST = 4
TERMINAL = {"STATE_CANCELED", "STATE_COMPLETED", "STATE_ERROR"}


def wait_for(pred: Callable[[], Any], timeout: float = 60.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


class AgentProcess:
    def __init__(self, master_url: str, token: str, work_dir: Path, *args: str, agent_id: str = "it-agent") -> None:
        self.agent_id = agent_id
        self.log_path = work_dir.parent / f"{agent_id}.stderr"
        # The token goes through the environment: argv is visible to every user of the host.
        env = {k: v for k, v in os.environ.items() if not k.startswith("DET_AGENT_")}
        env["DET_AGENT_TOKEN"] = token
        self.token = token
        with open(self.log_path, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "agent_bootstrap.agent", "--master-url", master_url, "--agent-id", agent_id,
                 "--work-dir", str(work_dir), "--slot-type", "cpu", "--log-level", "debug", *args],
                stdout=subprocess.DEVNULL, stderr=err, cwd=ROOT, env=env)

    def wait(self, timeout: float = 60) -> int:
        return self.proc.wait(timeout=timeout)

    @property
    def stderr(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def agents() -> Iterator[list[AgentProcess]]:
    started: list[AgentProcess] = []
    yield started
    for a in started:
        a.stop()


def admin(master: LiveMaster) -> dict[str, str]:
    return {"Authorization": f"Bearer {master.token()}"}


def agent_token(master: LiveMaster, pool: str = "default") -> str:
    r = httpx.post(master.url + "/api/v1/agents/tokens", json={"resourcePool": pool}, headers=admin(master))
    if r.status_code == 404:
        pytest.skip("waiting for master agent API")
    r.raise_for_status()
    return r.json()["token"]


def connected(master: LiveMaster, headers: dict[str, str], agent_id: str) -> dict[str, Any] | None:
    r = httpx.get(f"{master.url}/api/v1/agents/{agent_id}", headers=headers)
    if r.status_code != 200:
        return None
    agent = r.json()["agent"]
    return agent if agent.get("connected") else None


def last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


def test_bad_token_exits_with_one_clear_line(live_master: LiveMaster, tmp_path: Path,
                                              agents: list[AgentProcess]) -> None:
    agent_token(live_master)  # skips while the master has no agent API
    a = AgentProcess(live_master.url, "not-a-real-token", tmp_path / "work")
    agents.append(a)
    assert a.wait() == EXIT_REFUSED
    err = a.stderr
    assert "Traceback" not in err
    line = last_line(err)
    assert line.startswith("det-agent: the master refused this agent (401)")
    assert "not-a-real-token" not in err  # the credential is never logged
    assert err.count("event=register_failed") == 0  # refused is final: no retry loop


@pytest.fixture
def two_pool_master(db_url: str, tmp_path: Path) -> Iterator[LiveMaster]:
    cfg = tmp_path / "master.yaml"
    cfg.write_text("resource_pools:\n  - name: default\n  - name: gpu\n")
    m = LiveMaster(db_url, tmp_path / "master-state", config_path=cfg)
    m.start()
    yield m
    m.stop()


def test_token_of_another_pool_is_refused(two_pool_master: LiveMaster, tmp_path: Path,
                                          agents: list[AgentProcess]) -> None:
    token = agent_token(two_pool_master, pool="gpu")
    a = AgentProcess(two_pool_master.url, token, tmp_path / "work", "--resource-pool", "default")
    agents.append(a)
    assert a.wait() == EXIT_REFUSED
    line = last_line(a.stderr)
    assert line.startswith("det-agent: the master refused this agent (403)") and "'gpu'" in line
    assert token not in a.stderr
    # The same token in its own pool is accepted.
    b = AgentProcess(two_pool_master.url, token, tmp_path / "work2", "--resource-pool", "gpu", agent_id="gpu-agent")
    agents.append(b)
    wait_for(lambda: connected(two_pool_master, admin(two_pool_master), "gpu-agent"), what="gpu agent registered")


def test_on_connection_lost_runs_after_the_master_dies(live_master: LiveMaster, tmp_path: Path,
                                                       agents: list[AgentProcess]) -> None:
    token = agent_token(live_master)
    marker = tmp_path / "connection-lost"
    a = AgentProcess(live_master.url, token, tmp_path / "work", "--agent-reconnect-attempts", "2",
                     "--agent-reconnect-backoff", "0.2", "--agent-reconnect-backoff-max", "0.5",
                     "--on-connection-lost", f"echo lost $DET_AGENT_ID ${{DET_AGENT_TOKEN:-no-token}} > {marker}")
    agents.append(a)
    wait_for(lambda: connected(live_master, admin(live_master), a.agent_id), what="agent registered")
    live_master.kill()
    assert a.wait(timeout=120) == EXIT_CONNECTION_LOST
    assert marker.read_text().strip() == "lost it-agent no-token"  # once, without the agent token
    assert a.stderr.count("event=on_connection_lost_running") == 1
    assert last_line(a.stderr).startswith("det-agent: lost the master")


def test_agent_reregisters_after_a_master_restart_and_keeps_its_task(
        live_master: LiveMaster, tmp_path: Path, agents: list[AgentProcess]) -> None:
    token = agent_token(live_master)
    # No give-up option: the agent keeps trying (about every second here) for as long as it runs.
    a = AgentProcess(live_master.url, token, tmp_path / "work",
                     "--agent-reconnect-backoff", "0.2", "--agent-reconnect-backoff-max", "1")
    agents.append(a)
    pid_file = tmp_path / "work" / "trial.pid"
    create_experiment(live_master, hold=True)
    pid = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), what="trial process started"))
    live_master.kill()
    # Far more failed attempts than the old default limit (5), the task running all along.
    wait_for(lambda: "event=register_failed attempt=12 " in a.stderr, what="twelve failed reconnect attempts")
    assert a.proc.poll() is None and Path(f"/proc/{pid}").exists()
    live_master.start()
    # Re-registered, reporting the running allocation; the master still wants it, so it keeps running.
    wait_for(lambda: "event=registered pool=default running=1 kill=0" in a.stderr, what="re-registration")
    wait_for(lambda: connected(live_master, admin(live_master), a.agent_id), what="agent connected again")
    assert a.proc.poll() is None
    assert Path(f"/proc/{pid}").exists() and "event=task_exited" not in a.stderr
    a.proc.send_signal(signal.SIGTERM)
    assert a.wait() == 0
    assert "exit_code=143" in a.stderr


def test_give_up_after_is_an_explicit_time_limit(live_master: LiveMaster, tmp_path: Path,
                                                 agents: list[AgentProcess]) -> None:
    token = agent_token(live_master)
    a = AgentProcess(live_master.url, token, tmp_path / "work", "--give-up-after", "3",
                     "--agent-reconnect-backoff", "0.2", "--agent-reconnect-backoff-max", "0.5")
    agents.append(a)
    wait_for(lambda: connected(live_master, admin(live_master), a.agent_id), what="agent registered")
    live_master.kill()
    assert a.wait(timeout=120) == EXIT_CONNECTION_LOST
    assert "unreachable for" in last_line(a.stderr) and "reconnect_give_up_s=3" in last_line(a.stderr)


def _credential_file(work: Path) -> Path:
    return work / "state" / "agent-credential"


def test_an_agent_keeps_its_own_credential_and_the_pool_token_cannot_take_its_id(
        live_master: LiveMaster, tmp_path: Path, agents: list[AgentProcess]) -> None:
    token = agent_token(live_master)
    work = tmp_path / "work"
    a = AgentProcess(live_master.url, token, work)
    agents.append(a)
    wait_for(lambda: connected(live_master, admin(live_master), a.agent_id), what="agent enrolled")
    # The master counts the agent connected when it answers the enrolment; the agent writes its
    # credential after reading that answer.
    wait_for(lambda: "event=enrolled" in a.stderr, what="credential stored")
    cred_file = _credential_file(work)
    stored = json.loads(cred_file.read_text())
    assert (stored["agentId"], stored["resourcePool"]) == ("it-agent", "default")
    cred = stored["credential"]
    assert cred != token and cred not in a.stderr and token not in a.stderr
    assert (cred_file.stat().st_mode & 0o777, cred_file.parent.stat().st_mode & 0o777) == (0o600, 0o700)

    # Restarted, the agent presents its credential (the enrolment token would now be refused).
    a.stop()
    b = AgentProcess(live_master.url, token, work)
    agents.append(b)
    wait_for(lambda: "event=registered" in b.stderr, what="re-registration")
    assert "event=enrolled" not in b.stderr and json.loads(cred_file.read_text())["credential"] == cred

    # Another holder of the pool token, claiming the same id, is refused; the agent is untouched.
    intruder = AgentProcess(live_master.url, token, tmp_path / "other-work")
    assert intruder.wait() == EXIT_REFUSED
    assert "already enrolled" in last_line(intruder.stderr)
    assert b.proc.poll() is None and connected(live_master, admin(live_master), "it-agent")

    # An admin resets the enrolment: the agent's credential is refused, it enrols again by itself.
    r = httpx.delete(f"{live_master.url}/api/v1/agents/it-agent/enrolment", headers=admin(live_master))
    assert r.status_code == 200 and r.json() == {"revokedCredentials": 1}
    wait_for(lambda: "event=credential_refused" in b.stderr and "event=enrolled" in b.stderr, what="re-enrolment")
    wait_for(lambda: connected(live_master, admin(live_master), "it-agent"), what="agent connected again")
    assert json.loads(cred_file.read_text())["credential"] != cred and b.proc.poll() is None


TRAIN = """\
import os, sys, time
print("hello from trial", os.environ["DET_TRIAL_ID"], "cuda=[" + os.environ["CUDA_VISIBLE_DEVICES"] + "]",
      "agent=" + os.environ["DET_AGENT_ID"], flush=True)
sys.stderr.buffer.write(b"bytes \\xff on stderr\\n")
sys.stderr.flush()
if os.path.exists("hold.txt"):  # cwd is <work_dir>/tasks/<allocation>-<random>
    with open("../../trial.pid", "w") as f:
        f.write(str(os.getpid()))
    time.sleep(600)
# Done: tell the searcher (a clean exit before that would not be a success).
import json, urllib.request
req = urllib.request.Request(
    os.environ["DET_MASTER"] + "/api/v1/trials/" + os.environ["DET_TRIAL_ID"] + "/searcher/completed_operation",
    data=json.dumps({"op": {"length": 1}, "searcherMetric": 0.0}).encode(), method="POST",
    headers={"Authorization": "Bearer " + os.environ["DET_SESSION_TOKEN"], "Content-Type": "application/json"})
urllib.request.urlopen(req, timeout=30).read()
"""


def create_experiment(master: LiveMaster, hold: bool = False) -> dict[str, Any]:
    config = (
        "name: agent-it\nentrypoint: python3 train.py\n"
        "searcher:\n  name: single\n  metric: loss\n  max_length:\n    batches: 1\n"
        "resources:\n  slots_per_trial: 1\nmax_restarts: 0\n"
    )
    contents = {"train.py": TRAIN, **({"hold.txt": "keep running"} if hold else {})}
    files = [{"path": path, "type": 48, "content": base64.b64encode(text.encode()).decode(),
              "mode": 0o644, "mtime": "0", "uid": 0, "gid": 0} for path, text in contents.items()]
    r = httpx.post(master.url + "/api/v1/experiments", headers=admin(master),
                   json={"config": config, "modelDefinition": files, "activate": True})
    assert r.status_code == 200, r.text
    return r.json()["experiment"]


def trial_state(master: LiveMaster, trial_id: int) -> str:
    r = httpx.get(f"{master.url}/api/v1/trials/{trial_id}", headers=admin(master))
    r.raise_for_status()
    return r.json()["trial"]["state"]


def trial_logs(master: LiveMaster, trial_id: int) -> list[dict[str, Any]]:
    r = httpx.get(f"{master.url}/api/v1/trials/{trial_id}/logs", headers=admin(master), timeout=30)
    r.raise_for_status()
    return [json.loads(line)["result"] for line in r.text.splitlines() if line.strip()]


def test_trial_runs_on_the_agent_and_its_logs_reach_the_master(live_master: LiveMaster, tmp_path: Path,
                                                               agents: list[AgentProcess]) -> None:
    token = agent_token(live_master)
    a = AgentProcess(live_master.url, token, tmp_path / "work")
    agents.append(a)
    exp = create_experiment(live_master)
    trial_id = exp["trialIds"][0]
    wait_for(lambda: trial_state(live_master, trial_id) == "STATE_COMPLETED", what="trial completed")
    logs = trial_logs(live_master, trial_id)
    by_type = {(entry["stdtype"], entry["log"]) for entry in logs}
    assert ("stdout", f"hello from trial {trial_id} cuda=[] agent=it-agent\n") in by_type
    assert ("stderr", "bytes \ufffd on stderr\n") in by_type
    assert all(entry["agentId"] == "it-agent" for entry in logs)


def test_sigterm_kills_the_running_task_and_reports_it(live_master: LiveMaster, tmp_path: Path,
                                                      agents: list[AgentProcess]) -> None:
    token = agent_token(live_master)
    a = AgentProcess(live_master.url, token, tmp_path / "work")
    agents.append(a)
    pid_file = tmp_path / "work" / "trial.pid"
    exp = create_experiment(live_master, hold=True)
    trial_id = exp["trialIds"][0]
    pid = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), what="trial process started"))
    assert Path(f"/proc/{pid}").exists()
    a.proc.send_signal(signal.SIGTERM)
    assert a.wait() == 0
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(")")[-1][:3]
    assert "event=task_exited" in a.stderr and "exit_code=143" in a.stderr
    # The master heard that the allocation ended (the trial is no longer running there).
    wait_for(lambda: trial_state(live_master, trial_id) != "STATE_RUNNING", what="trial no longer running")


def test_killing_the_experiment_kills_the_task_on_the_agent(live_master: LiveMaster, tmp_path: Path,
                                                            agents: list[AgentProcess]) -> None:
    token = agent_token(live_master)
    a = AgentProcess(live_master.url, token, tmp_path / "work")
    agents.append(a)
    pid_file = tmp_path / "work" / "trial.pid"
    exp = create_experiment(live_master, hold=True)
    pid = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), what="trial process started"))
    r = httpx.post(f"{live_master.url}/api/v1/experiments/{exp['id']}/kill", headers=admin(live_master))
    assert r.status_code == 200, r.text
    wait_for(lambda: "event=task_exited" in a.stderr, what="task killed")
    assert "exit_code=143" in a.stderr and "killed at the master's request" in a.stderr
    wait_for(lambda: not Path(f"/proc/{pid}").exists()
             or Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z", what="process gone")
    wait_for(lambda: trial_state(live_master, exp["trialIds"][0]) in TERMINAL, what="trial ended")
    assert a.proc.poll() is None  # the agent itself keeps serving
