"""`harness.core.init()`: build the Core API for this process, on a cluster or off it.

    import harness.core

    with harness.core.init() as ctx:
        for op in ctx.searcher.operations():
            while steps < op.length:
                ...
                ctx.train.report_training_metrics(steps, {"loss": loss})
                if ctx.preempt.should_preempt():
                    with ctx.checkpoint.store_path({"steps_completed": steps}) as (path, uuid):
                        save(path)
                    return
            ctx.train.report_validation_metrics(steps, {"val_loss": v})
            op.report_completed(v)

On a cluster (DET_MASTER and DET_TRIAL_ID set) everything talks to the master. Off-cluster the
same code runs alone: metrics are printed and kept in `ctx.train_sink.reports`, checkpoints go to
./checkpoints (or the given storage), the searcher yields one op of `max_length`, and preemption
never comes.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.core._checkpoint import CheckpointContext, LocalCheckpointRegistry, MasterCheckpointRegistry
from harness.core._distributed import DistributedContext
from harness.core._info import ClusterInfo
from harness.core._preempt import PreemptContext
from harness.core._reporter import MetricsReporter, ReporterConfig
from harness.core._searcher import (
    LocalOperationSource,
    MasterOperationSource,
    SearcherContext,
    parse_max_length,
    parse_units,
)
from harness.core._session import RetryPolicy, Session
from harness.core._tensorboard import TensorboardMode, build_manager
from harness.core._train import EarlyExitReason, LocalMetricsSink, TrainContext
from harness.storage import CheckpointStorage, StorageConfigError, from_config
from harness.tensorboard.manager import TensorboardManager

log = logging.getLogger("harness.core")

DEFAULT_OFF_CLUSTER_CHECKPOINT_DIR = "checkpoints"


class InvalidHP(Exception):
    """Raise inside `with init()` when the hyperparameters cannot work: the trial is reported as an
    early exit with EXITED_REASON_INVALID_HP and the process exits 0 (Determined's semantics)."""


class Context:
    """The Core API: `.train`, `.checkpoint`, `.searcher`, `.preempt`, `.distributed`, `.info`."""

    def __init__(
        self,
        *,
        info: ClusterInfo,
        distributed: DistributedContext,
        train: TrainContext,
        checkpoint: CheckpointContext,
        searcher: SearcherContext,
        preempt: PreemptContext,
        session: Session | None = None,
        reporter: MetricsReporter | None = None,
        local_sink: LocalMetricsSink | None = None,
        local_searcher: LocalOperationSource | None = None,
        tensorboard: TensorboardManager | None = None,
    ) -> None:
        self.info = info
        self.distributed = distributed
        self.train = train
        self.checkpoint = checkpoint
        self.searcher = searcher
        self.preempt = preempt
        self._session = session
        self._reporter = reporter
        self._tensorboard = tensorboard
        # Off-cluster inspection: what was reported and what the searcher op was completed with.
        self.train_sink = local_sink
        self.searcher_results = local_searcher.results if local_searcher is not None else None
        self._closed = False

    @property
    def off_cluster(self) -> bool:
        return self._session is None

    @property
    def reporter(self) -> MetricsReporter | None:
        return self._reporter

    def start(self) -> Context:
        if self._reporter is not None:
            self._reporter.start()
        if self._tensorboard is not None:
            self._tensorboard.start()
        self.preempt.start()
        return self

    def __enter__(self) -> Context:
        return self

    def close(self, flush_timeout_s: float | None = None) -> None:
        """Flush metrics (with a deadline), write and upload the TensorBoard files, stop background
        threads, close the session."""
        if self._closed:
            return
        self._closed = True
        try:
            self.preempt.close()
            if self._tensorboard is not None:
                self._tensorboard.close()
            if self._reporter is not None:
                self._reporter.close(flush_timeout_s)
        finally:
            self.distributed.close()
            if self._session is not None:
                self._session.close()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: types.TracebackType | None) -> None:
        if exc is None:
            self.close()
            return
        invalid_hp = isinstance(exc, InvalidHP)
        try:
            if invalid_hp:
                self.train.report_early_exit(EarlyExitReason.INVALID_HP)
            self.close()
        except Exception:
            # The body's exception is the one that matters; do not mask it.
            log.exception("event=core_close_failed_after_error")
        if invalid_hp:
            log.info("event=invalid_hp action=exit_0 reason=%r", str(exc))
            sys.exit(0)


