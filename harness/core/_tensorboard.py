"""The Core API's TensorBoard mode and the manager a trial gets (harness/tensorboard/ does the work).

AUTO (the default, as in Determined): the chief writes every training and validation report as
TensorBoard scalars and syncs `get_tensorboard_path()` to checkpoint storage after reports (at
most once a second) and when the Core API closes. MANUAL: nothing is written; the trial writes its
own files under `get_tensorboard_path()` and uploads them with `upload_tensorboard_files()`.
"""

from __future__ import annotations

import enum

from harness.core._distributed import DistributedContext
from harness.core._info import ClusterInfo
from harness.storage import CheckpointStorage
from harness.tensorboard.manager import TensorboardManager
from harness.tensorboard.sync import TensorboardSync, local_path, sync_path


class TensorboardMode(enum.Enum):
    AUTO = "AUTO"
    MANUAL = "MANUAL"


def build_manager(info: ClusterInfo, dist: DistributedContext, storage: CheckpointStorage,
                  mode: TensorboardMode) -> TensorboardManager:
    """A trial's manager: files in a directory of its own (removed once uploaded), synced to `<cluster>/tensorboard/experiment/
    <exp>/trial/<trial>/` of its storage. Only the chief writes metrics in AUTO mode (Determined:
    non-chief workers' artifacts are not uploaded unless they upload them in MANUAL mode)."""
    mode = TensorboardMode(mode)
    config = info.experiment_config.get("checkpoint_storage") or {}
    base = local_path(config if isinstance(config, dict) else {}, info.allocation_id, dist.rank)
    sync = TensorboardSync(storage, base, sync_path(info.cluster_id, info.experiment_id, info.trial_id),
                           rank=dist.rank)
    return TensorboardManager(sync, write_metrics=mode is TensorboardMode.AUTO and dist.is_chief,
                              remove_local=True)
