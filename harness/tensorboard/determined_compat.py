"""The metric writer for Determined's own `determined.core` (0.38.x) in TensorboardMode AUTO when
the trial's interpreter has neither TensorFlow nor torch with `tensorboard` (Determined's
`get_metric_writer` would raise ModuleNotFoundError there and `core.init()` fail).

The agent's `sitecustomize` shim (agent_bootstrap/agent/det_shim/) wraps
`determined.tensorboard.get_metric_writer` to fall back to `metric_writer()`. It writes where
Determined's TFWriter writes (`determined.tensorboard.get_base_path({})`), so Determined's own
TensorboardManager syncs the files to checkpoint storage as usual. Standard library only.
"""

from __future__ import annotations

from typing import Any

from harness.tensorboard.events import as_scalar
from harness.tensorboard.writer import EventFileWriter


def metric_writer() -> Any:
    """A `determined.tensorboard.BatchMetricWriter` over our event file writer."""
    from determined import tensorboard as det_tensorboard

    class ShipyardWriter(det_tensorboard.MetricWriter):  # type: ignore[misc,name-defined]
        """add_scalar / reset / flush, as TFWriter: one file per reset, flushed per report."""

        def __init__(self) -> None:
            super().__init__()
            self.writer = EventFileWriter(det_tensorboard.get_base_path({}))

        def add_scalar(self, name: str, value: Any, step: int) -> None:
            scalar = as_scalar(value)
            if scalar is not None:
                self.writer.add_scalar(name, scalar, int(step))

        def reset(self) -> None:
            self.writer.close()

        def flush(self) -> None:
            self.writer.flush()

    return det_tensorboard.BatchMetricWriter(ShipyardWriter())
