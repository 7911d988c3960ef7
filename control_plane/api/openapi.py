"""The OpenAPI document as the API really behaves.

FastAPI documents a 422 for every operation with parameters, while the API answers a failed
validation with a 400 (api/errors.py), and documents no other error. Here every operation lists
the error statuses it can answer, each with the one error body (`ErrorBody`); NDJSON streams are
labelled `application/x-ndjson` (one `StreamLine` per line), not `application/json`.
"""

from __future__ import annotations

import typing
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI
from fastapi.dependencies.models import Dependant
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute, iter_route_contexts
from pydantic import BaseModel, Field
from starlette.responses import StreamingResponse

from control_plane.api import deps, rbac_responses, task_responses
from control_plane.api import responses as r
from control_plane.api.streams import STREAM_MEDIA_TYPE
from shipyard_common.agent_protocol import COMMANDS_PATH, CommandsResponse, RegisterResponse


class ErrorStatus(BaseModel):
    """grpc-gateway's status object, which Determined's client reads (`error.error`)."""

    code: int
    reason: str
    error: str


class ErrorDetail(BaseModel):
    field: str
    reason: str


class ErrorBody(BaseModel):
    """Every 4xx/5xx answer of the API."""

    error: ErrorStatus
    code: int
    message: str
    details: list[ErrorDetail] = Field(default_factory=list)


class StreamLine(BaseModel):
    """One line of an NDJSON stream: a `result`, or an `error` that ends the stream."""

    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


