"""State names. Experiment and trial states use Determined's wire strings directly."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import Any, TypeVar

# -- experiments, trials, allocations: enums with their allowed transitions -----------------------
# Each state machine is a table `from -> states it may move to`. Staying in a state is always
# allowed (requests are idempotent); terminal states lead nowhere. The tables are the one home of
# these rules: services consult `can_transition` / `transition` before writing a new state.


class ExperimentState(StrEnum):
    """Determined's experimentv1State wire strings (the values stored in the database)."""

    ACTIVE = "STATE_ACTIVE"
    PAUSED = "STATE_PAUSED"
    STOPPING_CANCELED = "STATE_STOPPING_CANCELED"
    STOPPING_KILLED = "STATE_STOPPING_KILLED"
    STOPPING_COMPLETED = "STATE_STOPPING_COMPLETED"
    STOPPING_ERROR = "STATE_STOPPING_ERROR"
    COMPLETED = "STATE_COMPLETED"
    CANCELED = "STATE_CANCELED"
    ERROR = "STATE_ERROR"


class TrialState(StrEnum):
    """Determined's trialv1State wire strings (the values stored in the database)."""

    QUEUED = "STATE_QUEUED"
    PULLING = "STATE_PULLING"
    STARTING = "STATE_STARTING"
    RUNNING = "STATE_RUNNING"
    PAUSED = "STATE_PAUSED"
    STOPPING_COMPLETED = "STATE_STOPPING_COMPLETED"
    STOPPING_CANCELED = "STATE_STOPPING_CANCELED"
    STOPPING_KILLED = "STATE_STOPPING_KILLED"
    COMPLETED = "STATE_COMPLETED"
    CANCELED = "STATE_CANCELED"
    ERROR = "STATE_ERROR"


class AllocationState(StrEnum):
    """Shipyard-internal: where one run of a trial is on its way to (and on) an agent."""

    PENDING = "pending"
    ASSIGNED = "assigned"
    PULLING = "pulling"
    STARTING = "starting"
    RUNNING = "running"
    TERMINATED = "terminated"


_E, _T, _A = ExperimentState, TrialState, AllocationState

EXPERIMENT_TRANSITIONS: Mapping[ExperimentState, frozenset[ExperimentState]] = MappingProxyType({
    # The searcher may finish an active experiment directly (Shutdown with every trial ended).
    _E.ACTIVE: frozenset({_E.PAUSED, _E.STOPPING_CANCELED, _E.STOPPING_KILLED, _E.STOPPING_COMPLETED,
                          _E.STOPPING_ERROR, _E.COMPLETED, _E.ERROR}),
    _E.PAUSED: frozenset({_E.ACTIVE, _E.STOPPING_CANCELED, _E.STOPPING_KILLED}),
    # A stopping experiment can still be killed (escalation), never resumed.
    _E.STOPPING_CANCELED: frozenset({_E.STOPPING_KILLED, _E.CANCELED}),
    _E.STOPPING_KILLED: frozenset({_E.CANCELED}),
    _E.STOPPING_COMPLETED: frozenset({_E.STOPPING_KILLED, _E.COMPLETED, _E.ERROR}),
    _E.STOPPING_ERROR: frozenset({_E.STOPPING_KILLED, _E.ERROR}),
    _E.COMPLETED: frozenset(),
    _E.CANCELED: frozenset(),
    _E.ERROR: frozenset(),
})

_TRIAL_LIVE = frozenset({_T.QUEUED, _T.PULLING, _T.STARTING, _T.RUNNING, _T.PAUSED})
_TRIAL_ENDS = frozenset({_T.STOPPING_COMPLETED, _T.STOPPING_CANCELED, _T.STOPPING_KILLED,
                         _T.COMPLETED, _T.CANCELED, _T.ERROR})
