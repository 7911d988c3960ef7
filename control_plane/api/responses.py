"""What every operation that answers a JSON object answers, as typed models for the OpenAPI
document (the agent protocol's answers use shipyard_common.agent_protocol's own models).

The handlers build Determined's JSON shapes in `serializers.py`; these models describe those
shapes (the fields Determined's clients rely on, typed as they are sent) so the document stops
saying "an object". They are documentation, checked by the schemathesis test against what the
API really sends (and tests/control_plane/api/test_schemathesis.py::test_every_json_answer_is_typed
keeps a new operation from going undocumented): a field listed here is always present with this type; unlisted fields (the
Shipyard extras, Determined's rarely read ones) may be present too (extra keys are allowed).
`openapi.RESPONSES` says which operation answers which model.
"""

from __future__ import annotations

from typing import Any

from control_plane.api.wire import Int32, Pagination, Wire


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


class TrialDetailOut(TrialOut):
    """One trial's GET adds its summary metrics (Determined's `summaryMetrics`: per group,
    `avg_metrics` / `validation_metrics` / the group's name, per metric count, sum, min, max,
    last and type; null before any report)."""

    summary_metrics: dict[str, dict[str, dict[str, Any]]] | None


class GetTrialResponse(Wire):
    trial: TrialDetailOut


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


class MetricsOut(Wire):
    avg_metrics: dict[str, Any]


class MetricsWorkloadOut(Wire):
    """Determined's v1MetricsWorkload."""

    metrics: MetricsOut
    num_inputs: int
    total_batches: int


class CheckpointWorkloadOut(Wire):
    """Determined's v1CheckpointWorkload."""

    uuid: str
    state: str
    total_batches: int


class WorkloadContainerOut(Wire):
    """Determined's v1WorkloadContainer: exactly one of the three is present."""

    training: MetricsWorkloadOut | None = None
    validation: MetricsWorkloadOut | None = None
    checkpoint: CheckpointWorkloadOut | None = None


class RunPrepareForReportingResponse(Wire):
    storage_id: int | None


class GetTrialWorkloadsResponse(Wire):
    workloads: list[WorkloadContainerOut]
    pagination: Pagination


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


# -- the rest of the API: every operation that answers a JSON object -------------------------------

class Empty(Wire):
    """`{}`: the operation answers nothing but its status."""


class HealthResponse(Wire):
    status: str


class LeaderView(Wire):
    master_id: str
    token: int
    address: str
    acquired_at: str | None
    expires_at: str | None


class LeaderResponse(Wire):
    """Shipyard's `GET /api/v1/master/leader`: which master runs the control loops (the leadership
    lease), and whether the one answering is it."""

    master_id: str
    leading: bool
    leader: LeaderView | None


class MasterInfo(Wire):
    """Determined's v1GetMasterResponse (`users.master_info`), answered from memory. `version` is
    the Determined API version served (what Determined's client compares with its own);
    `shipyardVersion` is Shipyard's."""

    version: str
    shipyard_version: str
    master_id: str
    cluster_id: str
    cluster_name: str
    telemetry_enabled: bool
    strict_job_queue_control: bool
    has_custom_logo: bool
    rbac_enabled: bool
    user_management_enabled: bool
    feature_switches: list[str]
    sso_providers: list[Any]
    product: str


class UserOut(Wire):
    """Determined's v1User (`users.user_json`)."""

    id: int
    username: str
    admin: bool
    active: bool
    display_name: str
    modified_at: str | None
    last_auth_at: str | None
    remote: bool


class UserResponse(Wire):
    user: UserOut


class GetUsersResponse(Wire):
    users: list[UserOut]
    pagination: Pagination


class LoginResponse(Wire):
    token: str
    user: UserOut


class CreateExperimentResponse(Wire):
    """`experiment` is empty (zero-valued, id 0) for `validateOnly`, as Determined answers."""

    experiment: ExperimentOut
    config: dict[str, Any]
    warnings: list[Any]
    config_warnings: list[str]


class PatchExperimentResponse(Wire):
    experiment: ExperimentOut


class LabelsResponse(Wire):
    labels: list[str]


class GcResponse(Wire):
    deleting: list[str]  # the uuids of the checkpoints the GC policy marked


class MetricsBatchResponse(Wire):
    stored: int
    duplicates: int


class MetricRowOut(Wire):
    """One report of a trial (`metrics.metric_row_json`)."""

    steps_completed: int
    group: str
    trial_run_id: int
    metrics: dict[str, Any]
    batch_metrics: list[Any] | None
    report_time: str | None