# The typed 200 answer (api/responses.py, or the agent protocol's own models) of every operation
# that answers a JSON object; tests/control_plane/api/test_schemathesis.py checks that none is left
# untyped and that the answers match.
RESPONSES: dict[tuple[str, str], type[BaseModel]] = {
    ("GET", "/api/v1/experiments"): r.GetExperimentsResponse,
    ("GET", "/api/v1/experiments/{experimentId}"): r.GetExperimentResponse,
    ("GET", "/api/v1/experiments/{experimentId}/trials"): r.GetExperimentTrialsResponse,
    ("GET", "/api/v1/trials/{trialId}"): r.GetTrialResponse,
    ("GET", "/api/v1/trials/{trialId}/workloads"): r.GetTrialWorkloadsResponse,
    ("POST", "/api/v1/trials/{trialId}/kill"): r.Empty,
    ("POST", "/api/v1/runs/start"): r.RunPrepareForReportingResponse,
    ("GET", "/api/v1/checkpoints/{checkpointUuid}"): r.GetCheckpointResponse,
    ("GET", "/api/v1/experiments/{id}/checkpoints"): r.GetCheckpointsResponse,
    ("GET", "/api/v1/trials/{id}/checkpoints"): r.GetCheckpointsResponse,
    ("POST", "/api/v1/models"): r.ModelResponse,
    ("GET", "/api/v1/models"): r.GetModelsResponse,
    ("GET", "/api/v1/models/{modelName}"): r.ModelResponse,
    ("PATCH", "/api/v1/models/{modelName}"): r.ModelResponse,
    ("DELETE", "/api/v1/models/{modelName}"): r.Empty,
    ("POST", "/api/v1/models/{modelName}/versions"): r.ModelVersionResponse,
    ("GET", "/api/v1/models/{modelName}/versions"): r.GetModelVersionsResponse,
    ("GET", "/api/v1/models/{modelName}/versions/{modelVersionNum}"): r.ModelVersionResponse,
    # workspaces, projects, templates
    ("POST", "/api/v1/workspaces"): r.PostWorkspaceResponse,
    ("GET", "/api/v1/workspaces"): r.GetWorkspacesResponse,
    ("GET", "/api/v1/workspaces/{id}"): r.WorkspaceResponse,
    ("PATCH", "/api/v1/workspaces/{id}"): r.WorkspaceResponse,
    ("DELETE", "/api/v1/workspaces/{id}"): r.DeleteResponse,
    ("POST", "/api/v1/workspaces/{id}/archive"): r.Empty,
    ("POST", "/api/v1/workspaces/{id}/unarchive"): r.Empty,
    ("GET", "/api/v1/workspaces/{id}/projects"): r.GetProjectsResponse,
    ("GET", "/api/v1/workspaces/{workspaceId}/available-resource-pools"): r.WorkspacePoolsResponse,
    ("POST", "/api/v1/workspaces/{workspaceId}/projects"): r.ProjectResponse,
    ("GET", "/api/v1/projects/{id}"): r.ProjectResponse,
    ("PATCH", "/api/v1/projects/{id}"): r.ProjectResponse,
    ("DELETE", "/api/v1/projects/{id}"): r.DeleteResponse,
    ("POST", "/api/v1/projects/{id}/archive"): r.Empty,
    ("POST", "/api/v1/projects/{id}/unarchive"): r.Empty,
    ("POST", "/api/v1/projects/{projectId}/move"): r.Empty,
    ("PUT", "/api/v1/projects/{projectId}/notes"): r.ProjectNotesResponse,
    ("POST", "/api/v1/experiments/{experimentId}/move"): r.Empty,
    ("GET", "/api/v1/templates"): r.GetTemplatesResponse,
    ("GET", "/api/v1/templates/{templateName}"): r.TemplateResponse,
    ("POST", "/api/v1/templates/{templateName}"): r.TemplateResponse,
    ("PUT", "/api/v1/templates/{templateName}"): r.TemplateResponse,
    ("PATCH", "/api/v1/templates/{templateName}"): r.TemplateResponse,
    ("DELETE", "/api/v1/templates/{templateName}"): r.Empty,
    ("GET", "/api/v1/master/config"): r.MasterConfigResponse,
    ("GET", "/api/v1/master/cluster_message"): r.GetClusterMessageResponse,
    ("PUT", "/api/v1/master/cluster_message"): r.Empty,
    ("DELETE", "/api/v1/master/cluster_message"): r.Empty,
    # commands and notebooks (api/ntsc.py)
    **task_responses.RESPONSES,
    # groups, roles and pool bindings (api/groups.py, api/rbac.py, api/pool_bindings.py)
    **rbac_responses.RESPONSES,
    # health and the master
    ("GET", "/health"): r.HealthResponse,
    ("GET", "/info"): r.MasterInfo,
    ("GET", "/api/v1/master"): r.MasterInfo,
    ("GET", "/api/v1/master/leader"): r.LeaderResponse,
    # users
    ("POST", "/api/v1/auth/login"): r.LoginResponse,
    ("POST", "/api/v1/auth/logout"): r.Empty,
    ("GET", "/api/v1/me"): r.UserResponse,
    ("POST", "/api/v1/users"): r.UserResponse,
    ("GET", "/api/v1/users"): r.GetUsersResponse,
    ("GET", "/api/v1/users/{userId}"): r.UserResponse,
    ("PATCH", "/api/v1/users/{userId}"): r.UserResponse,
    ("GET", "/api/v1/users/{username}/by-username"): r.UserResponse,
    ("POST", "/api/v1/users/{userId}/password"): r.UserResponse,
    # experiments
    ("POST", "/api/v1/experiments"): r.CreateExperimentResponse,
    ("PATCH", "/api/v1/experiments/{experimentId}"): r.PatchExperimentResponse,
    ("DELETE", "/api/v1/experiments/{experimentId}"): r.Empty,
    ("POST", "/api/v1/experiments/{experimentId}/activate"): r.Empty,
    ("POST", "/api/v1/experiments/{experimentId}/pause"): r.Empty,
    ("POST", "/api/v1/experiments/{experimentId}/cancel"): r.Empty,
    ("POST", "/api/v1/experiments/{experimentId}/kill"): r.Empty,
    ("POST", "/api/v1/experiments/{experimentId}/archive"): r.Empty,
    ("POST", "/api/v1/experiments/{experimentId}/unarchive"): r.Empty,
    ("PUT", "/api/v1/experiments/{experimentId}/labels/{label}"): r.LabelsResponse,
    ("DELETE", "/api/v1/experiments/{experimentId}/labels/{label}"): r.LabelsResponse,
    ("POST", "/api/v1/experiments/{experimentId}/gc"): r.GcResponse,
    ("GET", "/api/v1/experiments/{experimentId}/model_def"): r.ModelDefResponse,
    # metrics, logs, checkpoints
    ("POST", "/api/v1/trials/{trialId}/metrics"): r.Empty,
    ("GET", "/api/v1/trials/{trialId}/metrics"): r.GetTrialMetricsResponse,
    ("POST", "/api/v1/trials/{trialId}/metrics/batch"): r.MetricsBatchResponse,
    ("POST", "/api/v1/trials/{trialId}/training_metrics"): r.Empty,
    ("POST", "/api/v1/trials/{trialId}/validation_metrics"): r.Empty,
    ("POST", "/api/v1/task/logs"): r.Empty,
    ("POST", "/api/v1/checkpoints"): r.Empty,
    ("DELETE", "/api/v1/checkpoints"): r.Empty,
    ("PATCH", "/api/v1/checkpoints"): r.Empty,
    ("POST", "/api/v1/checkpoints/rm"): r.Empty,
    ("POST", "/api/v1/checkpoints/{checkpointUuid}/metadata"): r.CheckpointMetadataResponse,
    # trials' harness calls
    ("GET", "/api/v1/trials/{trialId}/searcher/operation"): r.SearcherOperationResponse,
    ("POST", "/api/v1/trials/{trialId}/searcher/completed_operation"): r.Empty,
    ("POST", "/api/v1/trials/{trialId}/early_exit"): r.Empty,
    ("POST", "/api/v1/trials/{trialId}/progress"): r.Empty,
    ("GET", "/api/v1/allocations/{allocationId}/signals/preemption"): r.PreemptionResponse,
    ("POST", "/api/v1/allocations/{allocationId}/signals/ack_preemption"): r.Empty,
    ("GET", "/api/v1/allocations/{allocationId}/resources/{resourcesId}/rendezvous"): r.RendezvousResponse,
    ("GET", "/api/v1/tasks"): r.GetTasksResponse,
    # resource pools
    ("GET", "/api/v1/resource-pools"): r.GetResourcePoolsResponse,
    ("GET", "/api/v1/resource-pools/{name}"): r.GetResourcePoolResponse,
    ("GET", "/api/v1/resource-pools/{name}/scaling-history"): r.GetScalingHistoryResponse,
    ("POST", "/api/v1/resource-pools/{name}/teardown"): r.TeardownResponse,
    ("POST", "/api/v1/resource-pools/{name}/enable"): r.Empty,
    # agents (the protocol's own models: shipyard_common.agent_protocol)
    ("POST", "/api/v1/agents/tokens"): r.AgentTokenResponse,
    ("POST", "/api/v1/agents/register"): RegisterResponse,
    ("GET", "/api/v1/agents/{agentId}/commands"): CommandsResponse,
    ("POST", "/api/v1/agents/{agentId}/events"): r.Empty,
    ("POST", "/api/v1/agents/{agentId}/interruption"): r.Empty,
    ("DELETE", "/api/v1/agents/{agentId}/enrolment"): r.ResetEnrolmentResponse,
    ("GET", "/api/v1/agents"): r.GetAgentsResponse,
    ("GET", "/api/v1/agents/{agentId}"): r.GetAgentResponse,
    ("POST", "/api/v1/agents/{agentId}/enable"): r.GetAgentResponse,
    ("POST", "/api/v1/agents/{agentId}/disable"): r.GetAgentResponse,
    # the job queue
    ("GET", "/api/v1/job-queues-v2"): r.GetJobsV2Response,
    ("GET", "/api/v1/job-queues"): r.GetJobsResponse,
    ("GET", "/api/v1/job-queues/stats"): r.GetJobQueueStatsResponse,
    ("POST", "/api/v1/job-queues"): r.Empty,
}

