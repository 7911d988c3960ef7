"""Config templates (Determined 0.38.1's /api/v1/templates: `det template`, `det e create
--template`): services/templates.py does the work."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Query
from pydantic import Field
from sqlalchemy.orm import Session

from control_plane.api import deps, serializers
from control_plane.api.wire import Count32, Int32, ProtoWire
from control_plane.auth import Principal
from control_plane.core.expconf.secrets import redact_config
from control_plane.db.models import ConfigTemplate
from control_plane.errors import bad_request
from control_plane.master import Master
from control_plane.services import templates

router = APIRouter()


def template_json(t: ConfigTemplate) -> dict[str, Any]:
    """Determined's v1Template; a storage secret key is hidden, as in experiment configs."""
    return {"name": t.name, "config": redact_config(t.config), "workspaceId": t.workspace_id}


class TemplateBody(ProtoWire):
    name: str | None = Field(default=None, max_length=templates.NAME_MAX)
    config: Any = None
    workspace_id: Int32 = 0


def _named(path_name: str, body: TemplateBody) -> None:
    if body.name not in (None, "", path_name):
        raise bad_request("does not match the template in the path", "name")


@router.get("/api/v1/templates")
def get_templates(
    _p: Principal = Depends(deps.user), db: Session = Depends(deps.get_db, scope="function"),
    name: str | None = None, sortBy: str | None = None, orderBy: str | None = None,
    workspaceIds: Annotated[list[Int32], Query()] = [],  # noqa: B006 - FastAPI copies defaults
    offset: Count32 = 0, limit: Count32 = 0,
) -> dict[str, Any]:
    serializers.reject_nul(name=name)
    serializers.parse_choice(sortBy, ("SORT_BY_UNSPECIFIED", "SORT_BY_NAME"), "sortBy", "SORT_BY_NAME")
    found = templates.list_templates(db, name, workspaceIds, desc=serializers.parse_order(orderBy))
    shown = serializers.page(found, offset, limit)
    return {"templates": [template_json(t) for t in shown],
            "pagination": serializers.pagination_json(offset, limit, len(found), len(shown))}


@router.get("/api/v1/templates/{templateName}")
def get_template(templateName: str, _p: Principal = Depends(deps.user),
                 db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
    return {"template": template_json(templates.get_template(db, templateName))}


@router.post("/api/v1/templates/{templateName}")
def post_template(templateName: str, body: TemplateBody, p: Principal = Depends(deps.user),
                  master: Master = Depends(deps.get_master),
                  db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
    _named(templateName, body)
    t = templates.create_template(db, master, p, templateName, body.config, body.workspace_id)
    return {"template": template_json(t)}


@router.put("/api/v1/templates/{templateName}")
def put_template(templateName: str, body: TemplateBody, p: Principal = Depends(deps.user),
                 master: Master = Depends(deps.get_master),
                 db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
    """Create or replace the config (Determined's upsert)."""
    _named(templateName, body)
    existing = db.get(ConfigTemplate, templateName)
    if existing is None:
        t = templates.create_template(db, master, p, templateName, body.config, body.workspace_id)
    else:
        templates.set_config(db, p, existing, body.config)
        t = existing
    return {"template": template_json(t)}


@router.patch("/api/v1/templates/{templateName}")
def patch_template_config(templateName: str, config: Annotated[Any, Body()] = None, p: Principal = Depends(deps.user),
                          db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
    """The body is the new config itself (`det template set`)."""
    t = templates.get_template(db, templateName)
    templates.set_config(db, p, t, config)
    return {"template": template_json(t)}


@router.delete("/api/v1/templates/{templateName}")
def delete_template(templateName: str, p: Principal = Depends(deps.user),
                    db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
    templates.delete_template(db, p, templates.get_template(db, templateName))
    return {}
