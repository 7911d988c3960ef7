"""Fixtures for the loop tests: a fake clock, an in-memory cloud behind the Provider interface (the
cloud edge), and a prepared Master on both databases whose pools the tests tick by hand."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest

from control_plane.config import load_config
from control_plane.db.engine import transaction
from control_plane.db.models import Agent, Allocation
from control_plane.master import Master
from provisioners.base import (
    MANAGED_BY_VALUE,
    TAG_CLUSTER,
    TAG_LAUNCH_ID,
    TAG_MANAGED_BY,
    TAG_POOL,
    CloudInstance,
    CloudState,
    LaunchResult,
    LaunchSpec,
    ProviderError,
)
from tests.conftest import ADMIN_PASSWORD, TEST_PASSWORD_HASHING

_Row = TypeVar("_Row")

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
ELASTIC = "elastic"


class FakeClock:
    def __init__(self, now: datetime = T0) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **kwargs: float) -> datetime:
        self.now += timedelta(**kwargs)
        return self.now


@dataclass
class FakeCloud:
    """The cloud as the autoscaler sees it through `launch / list / terminate / describe`: instances
    keyed by id, tagged like a real provider's, kept in memory. `errors` are answered to the next
    launches (one each), `terminate_errors` raised by the next terminate calls (one each);
    `before_launch` runs at the start of every launch call. Like EC2, a terminated instance is still
    described (state terminated) though no longer listed; `lag(id, n)` makes the next n lists miss
    an instance that is there (an eventually consistent list)."""

    clock: FakeClock
    cluster_id: str = ""
    pool: str = ELASTIC
    instances: dict[str, CloudInstance] = field(default_factory=dict)
    gone: dict[str, CloudInstance] = field(default_factory=dict)
    launches: list[tuple[LaunchSpec, ...]] = field(default_factory=list)
    terminated: list[str] = field(default_factory=list)
    terminate_calls: list[tuple[datetime, tuple[str, ...]]] = field(default_factory=list)  # (when, ids)
    errors: list[ProviderError] = field(default_factory=list)
    terminate_errors: list[ProviderError] = field(default_factory=list)
    before_launch: Callable[[Sequence[LaunchSpec]], None] | None = None
    list_lag: dict[str, int] = field(default_factory=dict)
    lag_new_instances: int = 0  # how many lists miss each instance launched from now on
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def tags(self, launch_id: str) -> dict[str, str]:
        return {TAG_MANAGED_BY: MANAGED_BY_VALUE, TAG_CLUSTER: self.cluster_id, TAG_POOL: self.pool,
                TAG_LAUNCH_ID: launch_id}

    def add(self, launch_id: str, state: CloudState = CloudState.RUNNING) -> CloudInstance:
        """An instance that is there without this master's launch call (a lost result, an orphan)."""
        inst = CloudInstance(id=f"i-{next(self._ids):04d}", state=state, launched_at=self.clock(),
                             launch_id=launch_id, location="zone-a", instance_type="fake.large",
                             tags=self.tags(launch_id))
        self.instances[inst.id] = inst
        return inst

    def set_state(self, instance_id: str, state: CloudState) -> None:
        self.instances[instance_id] = replace(self.instances[instance_id], state=state)

    def launch(self, specs: Sequence[LaunchSpec]) -> LaunchResult:
        if self.before_launch is not None:
            self.before_launch(specs)
        self.launches.append(tuple(specs))
        if self.errors:
            return LaunchResult((), self.errors.pop(0))
        launched = tuple(self.add(spec.launch_id, CloudState.PENDING) for spec in specs)
        for inst in launched:
            if self.lag_new_instances:
                self.lag(inst.id, self.lag_new_instances)
        return LaunchResult(launched)

    def lag(self, instance_id: str, lists: int = 1) -> None:
        self.list_lag[instance_id] = lists

    def reclaim(self, instance_id: str) -> None:
        """The instance ends without this master asking (a spot reclaim, a delete in the console)."""
        inst = self.instances.pop(instance_id)
        self.gone[instance_id] = replace(inst, state=CloudState.TERMINATED)

    def list(self) -> list[CloudInstance]:
        out = []
        for inst in self.instances.values():
            if self.list_lag.get(inst.id, 0) > 0:
                self.list_lag[inst.id] -= 1
                continue
            out.append(inst)
        return out

    def describe(self, ids: Sequence[str]) -> dict[str, CloudInstance | None]:
        return {i: self.instances.get(i) or self.gone.get(i) for i in ids}

    def terminate(self, ids: Sequence[str]) -> None:
        self.terminate_calls.append((self.clock(), tuple(ids)))
        if self.terminate_errors:
            raise self.terminate_errors.pop(0)
        for instance_id in ids:
            inst = self.instances.pop(instance_id, None)
            if inst is not None:
                self.terminated.append(instance_id)
                self.gone[instance_id] = replace(inst, state=CloudState.TERMINATED)

    def billed(self) -> int:
        """Instances the cloud account pays for now (stopped ones too: their disks bill)."""
        return len(self.instances)