# Answered from memory outside admission control (api/app.py): never 503.
_NEVER_BUSY = frozenset({"/health", "/info", "/api/v1/master"})
_LOGIN = "/api/v1/auth/login"
# Reads that can find the record in a state that forbids them (a checkpoint that is no longer
# COMPLETED, or whose storage does not answer, cannot be downloaded).
_CONFLICTING_READS = frozenset({"/checkpoints/{checkpointUuid}"})


def _depends_on(dependant: Dependant, call: Any) -> bool:
    return any(d.call is call or _depends_on(d, call) for d in dependant.dependencies)


def _error_statuses(route: APIRoute, method: str) -> list[int]:
    dependant = route.dependant
    has_input = bool(dependant.path_params or dependant.query_params or dependant.header_params
                     or dependant.cookie_params or route.body_field is not None)
    codes = []
    if has_input:
        codes.append(400)
    # login checks credentials too, and the command long-poll resolves its caller itself (api/agents.py)
    if _depends_on(dependant, deps.principal) or route.path in (_LOGIN, COMMANDS_PATH):
        codes += [401, 403]
    if has_input:  # ids in the path, the query (filters naming trials) or the body
        codes.append(404)
    if method != "GET":
        codes += [409, 413]
    elif route.path in _CONFLICTING_READS or route.path == COMMANDS_PATH:  # a replaced session: register again
        codes.append(409)
    # per-caller limits of their own: login throttling, concurrent log searches
    if route.path == _LOGIN or (method == "GET" and route.path.endswith("/logs")):
        codes.append(429)
    if route.path not in _NEVER_BUSY:
        codes.append(503)
    return codes


