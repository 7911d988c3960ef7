"""The typed answers of commands, notebooks and TensorBoards (api/ntsc.py), in Determined 0.38.1's
shapes (v1Command, v1Notebook, v1Tensorboard, v1Shell, v1Task), for the OpenAPI document (api/openapi.py RESPONSES)."""

from __future__ import annotations

from typing import Any

from control_plane.api.wire import Wire


class TaskOut(Wire):
    """v1Command / v1Notebook, with Shipyard's exitCode, isReady, slots and agentId beside."""

    id: str
    description: str
    state: str
    username: str
    user_id: int
    display_name: str
    resource_pool: str
    start_time: str
    job_id: str
    workspace_id: int
    exit_status: str | None
    exit_code: int | None
    is_ready: bool
    slots: int
    agent_id: str | None
    service_address: str | None = None  # notebooks and TensorBoards: /proxy/<id>/


class TensorboardOut(TaskOut):
    """v1Tensorboard: the experiments asked for and the trials shown."""

    experiment_ids: list[int]
    trial_ids: list[int]


class CommandResponse(Wire):
    command: TaskOut
    config: dict[str, Any]


class GetCommandsResponse(Wire):
    commands: list[TaskOut]


class KillCommandResponse(Wire):
    command: TaskOut


class NotebookResponse(Wire):
    notebook: TaskOut
    config: dict[str, Any]


class GetNotebooksResponse(Wire):
    notebooks: list[TaskOut]


class KillNotebookResponse(Wire):
    notebook: TaskOut


class TensorboardResponse(Wire):
    tensorboard: TensorboardOut
    config: dict[str, Any]


class GetTensorboardsResponse(Wire):
    tensorboards: list[TensorboardOut]


class KillTensorboardResponse(Wire):
    tensorboard: TensorboardOut


class AgentUserGroupOut(Wire):
    user: str | None  # the shell's login account, once its sshd listens


class ShellOut(TaskOut):
    """v1Shell: the login account, and for its owner (launch and get only) the key pair."""

    agent_user_group: AgentUserGroupOut | None = None
    private_key: str | None = None
    public_key: str | None = None


class ShellResponse(Wire):
    shell: ShellOut
    config: dict[str, Any]


class GetShellsResponse(Wire):
    shells: list[ShellOut]


class KillShellResponse(Wire):
    shell: ShellOut


class TaskAllocationOut(Wire):
    allocation_id: str
    task_id: str
    state: str
    slots: int
    is_ready: bool
    start_time: str | None
    end_time: str | None
    exit_reason: str | None
    status_code: int | None


class TaskDetailOut(Wire):
    task_id: str
    task_type: str
    start_time: str
    end_time: str | None
    allocations: list[TaskAllocationOut]


class GetTaskResponse(Wire):
    task: TaskDetailOut


class ContextResponse(Wire):
    b64_tgz: str  # the task's uploaded context, a base64 tar.gz


class Empty(Wire):
    """`{}`."""


RESPONSES: dict[tuple[str, str], type[Wire]] = {
    ("POST", "/api/v1/commands"): CommandResponse,
    ("GET", "/api/v1/commands"): GetCommandsResponse,
    ("GET", "/api/v1/commands/{commandId}"): CommandResponse,
    ("POST", "/api/v1/commands/{commandId}/kill"): KillCommandResponse,
    ("POST", "/api/v1/commands/{commandId}/set_priority"): CommandResponse,
    ("POST", "/api/v1/notebooks"): NotebookResponse,
    ("GET", "/api/v1/notebooks"): GetNotebooksResponse,
    ("GET", "/api/v1/notebooks/{notebookId}"): NotebookResponse,
    ("POST", "/api/v1/notebooks/{notebookId}/kill"): KillNotebookResponse,
    ("POST", "/api/v1/notebooks/{notebookId}/set_priority"): NotebookResponse,
    ("POST", "/api/v1/tensorboards"): TensorboardResponse,
    ("GET", "/api/v1/tensorboards"): GetTensorboardsResponse,
    ("GET", "/api/v1/tensorboards/{tensorboardId}"): TensorboardResponse,
    ("POST", "/api/v1/tensorboards/{tensorboardId}/kill"): KillTensorboardResponse,
    ("POST", "/api/v1/tensorboards/{tensorboardId}/set_priority"): TensorboardResponse,
    ("POST", "/api/v1/shells"): ShellResponse,
    ("GET", "/api/v1/shells"): GetShellsResponse,
    ("GET", "/api/v1/shells/{shellId}"): ShellResponse,
    ("POST", "/api/v1/shells/{shellId}/kill"): KillShellResponse,
    ("POST", "/api/v1/shells/{shellId}/set_priority"): ShellResponse,
    ("GET", "/api/v1/tasks/{taskId}"): GetTaskResponse,
    ("GET", "/api/v1/tasks/{taskId}/context"): ContextResponse,
    ("POST", "/api/v1/allocations/{allocationId}/proxy_address"): Empty,
}
