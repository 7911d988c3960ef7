"""Commands, notebooks, TensorBoards and shells in Determined 0.38.1's wire format (`/api/v1/commands`,
`/api/v1/notebooks`, `/api/v1/tensorboards`, `/api/v1/shells`, `GET /api/v1/tasks/{taskId}`), the address a task reports
(`POST /api/v1/allocations/{id}/proxy_address`) and its context archive. Parse, authorize, call
services/tasks.py, serialize."""

from __future__ import annotations

import base64
from typing import Any

from fastapi import APIRouter, Depends, Path, Query
from sqlalchemy.orm import Session

from control_plane.api import deps
from control_plane.api.wire import Count32, Id, ProtoWire, ts
from control_plane.auth import Principal
from control_plane.core import states as st
from control_plane.core.expconf.secrets import redact_config
from control_plane.core.task_config import SERVING_KINDS, TASK_TYPES
from control_plane.master import Master
from control_plane.services import shells, tasks, tensorboards
from control_plane.services.tasks import TaskView

router = APIRouter()

# Determined's resource names: the path, the list's key, one item's key.
_KINDS = {"command": ("commands", "command"), "notebook": ("notebooks", "notebook"),
          "tensorboard": ("tensorboards", "tensorboard"), "shell": ("shells", "shell")}
_STATES = {
    st.AllocationState.PENDING: "STATE_QUEUED",
    st.AllocationState.ASSIGNED: "STATE_PULLING",
    st.AllocationState.PULLING: "STATE_PULLING",
    st.AllocationState.STARTING: "STATE_STARTING",
    st.AllocationState.RUNNING: "STATE_RUNNING",
    st.AllocationState.TERMINATED: "STATE_TERMINATED",
}


class LaunchRequest(ProtoWire):
    config: dict[str, Any] | None = None
    files: list[dict[str, Any]] = []
    template_name: str | None = None
    workspace_id: Count32 | None = None  # 0 or absent: Uncategorized
    data: str | None = None
    preview: bool = False


class SetPriorityRequest(ProtoWire):
    """v1SetCommandPriorityRequest (and the notebook's, shell's, TensorBoard's): the id is the path's."""

    priority: int
    command_id: str | None = None
    notebook_id: str | None = None
    shell_id: str | None = None
    tensorboard_id: str | None = None


class LaunchTensorboardRequest(LaunchRequest):
    experiment_ids: list[Id] = []
    trial_ids: list[Id] = []


def task_state(v: TaskView) -> str:
    if v.alloc.state in st.ALLOC_ON_AGENT and v.alloc.kill_requested:
        return "STATE_TERMINATING"
    return _STATES.get(st.AllocationState(v.alloc.state), "STATE_UNSPECIFIED")


def exit_status(v: TaskView) -> str | None:
    a = v.alloc
    if a.state != st.AllocationState.TERMINATED:
        return None
    if a.end_cause == st.ExitCause.EXITED and a.exit_code is not None:
        return f"exited with code {a.exit_code}"
    return a.exit_reason or a.end_cause or "ended"


def task_json(v: TaskView) -> dict[str, Any]:
    """v1Command / v1Notebook / v1Tensorboard, with Shipyard's exitCode and isReady beside."""
    out = {
        "id": v.task.id, "description": v.task.description, "state": task_state(v), "username": v.username,
        "userId": v.task.owner_id, "displayName": v.username, "resourcePool": v.task.pool,
        "startTime": ts(v.task.created_at), "jobId": v.task.id, "workspaceId": v.task.workspace_id,
        "exitStatus": exit_status(v), "exitCode": v.alloc.exit_code, "isReady": v.ready,
        "slots": v.alloc.slots_needed, "agentId": v.alloc.agent_id,
    }
    if v.task.kind in SERVING_KINDS:
        out["serviceAddress"] = f"/proxy/{v.task.id}/"
    if v.task.kind == "tensorboard":
        cfg = tasks.config_of(v.task)
        out["experimentIds"], out["trialIds"] = cfg.experiment_ids, cfg.trial_ids
    return out


def _one(kind: str, v: TaskView, master: Master | None = None, p: Principal | None = None) -> dict[str, Any]:
    """A launch or get answer; a shell's carries its login account and, for its owner, its key pair."""
    item = task_json(v)
    if kind == shells.KIND and master is not None and p is not None:
        item.update(shells.shell_fields(master, p, v.task, with_key=True))
    return {_KINDS[kind][1]: item, "config": redact_config(v.task.config) if v.task.config else v.task.config}