ELASTIC_PROVIDER: dict[str, Any] = {
    "type": "local",  # the provider the fake stands in for (wrap_provider replaces it)
    "min_instances": 0,
    "max_instances": 3,
    "slots_per_instance": 2,
    "max_idle_agent_period": "60s",
    "max_agent_starting_period": "10m",
    "launch_error_backoff": "30s",
    "launch_error_backoff_max": "10m",
    # The fake stands in for a cloud whose lists lag (a local pool's list would be proof at once).
    "list_miss_grace": "2m",
}


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def make_master(db_url: str, state_dir: Path, clock: FakeClock, provider: dict[str, Any] | None = None) -> Master:
    pools = [{"name": "default"}, {"name": ELASTIC, "provider": provider or ELASTIC_PROVIDER}]
    config = load_config(env={}, db_url=db_url, state_dir=str(state_dir), admin_password=ADMIN_PASSWORD, **TEST_PASSWORD_HASHING,
                         resource_pools=pools)
    m = Master(config, clock=clock)
    m.prepare()
    return m


@pytest.fixture
def loop_master(db_url: str, tmp_path: Path, clock: FakeClock) -> Iterator[Master]:
    m = make_master(db_url, tmp_path / "state", clock)
    yield m
    m.stop()


def add_allocation(master: Master, alloc_id: str, *, pool: str = ELASTIC, slots: int = 1, priority: int = 42,
                   state: str = "pending", agent_id: str | None = None, slot_ids: Sequence[str] = (),
                   created_at: datetime | None = None) -> None:
    now = master.clock()
    with transaction(master.sessions) as s:
        s.add(Allocation(id=alloc_id, task_id=f"task-{alloc_id}", pool=pool, slots_needed=slots, priority=priority,
                         state=state, agent_id=agent_id, slot_ids=list(slot_ids), created_at=created_at or now,
                         assigned_at=None if state == "pending" else now,
                         started_at=now if state == "running" else None))


def add_agent(master: Master, agent_id: str, *, pool: str = ELASTIC, slots: int = 2, instance_id: str | None = None,
              state: str = "connected", last_seen: datetime | None = None) -> None:
    now = master.clock()
    with transaction(master.sessions) as s:
        s.add(Agent(id=agent_id, pool=pool, state=state, slots=[{"id": str(i), "type": "cpu"} for i in range(slots)],
                    session_id=f"session-{agent_id}", instance_id=instance_id, registered_at=now,
                    last_seen=last_seen or now))


def fetch(master: Master, model: type[_Row], key: str) -> _Row:
    """A row as it is in the database now, detached from its session."""
    with master.sessions() as s:
        row = s.get(model, key)
        assert row is not None, f"no {model.__name__} {key!r}"
        s.expunge(row)
        return row


def allocation(master: Master, alloc_id: str) -> Allocation:
    return fetch(master, Allocation, alloc_id)


def agent(master: Master, agent_id: str) -> Agent:
    return fetch(master, Agent, agent_id)
