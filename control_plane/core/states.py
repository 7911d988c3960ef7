"""State names. Experiment and trial states use Determined's wire strings directly."""

from __future__ import annotations

# experiments (experimentv1State)
EXP_ACTIVE = "STATE_ACTIVE"
EXP_PAUSED = "STATE_PAUSED"
EXP_STOPPING_CANCELED = "STATE_STOPPING_CANCELED"
EXP_STOPPING_KILLED = "STATE_STOPPING_KILLED"
EXP_STOPPING_COMPLETED = "STATE_STOPPING_COMPLETED"
EXP_STOPPING_ERROR = "STATE_STOPPING_ERROR"
EXP_COMPLETED = "STATE_COMPLETED"
EXP_CANCELED = "STATE_CANCELED"
EXP_ERROR = "STATE_ERROR"
EXP_TERMINAL = frozenset({EXP_COMPLETED, EXP_CANCELED, EXP_ERROR})
EXP_STOPPING = frozenset({EXP_STOPPING_CANCELED, EXP_STOPPING_KILLED, EXP_STOPPING_COMPLETED, EXP_STOPPING_ERROR})

# trials (trialv1State)
TRIAL_QUEUED = "STATE_QUEUED"
TRIAL_PULLING = "STATE_PULLING"
TRIAL_STARTING = "STATE_STARTING"
TRIAL_RUNNING = "STATE_RUNNING"
TRIAL_PAUSED = "STATE_PAUSED"
TRIAL_STOPPING_COMPLETED = "STATE_STOPPING_COMPLETED"
TRIAL_STOPPING_CANCELED = "STATE_STOPPING_CANCELED"
TRIAL_STOPPING_KILLED = "STATE_STOPPING_KILLED"
TRIAL_COMPLETED = "STATE_COMPLETED"
TRIAL_CANCELED = "STATE_CANCELED"
TRIAL_ERROR = "STATE_ERROR"
TRIAL_TERMINAL = frozenset({TRIAL_COMPLETED, TRIAL_CANCELED, TRIAL_ERROR})

# allocations (internal)
ALLOC_PENDING = "pending"
ALLOC_ASSIGNED = "assigned"
ALLOC_PULLING = "pulling"
ALLOC_STARTING = "starting"
ALLOC_RUNNING = "running"
ALLOC_TERMINATED = "terminated"
ALLOC_LIVE = frozenset({ALLOC_PENDING, ALLOC_ASSIGNED, ALLOC_PULLING, ALLOC_STARTING, ALLOC_RUNNING})
ALLOC_ON_AGENT = frozenset({ALLOC_ASSIGNED, ALLOC_PULLING, ALLOC_STARTING, ALLOC_RUNNING})

# why an allocation ended
CAUSE_EXITED = "exited"  # the process's own doing: counts against max_restarts when non-zero
CAUSE_KILLED = "killed"  # the master asked (kill, cancel)
CAUSE_PREEMPTED = "preempted"  # the master asked it to stop gracefully
CAUSE_AGENT_LOST = "agent_lost"
CAUSE_INSTANCE_TERMINATED = "instance_terminated"
INFRA_CAUSES = frozenset({CAUSE_KILLED, CAUSE_PREEMPTED, CAUSE_AGENT_LOST, CAUSE_INSTANCE_TERMINATED})

# agents
AGENT_CONNECTED = "connected"
AGENT_DISCONNECTED = "disconnected"


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

# Checkpoints. STATE_DELETING is Shipyard-internal: deletion was requested and the GC worker has
# not removed the files yet. Determined's checkpointv1State has no such value, and the deletion
# cannot be undone, so the API shows it as STATE_DELETED.
CKPT_ACTIVE = "STATE_ACTIVE"
CKPT_COMPLETED = "STATE_COMPLETED"
CKPT_ERROR = "STATE_ERROR"
CKPT_DELETING = "STATE_DELETING"
CKPT_DELETED = "STATE_DELETED"
CKPT_PARTIALLY_DELETED = "STATE_PARTIALLY_DELETED"
CKPT_WIRE_STATES = frozenset({CKPT_ACTIVE, CKPT_COMPLETED, CKPT_ERROR, CKPT_DELETED, CKPT_PARTIALLY_DELETED})
CKPT_LIVE = frozenset({CKPT_ACTIVE, CKPT_COMPLETED, CKPT_PARTIALLY_DELETED})
CKPT_GONE = frozenset({CKPT_DELETING, CKPT_DELETED})


def state_name(value: str) -> str:
    """Stored states are Determined's wire strings; tolerate a bare name from older rows."""
    return value if value.startswith("STATE_") else f"STATE_{value}"


def checkpoint_wire_state(value: str) -> str:
    s = state_name(value)
    return CKPT_DELETED if s == CKPT_DELETING else s