def _is_stream(route: APIRoute) -> bool:
    try:
        returns = typing.get_type_hints(route.endpoint).get("return")
    except Exception:  # an annotation that does not resolve: not one of ours
        return False
    return isinstance(returns, type) and issubclass(returns, StreamingResponse)


def _schemas(model: type[BaseModel]) -> dict[str, Any]:
    schema = model.model_json_schema(by_alias=True, ref_template="#/components/schemas/{model}",
                                     mode="serialization")
    defs = schema.pop("$defs", {})
    return {model.__name__: schema, **defs}


def build_openapi(app: FastAPI) -> dict[str, Any]:
    spec = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    components = spec.setdefault("components", {}).setdefault("schemas", {})
    components.pop("HTTPValidationError", None)
    components.pop("ValidationError", None)
    components.update(_schemas(ErrorBody))
    components.update(_schemas(StreamLine))
    for model in set(RESPONSES.values()):
        components.update(_schemas(model))
    error_ref = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
    # Routers are included lazily (FastAPI's _IncludedRouter); this walks the routes they hold.
    for ctx in iter_route_contexts(app.routes):
        route = ctx.original_route
        if not isinstance(route, APIRoute) or not route.include_in_schema:
            continue
        stream = _is_stream(route)
        for method in route.methods:
            op = spec["paths"].get(ctx.path_format or route.path_format, {}).get(method.lower())
            if op is None:
                continue
            responses = op.setdefault("responses", {})
            responses.pop("422", None)
            for code in _error_statuses(route, method):
                responses.setdefault(str(code), {"description": HTTPStatus(code).phrase, "content": error_ref})
            typed = RESPONSES.get((method, ctx.path_format or route.path_format))
            if typed is not None and "200" in responses:
                responses["200"]["content"] = {
                    "application/json": {"schema": {"$ref": f"#/components/schemas/{typed.__name__}"}}
                }
            if stream and "200" in responses:
                responses["200"]["description"] = "newline-delimited JSON: one StreamLine per line"
                responses["200"]["content"] = {
                    STREAM_MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/StreamLine"}}
                }
    return spec


def install_openapi(app: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build_openapi(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
