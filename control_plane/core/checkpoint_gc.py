"""Checkpoint garbage collection policy: a pure function from an experiment's checkpoints and its
`checkpoint_storage` save_* settings to the set of checkpoints to delete.

A checkpoint is kept when any rule keeps it (Determined's semantics):
- save_experiment_best N: the N best across the experiment, by the searcher metric of the
  validation taken at the checkpoint's step;
- save_trial_best N: the N best of each trial;
- save_trial_latest N: the N most recent of each trial;
and it is always kept when protected (a trial resumed from it, or the model registry holds it)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class CheckpointInfo:
    uuid: str
    trial_id: int
    steps_completed: int
    order: float  # report order (e.g. timestamp), ties broken by steps
    metric: float | None  # searcher metric at this step; None if never validated there


@dataclass(frozen=True)
class GCPolicy:
    save_experiment_best: int = 0
    save_trial_best: int = 1
    save_trial_latest: int = 1
    smaller_is_better: bool = True


def checkpoints_to_delete(
    checkpoints: Iterable[CheckpointInfo], policy: GCPolicy, protected: Iterable[str] = ()
) -> set[str]:
    ckpts = list(checkpoints)
    keep = set(protected)
    sign = 1.0 if policy.smaller_is_better else -1.0

    def best(group: list[CheckpointInfo], n: int) -> list[CheckpointInfo]:
        scored = [c for c in group if c.metric is not None]
        return sorted(scored, key=lambda c: (sign * float(c.metric or 0.0), -c.steps_completed, c.uuid))[:n] if n else []

    keep.update(c.uuid for c in best(ckpts, policy.save_experiment_best))
    by_trial: dict[int, list[CheckpointInfo]] = {}
    for c in ckpts:
        by_trial.setdefault(c.trial_id, []).append(c)
    for group in by_trial.values():
        keep.update(c.uuid for c in best(group, policy.save_trial_best))
        if policy.save_trial_latest:
            latest = sorted(group, key=lambda c: (c.steps_completed, c.order, c.uuid), reverse=True)
            keep.update(c.uuid for c in latest[: policy.save_trial_latest])
    return {c.uuid for c in ckpts} - keep
