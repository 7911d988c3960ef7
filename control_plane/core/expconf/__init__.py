"""Experiment configuration: Determined-compatible schema, master defaults and validation.

The field names, shapes and defaults follow Determined's expconf (``schemas/expconf/v0``) so that a
config written for Determined 0.38 is accepted as-is. This package is a pure decision core: it parses
text, applies the master's defaults that it is handed, and says yes (a typed, fully defaulted
``ExperimentConfig`` plus warnings) or no (``ConfigInvalid`` listing *every* problem with a dotted
field path and a readable reason). No I/O, no clock, no randomness: the caller supplies the seed.

Deliberate differences from Determined, each a "say no early" choice:

* ``resources.slots_per_trial`` must be >= 1 (Determined allows 0).
* ``adaptive_asha`` refuses a ``max_length`` whose smallest rung would be shorter than one unit
  (Determined lowers ``max_rungs`` instead; ``refuse_short_asha_rungs=False`` does the same and
  only warns).
* Only ``shared_fs``, ``s3`` and ``gcs`` checkpoint storage and the ``single``, ``random``, ``grid``
  and ``adaptive_asha`` searchers are supported.

Modules, each importing only those above it in this list: ``errors`` (FieldError, ConfigInvalid),
``describe`` (how messages name values and paths), ``loading`` (the YAML text and its bounds),
``defaults`` (the master's defaults), ``models`` (the pydantic models, one module per section),
``messages`` (pydantic's errors in plain words), ``models.experiment`` (the whole config and
``ExperimentConfig.from_stored``, the one typed accessor for stored configs), ``checks`` (what
pydantic cannot express) and ``parse`` (``parse_experiment_config``).
"""

from control_plane.core.expconf.defaults import merge_defaults
from control_plane.core.expconf.errors import ConfigInvalid, FieldError
from control_plane.core.expconf.loading import MAX_CONFIG_BYTES
from control_plane.core.expconf.models.base import LENGTH_UNITS, Length, PositiveLength
from control_plane.core.expconf.models.environment import DeviceImages, DeviceVariables, Environment
from control_plane.core.expconf.models.experiment import (
    BindMount,
    ExperimentConfig,
    Profiling,
    Reproducibility,
    config_to_dict,
)
from control_plane.core.expconf.models.hyperparameters import (
    CategoricalHyperparameter,
    ConstHyperparameter,
    DoubleHyperparameter,
    Hyperparameter,
    IntHyperparameter,
    LogHyperparameter,
    flatten_hyperparameters,
    grid_axis,
    grid_size,
    hyperparameters_to_dict,
)
from control_plane.core.expconf.models.resources import Device, Devices, Resources, byte_size
from control_plane.core.expconf.models.searcher import (
    AdaptiveASHASearcher,
    GridSearcher,
    RandomSearcher,
    SearcherConfig,
    SingleSearcher,
)
from control_plane.core.expconf.models.storage import (
    CheckpointStorage,
    GCSStorage,
    S3Storage,
    SharedFSStorage,
)
from control_plane.core.expconf.parse import parse_experiment_config

__all__ = [
    "LENGTH_UNITS",
    "MAX_CONFIG_BYTES",
    "AdaptiveASHASearcher",
    "BindMount",
    "CategoricalHyperparameter",
    "CheckpointStorage",
    "ConfigInvalid",
    "ConstHyperparameter",
    "DeviceImages",
    "DeviceVariables",
    "DoubleHyperparameter",
    "Environment",
    "ExperimentConfig",
    "FieldError",
    "GCSStorage",
    "GridSearcher",
    "Hyperparameter",
    "IntHyperparameter",
    "Length",
    "LogHyperparameter",
    "PositiveLength",
    "Profiling",
    "RandomSearcher",
    "Reproducibility",
    "Resources",
    "Device",
    "Devices",
    "S3Storage",
    "SearcherConfig",
    "SharedFSStorage",
    "SingleSearcher",
    "byte_size",
    "config_to_dict",
    "flatten_hyperparameters",
    "grid_axis",
    "grid_size",
    "hyperparameters_to_dict",
    "merge_defaults",
    "parse_experiment_config",
]
