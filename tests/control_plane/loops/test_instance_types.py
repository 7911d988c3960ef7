"""The autoscaler loop with a pool of several instance types and capacities, on both databases: the
decision launches the cheapest combination that fits, each launch row records its planned type and
capacity before the call, the launch asks for it with the next-cheapest fitting types as fallbacks,
the row then records what the cloud launched, and the pool's record shows the offers and the
choice. The cloud is the in-memory one (the provider's failover itself is tested against moto and
the GCE fake in tests/provisioners/)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from sqlalchemy import select

from control_plane.db.models import Instance, ResourcePool
from control_plane.loops.autoscaler import Autoscaler
from control_plane.master import Master
from provisioners.base import CloudState, InstanceOffer, LaunchChoice, LaunchResult, LaunchSpec
from tests.control_plane.loops.conftest import (
    ELASTIC,
    ELASTIC_PROVIDER,
    FakeClock,
    FakeCloud,
    add_allocation,
    fetch,
    make_master,
)

SMALL_SPOT = InstanceOffer("g.1", 1, True, 0.20)
SMALL = InstanceOffer("g.1", 1, False, 0.60)
BIG_SPOT = InstanceOffer("g.4", 4, True, 0.70)
BIG = InstanceOffer("g.4", 4, False, 2.00)


@dataclass
class TypedCloud(FakeCloud):
    """The in-memory cloud launching each spec as its first choice, but out of capacity for
    `exhausted` choices (it then goes on to the spec's next choice, as the real providers do)."""

    offered: tuple[InstanceOffer, ...] = (SMALL_SPOT, SMALL, BIG_SPOT, BIG)
    exhausted: set[LaunchChoice] = field(default_factory=set)

    def offers(self) -> tuple[InstanceOffer, ...]:
        return self.offered

    def launch(self, specs: Sequence[LaunchSpec]) -> LaunchResult:
        self.launches.append(tuple(specs))
        out = []
        for spec in specs:
            choice = next(c for c in spec.choices if c not in self.exhausted)
            inst = self.add(spec.launch_id, CloudState.PENDING)
            self.instances[inst.id] = inst = type(inst)(**{**inst.__dict__, "instance_type": choice.instance_type,
                                                            "spot": choice.spot})
            out.append(inst)
        return LaunchResult(tuple(out))


def _rows(master: Master) -> list[Instance]:
    with master.sessions() as s:
        rows = list(s.scalars(select(Instance)))
        s.expunge_all()
        return rows


def _four_ones_and_a_three(master: Master, clock: FakeClock) -> tuple[TypedCloud, Autoscaler]:
    """Four pending 1-slot tasks and one of 3 slots, and an autoscaler on the typed cloud."""
    cloud = TypedCloud(clock)
    cloud.cluster_id = master.cluster_id
    for i in range(4):
        add_allocation(master, f"one-{i}", slots=1)
    add_allocation(master, "three", slots=3)
    return cloud, Autoscaler(master, wrap_provider=lambda _pool, _provider: cloud)


@pytest.fixture
def roomy_master(db_url: str, tmp_path: Path, clock: FakeClock) -> Iterator[Master]:
    m = make_master(db_url, tmp_path / "state", clock, {**ELASTIC_PROVIDER, "max_instances": 10})
    yield m
    m.stop()


def test_launches_the_cheapest_mix_and_records_type_and_capacity(roomy_master: Master, clock: FakeClock) -> None:
    loop_master = roomy_master
    # One big spot ($0.70) takes the 3-slot task and one more; three small spot ($0.60) the rest:
    # $1.30/h, cheaper than two big spot ($1.40); no small one fits the 3-slot task.
    cloud, scaler = _four_ones_and_a_three(loop_master, clock)

    scaler.tick()

    (specs,) = cloud.launches
    assert Counter(s.choices[0] for s in specs) == Counter({BIG_SPOT.choice: 1, SMALL_SPOT.choice: 3})
    big = next(s for s in specs if s.choices[0] == BIG_SPOT.choice)
    # Fallbacks: what fits the same work, cheapest first (the 4-slot type only, on demand after spot).
    assert big.choices == (BIG_SPOT.choice, BIG.choice)
    small = next(s for s in specs if s.choices[0] == SMALL_SPOT.choice)
    assert small.choices == (SMALL_SPOT.choice, SMALL.choice, BIG_SPOT.choice, BIG.choice)
    rows = _rows(loop_master)
    assert sorted((r.instance_type, r.capacity) for r in rows) == [("g.1", "spot")] * 3 + [("g.4", "spot")]
    pool = fetch(loop_master, ResourcePool, ELASTIC)
    decision = pool.last_decision or {}
    assert decision["usd_per_hour"] == 1.3
    assert {(d["instance_type"], d["capacity"], d["count"]) for d in decision["launches"]} == {
        ("g.1", "spot", 3), ("g.4", "spot", 1)}
    assert {(o["instance_type"], o["capacity"], o["usd_per_hour"]) for o in decision["offers"]} == {
        ("g.1", "spot", 0.2), ("g.1", "on-demand", 0.6), ("g.4", "spot", 0.7), ("g.4", "on-demand", 2.0)}
    assert any(r.startswith("cheapest fit: ") and "3x g.1 (spot, $0.2/h)" in r and "est. $1.3/h" in r
               for r in decision["reasons"])

    # The booting instances absorb the same demand by their own slots: nothing more is launched.
    scaler.tick()
    assert len(cloud.launches) == 1


def test_at_max_instances_the_cheapest_mix_that_fits_the_room(loop_master: Master, clock: FakeClock) -> None:
    cloud, scaler = _four_ones_and_a_three(loop_master, clock)

    scaler.tick()

    # max_instances 3: the $1.30 mix needs 4 instances; two 4-slot spot ones ($1.40) fit everything.
    (specs,) = cloud.launches
    assert [s.choices[0] for s in specs] == [BIG_SPOT.choice] * 2


def test_the_row_records_what_launched_after_a_failover(loop_master: Master, clock: FakeClock) -> None:
    cloud = TypedCloud(clock, exhausted={BIG_SPOT.choice})
    cloud.cluster_id = loop_master.cluster_id
    add_allocation(loop_master, "four", slots=4)
    scaler = Autoscaler(loop_master, wrap_provider=lambda _pool, _provider: cloud)

    scaler.tick()

    (row,) = _rows(loop_master)
    assert (row.instance_type, row.capacity) == ("g.4", "on-demand")
    scaler.tick()
    assert len(cloud.launches) == 1  # the on-demand instance counts for the demand
