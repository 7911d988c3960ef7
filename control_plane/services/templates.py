"""Config templates (`det template`, `/api/v1/templates`): named experiment-config bases held by a
workspace. An experiment created with one gets the template under its own config, merged as
Determined merges them (core/expconf/merge.py). Anyone may read and use templates; their creator
or a role allowing it changes or removes them (`access.require_permission`)."""

from __future__ import annotations

import json
import logging
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from control_plane.auth import Principal
from control_plane.core.expconf.loading import load_document
from control_plane.core.expconf.merge import merge_template
from control_plane.core.expconf.secrets import PLACEHOLDER, keep_redacted, redacted_left
from control_plane.core.rbac import Perm
from control_plane.db.models import ConfigTemplate
from control_plane.errors import bad_request, conflict, not_found
from control_plane.master import Master
from control_plane.services import access, workspaces
from control_plane.services.text import clean_text

log = logging.getLogger("shipyard.templates")

NAME_MAX = 255


def _config(value: Any, old: dict[str, Any] | None = None) -> dict[str, Any]:
    """The template's config; a secret shown back as REDACTED and sent again keeps `old`'s value
    (the same template's), and is refused where there is none."""
    if not isinstance(value, dict):
        raise bad_request("must be a mapping of experiment config fields", "config")
    value = keep_redacted(value, old)
    if (left := redacted_left(value)) is not None:
        raise bad_request(PLACEHOLDER, f"config.{left}")
    return value


def get_template(s: Session, name: str) -> ConfigTemplate:
    t = s.get(ConfigTemplate, name)
    if t is None:
        raise not_found(f"template {name!r}")
    return t


def create_template(s: Session, master: Master, by: Principal, name: str, config: Any,
                    workspace_id: int = 0) -> ConfigTemplate:
    """Workspace 0 means the default workspace (Determined's client sends 0 without -w)."""
    access.require_user(by)
    if not name or not name.strip() or len(name) > NAME_MAX:
        raise bad_request(f"must be 1 to {NAME_MAX} characters", "name")
    ws = workspaces.get_workspace(s, workspace_id or workspaces.DEFAULT_WORKSPACE_ID)
    access.require_permission(s, by, Perm.CREATE_TEMPLATES, workspace_id=ws.id, what=f"workspace {ws.id}")
    if ws.archived:
        raise conflict(f"workspace {ws.id} is archived; it takes no new templates")
    if s.get(ConfigTemplate, name) is not None:
        raise conflict(f"template {name!r} already exists")
    t = ConfigTemplate(name=clean_text(name), workspace_id=ws.id, owner_id=by.user_id, config=_config(config),
                       created_at=master.clock())
    s.add(t)
    workspaces.flush_unique(s, f"template {t.name!r}")
    log.info("event=template_created template=%s workspace_id=%s by=%s", t.name, ws.id, by.username)
    return t


def set_config(s: Session, by: Principal, t: ConfigTemplate, config: Any) -> None:
    access.require_permission(s, by, Perm.UPDATE_TEMPLATES, workspace_id=t.workspace_id, what=f"template {t.name!r}",
                              owner_id=t.owner_id)
    t.config = _config(config, t.config)
    s.flush()


def delete_template(s: Session, by: Principal, t: ConfigTemplate) -> None:
    access.require_permission(s, by, Perm.DELETE_TEMPLATES, workspace_id=t.workspace_id, what=f"template {t.name!r}",
                              owner_id=t.owner_id)
    s.delete(t)
    s.flush()
    log.info("event=template_deleted template=%s by=%s", t.name, by.username)


def list_templates(s: Session, name: str | None = None, workspace_ids: list[int] | None = None,
                   desc: bool = False) -> list[ConfigTemplate]:
    q = select(ConfigTemplate)
    if name:
        q = q.where(ConfigTemplate.name.contains(name, autoescape=True))
    if workspace_ids:
        q = q.where(ConfigTemplate.workspace_id.in_(workspace_ids))
    return list(s.scalars(q.order_by(ConfigTemplate.name.desc() if desc else ConfigTemplate.name)))


def apply(s: Session, name: str, config_text: str) -> str:
    """The experiment's config text with the template under it, as JSON text (YAML reads JSON). A
    config that is not a mapping is returned as it is, for validation to say why."""
    t = s.get(ConfigTemplate, name)
    if t is None:
        raise bad_request(f"no template named {name!r}", "template")
    doc = load_document(config_text)
    if not isinstance(doc, dict):
        return config_text
    return json.dumps(merge_template(doc, t.config))
