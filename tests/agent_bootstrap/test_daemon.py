"""The agent's command handling and task supervision, with a real ProcessRuntime and in-test sinks in
place of the master (events are read from the outbox, log lines from a list sink)."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_bootstrap.agent import identity
from agent_bootstrap.agent.client import MasterUnavailable
from agent_bootstrap.agent.config import AgentConfig
from agent_bootstrap.agent.daemon import SETUP_FAILED, Agent, task_environment
from agent_bootstrap.agent.devices import Slot
from agent_bootstrap.agent.logship import LogLine, LogShipper
from agent_bootstrap.agent.runtime import LaunchSpec, ProcessRuntime, TaskHandle
from shipyard_common.agent_protocol import RegisterRequest, RegisterResponse, StartCommand, TaskSpec
from shipyard_common.model_def import ModelFile, pack_model_definition

GPUS = [Slot(id="0", type="cuda", brand="A10G", uuid="GPU-aaa", index=0),
        Slot(id="1", type="cuda", brand="A10G", uuid="GPU-bbb", index=1)]


class ListSink:
    def __init__(self) -> None:
        self.lines: list[LogLine] = []

    def send(self, batch: list[LogLine]) -> None:
        self.lines.extend(batch)


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Agent]:
    config = AgentConfig(master_url="http://127.0.0.1:9", agent_id="agent-1", work_dir=tmp_path / "work",
                         default_kill_grace=5)
    base_env = dict(os.environ, DET_AGENT_TOKEN="agent-secret", DET_AGENT_MASTER_URL="x")
    a = Agent(config, "agent-secret", GPUS, ProcessRuntime(poll_interval=0.02), base_env=base_env)
    a.tasks_dir.mkdir(parents=True)
    a.shipper = LogShipper(ListSink(), flush_interval=0.01).start()
    yield a
    a.shipper.close(timeout=5)
    a.runtime.close()


def events(agent: Agent, alloc: str) -> list[dict[str, Any]]:
    return [e.to_wire() for e in agent.outbox._pending if e.allocation_id == alloc]


def shipped(agent: Agent, alloc: str) -> str:
    sink = agent.shipper.sink
    assert isinstance(sink, ListSink)
    return "".join(ln.text for ln in sink.lines if ln.allocation_id == alloc)


def start(agent: Agent, alloc: str, entrypoint: list[str] | str, slot_ids: list[str] | None = None,
          **spec: Any) -> None:
    cmd = StartCommand(type="start", allocation_id=alloc, spec=TaskSpec(
        allocation_id=alloc, task_id=f"task-{alloc}", entrypoint=entrypoint, slot_ids=slot_ids or ["1"],
        env={"DET_ALLOCATION_ID": alloc}, token="alloc-token", **spec))
    agent._start(cmd)


def join(agent: Agent, alloc: str) -> None:
    thread = agent._tasks[alloc].thread
    assert thread is not None
    thread.join(60)
    assert not thread.is_alive()


def test_missing_entrypoint_reports_127_and_ships_a_line(agent: Agent) -> None:
    start(agent, "a1", ["definitely-not-a-command", "train.py"])
    join(agent, "a1")
    evs = events(agent, "a1")
    assert [e["type"] for e in evs] == ["starting", "exited"]
    assert evs[1]["exitCode"] == 127 and "entrypoint not found" in evs[1]["message"]
    assert "[shipyard-agent] entrypoint not found: 'definitely-not-a-command'" in shipped(agent, "a1")


def test_task_runs_with_its_environment_and_reports_running_then_exited(agent: Agent) -> None:
    start(agent, "a2", 'echo "cuda=$CUDA_VISIBLE_DEVICES agent=$DET_AGENT_ID alloc=$DET_ALLOCATION_ID '
                       'token=${DET_AGENT_TOKEN:-none} cwd=$(basename $(pwd))"')
    start(agent, "a2", ["false"])  # the master repeats starts until it hears back: ignored
    join(agent, "a2")
    evs = events(agent, "a2")
    assert [e["type"] for e in evs] == ["starting", "running", "exited"]
    assert isinstance(evs[1]["pid"], int) and evs[2]["exitCode"] == 0 and evs[2]["message"] is None
    out = "".join(line for line in shipped(agent, "a2").splitlines(keepends=True)
                  if not line.startswith("[shipyard-agent]"))  # a root agent's notice, if any
    assert out.startswith("cuda=GPU-bbb agent=agent-1 alloc=a2 token=none cwd=a2-")
    assert list(agent.tasks_dir.iterdir()) == []  # the task directory is removed afterwards


def test_kill_command_stops_a_running_task(agent: Agent) -> None:
    start(agent, "a3", [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(600)"])
    # Wait until the process runs (its line is shipped), then kill it.
    deadline = time.monotonic() + 30
    while "up" not in shipped(agent, "a3") and time.monotonic() < deadline:
        time.sleep(0.02)
    agent._kill("a3", 5, "killed at the master's request")
    join(agent, "a3")
    exited = events(agent, "a3")[-1]
    assert exited["type"] == "exited" and exited["exitCode"] == 143
    assert exited["message"] == "killed at the master's request"
    # A repeated kill while the exited event is still pending adds nothing.
    agent._kill("a3", 5, "again")
    assert [e["type"] for e in events(agent, "a3")].count("exited") == 1


def test_kill_for_an_unknown_allocation_reports_it_exited(agent: Agent) -> None:
    agent._kill("ghost", None, "killed")
    assert [(e["type"], e["exitCode"]) for e in events(agent, "ghost")] == [("exited", None)]
    start(agent, "ghost", ["true"])  # a late start for it is ignored
    assert agent._tasks["ghost"].thread is None


def test_unknown_slot_is_a_setup_failure(agent: Agent) -> None:
    start(agent, "a4", ["true"], slot_ids=["7"])
    join(agent, "a4")
    exited = events(agent, "a4")[-1]
    assert exited["exitCode"] == SETUP_FAILED and "slot '7'" in exited["message"]


def test_invalid_start_command_is_reported_not_fatal(agent: Agent) -> None:
    agent._dispatch({"type": "start", "allocationId": "bad", "spec": {"allocationId": "bad"}})
    agent._dispatch({"type": "reboot"})
    evs = events(agent, "bad")
    assert len(evs) == 1 and evs[0]["exitCode"] == SETUP_FAILED and "entrypoint" in evs[0]["message"]


def test_task_environment_cpu_slots_hide_gpus() -> None:
    spec = TaskSpec(allocation_id="x", entrypoint=["true"], env={"A": 1, "CUDA_VISIBLE_DEVICES": "0"})  # type: ignore[dict-item]
    env = task_environment({"PATH": "/bin", "DET_AGENT_TOKEN": "secret"}, spec,
                           [Slot(id="0", type="cpu", brand="cpu")], "agent-1")
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["DET_AGENT_ID"] == "agent-1"
    assert env["A"] == "1" and "DET_AGENT_TOKEN" not in env
    # The agent's own interpreter comes first (tasks run in its environment), then the inherited PATH.
    assert env["PATH"] == os.path.dirname(sys.executable) + ":/bin"
    # ...unless the experiment sets PATH itself (e.g. another venv's bin first).
    own = TaskSpec(allocation_id="x", entrypoint=["true"], env={"PATH": "/venv/bin:/bin"})
    assert task_environment({"PATH": "/bin"}, own, [], "agent-1")["PATH"] == "/venv/bin:/bin"


class ThreadRuntime:
    """A second implementation of the runtime seam, to hold the daemon to it: a task is a thread that
    prints a line, then exits with argv[1] as its code, or (argv[1] == "wait") waits until SIGTERM."""

    name = "thread"

    def __init__(self) -> None:
        self.released: list[str] = []

    def start(self, spec: LaunchSpec) -> TaskHandle:
        stop = threading.Event()
        result: dict[str, int] = {}

        def run() -> None:
            spec.output("stdout", f"hello from {spec.argv[0]}\n")
            if spec.argv[1] == "wait":
                stop.wait(60)
                result["code"] = 128 + signal.SIGTERM
            else:
                result["code"] = int(spec.argv[1])

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return TaskHandle(id=f"thread-{spec.allocation_id}", allocation_id=spec.allocation_id, runtime=self.name,
                          data=(thread, stop, result))

    def signal(self, handle: TaskHandle, sig: int) -> None:
        if sig in (signal.SIGTERM, signal.SIGKILL):
            handle.data[1].set()

    def wait(self, handle: TaskHandle, timeout: float | None = None) -> int | None:
        thread, _, result = handle.data
        thread.join(timeout)
        return None if thread.is_alive() else result["code"]

    def release(self, handle: TaskHandle) -> None:
        self.released.append(handle.id)

    def clean_up_leftovers(self) -> int:
        return 0

    def close(self) -> None:
        pass


def test_the_daemon_drives_any_runtime_through_the_seam(tmp_path: Path) -> None:
    config = AgentConfig(master_url="http://127.0.0.1:9", agent_id="agent-1", work_dir=tmp_path / "work")
    runtime = ThreadRuntime()
    a = Agent(config, "agent-secret", GPUS, runtime, base_env={})
    a.tasks_dir.mkdir(parents=True)
    a.shipper = LogShipper(ListSink(), flush_interval=0.01).start()
    try:
        start(a, "t1", ["job", "3"])
        start(a, "t2", ["job", "wait"])
        join(a, "t1")
        deadline = time.monotonic() + 30
        while "hello" not in shipped(a, "t2") and time.monotonic() < deadline:
            time.sleep(0.02)
        a._kill("t2", 5, "killed at the master's request")
        join(a, "t2")
        t1, t2 = events(a, "t1"), events(a, "t2")
        assert [e["type"] for e in t1] == ["starting", "running", "exited"] and t1[1]["pid"] is None
        assert (t1[2]["exitCode"], t1[2]["message"]) == (3, "exited with code 3")
        assert (t2[-1]["exitCode"], t2[-1]["message"]) == (143, "killed at the master's request")
        assert shipped(a, "t1") == "hello from job\n"
        assert sorted(runtime.released) == ["thread-t1", "thread-t2"]
    finally:
        a.shipper.close(timeout=5)


def test_the_reconnect_cap_is_the_lower_of_the_agents_and_the_masters(agent: Agent) -> None:
    assert agent._backoff_cap() == agent.config.agent_reconnect_backoff_max == 15.0
    agent._master_backoff_cap = 2.0  # announced at registration (the master's agent_reconnect_cap_s)
    assert agent._backoff_cap() == 2.0
    agent._master_backoff_cap = 60.0  # a laxer master does not make the agent wait longer
    assert agent._backoff_cap() == 15.0


def test_without_an_explicit_limit_the_agent_never_gives_up(agent: Agent, tmp_path: Path) -> None:
    long_ago = time.monotonic() - 10 * 24 * 3600
    assert agent._give_up_reason(failed=100_000, lost_since=long_ago) is None
    limited = Agent(AgentConfig(master_url="http://127.0.0.1:9", agent_id="agent-2", work_dir=tmp_path / "w2",
                                agent_reconnect_attempts=3, reconnect_give_up_s=60),
                    "agent-secret", GPUS, agent.runtime)
    assert limited._give_up_reason(failed=2, lost_since=time.monotonic()) is None
    assert "3 connection attempts failed" in (limited._give_up_reason(3, time.monotonic()) or "")
    assert "reconnect_give_up_s=60" in (limited._give_up_reason(1, time.monotonic() - 61) or "")


# ---- outages of any length (issue 27) ---------------------------------------------------------------

class _AwayThenBackMaster:
    """In place of the master's HTTP client: refuses `failures` model-definition fetches (a master
    that is away), then serves the archive; records registrations."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.fetches = 0
        self.registered: list[RegisterRequest] = []

    def fetch_model_definition(self, path: str, token: str | None) -> bytes:
        self.fetches += 1
        if self.fetches <= self.failures:
            raise MasterUnavailable(f"GET {path}: ConnectError: connection refused")
        return pack_model_definition([ModelFile(path="train.sh", content=b"echo trained\n", mode=0o644,
                                                is_dir=False)])

    def register(self, req: RegisterRequest, token: str | None = None) -> RegisterResponse:
        self.registered.append(req)
        return RegisterResponse(session_id="s-2")

    def close(self) -> None:
        pass


