"""The local provider (`type: local` pools) through its launch / list / terminate seam, with real
agent processes.

The agents point at a master URL where nothing listens: they keep retrying registration with a
backoff that outlasts every test here, so each "instance" is a live process group for as long as a
test needs it. Providers are built through the factory and registry, as the master builds them."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from provisioners.base import (
    TAG_CLUSTER,
    TAG_LAUNCH_ID,
    TAG_MASTER,
    TAG_POOL,
    CloudInstance,
    CloudState,
    ErrorKind,
    LaunchSpec,
    Provider,
)
from provisioners.factory import PoolConfigError, build_provider
from provisioners.local import LocalProvider
from shipyard_common.processes import group_alive, pid_alive, stop_process_group
from tests.pg import free_port

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the agents through /proc")


def provider(state_dir: Path, *, pool: str = "p", cluster: str = "c", master_url: str = "http://127.0.0.1:9",
             **own: Any) -> Provider:
    return build_provider({"type": "local", **own}, pool=pool, cluster_id=cluster, master_url=master_url,
                          state_dir=state_dir).provider


def specs(n: int) -> list[LaunchSpec]:
    return [LaunchSpec(launch_id=uuid.uuid4().hex, user_data=f"token-{i}") for i in range(n)]


def agent_processes(root: Path) -> list[tuple[str, int]]:
    """(instance id, pid) of every live agent process whose files are under `root`, found in /proc
    rather than in the provider's own records, so the provider's bookkeeping is checked against the
    processes that really exist."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue  # exited while we looked
        pid = int(entry.name)
        if "agent_bootstrap.agent" in argv and "--instance-id" in argv and any(a.startswith(str(root)) for a in argv):
            if pid_alive(pid):
                found.append((argv[argv.index("--instance-id") + 1], pid))
        elif argv == [""] and pid_alive(pid) and _parent(pid) == os.getpid():
            found.append(("", pid))  # our child in the middle of its exec: no command line yet
    return sorted(found)


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def agents_under(root: Path) -> dict[str, int]:
    return dict(agent_processes(root))


def agents_of(root: Path, instances: Sequence[CloudInstance]) -> dict[str, int]:
    """instance id -> pid of the given instances' agents, once none of our children is still in its
    exec (for a moment the kernel shows an empty command line)."""
    want = {i.id for i in instances}

    def settled() -> bool:
        ids = {iid for iid, _ in agent_processes(root)}
        return want <= ids and "" not in ids

    eventually(settled, f"agent processes of {sorted(want)}")
    return {k: v for k, v in agents_under(root).items() if k in want}