TRIAL_TRANSITIONS: Mapping[TrialState, frozenset[TrialState]] = MappingProxyType({
    # A live trial follows its allocation (queued again after a restart or a preemption) and can
    # end from any of those states.
    **{s: (_TRIAL_LIVE | _TRIAL_ENDS) - {s} for s in _TRIAL_LIVE},
    _T.STOPPING_COMPLETED: frozenset({_T.STOPPING_KILLED, _T.COMPLETED, _T.CANCELED, _T.ERROR}),
    _T.STOPPING_CANCELED: frozenset({_T.STOPPING_KILLED, _T.CANCELED, _T.ERROR}),
    _T.STOPPING_KILLED: frozenset({_T.CANCELED, _T.ERROR}),
    _T.COMPLETED: frozenset(),
    _T.CANCELED: frozenset(),
    _T.ERROR: frozenset(),
})

ALLOCATION_TRANSITIONS: Mapping[AllocationState, frozenset[AllocationState]] = MappingProxyType({
    # Forward only: an agent may skip steps (no image to pull) but never goes back.
    _A.PENDING: frozenset({_A.ASSIGNED, _A.TERMINATED}),
    _A.ASSIGNED: frozenset({_A.PULLING, _A.STARTING, _A.RUNNING, _A.TERMINATED}),
    _A.PULLING: frozenset({_A.STARTING, _A.RUNNING, _A.TERMINATED}),
    _A.STARTING: frozenset({_A.RUNNING, _A.TERMINATED}),
    _A.RUNNING: frozenset({_A.TERMINATED}),
    _A.TERMINATED: frozenset(),
})

_TABLES: dict[type[StrEnum], Mapping[Any, frozenset[Any]]] = {
    ExperimentState: EXPERIMENT_TRANSITIONS,
    TrialState: TRIAL_TRANSITIONS,
    AllocationState: ALLOCATION_TRANSITIONS,
}

_S = TypeVar("_S", bound=StrEnum)  # any machine registered in _TABLES


class IllegalTransition(ValueError):
    """A state change the state machine does not allow."""

    def __init__(self, current: str, target: StrEnum) -> None:
        self.current, self.target = current, target
        kind = type(target).__name__.removesuffix("State").lower()
        super().__init__(f"{kind} cannot move from {current} to {target}")


def can_transition(current: _S | str, target: _S) -> bool:
    """Whether a `current` -> `target` change is allowed (staying put always is). `current` may
    be the plain string read from a row; the machine is the one `target` belongs to."""
    machine = type(target)
    if current == target:
        return True
    try:
        return target in _TABLES[machine][machine(current)]
    except ValueError:  # a string this machine does not know leads nowhere
        return False


def transition(current: _S | str, target: _S) -> _S:
    """`target` if the change is allowed, else `IllegalTransition`."""
    if not can_transition(current, target):
        raise IllegalTransition(current, target)
    return target


class ExperimentAction(StrEnum):
    """What a user asks of an experiment (`det experiment activate|pause|cancel|kill`)."""

    ACTIVATE = "activate"
    PAUSE = "pause"
    CANCEL = "cancel"
    KILL = "kill"


# The state an action moves an experiment to; whether it may is EXPERIMENT_TRANSITIONS's call.
ACTION_TARGETS: Mapping[ExperimentAction, ExperimentState] = MappingProxyType({
    ExperimentAction.ACTIVATE: _E.ACTIVE,
    ExperimentAction.PAUSE: _E.PAUSED,
    ExperimentAction.CANCEL: _E.STOPPING_CANCELED,
    ExperimentAction.KILL: _E.STOPPING_KILLED,
})
# Callers may name the state they want instead of the action.
_ACTION_BY_STATE: Mapping[str, ExperimentAction] = MappingProxyType({
    _E.ACTIVE: ExperimentAction.ACTIVATE,
    _E.PAUSED: ExperimentAction.PAUSE,
    _E.STOPPING_CANCELED: ExperimentAction.CANCEL,
    _E.CANCELED: ExperimentAction.CANCEL,
    _E.STOPPING_KILLED: ExperimentAction.KILL,
})


def experiment_action(name: str) -> ExperimentAction | None:
    """The action `name` means (`cancel`, or a state such as `STATE_CANCELED`); None if none."""
    if name in _ACTION_BY_STATE:
        return _ACTION_BY_STATE[name]
    try:
        return ExperimentAction(name)
    except ValueError:
        return None