class GetTrialMetricsResponse(Wire):
    metrics: list[MetricRowOut]
    pagination: Pagination


class CheckpointMetadataResponse(Wire):
    metadata: dict[str, Any]


class ModelDefResponse(Wire):
    b64_tgz: str  # the experiment's model definition, a base64 tar.gz


class ValidateAfter(Wire):
    length: int


class SearcherOp(Wire):
    validate_after: ValidateAfter


class SearcherOperationResponse(Wire):
    """The trial's current searcher operation; `op` is null once there is none left."""

    op: SearcherOp | None
    completed: bool


class PreemptionResponse(Wire):
    preempt: bool


class RendezvousInfo(Wire):
    """Determined's v1RendezvousInfo: one address per process group (agent), this group's rank,
    the slots of every group."""

    addresses: list[str]
    rank: Int32
    slots: list[Int32]


class RendezvousResponse(Wire):
    rendezvous_info: RendezvousInfo


class ProcessGroup(Wire):
    """One agent's part of an allocation placed across agents (rank = its position)."""

    agent_id: str
    slot_ids: list[str]
    state: str
    exit_code: int | None = None


class AllocationSummary(Wire):
    """One allocation (`tasks.allocation_json`)."""

    allocation_id: str
    task_id: str
    trial_id: int | None
    experiment_id: int | None
    resource_pool: str
    slots_needed: int
    priority: int
    state: str
    agent_id: str | None
    slot_ids: list[Any]
    # A trial across agents: one process group per agent, the chief first (else empty).
    process_groups: list[ProcessGroup] = []
    registered_time: str | None
    started_time: str | None
    ended_time: str | None
    exit_code: int | None
    exit_reason: str | None
    end_cause: str | None
    preempt_requested: bool
    kill_requested: bool


class GetTasksResponse(Wire):
    allocation_id_to_summary: dict[str, AllocationSummary]


class PoolInstanceOut(Wire):
    launch_id: str
    instance_id: str | None
    state: str
    agent_id: str | None
    location: str
    instance_type: str
    launched_at: str | None
    terminate_reason: str | None
    terminate_requested_at: str | None


class CapacityCooldownOut(Wire):
    location: Any
    instance_type: Any
    until: Any
    code: Any
    error: Any
    failures: Any


class ConsolidationMoveOut(Wire):
    """An allocation moved off an instance by consolidation (checkpoint, stop, resume elsewhere)."""

    at: str | None
    launch_id: str
    instance_id: str | None
    allocation_id: str
    trial_id: int | None
    reason: str
    saving: float
    saving_unit: str
    # A replacement: the new, cheaper instance the work moves to; pending until its agent connects.
    replacement_launch_id: str | None = None
    pending: bool = False


class ScalingEventOut(Wire):
    """One row of the autoscaler's history (services/scaling_history.py): a decision that changed
    something, or a run of `ticks` steady decisions from `at` to `until`."""

    id: int
    at: str | None
    until: str | None
    kind: str
    launch: int
    terminate: int
    ticks: int
    reasons: list[str]
    launches: list[dict[str, Any]]
    terminations: list[dict[str, Any]]
    moves: dict[str, Any] | None


class GetScalingHistoryResponse(Wire):
    events: list[ScalingEventOut]


class ResourcePoolOut(Wire):
    """Determined's v1ResourcePool (`pools.pool_json`), with Shipyard's autoscaler state."""

    name: str
    description: str
    type: str
    default_compute_pool: bool
    default_aux_pool: bool
    num_agents: int
    slots_available: int
    slots_used: int
    slot_type: str
    scheduler_type: str
    preemptible: bool
    min_agents: int
    max_agents: int
    provider: str | None
    queued_allocations: int
    running_allocations: int
    state: str
    error: str | None
    backoff_until: str | None
    last_decision: dict[str, Any] | None
    last_decision_at: str | None
    capacity_cooldowns: list[CapacityCooldownOut]
    consolidation_moves: list[ConsolidationMoveOut]
    scaling_history: list[ScalingEventOut]
    instances: list[PoolInstanceOut]


class GetResourcePoolsResponse(Wire):
    resource_pools: list[ResourcePoolOut]


class GetResourcePoolResponse(Wire):
    resource_pool: ResourcePoolOut


class TeardownResponse(Wire):
    terminated: int


class AgentTokenResponse(Wire):
    token: str


class ResetEnrolmentResponse(Wire):
    revoked_credentials: int


class DeviceOut(Wire):
    id: Any
    brand: str
    uuid: str
    type: str


class ContainerOut(Wire):
    id: str
    state: str
    devices: list[Any]