def argv_of(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def started_here(pid: int, root: Path) -> bool:
    """Whether `pid` is still an agent with its files under `root` (or one still in exec, whose
    command line is empty for a moment), not a process that reused the pid."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return pid_alive(pid) and (argv == b"" or str(root).encode() in argv)


def group_ended(pgid: int) -> bool:
    # The agents are children of this test process: collect the exit status (the provider object
    # that started them may not be the one that stopped them), else a zombie keeps the group "alive".
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pgid, os.WNOHANG)
    return not group_alive(pgid)


def eventually(cond: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout}s: {what}")
        time.sleep(0.05)


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    """The master's state directory; every agent still running under it is stopped afterwards, so a
    failing test leaves no process behind."""
    yield tmp_path
    # The provider's records as well as /proc: an agent caught mid-exec shows no command line.
    recorded = {json.loads(rec.read_text())["pid"] for rec in tmp_path.rglob("local-*.json")}
    ours = {pid for pid in recorded if started_here(pid, tmp_path)}
    for pid in ours | set(agents_under(tmp_path).values()):
        stop_process_group(pid, grace=2.0)
        group_ended(pid)


@pytest.mark.integration
def test_launch_starts_one_agent_process_group_per_spec(state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHIPYARD_ADMIN_PASSWORD", "not-for-agents")
    url = f"http://127.0.0.1:{free_port()}"
    wanted = specs(3)
    result = provider(state_dir, master_url=url, slots_per_instance=2).launch(wanted)

    assert result.error is None
    assert [i.launch_id for i in result.launched] == [s.launch_id for s in wanted]
    assert len({i.id for i in result.launched}) == 3
    for inst in result.launched:
        assert inst.state is CloudState.RUNNING and inst.private_ip == "127.0.0.1"
        assert (inst.tags[TAG_CLUSTER], inst.tags[TAG_POOL], inst.tags[TAG_MASTER]) == ("c", "p", url)
        assert inst.tags[TAG_LAUNCH_ID] == inst.launch_id

    running = agents_of(state_dir, result.launched)
    assert agent_processes(state_dir) == sorted(running.items())  # one process per instance, none besides
    for inst, spec in zip(result.launched, wanted, strict=True):
        pid = running[inst.id]
        assert os.getpgid(pid) == pid and os.getsid(pid) == pid  # its own session: one signal reaches it all
        argv = argv_of(pid)
        assert argv[argv.index("--master-url") + 1] == url and argv[argv.index("--resource-pool") + 1] == "p"
        assert argv[argv.index("--slots") + 1] == "2"
        # The spec's user data is the agent's credential: handed over in a file only its owner reads.
        token_file = Path(argv[argv.index("--token-file") + 1])
        assert token_file.read_text() == spec.user_data
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        assert b"SHIPYARD_ADMIN_PASSWORD" not in Path(f"/proc/{pid}/environ").read_bytes()


@pytest.mark.integration
def test_launching_a_launch_id_again_returns_the_same_instance(state_dir: Path) -> None:
    local = provider(state_dir)
    [spec] = specs(1)
    first = local.launch([spec]).launched
    again = local.launch([spec]).launched
    assert [i.id for i in again] == [i.id for i in first]
    agents_of(state_dir, first)
    assert [iid for iid, _ in agent_processes(state_dir)] == [first[0].id]  # no second process


@pytest.mark.integration
def test_list_reports_only_the_instances_of_its_own_cluster_and_pool(state_dir: Path) -> None:
    mine = provider(state_dir)
    launched = mine.launch(specs(2)).launched
    other_pool = provider(state_dir, pool="q")
    other_cluster = provider(state_dir, cluster="d")  # same pool name: the same directory, other tags
    theirs = other_cluster.launch(specs(1)).launched

    listed = mine.list()
    assert sorted((i.id, i.launch_id, i.state) for i in listed) == sorted(
        (i.id, i.launch_id, CloudState.RUNNING) for i in launched)
    assert other_pool.list() == []
    assert [i.id for i in other_cluster.list()] == [theirs[0].id]

    # Two pools sharing one work_dir are told apart by their tags as well.
    shared = state_dir / "shared"
    in_p = provider(state_dir, work_dir=str(shared)).launch(specs(1)).launched
    assert provider(state_dir, pool="q", work_dir=str(shared)).list() == []
    assert [i.id for i in provider(state_dir, work_dir=str(shared)).list()] == [in_p[0].id]


@pytest.mark.integration
def test_a_restarted_master_finds_its_instances_and_can_end_them(state_dir: Path) -> None:
    before = provider(state_dir).launch(specs(2)).launched
    pids = agents_of(state_dir, before)

    restarted = provider(state_dir)  # a new provider object over the same state: what a restart builds
    found = restarted.list()
    assert sorted((i.id, i.launch_id, i.launched_at) for i in found) == sorted(
        (i.id, i.launch_id, i.launched_at) for i in before)

    restarted.terminate([i.id for i in found])
    eventually(lambda: all(group_ended(pid) for pid in pids.values()), "the process groups ended")
    assert restarted.list() == [] and provider(state_dir).list() == []


@pytest.mark.integration
def test_terminate_ends_the_process_groups_and_is_idempotent(state_dir: Path) -> None:
    local = provider(state_dir)
    a, b = local.launch(specs(2)).launched
    pids = agents_of(state_dir, (a, b))

    local.terminate([a.id, "local-000000000000"])  # an id it never launched is not an error
    eventually(lambda: group_ended(pids[a.id]), "the first instance's process group ended")
    assert pid_alive(pids[b.id])
    assert [i.id for i in local.list()] == [b.id]

    local.terminate([a.id])  # already gone
    local.terminate([])
    local.terminate([b.id, b.id])
    eventually(lambda: group_ended(pids[b.id]), "the second instance's process group ended")
    assert local.list() == [] and agents_under(state_dir) == {}


@pytest.mark.integration
def test_an_instance_whose_agent_died_leaves_the_list(state_dir: Path) -> None:
    local = provider(state_dir)
    dead, alive = local.launch(specs(2)).launched
    pids = agents_of(state_dir, (dead, alive))
    os.kill(pids[dead.id], signal.SIGKILL)

    # A provider that did not start the agent sees it gone while it is still an unreaped zombie ...
    eventually(lambda: [i.id for i in provider(state_dir).list()] == [alive.id], "the dead agent left the list")
    # ... and so does the one that started it; terminating the dead instance afterwards is harmless.
    assert [i.id for i in local.list()] == [alive.id]
    local.terminate([dead.id])
    assert [i.id for i in local.list()] == [alive.id] and pid_alive(pids[alive.id])


@pytest.mark.integration
def test_an_agent_that_exits_at_once_is_not_listed(state_dir: Path) -> None:
    quits = state_dir / "quits.sh"
    quits.write_text("#!/bin/sh\nexit 3\n")
    quits.chmod(0o755)
    local = provider(state_dir, python=str(quits))
    result = local.launch(specs(1))
    assert result.error is None and len(result.launched) == 1  # it did start
    eventually(lambda: local.list() == [], "the exited agent left the list")


@pytest.mark.integration
def test_an_agent_that_cannot_start_is_a_launch_error(state_dir: Path) -> None:
    local = provider(state_dir, python=str(state_dir / "no-such-python"))
    result = local.launch(specs(2))
    assert result.launched == ()
    assert result.error is not None and result.error.kind is ErrorKind.INVALID
    assert "cannot start agent" in str(result.error)
    assert local.list() == []


def test_a_local_pool_builds_a_local_provider(tmp_path: Path) -> None:
    built = build_provider({"type": "local", "slots_per_instance": 4, "slot_type": "auto"}, pool="p", cluster_id="c",
                           master_url="http://m:8080", state_dir=tmp_path)
    assert isinstance(built.provider, LocalProvider) and built.slots_per_instance == 4
    assert (tmp_path / "local-instances" / "p").is_dir()  # the pool's own directory by default


@pytest.mark.parametrize("own, needle", [
    ({"slots_per_instance": True}, "slots_per_instance: must be an integer >= 1"),
    ({"slots_per_instance": "2"}, "slots_per_instance: must be an integer >= 1"),
    ({"slot_type": "gpu"}, "slot_type: must be cpu or auto"),
    ({"instance_type": "m5.large", "zones": ["a"]}, "instance_type: unknown field (known: python, slot_type, "
                                                    "slots_per_instance, work_dir); zones: unknown field"),
])
def test_bad_local_pool_configs_are_refused_naming_the_field(own: dict[str, Any], needle: str, tmp_path: Path) -> None:
    with pytest.raises(PoolConfigError) as e:
        provider(tmp_path, **own)
    assert needle in str(e.value)


@pytest.mark.integration
def test_terminate_removes_the_instance_credentials(state_dir: Path) -> None:
    local = provider(state_dir)
    a, b = local.launch(specs(2)).launched
    tokens = {p.parent.name: p for p in state_dir.rglob("bootstrap-token")}
    assert set(tokens) == {a.id, b.id}
    local.terminate([a.id])
    assert not tokens[a.id].exists()  # a terminated instance leaves no credential on disk
    assert tokens[b.id].exists()
    assert (tokens[a.id].parent / "agent.log").exists()  # its log stays for debugging
    local.terminate([b.id])
    assert list(state_dir.rglob("bootstrap-token")) == []


@pytest.mark.integration
def test_a_malformed_record_is_skipped_not_fatal(state_dir: Path) -> None:
    local = provider(state_dir)
    (a,) = local.launch(specs(1)).launched
    (record,) = state_dir.rglob(f"{a.id}.json")
    bad = record.with_name("local-badbadbadbad.json")
    bad.write_text(json.dumps({"id": "local-badbadbadbad", "tags": json.loads(record.read_text())["tags"]}))
    assert [i.id for i in local.list()] == [a.id]  # no KeyError: the bad record is skipped
    assert bad.exists()  # and kept for whoever edited it
    local.terminate([a.id])
    bad.unlink()