def _routes(kind: str) -> None:
    plural, single = _KINDS[kind]
    one = f"/api/v1/{plural}/{{{single}Id}}"  # Determined's names: {commandId}, {notebookId}

    if kind != "tensorboard":  # launch_tensorboard below takes its own request
        _launch_route(kind, plural)

    @router.get(f"/api/v1/{plural}", name=f"list_{kind}s")
    def list_(p: Principal = Depends(deps.user), db: Session = Depends(deps.get_db, scope="function"),
              users: list[str] = Query([]), workspaceId: Count32 = 0) -> dict[str, Any]:  # noqa: B008
        found = tasks.list_tasks(db, p, kind, users, workspace_id=workspaceId, everyone=True)
        return {plural: [task_json(v) for v in found]}

    @router.get(one, name=f"get_{kind}")
    def get(task_id: str = Path(alias=f"{single}Id"), p: Principal = Depends(deps.user),
            master: Master = Depends(deps.get_master),
            db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
        return _one(kind, tasks.get(db, p, task_id, kind), master, p)

    @router.post(f"{one}/kill", name=f"kill_{kind}")
    def kill(task_id: str = Path(alias=f"{single}Id"), p: Principal = Depends(deps.user),
             master: Master = Depends(deps.get_master),
             db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
        return {single: task_json(tasks.kill(db, master, p, task_id, kind))}

    @router.post(f"{one}/set_priority", name=f"set_{kind}_priority")
    def set_priority(body: SetPriorityRequest, task_id: str = Path(alias=f"{single}Id"),
                     p: Principal = Depends(deps.user), master: Master = Depends(deps.get_master),
                     db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
        return _one(kind, tasks.set_priority(db, master, p, task_id, kind, body.priority), master, p)


def _launch_route(kind: str, plural: str) -> None:
    @router.post(f"/api/v1/{plural}", name=f"launch_{kind}")
    def launch(body: LaunchRequest, p: Principal = Depends(deps.user), master: Master = Depends(deps.get_master),
               db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
        return _one(kind, tasks.launch(db, master, p, kind, body.config, body.files, body.workspace_id), master, p)


@router.post("/api/v1/tensorboards")
def launch_tensorboard(body: LaunchTensorboardRequest, p: Principal = Depends(deps.user),
                       master: Master = Depends(deps.get_master),
                       db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
    """Determined's LaunchTensorboard: the experiments' trials and the named ones, each readable."""
    trial_ids = tensorboards.trials_for(db, p, body.experiment_ids, body.trial_ids)
    config = body.config if isinstance(body.config, dict) else {}
    config = {**config, "experiment_ids": body.experiment_ids, "trial_ids": trial_ids}
    return _one("tensorboard", tasks.launch(db, master, p, "tensorboard", config, body.files, body.workspace_id))


for _kind in _KINDS:
    _routes(_kind)


@router.get("/api/v1/tasks/{taskId}")
def get_task(taskId: str, p: Principal = Depends(deps.user_or_allocation),
             db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
    """Determined's v1Task: `det notebook start` waits on `allocations[0].isReady`."""
    v = tasks.get(db, p, taskId)
    a = v.alloc
    return {"task": {
        "taskId": v.task.id, "taskType": f"TASK_TYPE_{TASK_TYPES[v.task.kind]}", "startTime": ts(v.task.created_at),
        "endTime": ts(a.ended_at),
        "allocations": [{"allocationId": a.id, "taskId": v.task.id, "state": task_state(v), "slots": a.slots_needed,
                         "isReady": v.ready, "startTime": ts(a.started_at), "endTime": ts(a.ended_at),
                         "exitReason": a.exit_reason, "statusCode": a.exit_code}],
    }}


@router.get("/api/v1/tasks/{taskId}/context")
def task_context(taskId: str, p: Principal = Depends(deps.user_or_allocation),
                 db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
    """The uploaded context (`-c DIR`), which the agent unpacks into the task's directory."""
    return {"b64Tgz": base64.b64encode(tasks.context_archive(db, p, taskId)).decode()}


class ProxyAddress(ProtoWire):
    allocation_id: str | None = None
    proxy_address: str


@router.post("/api/v1/allocations/{allocationId}/proxy_address")
def post_proxy_address(allocationId: str, body: ProxyAddress, p: Principal = Depends(deps.principal),
                       db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
    tasks.set_proxy_address(db, p, allocationId, body.proxy_address)
    return {}