def _storage_from(checkpoint_storage: Mapping[str, Any] | str | Path | CheckpointStorage | None,
                  info: ClusterInfo, on_cluster: bool) -> CheckpointStorage:
    if isinstance(checkpoint_storage, CheckpointStorage):
        return checkpoint_storage
    if checkpoint_storage is not None:
        return from_config(checkpoint_storage)
    configured = info.experiment_config.get("checkpoint_storage")
    if configured:
        return from_config(configured)
    if on_cluster:
        raise StorageConfigError("the experiment config has no checkpoint_storage section")
    return from_config(Path(DEFAULT_OFF_CLUSTER_CHECKPOINT_DIR).absolute())


def init(
    *,
    off_cluster: bool | None = None,
    max_length: int | None = None,
    checkpoint_storage: Mapping[str, Any] | str | Path | CheckpointStorage | None = None,
    distributed: DistributedContext | None = None,
    hparams: dict[str, Any] | None = None,
    reporter_config: ReporterConfig | None = None,
    print_metrics: bool = True,
    check_storage: bool = True,
    env: Mapping[str, str] | None = None,
    tensorboard_mode: TensorboardMode | str = TensorboardMode.AUTO,
) -> Context:
    """Build the Core API. Use as `with harness.core.init() as ctx:`.

    off_cluster: None = decide from the environment (no DET_MASTER or DET_TRIAL_ID → off-cluster).
    max_length: off-cluster only, the length of the single searcher op (default: the config's
        searcher.max_length, else 1).
    checkpoint_storage: override the config's checkpoint_storage (dict, "s3://b/p", "gs://b/p",
        a directory, or a CheckpointStorage).
    hparams: off-cluster only, the hyperparameters `ctx.info.hparams` should show.
    reporter_config: buffer size, batch size, backoff and flush deadline of the metrics reporter.
    check_storage: write and delete a probe object so an unwritable storage fails here, before
        training starts (StorageNotWritable).
    env: the environment to read (default os.environ).
    tensorboard_mode: AUTO (on a cluster, every training and validation report is also written as
        TensorBoard scalars and synced to checkpoint storage) or MANUAL (see _tensorboard.py).
    """
    env = os.environ if env is None else env
    info, off_cluster = _cluster_info(env, off_cluster, hparams)
    dist = distributed or _distributed_from(env)
    storage = _storage_from(checkpoint_storage, info, on_cluster=not off_cluster)
    if check_storage:
        storage.check_writable()
    if off_cluster:
        return _off_cluster_context(info, dist, storage, max_length=max_length, print_metrics=print_metrics)
    return _cluster_context(info, dist, storage, reporter_config, TensorboardMode(tensorboard_mode))


def _cluster_info(env: Mapping[str, str], off_cluster: bool | None,
                  hparams: dict[str, Any] | None) -> tuple[ClusterInfo, bool]:
    """This process's ClusterInfo, and whether it runs off-cluster (decided from `env` when None)."""
    info = ClusterInfo.from_env(env)
    if off_cluster is None:
        off_cluster = not info.on_cluster
    if not off_cluster and not info.on_cluster:
        raise RuntimeError("init(off_cluster=False) needs DET_MASTER and DET_TRIAL_ID in the environment")
    if off_cluster and hparams is not None:
        info = _with(info, hparams=dict(hparams))
    return info, off_cluster


