"""Workspaces and projects (Determined 0.38.1's /api/v1/workspaces, /api/v1/projects and
`POST /api/v1/experiments/{id}/move`): services/workspaces.py does the work."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from pydantic import Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from control_plane.api import deps, serializers
from control_plane.api.wire import Count32, Id, Int32, ProtoWire, ts
from control_plane.auth import Principal
from control_plane.core.expconf.secrets import redact_storage
from control_plane.db.models import Project, User, Workspace
from control_plane.errors import bad_request
from control_plane.master import Master
from control_plane.services import access, pool_bindings, workspaces

router = APIRouter()

NOT_DELETING = "WORKSPACE_STATE_UNSPECIFIED"


def _usernames(db: Session, ids: Sequence[int | None]) -> dict[int, str]:
    wanted = {i for i in ids if i is not None}
    if not wanted:
        return {}
    return dict(db.execute(select(User.id, User.username).where(User.id.in_(wanted))).all())  # type: ignore[arg-type]


def workspaces_json(db: Session, spaces: Sequence[Workspace]) -> list[dict[str, Any]]:
    """Determined's v1Workspace."""
    counts = workspaces.workspace_counts(db, [w.id for w in spaces])
    names = _usernames(db, [w.owner_id for w in spaces])
    return [{
        "id": w.id, "name": w.name, "archived": w.archived, "immutable": w.immutable,
        "userId": w.owner_id or 0, "username": names.get(w.owner_id or 0, ""),
        "numProjects": counts[w.id].projects, "numExperiments": counts[w.id].experiments,
        "pinned": False, "pinnedAt": None, "state": NOT_DELETING, "errorMessage": "", "agentUserGroup": None,
        "checkpointStorageConfig": redact_storage(w.checkpoint_storage),
        "defaultComputePool": w.default_compute_pool or "", "defaultAuxPool": w.default_aux_pool or "",
    } for w in spaces]


def projects_json(db: Session, projects: Sequence[Project]) -> list[dict[str, Any]]:
    """Determined's v1Project."""
    counts = workspaces.project_counts(db, [p.id for p in projects])
    names = _usernames(db, [p.owner_id for p in projects])
    spaces = dict(db.execute(select(Workspace.id, Workspace.name).where(
        Workspace.id.in_({p.workspace_id for p in projects}))).all()) if projects else {}
    return [{
        "id": p.id, "name": p.name, "key": p.key, "description": p.description, "notes": list(p.notes or []),
        "workspaceId": p.workspace_id, "workspaceName": spaces.get(p.workspace_id, ""),
        "archived": p.archived, "immutable": p.immutable, "userId": p.owner_id or 0,
        "username": names.get(p.owner_id or 0, ""), "numExperiments": counts[p.id].experiments,
        "numActiveExperiments": counts[p.id].active, "numRuns": counts[p.id].experiments,
        "lastExperimentStartedAt": ts(counts[p.id].last_started), "state": NOT_DELETING, "errorMessage": "",
    } for p in projects]


def _one_workspace(db: Session, w: Workspace) -> dict[str, Any]:
    return {"workspace": workspaces_json(db, [w])[0]}


def _one_project(db: Session, p: Project) -> dict[str, Any]:
    return {"project": projects_json(db, [p])[0]}


def _kubernetes_only(**fields: Any) -> None:
    for name, value in fields.items():
        if value:
            raise bad_request("is not supported by Shipyard (no Kubernetes resource manager or agent user groups)",
                              name)


# -- workspaces ------------------------------------------------------------------------------------
class PostWorkspace(ProtoWire):
    name: str = Field(max_length=workspaces.NAME_MAX)
    default_compute_pool: str | None = Field(default=None, max_length=64)
    default_aux_pool: str | None = Field(default=None, max_length=64)
    checkpoint_storage_config: dict[str, Any] | None = None
    agent_user_group: dict[str, Any] | None = None
    cluster_namespace_meta: dict[str, Any] | None = None
    cluster_quota_pairs: dict[str, Any] | None = None


