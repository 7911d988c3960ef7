"""What the main read operations answer, as typed models for the OpenAPI document.

The handlers build Determined's JSON shapes in `serializers.py`; these models describe those
shapes (the fields Determined's clients rely on, typed as they are sent) so the document stops
saying "an object". They are documentation, checked by the schemathesis test against what the
API really sends: a field listed here is always present with this type; unlisted fields (the
Shipyard extras, Determined's rarely read ones) may be present too (extra keys are allowed).
`openapi.RESPONSES` says which operation answers which model.
"""

from __future__ import annotations

from typing import Any

from control_plane.api.wire import Pagination, Wire


class ExperimentOut(Wire):
    """Determined's v1Experiment (`serializers.experiment_json`)."""

    id: int
    name: str
    description: str
    labels: list[str]
    notes: str
    start_time: str
    end_time: str | None
    duration: int | None
    state: str
    archived: bool
    num_trials: int
    trial_ids: list[int]
    user_id: int
    username: str
    resource_pool: str
    searcher_type: str
    searcher_metric: str | None
    progress: float
    project_id: int
    workspace_id: int
    config: dict[str, Any]
    original_config: str
    hyperparameters: dict[str, Any]
    checkpoint_size: str  # int64 as a string, as grpc-gateway sends it
    checkpoint_count: int
    best_trial_id: int | None
    model_definition_size: int | None
    unmanaged: bool


class JobSummary(Wire):
    state: str
    jobs_ahead: int
    requested_slots: int
    allocated_slots: int


class GetExperimentResponse(Wire):
    experiment: ExperimentOut
    config: dict[str, Any]
    job_summary: JobSummary | None


class GetExperimentsResponse(Wire):
    experiments: list[ExperimentOut]
    pagination: Pagination


class TrialOut(Wire):
    """Determined's trialv1Trial (`serializers.trial_json`)."""

    id: int
    experiment_id: int
    start_time: str
    end_time: str | None
    state: str
    restarts: int
    hparams: dict[str, Any]
    total_batches_processed: int
    best_validation: dict[str, Any] | None
    latest_validation: dict[str, Any] | None
    best_checkpoint: dict[str, Any] | None
    wall_clock_time: float
    task_id: str
    task_ids: list[str]
    checkpoint_count: int
    total_checkpoint_size: str


class GetTrialResponse(Wire):
    trial: TrialOut


class GetExperimentTrialsResponse(Wire):
    trials: list[TrialOut]
    pagination: Pagination


class CheckpointOut(Wire):
    """Determined's v1Checkpoint (`serializers.checkpoint_json`)."""

    uuid: str
    task_id: str | None
    allocation_id: str | None
    report_time: str | None
    resources: dict[str, str]  # file → size in bytes, int64 as a string
    metadata: dict[str, Any]
    state: str
    training: dict[str, Any]


class GetCheckpointResponse(Wire):
    checkpoint: CheckpointOut


class GetCheckpointsResponse(Wire):
    checkpoints: list[CheckpointOut]
    pagination: Pagination


class ModelOut(Wire):
    """Determined's v1Model (`api/models.model_json`)."""

    id: int
    name: str
    description: str
    metadata: dict[str, Any]
    labels: list[str]
    notes: str
    archived: bool
    creation_time: str
    last_updated_time: str
    num_versions: int
    user_id: int
    username: str
    workspace_id: int


class ModelResponse(Wire):
    model: ModelOut


class GetModelsResponse(Wire):
    models: list[ModelOut]
    pagination: Pagination


class ModelVersionOut(Wire):
    id: int
    version: int
    name: str
    comment: str
    notes: str
    metadata: dict[str, Any]
    labels: list[str]
    creation_time: str
    user_id: int
    username: str
    model: ModelOut
    checkpoint: CheckpointOut | None


class ModelVersionResponse(Wire):
    model_version: ModelVersionOut


class GetModelVersionsResponse(Wire):
    model: ModelOut
    model_versions: list[ModelVersionOut]
    pagination: Pagination
