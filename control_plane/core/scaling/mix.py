"""The cheapest combination of instance types for the demand no existing instance absorbs: bin
packing by cost, not by count. Pure: no I/O, no clock.

Given what is left of the pending demand (tasks by slot shape, each on one instance; gang parts,
each a whole instance) and the options a pool may launch (`InstanceOption`: a type in a capacity,
its slots and $/h), `cheapest_mix` answers how many instances of which option to launch:

* every single option that fits all shapes, packed alone (best-fit decreasing, the one-type
  decider's packing, passed in as `pack_one`), is a candidate;
* so is a mix: while many tasks remain, the largest one left opens an instance of the option with
  the lowest price per slot it fills (its first-fit-decreasing fill of the tasks left), repeated
  while the same fill recurs, so 10,000 tasks of a few shapes cost a few steps; the last few tasks
  (`EXACT_TASKS`) are placed by an exact branch and bound over types and instances, so for small
  demands the mix is the cheapest that exists;
* the cheapest candidate wins; a tie goes to fewer instances.

An option without a price costs `UNKNOWN_PRICE` an instance: it is chosen only where no priced
option fits, and among unpriced ones the packing minimises the count.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from control_plane.core.scaling.model import InstanceOption, LaunchPlan

UNKNOWN_PRICE = 1e6
EXACT_TASKS = 8  # tasks left to the exact search
_MAX_NODES = 20_000  # the exact search's budget; past it, the best found so far (never worse than greedy)

Shapes = Sequence[tuple[int, int]]  # (slots, tasks), any order
PackOne = Callable[[Shapes, int], int]  # (shapes, slots of one instance) -> instances (best-fit decreasing)


def cost(option: InstanceOption) -> float:
    return option.usd_per_hour if option.usd_per_hour is not None else UNKNOWN_PRICE


@dataclass(frozen=True)
class Mix:
    """Instances to launch: (option, largest task it hosts, count), and their cost an hour."""

    bins: tuple[tuple[InstanceOption, int, int], ...]
    cost: float

    @property
    def count(self) -> int:
        return sum(n for _, _, n in self.bins)


def _mix(bins: dict[tuple[InstanceOption, int], int]) -> Mix:
    rows = tuple((o, largest, n) for (o, largest), n in bins.items() if n)
    return Mix(rows, sum(cost(o) * n for o, _, n in rows))


def _fill(slots: int, left: dict[int, int]) -> dict[int, int]:
    """First-fit decreasing of the tasks left into one empty instance of `slots` slots."""
    free, taken = slots, {}
    for size in sorted(left, reverse=True):
        k = min(left[size], free // size) if size else 0
        if k:
            taken[size] = k
            free -= k * size
    return taken


def _greedy(left: dict[int, int], options: Sequence[InstanceOption], stop_at: int,
            bins: dict[tuple[InstanceOption, int], int]) -> None:
    """Open instances for the largest task left, each of the option with the lowest price per slot
    it fills, until at most `stop_at` tasks are left (they stay in `left`)."""
    while sum(left.values()) > stop_at:
        largest = max(s for s, c in left.items() if c)
        best: tuple[tuple[float, float, int], InstanceOption, dict[int, int]] | None = None
        for o in options:
            if o.slots < largest:
                continue
            taken = _fill(o.slots, left)
            key = (cost(o) / sum(s * k for s, k in taken.items()), cost(o), -o.slots)
            if best is None or key < best[0]:
                best = (key, o, taken)
        assert best is not None  # the caller keeps only shapes some option fits
        _, option, taken = best
        repeat = min(left[s] // k for s, k in taken.items())
        # Repeat the fill while it recurs, but leave the exact search its share.
        repeat = max(1, min(repeat, (sum(left.values()) - stop_at) // sum(taken.values())))
        for s, k in taken.items():
            left[s] -= k * repeat
            if not left[s]:
                del left[s]
        bins[(option, largest)] = bins.get((option, largest), 0) + repeat


def _exact(tasks: list[int], options: Sequence[InstanceOption], bound: float) -> dict[tuple[InstanceOption, int], int] | None:
    """The cheapest placement of a few tasks (slot sizes, largest first) on new instances, by branch
    and bound; None when none is cheaper than `bound`. Instances are (option index, free, largest)."""
    per_slot = min((cost(o) / o.slots for o in options if o.slots), default=0.0)
    best: list[tuple[float, list[tuple[int, int, int]]]] = []
    open_: list[tuple[int, int, int]] = []
    nodes = 0
    rest = [sum(tasks[i:]) for i in range(len(tasks) + 1)]

    def go(i: int, spent: float) -> None:
        nonlocal nodes, bound
        nodes += 1
        free = sum(f for _, f, _ in open_)
        if nodes > _MAX_NODES or spent + max(0, rest[i] - free) * per_slot >= bound - 1e-9:
            return
        if i == len(tasks):
            bound = spent
            best[:] = [(spent, list(open_))]
            return
        size, tried = tasks[i], set()
        for j, (oi, f, largest) in enumerate(open_):
            if f >= size and (oi, f) not in tried:
                tried.add((oi, f))
                open_[j] = (oi, f - size, largest)
                go(i + 1, spent)
                open_[j] = (oi, f, largest)
        for oi, o in enumerate(options):
            if o.slots >= size:
                open_.append((oi, o.slots - size, size))
                go(i + 1, spent + cost(o))
                open_.pop()

    go(0, 0.0)
    if not best:
        return None
    out: dict[tuple[InstanceOption, int], int] = {}
    for oi, _, largest in best[0][1]:
        out[(options[oi], largest)] = out.get((options[oi], largest), 0) + 1
    return out


def _greedy_mix(shapes: Shapes, options: Sequence[InstanceOption]) -> Mix:
    left = {s: c for s, c in shapes if c}
    bins: dict[tuple[InstanceOption, int], int] = {}
    _greedy(left, options, EXACT_TASKS, bins)
    tail = sorted((s for s, c in left.items() for _ in range(c)), reverse=True)
    greedy_tail: dict[tuple[InstanceOption, int], int] = {}
    _greedy(dict(left), options, 0, greedy_tail)
    exact = _exact(tail, options, _mix(greedy_tail).cost + 1e-9) if tail else {}
    for key, n in (exact if exact is not None else greedy_tail).items():
        bins[key] = bins.get(key, 0) + n
    return _mix(bins)


def cheapest_mix(shapes: Shapes, options: Sequence[InstanceOption], pack_one: PackOne,
                 limit: int | None = None) -> Mix:
    """The cheapest instances found for `shapes` (tasks of a slot size > 0, each on one instance;
    every size fits some option); one of at most `limit` instances first, if any is found (a pool
    at its max_instances gets what fits all the work in the room left, not a cut cheaper mix)."""
    shapes = [(s, c) for s, c in shapes if c]
    if not shapes:
        return Mix((), 0.0)
    largest = max(s for s, _ in shapes)
    candidates = [_greedy_mix(shapes, options)]
    for o in options:
        if o.slots >= largest:
            n = pack_one(shapes, o.slots)
            candidates.append(Mix(((o, largest, n),), cost(o) * n))
    return min(candidates, key=lambda m: (limit is not None and m.count > limit, round(m.cost, 9), m.count))


def cheapest_fitting(options: Sequence[InstanceOption], slots: int) -> InstanceOption | None:
    """The cheapest option with at least `slots` slots (fewer slots on a tie)."""
    fitting = [o for o in options if o.slots >= slots]
    return min(fitting, key=lambda o: (cost(o), o.slots, o.spot is False)) if fitting else None


def plans(bins: Sequence[tuple[InstanceOption, int, int]], options: Sequence[InstanceOption]) -> tuple[LaunchPlan, ...]:
    """Launch plans of (option, largest task, count) rows, merged by option, each with its fallbacks:
    the other options that fit its largest task, cheapest first (capacity failover)."""
    merged: dict[InstanceOption, tuple[int, int]] = {}
    for o, largest, n in bins:
        count, need = merged.get(o, (0, 0))
        merged[o] = (count + n, max(need, largest))
    out = []
    for o, (count, need) in merged.items():
        fallbacks = sorted((f for f in options if f != o and f.slots >= need),
                           key=lambda f: (cost(f), f.slots, f.instance_type, f.spot is False))
        out.append(LaunchPlan(o, count, tuple(fallbacks)))
    return tuple(out)
