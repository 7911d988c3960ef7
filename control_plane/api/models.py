"""Model registry (Determined's paths): named models whose versions point at checkpoints, with
metadata, labels and notes; plus `POST /api/v1/experiments/{id}/gc`. A checkpoint held by a
model version is never garbage-collected."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends
from pydantic import Field
from sqlalchemy.orm import Session

from control_plane.api import deps, serializers
from control_plane.api.wire import Count32, Id, Int32, ProtoWire, ts
from control_plane.auth import Principal
from control_plane.db.models import Checkpoint, Model, ModelVersion, User
from control_plane.errors import bad_request
from control_plane.master import Master
from control_plane.services import access, checkpoints, models

router = APIRouter()

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9 _.:-]*$"


class PostModel(ProtoWire):
    name: str = Field(min_length=1, max_length=255, pattern=NAME_PATTERN)
    description: str = Field(default="", max_length=10_000)
    metadata: dict[str, Any] = Field(default_factory=dict)
    labels: list[str] = Field(default_factory=list, max_length=100)
    notes: str = Field(default="", max_length=100_000)
    workspace_id: Int32 | None = None
    workspace_name: str | None = None


def model_json(m: Model, owner: str, versions: int) -> dict[str, Any]:
    return {
        "id": m.id, "name": m.name, "description": m.description, "metadata": m.metadata_ or {},
        "labels": m.labels or [], "notes": m.notes, "archived": m.archived,
        "creationTime": ts(m.created_at), "lastUpdatedTime": ts(m.modified_at),
        "numVersions": versions, "userId": m.owner_id, "username": owner, "workspaceId": 1,
    }


def _model_out(db: Session, m: Model) -> dict[str, Any]:
    owner = db.get(User, m.owner_id)
    return model_json(m, owner.username if owner else "", models.version_count(db, m))


@router.post("/api/v1/models")
def post_model(body: PostModel, p: Principal = Depends(deps.user), master: Master = Depends(deps.get_master),
               db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
    new = models.NewModel(name=body.name, description=body.description, metadata=body.metadata,
                          labels=body.labels, notes=body.notes)
    return {"model": _model_out(db, models.create_model(db, master, p, new))}


@router.get("/api/v1/models")
def get_models(_p: Principal = Depends(deps.user), db: Session = Depends(deps.get_db, scope="function"), name: str | None = None,
               archived: bool | None = None, offset: Count32 = 0, limit: Count32 = 0) -> dict[str, Any]:
    found = models.list_models(db, name, archived)
    shown = serializers.page(found, offset, limit)
    return {"models": [_model_out(db, m) for m in shown],
            "pagination": serializers.pagination_json(offset, limit, len(found), len(shown))}


@router.get("/api/v1/models/{modelName}")
def get_model(modelName: str, _p: Principal = Depends(deps.user), db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
    return {"model": _model_out(db, models.get_model(db, modelName))}


class PatchModel(ProtoWire):
    """Determined's v1PatchModel: each field given replaces the model's (metadata whole, as the SDK's
    set_metadata sends the merged dict); absent or null leaves it."""
    name: str | None = Field(default=None, max_length=255)
    description: str | None = Field(default=None, max_length=10_000)
    metadata: dict[str, Any] | None = None
    labels: list[str] | None = Field(default=None, max_length=100)
    notes: str | None = Field(default=None, max_length=100_000)
    workspace_id: Int32 | None = None
    workspace_name: str | None = None


@router.patch("/api/v1/models/{modelName}")
def patch_model(modelName: str, body: PatchModel, p: Principal = Depends(deps.user), master: Master = Depends(deps.get_master),
                db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
    """Description, labels, metadata and notes, as the model's owner or an admin. Models live in
    the default workspace here: renaming and moving are refused by name, not silently ignored."""
    m = models.get_model(db, modelName)
    if body.name is not None and body.name != m.name:
        raise bad_request("renaming a model is not supported", "name")
    if body.workspace_id not in (None, 0, 1) or body.workspace_name not in (None, "", "Uncategorized"):
        raise bad_request("models stay in the default workspace (id 1)", "workspaceId")
    models.edit_model(db, master, p, m, description=body.description, labels=body.labels,
                      metadata=body.metadata, notes=body.notes)
    return {"model": _model_out(db, m)}


@router.delete("/api/v1/models/{modelName}")
def delete_model(modelName: str, p: Principal = Depends(deps.user),
                 db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
    """Determined's DeleteModel (`det model delete`): the model and its versions; the checkpoints
    stay. Its owner or an admin."""
    models.delete_model(db, p, models.get_model(db, modelName))
    return {}


class PostModelVersion(ProtoWire):
    model_name: str | None = None
    checkpoint_uuid: str
    name: str = Field(default="", max_length=255)
    comment: str = Field(default="", max_length=10_000)
    metadata: dict[str, Any] = Field(default_factory=dict)
    labels: list[str] = Field(default_factory=list, max_length=100)
    notes: str = Field(default="", max_length=100_000)


def _version_json(db: Session, v: ModelVersion, m: Model) -> dict[str, Any]:
    ckpt = db.get(Checkpoint, v.checkpoint_uuid)
    owner = db.get(User, v.owner_id)
    return {
        "id": v.id, "version": v.version, "name": v.name, "comment": v.comment, "notes": v.notes,
        "metadata": v.metadata_ or {}, "labels": v.labels or [],
        "creationTime": ts(v.created_at), "lastUpdatedTime": ts(v.created_at),
        "userId": v.owner_id, "username": owner.username if owner else "",
        "model": _model_out(db, m),
        "checkpoint": serializers.checkpoint_json(ckpt, checkpoints.context(db, [ckpt])) if ckpt else None,
    }


@router.post("/api/v1/models/{modelName}/versions")
def post_model_version(modelName: str, body: PostModelVersion, p: Principal = Depends(deps.user),
                       master: Master = Depends(deps.get_master), db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
    if body.model_name is not None and body.model_name != modelName:
        raise bad_request("does not match the model in the path", "modelName")
    m = models.get_model(db, modelName)
    new = models.NewModelVersion(checkpoint_uuid=body.checkpoint_uuid, name=body.name, comment=body.comment,
                                 metadata=body.metadata, labels=body.labels, notes=body.notes)
    return {"modelVersion": _version_json(db, models.register_version(db, master, p, m, new), m)}


@router.get("/api/v1/models/{modelName}/versions")
def get_model_versions(modelName: str, _p: Principal = Depends(deps.user), db: Session = Depends(deps.get_db, scope="function"),
                       offset: Count32 = 0, limit: Count32 = 0) -> dict[str, Any]:
    m = models.get_model(db, modelName)
    versions = models.list_versions(db, m)
    shown = serializers.page(versions, offset, limit)
    return {"model": _model_out(db, m), "modelVersions": [_version_json(db, v, m) for v in shown],
            "pagination": serializers.pagination_json(offset, limit, len(versions), len(shown))}


@router.get("/api/v1/models/{modelName}/versions/{modelVersionNum}")
def get_model_version(modelName: str, modelVersionNum: Id, _p: Principal = Depends(deps.user),
                      db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
    m = models.get_model(db, modelName)
    return {"modelVersion": _version_json(db, models.get_version(db, m, modelVersionNum), m)}


@router.post("/api/v1/experiments/{experimentId}/gc")
def gc_experiment(experimentId: Id, p: Principal = Depends(deps.user), master: Master = Depends(deps.get_master),
                  db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
    exp = access.get_experiment(db, experimentId)
    access.require_owner(p, exp)  # as every change to an experiment (services/authz.py)
    return {"deleting": checkpoints.collect_garbage(db, master, exp)}
