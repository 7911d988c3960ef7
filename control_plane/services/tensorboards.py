"""TensorBoard tasks (issue 29): which trials one serves and where their event files are.

The harness writes every trial's tfevents to its experiment's checkpoint storage under
`<cluster_id>/tensorboard/experiment/<exp>/trial/<trial>/` (harness/tensorboard/sync.py); a
TensorBoard task reads them from there (harness/tensorboard/serve.py). Launching one is a task like
a notebook (services/tasks.py) whose config names its trials; this module resolves the request's
experiments and trials, and gives the task the storage and path of each.

Every function works inside the caller's transaction and raises control_plane.errors."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import PurePosixPath
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from control_plane.auth import Principal
from control_plane.db.models import Experiment, Trial
from control_plane.errors import bad_request
from control_plane.services import access, metrics
from shipyard_common.tensorboard_paths import sync_path

# Determined's limit: at most this many trials per TensorBoard.
MAX_TRIALS = 100


def trials_for(s: Session, p: Principal, experiment_ids: Sequence[int], trial_ids: Sequence[int]) -> list[int]:
    """The trials a TensorBoard of these experiments and trials serves (each readable by the caller):
    each experiment's trials (its MAX_TRIALS best by validation metric if it has more, as Determined
    picks them), then the named ones, without repeats; more than MAX_TRIALS in all is refused."""
    if not experiment_ids and not trial_ids:
        raise bad_request("name experiments (experimentIds) or trials (trialIds) to show", "experimentIds")
    found: list[int] = []
    for exp_id in experiment_ids:
        exp = access.get_experiment(s, exp_id)
        access.require_read_experiment(s, p, exp)
        found += _best(s, exp)
    for trial_id in trial_ids:
        access.require_read_trial(p, access.get_trial(s, trial_id))
        found.append(trial_id)
    unique = list(dict.fromkeys(found))
    if not unique:
        raise bad_request("the experiments named have no trials yet", "experimentIds")
    if len(unique) > MAX_TRIALS:
        raise bad_request(f"{len(unique)} trials: a TensorBoard shows at most {MAX_TRIALS}", "trialIds")
    return unique


def _best(s: Session, exp: Experiment) -> list[int]:
    """The experiment's trials in id order, or its MAX_TRIALS best (validated ones first) if more."""
    rows = list(s.execute(select(Trial.id, Trial.best_validation).where(Trial.experiment_id == exp.id)
                          .order_by(Trial.id)))
    if len(rows) <= MAX_TRIALS:
        return [trial_id for trial_id, _ in rows]
    smaller = metrics.searcher_goal(exp.config).smaller_is_better
    ranked = sorted(rows, key=lambda r: (r[1] is None, 0.0 if r[1] is None else (r[1] if smaller else -r[1]), r[0]))
    return sorted(trial_id for trial_id, _ in ranked[:MAX_TRIALS])


# A storage's own credentials: another user's never reach a TensorBoard's environment.
STORAGE_CREDENTIALS = ("access_key", "secret_key")


def sources(s: Session, cluster_id: str, trial_ids: Sequence[int], launcher_id: int | None) -> list[dict[str, Any]]:
    """For the task's launcher: each trial's run name, its experiment's checkpoint storage, the
    path of its event files in that storage and its experiment's owner (a root agent adds the uid
    the owner's trials run as; the launcher reads a shared_fs directory only if that uid owns it).
    The storage of an experiment `launcher_id` does not own comes without its credentials (the
    TensorBoard runs as its launcher, who could read its environment): it is read with what the
    agent's machine has (an instance role), as a trial without keys would."""
    out = []
    rows = s.execute(select(Trial.id, Experiment.id, Experiment.config, Experiment.owner_id)
                     .join(Experiment, Experiment.id == Trial.experiment_id)
                     .where(Trial.id.in_(list(trial_ids))).order_by(Trial.id))
    for trial_id, exp_id, config, owner_id in rows:
        storage = dict((config or {}).get("checkpoint_storage") or {})
        if owner_id != launcher_id:
            storage = {k: v for k, v in storage.items() if k not in STORAGE_CREDENTIALS}
        out.append({"name": f"exp{exp_id}-trial{trial_id}", "storage": storage,
                    "path": sync_path(cluster_id, exp_id, trial_id), "owner": owner_id})
    return out


def shared_fs_paths(sources: Sequence[dict[str, Any]]) -> list[str]:
    """The event directories the sources read from shared_fs storages (a container running the task
    binds each read-only): the trial's own directory, never the rest of the storage (other
    experiments' checkpoints share it)."""
    out = []
    for src in sources:
        storage = src["storage"]
        if storage.get("type") == "shared_fs" and storage.get("host_path"):
            out.append(str(PurePosixPath(storage["host_path"], storage.get("storage_path") or "", src["path"])))
    return list(dict.fromkeys(out))
