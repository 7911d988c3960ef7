"""Checkpoint GC, the shell: when an experiment ends (or on `det experiment gc`), mark the
checkpoints the policy drops as STATE_DELETING in the same transaction; the GC loop then deletes
their files from storage and marks them STATE_DELETED. Level-triggered: a crash between the two
leaves rows in STATE_DELETING, which the next pass finishes."""

from __future__ import annotations

import logging

from sqlalchemy import select
from sqlalchemy.orm import Session

from control_plane.core import metrics as metric_values
from control_plane.core import states as st
from control_plane.core.checkpoint_gc import CheckpointInfo, GCPolicy, checkpoints_to_delete
from control_plane.core.expconf import ExperimentConfig
from control_plane.db.models import Allocation, Checkpoint, Experiment, Metric, ModelVersion
from control_plane.master import Master

log = logging.getLogger("shipyard.gc")


def policy_of(exp: Experiment) -> GCPolicy:
    cfg = ExperimentConfig.from_stored(exp.config)
    storage = cfg.checkpoint_storage
    return GCPolicy(
        save_experiment_best=storage.save_experiment_best,
        save_trial_best=storage.save_trial_best,
        save_trial_latest=storage.save_trial_latest,
        smaller_is_better=cfg.searcher.smaller_is_better,
    )


def mark_for_gc(s: Session, exp: Experiment) -> list[str]:
    ckpts = list(s.scalars(select(Checkpoint).where(Checkpoint.experiment_id == exp.id,
                                                    Checkpoint.state.in_(st.CKPT_LIVE))))
    if not ckpts:
        return []
    metric_name = ExperimentConfig.from_stored(exp.config).searcher.metric
    trial_ids = {c.trial_id for c in ckpts if c.trial_id is not None}
    metrics: dict[tuple[int, int], float] = {}
    if metric_name and trial_ids:
        for m in s.scalars(select(Metric).where(Metric.trial_id.in_(trial_ids), Metric.group_name == "validation")):
            doc = m.metrics or {}
            v = metric_values.metric_number((doc.get("validation_metrics") or doc.get("avg_metrics") or {}).get(metric_name))
            if v is not None:
                metrics[(m.trial_id, m.steps_completed)] = v
    protected = {u for (u,) in s.execute(select(Allocation.restored_checkpoint_uuid).where(
        Allocation.experiment_id == exp.id, Allocation.restored_checkpoint_uuid.is_not(None)))}
    protected |= {u for (u,) in s.execute(select(ModelVersion.checkpoint_uuid))}
    infos = [CheckpointInfo(c.uuid, c.trial_id or 0, c.steps_completed, c.report_time.timestamp(),
                            metrics.get((c.trial_id or 0, c.steps_completed))) for c in ckpts]
    doomed = checkpoints_to_delete(infos, policy_of(exp), protected)
    for c in ckpts:
        if c.uuid in doomed:
            c.state = st.CheckpointState.DELETING
    log.info("event=checkpoint_gc_marked experiment_id=%s total=%d delete=%d", exp.id, len(ckpts), len(doomed))
    return sorted(doomed)


def on_experiment_ended(s: Session, master: Master, exp: Experiment) -> None:
    mark_for_gc(s, exp)
    master.notify(s)
