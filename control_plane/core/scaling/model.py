"""The scale decider's vocabulary: what it is given (demand, arrivals, instances, limits) and what
it answers (a decision of launches and terminations, each with its reason). Pure data."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from control_plane.core.states import InstanceState

# The pool settings' defaults have one home (shipyard_common/pool_settings.py); the limits a test or
# a benchmark builds by hand take the same ones.
from shipyard_common.pool_settings import (
    DEFAULT_ARRIVAL_WINDOW,
    DEFAULT_MAX_AGENT_STARTING_PERIOD,
    DEFAULT_MAX_DISCONNECTED_PERIOD,
    DEFAULT_MAX_IDLE_AGENT_PERIOD,
    DEFAULT_WARM_POOL_MAX_AGE,
)

__all__ = [
    "DEFAULT_ARRIVAL_WINDOW",
    "DEFAULT_MAX_AGENT_STARTING_PERIOD",
    "DEFAULT_MAX_DISCONNECTED_PERIOD",
    "DEFAULT_MAX_IDLE_AGENT_PERIOD",
    "Arrival",
    "InstanceAction",
    "InstanceOption",
    "InstanceView",
    "LaunchPlan",
    "PendingDemand",
    "PoolLimits",
    "ScaleDecision",
    "Termination",
]


@dataclass(frozen=True)
class PendingDemand:
    """`count` tasks, each needing `slots` slots on one instance (a gang). `slots == 0` is a task
    that needs an instance but no slot; it fits on any instance. `instances` > 1: each task is a
    gang across that many whole instances of `slots` slots at once (core/scheduling/gang.py); one
    that needs more than `max_instances` can never be placed, so it launches and keeps nothing."""

    slots: int
    count: int
    instances: int = 1

    def __post_init__(self) -> None:
        if self.slots < 0:
            raise ValueError(f"slots must be >= 0, got {self.slots}")
        if self.count < 0:
            raise ValueError(f"count must be >= 0, got {self.count}")
        if self.instances < 1:
            raise ValueError(f"instances must be >= 1, got {self.instances}")


@dataclass(frozen=True)
class Arrival:
    """A task that arrived in the pool's queue at `at`, needing `slots` slots on one instance (an
    allocation's creation). The recent ones predict the next (scale-down hysteresis)."""

    at: datetime
    slots: int


@dataclass(frozen=True)
class InstanceView:
    """One instance of the pool as the autoscaler loop observed it.

    `agent_disconnected_since` is when a once-connected agent dropped (None while connected, or if
    unknown: then the disconnection is treated as starting now). `idle_since` is when the agent's
    last task finished; None means busy. "Busy" is only meaningful for a connected agent: the work of
    an agent gone longer than max_disconnected_period is presumed lost, and its instance is replaced.
    """

    id: str
    state: InstanceState
    launched_at: datetime
    agent_connected: bool = False
    agent_first_connected_at: datetime | None = None
    agent_disconnected_since: datetime | None = None
    busy_slots: int = 0
    idle_since: datetime | None = None
    #: The instance's own slots (a pool of several instance types); None: `PoolLimits.slots_per_instance`.
    slots: int | None = None
    instance_type: str = ""
    #: False: its agent is disabled (cordoned, drained, disabled by an admin): no demand is packed
    #: onto it and it is no room ahead of arrivals, though it is idle when it holds nothing.
    accepts_work: bool = True
    #: Bought as spot: never parked in the warm pool (a spot instance cannot be stopped and started
    #: again at will), terminated instead.
    spot: bool = False
    #: PARKING / PARKED: when it was stopped into the warm pool. (An instance started again from the
    #: warm pool is STARTING with `launched_at` the start, as if launched then.)
    parked_at: datetime | None = None


@dataclass(frozen=True)
class InstanceOption:
    """One way a pool may launch an instance: an instance (machine) type in one capacity (spot or
    on-demand), the slots it brings, and its estimated price in USD per hour (None: not in the price
    catalogue; such an option is chosen only when no priced one fits)."""

    instance_type: str
    slots: int
    usd_per_hour: float | None = None
    spot: bool = False

    def __post_init__(self) -> None:
        if self.slots < 0:
            raise ValueError(f"slots must be >= 0, got {self.slots}")
        if self.usd_per_hour is not None and self.usd_per_hour < 0:
            raise ValueError(f"usd_per_hour must be >= 0, got {self.usd_per_hour}")

    @property
    def capacity(self) -> str:
        return "spot" if self.spot else "on-demand"

    def describe(self) -> str:
        price = f", ${self.usd_per_hour:.4g}/h" if self.usd_per_hour is not None else ", price unknown"
        return f"{self.instance_type} ({self.capacity}{price})"


