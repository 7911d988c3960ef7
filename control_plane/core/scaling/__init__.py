"""Scaling of elastic resource pools: the pure scale decider (decider.py, over the vocabulary of
model.py) and the launch-error backoff (backoff.py)."""

from control_plane.core.scaling.decider import decide, instances_needed, lower_bound_instances, summarize
from control_plane.core.scaling.model import (
    DEFAULT_ARRIVAL_WINDOW,
    DEFAULT_MAX_AGENT_STARTING_PERIOD,
    DEFAULT_MAX_DISCONNECTED_PERIOD,
    DEFAULT_MAX_IDLE_AGENT_PERIOD,
    Arrival,
    InstanceOption,
    InstanceView,
    LaunchPlan,
    PendingDemand,
    PoolLimits,
    ScaleDecision,
    Termination,
)

__all__ = [
    "DEFAULT_ARRIVAL_WINDOW",
    "DEFAULT_MAX_AGENT_STARTING_PERIOD",
    "DEFAULT_MAX_DISCONNECTED_PERIOD",
    "DEFAULT_MAX_IDLE_AGENT_PERIOD",
    "Arrival",
    "InstanceOption",
    "InstanceView",
    "LaunchPlan",
    "PendingDemand",
    "PoolLimits",
    "ScaleDecision",
    "Termination",
    "decide",
    "instances_needed",
    "lower_bound_instances",
    "summarize",
]
