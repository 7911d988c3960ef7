"""Where a trial's TensorBoard event files live in its checkpoint storage: written there by the
harness (harness/tensorboard/sync.py), read from there by a TensorBoard task (services/tensorboards.py).
Determined's `get_sync_path`."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Optional


def sync_path(cluster_id: Optional[str], experiment_id: Optional[int], trial_id: Optional[int]) -> str:
    return str(PurePosixPath(cluster_id or "default", "tensorboard", "experiment", str(experiment_id),
                             "trial", str(trial_id)))
