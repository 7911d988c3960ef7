"""Shipyard's Core API: what training code uses to talk to the master.

Modelled on Determined's `determined.core` (same names and semantics where they exist), with
metrics shipped by a background reporter that survives master outages. See `init()`.
"""

from harness.core._checkpoint import CheckpointContext
from harness.core._context import Context, InvalidHP, init
from harness.core._distributed import Collectives, DistributedContext, TorchCollectives
from harness.core._info import ClusterInfo, ClusterInfoError
from harness.core._preempt import PreemptContext
from harness.core._reporter import MetricsReporter, MetricsReportError, ReporterConfig, ReporterStats
from harness.core._searcher import SearcherContext, SearcherOperation, Unit
from harness.core._session import APIError, AuthError, NotFoundError, Session, TransientAPIError
from harness.core._tensorboard import TensorboardMode
from harness.core._train import EarlyExitReason, LocalMetricsSink, MetricsReport, TrainContext

__all__ = [
    "APIError",
    "AuthError",
    "CheckpointContext",
    "ClusterInfo",
    "ClusterInfoError",
    "Collectives",
    "Context",
    "DistributedContext",
    "EarlyExitReason",
    "InvalidHP",
    "LocalMetricsSink",
    "MetricsReport",
    "MetricsReportError",
    "MetricsReporter",
    "NotFoundError",
    "PreemptContext",
    "ReporterConfig",
    "ReporterStats",
    "SearcherContext",
    "SearcherOperation",
    "Session",
    "TensorboardMode",
    "TransientAPIError",
    "TorchCollectives",
    "TrainContext",
    "Unit",
    "init",
]
