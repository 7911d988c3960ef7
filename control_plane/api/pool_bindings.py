"""Resource pools bound to workspaces (Determined 0.38.1's
/api/v1/resource-pools/{resourcePoolName}/workspace-bindings, as `det resource-pool bindings
add|remove|replace|list` calls them): services/pool_bindings.py does the work."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends
from pydantic import Field
from sqlalchemy.orm import Session

from control_plane.api import deps, serializers
from control_plane.api.wire import Id, ProtoWire
from control_plane.auth import Principal
from control_plane.master import Master
from control_plane.services import pool_bindings

router = APIRouter()
PATH = "/api/v1/resource-pools/{resourcePoolName}/workspace-bindings"


class Bindings(ProtoWire):
    resource_pool_name: str | None = Field(default=None, max_length=64)
    workspace_ids: list[Id] = []
    workspace_names: list[str] = Field(default=[], max_length=1000)


def _change(mode: str) -> Any:
    def handler(resourcePoolName: str, body: Bindings, p: Principal = Depends(deps.user),
                master: Master = Depends(deps.get_master),
                db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
        serializers.reject_nul(resourcePoolName=resourcePoolName, workspaceNames=body.workspace_names)
        pool_bindings.change(db, master, p, resourcePoolName, body.workspace_ids, body.workspace_names, mode=mode)
        return {}

    handler.__name__ = f"{mode}_pool_bindings"
    return handler


router.post(PATH)(_change("add"))
router.delete(PATH)(_change("remove"))
router.put(PATH)(_change("replace"))


@router.get(PATH)
def list_bindings(resourcePoolName: str, _p: Principal = Depends(deps.user),
                  db: Session = Depends(deps.get_db, scope="function")) -> dict[str, Any]:
    serializers.reject_nul(resourcePoolName=resourcePoolName)
    ids = pool_bindings.bound(db, resourcePoolName)
    return {"workspaceIds": ids, "pagination": serializers.pagination_json(0, 0, len(ids), len(ids))}