@dataclass(frozen=True)
class LaunchPlan:
    """`count` instances of one option, and what to try instead, in order, when the cloud has no
    capacity for it (the next-cheapest options that fit the same work)."""

    option: InstanceOption
    count: int
    fallbacks: tuple[InstanceOption, ...] = ()

    @property
    def usd_per_hour(self) -> float | None:
        price = self.option.usd_per_hour
        return None if price is None else price * self.count


@dataclass(frozen=True)
class PoolLimits:
    min_instances: int
    max_instances: int
    slots_per_instance: int
    max_idle_agent_period: timedelta = DEFAULT_MAX_IDLE_AGENT_PERIOD
    max_agent_starting_period: timedelta = DEFAULT_MAX_AGENT_STARTING_PERIOD
    max_disconnected_period: timedelta = DEFAULT_MAX_DISCONNECTED_PERIOD
    max_launch_per_decision: int | None = None
    arrival_window: timedelta = DEFAULT_ARRIVAL_WINDOW
    #: The instance types (and capacities) the pool may launch, any order. Empty: one unnamed type
    #: of `slots_per_instance` slots, as before pools had several; with some, `slots_per_instance`
    #: is the largest option's slots (what a task must fit on one instance).
    options: tuple[InstanceOption, ...] = ()
    #: Options the cloud has no capacity for in any location now: new instances are planned on the
    #: others (all of them when every one is out: the launch then reports it and the pool backs off).
    out_of_capacity: frozenset[InstanceOption] = frozenset()
    #: Measured boot times (launch to agent first connected) of the pool's recent instances. Given
    #: (and an arrival window), the idle stage weighs idling against a relaunch (idle.py); empty:
    #: idle instances go after max_idle_agent_period (with the scale-down hysteresis).
    boot_times: tuple[timedelta, ...] = ()
    #: The warm pool: up to this many idle on-demand instances are stopped (parked) instead of
    #: terminated, and started again before anything is launched; 0: none (terminated, as before).
    warm_pool_size: int = 0
    #: A parked instance older than this is terminated (its disks bill, its software ages).
    warm_pool_max_age: timedelta = DEFAULT_WARM_POOL_MAX_AGE
    #: Measured starts from the warm pool (start to agent connected again); the idle policy weighs
    #: a relaunch of an instance it would park by them (by `boot_times` while there are none).
    start_times: tuple[timedelta, ...] = ()

    def __post_init__(self) -> None:
        if self.warm_pool_size < 0:
            raise ValueError(f"warm_pool_size must be >= 0, got {self.warm_pool_size}")
        if self.min_instances < 0:
            raise ValueError(f"min_instances must be >= 0, got {self.min_instances}")
        if self.max_instances < self.min_instances:
            raise ValueError(
                f"max_instances ({self.max_instances}) must be >= min_instances ({self.min_instances})"
            )
        if self.slots_per_instance < 0:
            raise ValueError(f"slots_per_instance must be >= 0, got {self.slots_per_instance}")
        if self.max_launch_per_decision is not None and self.max_launch_per_decision < 0:
            raise ValueError(f"max_launch_per_decision must be >= 0, got {self.max_launch_per_decision}")
        if self.options and self.slots_per_instance != max(o.slots for o in self.options):
            raise ValueError(f"slots_per_instance ({self.slots_per_instance}) must be the largest option's slots "
                             f"({max(o.slots for o in self.options)})")
        if self.arrival_window < timedelta(0):
            raise ValueError(f"arrival_window must be >= 0 (0: no hysteresis), got {self.arrival_window}")


@dataclass(frozen=True)
class Termination:
    """`presumes_idle`: decided because the instance had no work in the snapshot (idle, or shed
    before its agent connected). The shell must apply it only if that is still true when it writes
    (a placement may have committed since), and skip it otherwise."""

    id: str
    reason: str
    presumes_idle: bool = False


@dataclass(frozen=True)
class InstanceAction:
    """An instance to park (stop into the warm pool: the shell applies it only if the instance is
    still without work, as an idle termination) or to start again from it, and why."""

    id: str
    reason: str


@dataclass(frozen=True)
class ScaleDecision:
    """`launch` instances in all; with `PoolLimits.options`, `launches` says which (their counts add
    up to `launch`). `start`: parked instances to start again, each instead of a launch of its type;
    `park`: idle instances to stop into the warm pool instead of terminating them."""

    launch: int
    terminate: tuple[Termination, ...] = ()
    reasons: tuple[str, ...] = field(default_factory=tuple)
    launches: tuple[LaunchPlan, ...] = ()
    start: tuple[InstanceAction, ...] = ()
    park: tuple[InstanceAction, ...] = ()

    @property
    def usd_per_hour(self) -> float | None:
        """The estimated price of the launches an hour; None when one has no price."""
        prices = [p.usd_per_hour for p in self.launches]
        return None if any(p is None for p in prices) else sum(p for p in prices if p is not None)

    @property
    def terminate_ids(self) -> tuple[str, ...]:
        return tuple(t.id for t in self.terminate)