# Sets of states the rest of the tree filters by (members of the enums above and below).
EXP_TERMINAL = frozenset({_E.COMPLETED, _E.CANCELED, _E.ERROR})
EXP_STOPPING = frozenset({_E.STOPPING_CANCELED, _E.STOPPING_KILLED, _E.STOPPING_COMPLETED, _E.STOPPING_ERROR})
TRIAL_TERMINAL = frozenset({_T.COMPLETED, _T.CANCELED, _T.ERROR})
ALLOC_ON_AGENT = frozenset({_A.ASSIGNED, _A.PULLING, _A.STARTING, _A.RUNNING})
ALLOC_LIVE = ALLOC_ON_AGENT | {_A.PENDING}


class ExitCause(StrEnum):
    """Why an allocation ended (stored on the allocation)."""

    EXITED = "exited"  # the process's own doing: counts against max_restarts when non-zero
    KILLED = "killed"  # the master asked (kill, cancel)
    PREEMPTED = "preempted"  # the master asked it to stop gracefully
    AGENT_LOST = "agent_lost"
    INSTANCE_TERMINATED = "instance_terminated"


# Causes outside the trial's own doing: they never count against max_restarts.
INFRA_CAUSES = frozenset({ExitCause.KILLED, ExitCause.PREEMPTED, ExitCause.AGENT_LOST, ExitCause.INSTANCE_TERMINATED})


class AgentState(StrEnum):
    """Whether an agent is polling the master (stored on the agent)."""

    CONNECTED = "connected"
    DISCONNECTED = "disconnected"


# -- wire state sets (the API filters by these) ----------------------------------------------------
EXPERIMENT_STATES = frozenset(
    {
        "STATE_ACTIVE", "STATE_PAUSED", "STATE_STOPPING_COMPLETED", "STATE_STOPPING_CANCELED",
        "STATE_STOPPING_ERROR", "STATE_STOPPING_KILLED", "STATE_COMPLETED", "STATE_CANCELED",
        "STATE_ERROR", "STATE_DELETED", "STATE_DELETING", "STATE_DELETE_FAILED", "STATE_QUEUED",
        "STATE_PULLING", "STATE_STARTING", "STATE_RUNNING",
    }
)
TRIAL_STATES = frozenset(
    {
        "STATE_ACTIVE", "STATE_PAUSED", "STATE_STOPPING_CANCELED", "STATE_STOPPING_KILLED",
        "STATE_STOPPING_COMPLETED", "STATE_STOPPING_ERROR", "STATE_CANCELED", "STATE_COMPLETED",
        "STATE_ERROR", "STATE_QUEUED", "STATE_PULLING", "STATE_STARTING", "STATE_RUNNING",
    }
)
# Trials are stored in their active sub-states; Determined's STATE_ACTIVE filter means all of them.
TRIAL_ACTIVE_SUBSTATES = frozenset({"STATE_ACTIVE", "STATE_QUEUED", "STATE_PULLING", "STATE_STARTING", "STATE_RUNNING"})

class CheckpointState(StrEnum):
    """Determined's checkpointv1State wire strings, plus STATE_DELETING: Shipyard-internal, deletion
    was requested and the GC worker has not removed the files yet. Determined has no such value,
    and the deletion cannot be undone, so the API shows it as STATE_DELETED."""

    ACTIVE = "STATE_ACTIVE"
    COMPLETED = "STATE_COMPLETED"
    ERROR = "STATE_ERROR"
    DELETING = "STATE_DELETING"
    DELETED = "STATE_DELETED"
    PARTIALLY_DELETED = "STATE_PARTIALLY_DELETED"


_C = CheckpointState
CKPT_WIRE_STATES = frozenset({_C.ACTIVE, _C.COMPLETED, _C.ERROR, _C.DELETED, _C.PARTIALLY_DELETED})
CKPT_LIVE = frozenset({_C.ACTIVE, _C.COMPLETED, _C.PARTIALLY_DELETED})
CKPT_GONE = frozenset({_C.DELETING, _C.DELETED})


def state_name(value: str) -> str:
    """Stored states are Determined's wire strings; tolerate a bare name from older rows."""
    return value if value.startswith("STATE_") else f"STATE_{value}"


def checkpoint_wire_state(value: str) -> str:
    s = state_name(value)
    return CheckpointState.DELETED if s == CheckpointState.DELETING else s


