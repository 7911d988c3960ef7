"""The model registry: named models whose versions point at checkpoints. A version holds its
checkpoint: it can only point at a live one the registering user owns (or any, for an admin), and
keeps it from deletion and garbage collection."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from control_plane.auth import Principal
from control_plane.core import states as st
from control_plane.core.rbac import DEFAULT_WORKSPACE_ID, Perm
from control_plane.db.models import Checkpoint, Experiment, Model, ModelVersion
from control_plane.errors import Conflict, DomainError, bad_request, conflict, forbidden, not_found
from control_plane.master import Master
from control_plane.services import access, authz
from control_plane.services.experiments import check_label
from control_plane.services.text import clean_text

log = logging.getLogger("shipyard.models")


@dataclass(frozen=True)
class NewModel:
    name: str
    description: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    labels: list[str] = field(default_factory=list)
    notes: str = ""


def create_model(s: Session, master: Master, owner: Principal, new: NewModel) -> Model:
    if s.scalar(select(Model).where(Model.name == new.name)) is not None:
        raise conflict(f"model {new.name!r} already exists")
    now = master.clock()
    m = Model(name=new.name, description=new.description, metadata_=new.metadata, labels=new.labels,
              notes=new.notes, owner_id=owner.user_id, created_at=now, modified_at=now)
    s.add(m)
    s.flush()
    log.info("event=model_created model=%s by=%s", m.name, owner.username)
    return m


def get_model(s: Session, name: str) -> Model:
    m = s.scalar(select(Model).where(Model.name == name))
    if m is None:
        raise not_found(f"model {name!r}")
    return m


def list_models(s: Session, name: str | None = None, archived: bool | None = None) -> list[Model]:
    """Models in id order; `name` matches a part of the name."""
    q = select(Model).order_by(Model.id)
    if name:
        q = q.where(Model.name.contains(name))
    if archived is not None:
        q = q.where(Model.archived == archived)
    return list(s.scalars(q))


def version_count(s: Session, m: Model) -> int:
    return s.scalar(select(func.count()).select_from(ModelVersion).where(ModelVersion.model_id == m.id)) or 0


@dataclass(frozen=True)
class NewModelVersion:
    checkpoint_uuid: str
    name: str = ""
    comment: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    labels: list[str] = field(default_factory=list)
    notes: str = ""


def require_edit(s: Session, by: Principal, m: Model) -> None:
    """403 unless `by` may change model `m`: its owner, or a role granting EDIT_MODEL_REGISTRY in
    Uncategorized, where models live (an admin, a ClusterAdmin)."""
    authz.require(s, by, Perm.EDIT_MODEL_REGISTRY, workspace_id=DEFAULT_WORKSPACE_ID, what=f"model {m.name!r}",
                  owner_id=m.owner_id)


def may_edit(s: Session, by: Principal, m: Model) -> bool:
    """Whether require_edit lets `by` through (what the web UI offers)."""
    try:
        require_edit(s, by, m)
    except DomainError:
        return False
    return True


def register_version(s: Session, master: Master, by: Principal, m: Model, new: NewModelVersion) -> ModelVersion:
    """The model's next version, pointing at a live checkpoint; the model's owner or an admin."""
    require_edit(s, by, m)
    ckpt = s.get(Checkpoint, new.checkpoint_uuid)
    if ckpt is None:
        raise bad_request(f"no checkpoint {new.checkpoint_uuid}", "checkpointUuid")
    _require_checkpoint_owner(s, by, ckpt)
    if ckpt.state not in st.CKPT_LIVE:
        raise Conflict(f"checkpoint {ckpt.uuid} is {st.checkpoint_wire_state(ckpt.state)}")
    last = s.scalar(select(func.max(ModelVersion.version)).where(ModelVersion.model_id == m.id)) or 0
    now = master.clock()
    v = ModelVersion(model_id=m.id, version=last + 1, checkpoint_uuid=ckpt.uuid, name=new.name,
                     comment=new.comment, notes=new.notes, metadata_=new.metadata, labels=new.labels,
                     owner_id=by.user_id, created_at=now)
    s.add(v)
    m.modified_at = now
    s.flush()
    log.info("event=model_version_registered model=%s version=%s checkpoint=%s by=%s",
             m.name, v.version, ckpt.uuid, by.username)
    return v


def _require_checkpoint_owner(s: Session, by: Principal, ckpt: Checkpoint) -> None:
    """A version holds its checkpoint (no deletion, no GC), so only who could delete the checkpoint
    may register it: who may change its experiment (services/access.py), or an admin (also for one
    without experiment)."""
    exp = s.get(Experiment, ckpt.experiment_id) if ckpt.experiment_id is not None else None
    if exp is None:
        if not authz.is_cluster_admin(s, by):
            raise forbidden(f"checkpoint {ckpt.uuid} has no experiment; only an admin can register it")
        return
    access.require_owner(by, exp)


DESCRIPTION_MAX = 10_000


NOTES_MAX = 100_000


def edit_model(s: Session, master: Master, by: Principal, m: Model, description: str | None = None,
               labels: list[str] | None = None, metadata: dict[str, Any] | None = None,
               notes: str | None = None) -> None:
    """The model's description, labels, metadata (replaced whole, as Determined's PatchModel does)
    and notes; None leaves one as it is. Its owner or an admin."""
    require_edit(s, by, m)
    if description is not None:
        if len(description) > DESCRIPTION_MAX:
            raise bad_request(f"must be at most {DESCRIPTION_MAX} characters", "description")
        m.description = clean_text(description)
    if labels is not None:
        m.labels = list(dict.fromkeys(check_label(x, f"labels[{i}]") for i, x in enumerate(labels)))
    if metadata is not None:
        m.metadata_ = metadata
    if notes is not None:
        if len(notes) > NOTES_MAX:
            raise bad_request(f"must be at most {NOTES_MAX} characters", "notes")
        m.notes = clean_text(notes)
    m.modified_at = master.clock()
    s.flush()
    log.info("event=model_edited model=%s by=%s", m.name, by.username)


def delete_model(s: Session, by: Principal, m: Model) -> int:
    """Determined's DeleteModel: the model and its versions, in the caller's one transaction; their
    checkpoints stay (no longer held, a later GC may take them). Who may edit it: its owner, or an
    admin / ClusterAdmin. Returns how many versions went."""
    require_edit(s, by, m)
    versions = list_versions(s, m)
    for v in versions:
        s.delete(v)
    s.flush()  # the versions first: SQLite without foreign keys would keep them otherwise
    s.delete(m)
    s.flush()
    log.info("event=model_deleted model=%s versions=%d by=%s", m.name, len(versions), by.username)
    return len(versions)


def list_versions(s: Session, m: Model) -> list[ModelVersion]:
    return list(s.scalars(select(ModelVersion).where(ModelVersion.model_id == m.id).order_by(ModelVersion.version)))


def get_version(s: Session, m: Model, number: int) -> ModelVersion:
    v = s.scalar(select(ModelVersion).where(ModelVersion.model_id == m.id, ModelVersion.version == number))
    if v is None:
        raise not_found(f"version {number} of model {m.name!r}")
    return v