def _searcher_metric(config: Mapping[str, Any]) -> tuple[str | None, bool]:
    """The searcher's metric name and whether smaller is better, from the experiment config."""
    searcher_cfg = config.get("searcher") or {}
    return searcher_cfg.get("metric"), bool(searcher_cfg.get("smaller_is_better", True))


def _off_cluster_context(info: ClusterInfo, dist: DistributedContext, storage: CheckpointStorage, *,
                         max_length: int | None, print_metrics: bool) -> Context:
    """Metrics printed and kept locally, a local checkpoint registry, one searcher op of `max_length`."""
    config = info.experiment_config
    metric_name, smaller_is_better = _searcher_metric(config)
    sink = LocalMetricsSink(echo=print_metrics and dist.is_chief)
    train = TrainContext(sink, dist, searcher_metric=metric_name, smaller_is_better=smaller_is_better)
    length = max_length if max_length is not None else (parse_max_length(config) or 1)
    source = LocalOperationSource(length)
    log.info("event=core_init mode=off_cluster storage=%s max_length=%d", storage.describe(), length)
    return Context(
        info=info,
        distributed=dist,
        train=train,
        checkpoint=CheckpointContext(storage, dist, LocalCheckpointRegistry()),
        searcher=SearcherContext(source, train, dist, parse_units(config)),
        preempt=PreemptContext(dist),
        local_sink=sink,
        local_searcher=source,
    ).start()


def _cluster_context(info: ClusterInfo, dist: DistributedContext, storage: CheckpointStorage,
                     reporter_config: ReporterConfig | None, tensorboard_mode: TensorboardMode) -> Context:
    """Everything through the master: one session, the metrics reporter, its searcher and preemption."""
    assert info.master_url is not None and info.trial_id is not None
    config = info.experiment_config
    metric_name, smaller_is_better = _searcher_metric(config)
    session = Session(info.master_url, info.session_token, retry=RetryPolicy.for_trial(os.environ))
    # The spool goes in the trial's own work dir: the agent starts the process there.
    reporter = MetricsReporter(session, info.trial_id, info.trial_run_id,
                               reporter_config or ReporterConfig.for_trial(os.environ, os.getcwd()))
    tensorboard = build_manager(info, dist, storage, tensorboard_mode)
    train = TrainContext(reporter, dist, session=session, trial_id=info.trial_id,
                         experiment_id=info.experiment_id, searcher_metric=metric_name,
                         smaller_is_better=smaller_is_better, tensorboard=tensorboard)
    preempt = PreemptContext(dist, session, info.allocation_id)
    flush_s = reporter.config.flush_timeout_s
    source = MasterOperationSource(session, info.trial_id, preempt, lambda: reporter.flush(flush_s))
    registry = MasterCheckpointRegistry(session, task_id=info.task_id, allocation_id=info.allocation_id,
                                        trial_id=info.trial_id, experiment_id=info.experiment_id)
    log.info("event=core_init mode=cluster master=%s trial_id=%s experiment_id=%s allocation_id=%s "
             "storage=%s rank=%d size=%d", info.master_url, info.trial_id, info.experiment_id,
             info.allocation_id, storage.describe(), dist.rank, dist.size)
    return Context(
        info=info,
        distributed=dist,
        train=train,
        checkpoint=CheckpointContext(storage, dist, registry),
        searcher=SearcherContext(source, train, dist, parse_units(config)),
        preempt=preempt,
        session=session,
        reporter=reporter,
        tensorboard=tensorboard,
    ).start()


def _distributed_from(env: Mapping[str, str]) -> DistributedContext:
    """One process: rank 0 of 1. Several (a launcher set WORLD_SIZE > 1): torch.distributed's
    collectives when torch is installed, so the chief's searcher operations and preemption signal
    reach every worker."""
    dist = DistributedContext.from_env(env)
    if dist.size == 1 or importlib.util.find_spec("torch") is None:
        return dist
    return DistributedContext.from_torch_distributed(env)


def _with(info: ClusterInfo, **changes: Any) -> ClusterInfo:
    import dataclasses

    return dataclasses.replace(info, **changes)