def _agent_against(master: _AwayThenBackMaster, tmp_path: Path) -> Agent:
    config = AgentConfig(master_url="http://127.0.0.1:9", agent_id="agent-3", work_dir=tmp_path / "work3",
                         agent_reconnect_backoff=0.01, agent_reconnect_backoff_max=0.05)
    a = Agent(config, "agent-secret", GPUS, ProcessRuntime(poll_interval=0.02), base_env=dict(os.environ),
              client_factory=lambda: master)  # type: ignore[arg-type, return-value]
    a.tasks_dir.mkdir(parents=True)
    a.shipper = LogShipper(ListSink(), flush_interval=0.01).start()
    return a


def test_the_model_definition_is_fetched_however_long_the_master_is_away(tmp_path: Path) -> None:
    """Forty refusals (the old bound was five) and the task still starts once the master answers."""
    master = _AwayThenBackMaster(failures=40)
    a = _agent_against(master, tmp_path)
    try:
        start(a, "m1", "sh train.sh", model_definition_path="/api/v1/tasks/m1/model_def")
        join(a, "m1")
        assert master.fetches == 41
        assert [(e["type"], e.get("exitCode")) for e in events(a, "m1")][-1] == ("exited", 0)
        assert shipped(a, "m1") == "trained\n"
    finally:
        a.shipper.close(timeout=5)
        a.runtime.close()