@router.post("/api/v1/workspaces")
def post_workspace(body: PostWorkspace, p: Principal = Depends(deps.user), master: Master = Depends(deps.get_master),
                   db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
    _kubernetes_only(agentUserGroup=body.agent_user_group, clusterNamespaceMeta=body.cluster_namespace_meta,
                     clusterQuotaPairs=body.cluster_quota_pairs)
    ws = workspaces.create_workspace(db, master, p, workspaces.WorkspaceSettings(
        name=body.name, default_compute_pool=body.default_compute_pool, default_aux_pool=body.default_aux_pool,
        checkpoint_storage=body.checkpoint_storage_config))
    return {**_one_workspace(db, ws), "namespaceBindings": {}}


WORKSPACE_SORTS = ("SORT_BY_UNSPECIFIED", "SORT_BY_ID", "SORT_BY_NAME")


@router.get("/api/v1/workspaces")
def get_workspaces(
    _p: Principal = Depends(deps.user), db: Session = Depends(deps.get_db, scope="function"),
    name: str | None = None, nameCaseSensitive: str | None = None, archived: bool | None = None,
    pinned: bool | None = None, sortBy: str | None = None, orderBy: str | None = None,
    users: Annotated[list[str], Query()] = [],  # noqa: B006 - FastAPI copies defaults
    userIds: Annotated[list[Int32], Query()] = [],  # noqa: B006
    offset: Count32 = 0, limit: Count32 = 0,
) -> dict[str, Any]:
    serializers.reject_nul(name=name, nameCaseSensitive=nameCaseSensitive, users=users)
    by_name = serializers.parse_choice(sortBy, WORKSPACE_SORTS, "sortBy", "SORT_BY_ID") == "SORT_BY_NAME"
    found = [] if pinned else workspaces.list_workspaces(db, workspaces.WorkspaceFilter(
        name=name, name_case_sensitive=nameCaseSensitive, archived=archived, user_ids=userIds, usernames=users,
    ), by_name=by_name, desc=serializers.parse_order(orderBy))
    shown = serializers.page(found, offset, limit)
    return {"workspaces": workspaces_json(db, shown),
            "pagination": serializers.pagination_json(offset, limit, len(found), len(shown))}


@router.get("/api/v1/workspaces/{id}")
def get_workspace(id: Id, _p: Principal = Depends(deps.user),
                  db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
    return _one_workspace(db, workspaces.get_workspace(db, id))


class PatchWorkspace(ProtoWire):
    name: str | None = Field(default=None, max_length=workspaces.NAME_MAX)
    default_compute_pool: str | None = Field(default=None, max_length=64)
    default_compute_resource_pool: str | None = Field(default=None, max_length=64)
    default_aux_pool: str | None = Field(default=None, max_length=64)
    default_aux_resource_pool: str | None = Field(default=None, max_length=64)
    checkpoint_storage_config: dict[str, Any] | None = None
    agent_user_group: dict[str, Any] | None = None
    cluster_namespace_meta: dict[str, Any] | None = None


def _either(first: str | None, second: str | None) -> str | None:
    return first if first is not None else second


@router.patch("/api/v1/workspaces/{id}")
def patch_workspace(id: Id, body: PatchWorkspace, p: Principal = Depends(deps.user),
                    master: Master = Depends(deps.get_master),
                    db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
    """`det workspace edit` sends the *ResourcePool names, the web UI of Determined the others."""
    _kubernetes_only(agentUserGroup=body.agent_user_group, clusterNamespaceMeta=body.cluster_namespace_meta)
    ws = workspaces.get_workspace(db, id)
    workspaces.edit_workspace(db, master, p, ws, workspaces.WorkspaceSettings(
        name=body.name, default_compute_pool=_either(body.default_compute_resource_pool, body.default_compute_pool),
        default_aux_pool=_either(body.default_aux_resource_pool, body.default_aux_pool),
        checkpoint_storage=body.checkpoint_storage_config))
    return _one_workspace(db, ws)


@router.delete("/api/v1/workspaces/{id}")
def delete_workspace(id: Id, p: Principal = Depends(deps.user),
                     db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
    workspaces.delete_workspace(db, p, workspaces.get_workspace(db, id))
    return {"completed": True}




@router.get("/api/v1/workspaces/{workspaceId}/available-resource-pools")
def get_workspace_pools(workspaceId: Id, _p: Principal = Depends(deps.user), master: Master = Depends(deps.get_master),
                        db: Session = Depends(deps.get_db, scope="function"), offset: Count32 = 0,
                        limit: Count32 = 0) -> dict[str, Any]:
    """`det workspace list-pools`: the pools the workspace may use (unbound ones and those bound to it)."""
    workspaces.get_workspace(db, workspaceId)
    names = pool_bindings.usable_pools(db, master, workspaceId)
    shown = serializers.page(names, offset, limit)
    return {"resourcePools": shown, "pagination": serializers.pagination_json(offset, limit, len(names), len(shown))}


# -- projects --------------------------------------------------------------------------------------
@router.get("/api/v1/workspaces/{id}/projects")
def get_workspace_projects(
    id: Count32, _p: Principal = Depends(deps.user), db: Session = Depends(deps.get_db, scope="function"),
    name: str | None = None, archived: bool | None = None, sortBy: str | None = None, orderBy: str | None = None,
    users: Annotated[list[str], Query()] = [],  # noqa: B006
    userIds: Annotated[list[Int32], Query()] = [],  # noqa: B006
    offset: Count32 = 0, limit: Count32 = 0,
) -> dict[str, Any]:
    """Workspace 0: the projects of every workspace."""
    serializers.reject_nul(name=name, users=users)
    if id:
        workspaces.get_workspace(db, id)
    sort_by = serializers.parse_choice(sortBy, workspaces.PROJECT_SORTS, "sortBy", "SORT_BY_ID")
    found = workspaces.list_projects(db, workspaces.ProjectFilter(
        workspace_id=id, name=name, archived=archived, user_ids=userIds, usernames=users,
    ), sort_by=sort_by, desc=serializers.parse_order(orderBy))
    shown = serializers.page(found, offset, limit)
    return {"projects": projects_json(db, shown),
            "pagination": serializers.pagination_json(offset, limit, len(found), len(shown))}


class PostProject(ProtoWire):
    name: str = Field(max_length=workspaces.NAME_MAX)
    workspace_id: Int32 | None = None
    description: str = Field(default="", max_length=10_000)
    key: str | None = Field(default=None, max_length=64)


@router.post("/api/v1/workspaces/{workspaceId}/projects")
def post_project(workspaceId: Id, body: PostProject, p: Principal = Depends(deps.user),
                 master: Master = Depends(deps.get_master),
                 db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
    if body.workspace_id not in (None, 0, workspaceId):
        raise bad_request("does not match the workspace in the path", "workspaceId")
    ws = workspaces.get_workspace(db, workspaceId)
    return _one_project(db, workspaces.create_project(db, master, p, ws, body.name, body.description, body.key))


@router.get("/api/v1/projects/{id}")
def get_project(id: Id, _p: Principal = Depends(deps.user),
                db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
    return _one_project(db, workspaces.get_project(db, id))


class PatchProject(ProtoWire):
    name: str | None = Field(default=None, max_length=workspaces.NAME_MAX)
    description: str | None = Field(default=None, max_length=10_000)
    key: str | None = Field(default=None, max_length=64)


@router.patch("/api/v1/projects/{id}")
def patch_project(id: Id, body: PatchProject, p: Principal = Depends(deps.user),
                  db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
    project = workspaces.get_project(db, id)
    workspaces.edit_project(db, p, project, workspaces.ProjectEdit(body.name, body.description, body.key))
    return _one_project(db, project)


@router.delete("/api/v1/projects/{id}")
def delete_project(id: Id, p: Principal = Depends(deps.user),
                   db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
    workspaces.delete_project(db, p, workspaces.get_project(db, id))
    return {"completed": True}




def _archiving(kind: str, archived: bool) -> Any:
    """`POST /api/v1/{workspaces|projects}/{id}/{archive|unarchive}`."""
    def handler(id: Id, p: Principal = Depends(deps.user),
                db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
        if kind == "workspaces":
            workspaces.set_workspace_archived(db, p, workspaces.get_workspace(db, id), archived)
        else:
            workspaces.set_project_archived(db, p, workspaces.get_project(db, id), archived)
        return {}

    handler.__name__ = f"{'' if archived else 'un'}archive_{kind[:-1]}"
    return handler


for _kind in ("workspaces", "projects"):
    for _archived in (True, False):
        router.post(f"/api/v1/{_kind}/{{id}}/{'' if _archived else 'un'}archive")(_archiving(_kind, _archived))


class Note(ProtoWire):
    name: str = ""
    contents: str = ""


class PutProjectNotes(ProtoWire):
    notes: list[Note] = Field(default_factory=list)
    project_id: Int32 | None = None


@router.put("/api/v1/projects/{projectId}/notes")
def put_project_notes(projectId: Id, body: PutProjectNotes, p: Principal = Depends(deps.user),
                      db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
    """`Project.add_note` / `remove_note` of Determined's SDK send the whole list."""
    if body.project_id not in (None, 0, projectId):
        raise bad_request("does not match the project in the path", "projectId")
    project = workspaces.get_project(db, projectId)
    return {"notes": workspaces.set_project_notes(db, p, project, [(n.name, n.contents) for n in body.notes])}


class MoveProject(ProtoWire):
    destination_workspace_id: Id
    project_id: Int32 | None = None


@router.post("/api/v1/projects/{projectId}/move")
def move_project(projectId: Id, body: MoveProject, p: Principal = Depends(deps.user),
                 db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
    if body.project_id not in (None, 0, projectId):
        raise bad_request("does not match the project in the path", "projectId")
    workspaces.move_project(db, p, workspaces.get_project(db, projectId),
                            workspaces.get_workspace(db, body.destination_workspace_id))
    return {}


class MoveExperiment(ProtoWire):
    destination_project_id: Id
    experiment_id: Int32 | None = None


@router.post("/api/v1/experiments/{experimentId}/move")
def move_experiment(experimentId: Id, body: MoveExperiment, p: Principal = Depends(deps.user),
                    db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
    if body.experiment_id not in (None, 0, experimentId):
        raise bad_request("does not match the experiment in the path", "experimentId")
    workspaces.move_experiment(db, p, access.get_experiment(db, experimentId), body.destination_project_id)
    return {}