# -- instances and pools: the autoscaler's record (control_plane/loops/autoscaler/) ------------
# Same rules as above: staying put is always allowed, `can_transition` / `transition` read these
# tables. What the cloud itself reports about an instance is provisioners.base.CloudState.


class InstanceState(StrEnum):
    """The master's record of an instance it launched (the `instances` table)."""

    REQUESTED = "requested"  # row written before the launch call; no cloud instance confirmed yet
    STARTING = "starting"  # the cloud has it, not running yet
    RUNNING = "running"
    STOPPING = "stopping"  # terminate requested, or the cloud is stopping it
    TERMINATED = "terminated"
    # The warm pool (`warm_pool_size`): an idle on-demand instance powered off instead of terminated,
    # its disks kept, so that a start brings it back faster than a launch boots a new one.
    PARKING = "parking"  # stop requested: the cloud is powering it off
    PARKED = "parked"  # powered off and kept: no slot, no compute billed; its disks bill


_I = InstanceState

INSTANCE_TRANSITIONS: Mapping[InstanceState, frozenset[InstanceState]] = MappingProxyType({
    _I.REQUESTED: frozenset({_I.STARTING, _I.RUNNING, _I.STOPPING, _I.TERMINATED}),
    _I.STARTING: frozenset({_I.RUNNING, _I.STOPPING, _I.TERMINATED}),
    # Running → starting: the cloud reports it pending again (a GCE host repairing under it).
    # Running → parking: idle, and stopped into the warm pool instead of terminated.
    _I.RUNNING: frozenset({_I.STARTING, _I.STOPPING, _I.TERMINATED, _I.PARKING}),
    # Once asked to stop, an instance only ends: the cloud's view never brings it back.
    _I.STOPPING: frozenset({_I.TERMINATED}),
    _I.TERMINATED: frozenset(),
    # A parked instance is started again (→ starting, as a launch), or terminated; never running
    # by the cloud's say alone (a start is the master's decision).
    _I.PARKING: frozenset({_I.PARKED, _I.STOPPING, _I.TERMINATED}),
    # Parked → parking: the cloud reports it running although the master did not start it: it is
    # stopped again.
    _I.PARKED: frozenset({_I.STARTING, _I.STOPPING, _I.TERMINATED, _I.PARKING}),
})
# Instances that count toward the pool's size.
INSTANCE_LIVE = frozenset({_I.REQUESTED, _I.STARTING, _I.RUNNING})
# Instances that may bill compute: the live ones, those being terminated until the cloud says they
# are gone, and those being parked until it says they are stopped. These count toward max_instances.
INSTANCE_BILLED = INSTANCE_LIVE | {_I.STOPPING, _I.PARKING}
# The warm pool: powered off (or being powered off), their disks billing; a parked one is outside
# max_instances.
INSTANCE_PARKED = frozenset({_I.PARKING, _I.PARKED})
# Every instance the master accounts for until the cloud says it is gone.
INSTANCE_KEPT = INSTANCE_BILLED | INSTANCE_PARKED


class PoolState(StrEnum):
    """Whether an elastic pool may launch (the `resource_pools` table)."""

    OK = "ok"
    BACKOFF = "backoff"  # launch errors: no launch before backoff_until
    ERROR = "error"  # unusable config or account: looked at again after launch_error_backoff_max
    DISABLED = "disabled"  # torn down: launches nothing until enabled


_P = PoolState

POOL_TRANSITIONS: Mapping[PoolState, frozenset[PoolState]] = MappingProxyType({
    _P.OK: frozenset({_P.BACKOFF, _P.ERROR, _P.DISABLED}),
    _P.BACKOFF: frozenset({_P.OK, _P.ERROR, _P.DISABLED}),
    _P.ERROR: frozenset({_P.OK, _P.BACKOFF, _P.DISABLED}),
    # A torn-down pool stays down, whatever a launch still in flight reports, until enabled.
    _P.DISABLED: frozenset({_P.OK}),
})

_TABLES[InstanceState] = INSTANCE_TRANSITIONS
_TABLES[PoolState] = POOL_TRANSITIONS