def test_a_task_killed_while_its_model_definition_waits_for_the_master_ends_killed(tmp_path: Path) -> None:
    master = _AwayThenBackMaster(failures=10**9)
    a = _agent_against(master, tmp_path)
    try:
        start(a, "m2", "sh train.sh", model_definition_path="/api/v1/tasks/m2/model_def")
        time.sleep(0.3)
        a._kill("m2", 1.0, "killed at the master's request")
        join(a, "m2")
        last = events(a, "m2")[-1]
        assert last["type"] == "exited" and last.get("exitCode") is None
        assert last["message"] == "killed at the master's request before the process started"
    finally:
        a.shipper.close(timeout=5)
        a.runtime.close()


def test_a_task_that_exited_while_the_master_was_away_is_reregistered_until_its_exit_is_heard(
        agent: Agent) -> None:
    """Its exit event waits in the outbox: the registration lists it, so the master keeps the
    allocation for the exit code that follows (a failure then counts in the trial's restarts)."""
    start(agent, "r1", [sys.executable, "-c", "raise SystemExit(3)"])
    start(agent, "r2", [sys.executable, "-c", "import time; time.sleep(30)"])
    join(agent, "r1")
    master = _AwayThenBackMaster(failures=0)
    agent._register(master)  # type: ignore[arg-type]
    assert master.registered[-1].running_allocations == ["r1", "r2"]
    assert events(agent, "r1")[-1]["exitCode"] == 3
    # Once the master took the exit, the next registration no longer lists it.
    with agent.outbox._cond:
        agent.outbox._pending = [e for e in agent.outbox._pending if e.allocation_id != "r1"]
    agent._register(master)  # type: ignore[arg-type]
    assert master.registered[-1].running_allocations == ["r2"]
    agent._kill("r2", 0.5, "test over")
    join(agent, "r2")


