"""`GET /api/v1/master/config` (Determined's GetMasterConfig: `det master config`), admins only:
the effective master configuration with its secrets hidden (services/master_config.py)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends

from control_plane.api import deps
from control_plane.auth import Principal
from control_plane.master import Master
from control_plane.services.master_config import shown_config

router = APIRouter()


@router.get("/api/v1/master/config")
def get_master_config(_p: Principal = Depends(deps.admin), master: Master = Depends(deps.get_master)) -> dict[str, Any]:
    return {"config": shown_config(master.config)}
