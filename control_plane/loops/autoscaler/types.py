"""A pool of several instance types (or capacities) as the autoscaler sees it: the provider's offers
as the decider's options, each instance's slots by its recorded type, and the choices a launch
tries in order (the type the decider chose, then the next-cheapest that fit the same work: the
capacity failover across types, provisioners/capacity.launch_with_failover)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from control_plane.core.scaling import InstanceOption, LaunchPlan, ScaleDecision
from control_plane.core.scaling.mix import cost
from provisioners.base import InstanceOffer, LaunchChoice, offers_of

SPOT, ON_DEMAND = "spot", "on-demand"


def options_of(provider: object) -> tuple[InstanceOption, ...]:
    """The decider's options: the provider's offers when it has more than one (one type in one
    capacity is the single-type pool the decider knew before)."""
    offers = offers_of(provider)
    if len(offers) < 2:
        return ()
    return tuple(_option(o) for o in offers)


def _option(o: InstanceOffer) -> InstanceOption:
    return InstanceOption(o.instance_type, o.slots, o.usd_per_hour, o.spot)


def out_of_capacity(provider: object) -> frozenset[InstanceOption]:
    """The options out of capacity in every location now: the decider plans without them (a cheap
    type out of capacity would otherwise be planned, then fail over one instance at a time to a
    bigger type, launching more of those than a plan for the bigger type needs)."""
    available = set(offers_of(provider, available=True))
    return frozenset(_option(o) for o in offers_of(provider) if o not in available)


def matches(key: str, instance_type: str) -> bool:
    """Whether an offer's type `key` is the type a cloud reports: equal, or (GCP) the machine type
    of a key that adds its accelerators ("n1-standard-8 + 2x nvidia-tesla-t4")."""
    return key == instance_type or key.startswith(f"{instance_type} + ")


def slots_of(options: Sequence[InstanceOption], instance_type: str) -> int | None:
    """An instance's slots by its recorded type; None (the pool's slots) when no option has it."""
    return next((o.slots for o in options if instance_type and matches(o.instance_type, instance_type)), None)


def recorded_type(options: Sequence[InstanceOption], instance_type: str) -> str:
    """The option key to record for what the cloud launched (its own name when none matches)."""
    return next((o.instance_type for o in options if instance_type and matches(o.instance_type, instance_type)),
                instance_type)


def planned_rows(decision: ScaleDecision, launch: int) -> list[tuple[str, str]]:
    """(instance type, capacity) of each of the first `launch` instances of the decision's plans;
    ("", "") for a single-type pool's."""
    rows = [(p.option.instance_type, p.option.capacity) for p in decision.launches for _ in range(p.count)]
    return (rows + [("", "")] * launch)[:launch]


def choices_for(offers: Sequence[InstanceOffer], instance_type: str, capacity: str) -> tuple[LaunchChoice, ...]:
    """What a launch row tries, in order: its planned type and capacity, then every other offer
    with at least its slots, cheapest first. () when it has no plan (the provider's own order)."""
    chosen = next((o for o in offers if o.instance_type == instance_type and o.spot == (capacity == SPOT)), None)
    if chosen is None:
        return ()
    rest = sorted((o for o in offers if o != chosen and o.slots >= chosen.slots),
                  key=lambda o: (cost(InstanceOption(o.instance_type, o.slots, o.usd_per_hour, o.spot)),
                                 o.slots, o.instance_type))
    return (chosen.choice, *(o.choice for o in rest))


def describe_plans(plans: Sequence[LaunchPlan]) -> list[dict[str, Any]]:
    """The decision's launches as `det resource-pool describe` and the API show them."""
    return [{"instance_type": p.option.instance_type, "capacity": p.option.capacity, "count": p.count,
             "slots": p.option.slots, "usd_per_hour_each": p.option.usd_per_hour,
             "fallbacks": [f"{f.instance_type} ({f.capacity})" for f in p.fallbacks]} for p in plans]


def describe_offers(options: Sequence[InstanceOption]) -> list[dict[str, Any]]:
    return [{"instance_type": o.instance_type, "capacity": o.capacity, "slots": o.slots,
             "usd_per_hour": o.usd_per_hour} for o in options]