def test_a_task_user_who_cannot_run_the_agents_python_is_told_why_in_its_log(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A root agent installed in a Python under a 0700 directory (pyenv or conda under /root): the
    # task's uid would silently get the system's python3, without the agent's packages.
    if os.geteuid() != 0:
        pytest.skip("only a root agent runs tasks as other users")
    private = tmp_path / "home"
    (private / "py" / "bin").mkdir(parents=True)
    (private / "py" / "bin" / "python3").write_text("")
    blocked = identity.unreachable_interpreter(str(private / "py" / "bin" / "python3"), "/usr")
    assert blocked is not None and blocked in (tmp_path, *tmp_path.parents)  # pytest's dirs are 0700
    assert identity.unreachable_interpreter("/usr/bin/env", "/usr") is None
    public = Path(tempfile.mkdtemp(prefix="agent-", dir="/tmp"))  # tasks need a traversable path
    try:
        public.chmod(0o711)
        # The agent installed in a Python under that private directory: the agent finds it itself.
        monkeypatch.setattr(sys, "executable", str(private / "py" / "bin" / "python3"))
        monkeypatch.setattr(sys, "prefix", str(private / "py"))
        a = Agent(AgentConfig(master_url="http://127.0.0.1:9", agent_id="agent-1", work_dir=public / "work"),
                  "agent-secret", GPUS, ProcessRuntime(poll_interval=0.02), base_env=dict(os.environ))
        assert a.identities.enabled
        a.tasks_dir.mkdir(parents=True)
        a.shipper = LogShipper(ListSink(), flush_interval=0.01).start()
        monkeypatch.undo()  # the tasks themselves run with this process's real interpreter on PATH
        assert a._python_blocked == blocked
        start(a, "u1", "echo ran as $(id -u)")
        a._start(StartCommand(type="start", allocation_id="u2", spec=TaskSpec(
            allocation_id="u2", task_id="task-u2", entrypoint="echo ran as $(id -u)", slot_ids=["1"],
            env={"DET_ALLOCATION_ID": "u2", "PATH": "/usr/bin:/bin"}, token="alloc-token")))
        join(a, "u1")
        join(a, "u2")
        a.shipper.close(timeout=5)
        a.runtime.close()
        told = shipped(a, "u1")
        assert f"ran as {identity.NOBODY}" in told, told
        assert "[shipyard-agent] this agent's Python" in told and f"{blocked} is not traversable" in told, told
        assert "[shipyard-agent]" not in shipped(a, "u2")  # the experiment chose its own PATH
    finally:
        shutil.rmtree(public, ignore_errors=True)
