"""The autoscaler loop: per elastic pool, observe (cloud list + database), decide (pure scale
decider), act (launch / terminate through the pool's provider), and record everything on the pool.

Level-triggered: every tick starts from what the cloud's tags and the database say, never from
memory, so a crash anywhere is healed by the next tick:
- an instance row is written (state `requested`, keyed by a fresh launch id) *before* the launch
  call; the launch id is the cloud's idempotency key and a tag on the instance;
- a cloud instance whose launch id matches a row is adopted (this heals a crash between launch and
  record: no duplicate launch); one with this cluster's tags and no row is an orphan, terminated;
- a row whose instance vanished from the cloud (spot reclaim, manual delete) ends, and so do the
  allocations that ran on it (an infrastructure failure: it does not count against max_restarts).
  A list miss is evidence, not proof (cloud lists are eventually consistent): the row ends when the
  cloud says so by id (`describe`) or after the pool's `list_miss_grace`
  (control_plane/core/scaling/reconcile.py has the rules);
- terminations are level-triggered: a row in `stopping` (and an orphan) gets its terminate call
  again on later ticks, at growing intervals up to a bound, until the cloud reports the instance
  gone; a crash between committing `stopping` and the call is healed the same way. Until then the
  instance counts toward max_instances (it bills). An instance the cloud reports stopped, suspended
  or shutting down (a GCE VM powered off, an EC2 instance stopped by hand) is terminated: its disks
  would bill forever.
The snapshot is read in a read-only transaction and the decision written in another, so placement
may commit in between: a termination that presumes the instance idle is applied only if its agent
still holds no allocation under a lock on the agent's row, which is disabled in the same
transaction (placement assigns through a compare-and-set on `enabled`); whichever commits first
wins. The decider is given the pool's recent demand arrivals (allocations created over its
`arrival_window`) for its scale-down hysteresis.
Launch errors back the pool off or stop it (the pure core control_plane/core/scaling/backoff.py
decides how long from the error's kind and scope), and the pool shows why in
`det resource-pool describe`; during a long backoff one instance probes every
`launch_probe_interval`. An error shown on the pool ends with the condition that caused it.

What is kept in memory is safe to lose (`memory.py`).

The steps, one module each: `reconcile` (observe: rows against the cloud's list), `decision` (the
snapshot, the pure decider, the write with the idle claim), `act` (launch and terminate calls,
their outcomes, teardown's write); `records` holds the row changes they share, and `loop` the
`Autoscaler` that chains them per pool.

Tests reach the cloud edge through `wrap_provider`: a function that wraps each pool's provider
(failure injection, a crash right after a launch), so no test-only path lives here."""

from control_plane.loops.autoscaler.act import UserDataRenderer
from control_plane.loops.autoscaler.loop import Autoscaler, ProviderWrapper, register
from control_plane.loops.autoscaler.reconcile import LIST_ERROR, REQUEST_GRACE

__all__ = [
    "LIST_ERROR",
    "REQUEST_GRACE",
    "Autoscaler",
    "ProviderWrapper",
    "UserDataRenderer",
    "register",
]