class AgentSlotOut(Wire):
    id: str
    device: DeviceOut
    enabled: bool
    draining: bool
    container: ContainerOut | None


class AgentOut(Wire):
    """Determined's v1Agent (`agents.agent_json`)."""

    id: str
    resource_pools: list[str]
    registered_time: str | None
    last_seen: str | None
    state: str
    enabled: bool
    draining: bool
    drain_started_time: str | None
    addresses: list[Any]
    version: str
    slots: dict[str, AgentSlotOut]
    slot_stats: dict[str, Any]
    instance_id: str | None
    idle_since: str | None
    connected: bool


class GetAgentsResponse(Wire):
    agents: list[AgentOut]


class GetAgentResponse(Wire):
    agent: AgentOut


class JobSummaryOut(Wire):
    """Determined's v1JobSummary."""

    state: str
    jobs_ahead: int


class JobOut(Wire):
    """Determined's v1Job (`jobs.job_json`), plus Shipyard's `waitingReason`."""

    summary: JobSummaryOut
    type: str
    submission_time: str | None
    username: str
    user_id: int
    resource_pool: str
    is_preemptible: bool
    priority: int
    weight: float
    entity_id: str
    job_id: str
    requested_slots: int
    allocated_slots: int
    name: str
    progress: float | None  # None for a command, notebook, TensorBoard or shell
    workspace_id: int
    waiting_reason: str | None


class RBACJobOut(Wire):
    """Determined's v1RBACJob: every caller sees the full job."""

    full: JobOut


class GetJobsV2Response(Wire):
    jobs: list[RBACJobOut]
    pagination: Pagination


class GetJobsResponse(Wire):
    jobs: list[JobOut]
    pagination: Pagination


class QueueStatsOut(Wire):
    queued_count: int
    scheduled_count: int


class RPQueueStatOut(Wire):
    """Determined's v1RPQueueStat."""

    resource_pool: str
    stats: QueueStatsOut
    aggregates: list[Any]


class GetJobQueueStatsResponse(Wire):
    results: list[RPQueueStatOut]


# -- workspaces, projects, templates (api/workspaces.py, api/templates.py) -------------------------
class WorkspaceOut(Wire):
    """Determined's v1Workspace."""

    id: int
    name: str
    archived: bool
    immutable: bool
    user_id: int
    username: str
    num_projects: int
    num_experiments: int
    pinned: bool
    state: str
    error_message: str
    checkpoint_storage_config: dict[str, Any] | None
    default_compute_pool: str
    default_aux_pool: str


class WorkspaceResponse(Wire):
    workspace: WorkspaceOut


class PostWorkspaceResponse(Wire):
    workspace: WorkspaceOut
    namespace_bindings: dict[str, Any]


class GetWorkspacesResponse(Wire):
    workspaces: list[WorkspaceOut]
    pagination: Pagination


class WorkspacePoolsResponse(Wire):
    resource_pools: list[str]
    pagination: Pagination


class ProjectOut(Wire):
    """Determined's v1Project."""

    id: int
    name: str
    key: str
    description: str
    notes: list[dict[str, Any]]
    workspace_id: int
    workspace_name: str
    archived: bool
    immutable: bool
    user_id: int
    username: str
    num_experiments: int
    num_active_experiments: int
    num_runs: int
    last_experiment_started_at: str | None
    state: str
    error_message: str


class ProjectResponse(Wire):
    project: ProjectOut


class GetProjectsResponse(Wire):
    projects: list[ProjectOut]
    pagination: Pagination


class ProjectNotesResponse(Wire):
    notes: list[dict[str, Any]]


class DeleteResponse(Wire):
    """Determined's v1DeleteWorkspaceResponse / v1DeleteProjectResponse: deleted at once."""

    completed: bool


class TemplateOut(Wire):
    """Determined's v1Template."""

    name: str
    config: dict[str, Any]
    workspace_id: int


class TemplateResponse(Wire):
    template: TemplateOut


class GetTemplatesResponse(Wire):
    templates: list[TemplateOut]
    pagination: Pagination


class ClusterMessageOut(Wire):
    """Determined's v1ClusterMessage (`endTime` absent: indefinite)."""

    message: str
    start_time: str
    end_time: str | None = None
    created_time: str


class GetClusterMessageResponse(Wire):
    """Determined's v1GetClusterMessageResponse: absent when there is no message."""

    cluster_message: ClusterMessageOut | None = None


class MasterConfigResponse(Wire):
    """Determined's v1GetMasterConfigResponse: the effective master config, secrets hidden."""

    config: dict[str, Any]
