"""Resource pools bound to workspaces (`det resource-pool bindings`, Determined 0.38.1's
/api/v1/resource-pools/{name}/workspace-bindings): a pool with bindings takes only the experiments
of its workspaces; a pool without any takes everyone's. Only a ClusterAdmin binds
(MODIFY_RP_WORKSPACE_BINDINGS). The master's default pool is never bound, as in Determined, so
experiments that name no pool (and Uncategorized's) always have one."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from control_plane.auth import Principal
from control_plane.core.rbac import Perm
from control_plane.db.models import PoolWorkspaceBinding, Workspace
from control_plane.errors import bad_request, not_found
from control_plane.master import Master
from control_plane.services import authz

log = logging.getLogger("shipyard.pool_bindings")


def _pool(master: Master, name: str) -> str:
    if master.config.pool(name) is None:
        raise not_found(f"resource pool {name!r}")
    return name


def workspace_ids(s: Session, ids: Sequence[int], names: Sequence[str]) -> list[int]:
    """The workspaces named by id or name; 400 naming the first unknown one."""
    found = dict(s.execute(select(Workspace.name, Workspace.id).where(Workspace.name.in_(set(names)))).all()) \
        if names else {}
    missing = [n for n in names if n not in found]
    if missing:
        raise bad_request(f"no workspace named {missing[0]!r}", "workspaceNames")
    known = set(s.scalars(select(Workspace.id).where(Workspace.id.in_(set(ids))))) if ids else set()
    unknown = sorted(set(ids) - known)
    if unknown:
        raise bad_request(f"no workspace with id {unknown[0]}", "workspaceIds")
    return sorted(set(ids) | set(found.values()))


def bound(s: Session, pool: str) -> list[int]:
    return list(s.scalars(select(PoolWorkspaceBinding.workspace_id).where(PoolWorkspaceBinding.pool == pool)
                          .order_by(PoolWorkspaceBinding.workspace_id)))


def change(s: Session, master: Master, by: Principal, pool: str, ids: Sequence[int], names: Sequence[str], *,
           mode: str) -> None:
    """mode: "add", "remove" or "replace" the pool's bindings with the workspaces named by id or
    name. Authorized first: a caller who may not bind learns nothing of which workspaces exist."""
    authz.require(s, by, Perm.MODIFY_RP_WORKSPACE_BINDINGS, workspace_id=None, what=f"resource pool {pool!r}")
    ws_ids = workspace_ids(s, ids, names)
    _pool(master, pool)
    if pool == master.config.default_resource_pool and ws_ids and mode != "remove":
        raise bad_request(f"{pool!r} is the cluster's default pool; it cannot be bound to workspaces",
                          "resourcePoolName")
    have = set(bound(s, pool))
    if mode == "replace":
        s.execute(delete(PoolWorkspaceBinding).where(PoolWorkspaceBinding.pool == pool))
        have = set()
    if mode == "remove":
        if ws_ids:
            s.execute(delete(PoolWorkspaceBinding).where(PoolWorkspaceBinding.pool == pool,
                                                         PoolWorkspaceBinding.workspace_id.in_(set(ws_ids))))
    else:
        s.add_all(PoolWorkspaceBinding(pool=pool, workspace_id=w) for w in sorted(set(ws_ids) - have))
    s.flush()
    log.info("event=pool_bindings_%s pool=%s workspaces=%s by=%s", mode, pool, list(ws_ids), by.username)


def require_usable(s: Session, pool: str, workspace_id: int, field: str) -> None:
    """400 naming the pool when it is bound to workspaces and not to this one."""
    ids = bound(s, pool)
    if ids and workspace_id not in ids:
        raise bad_request(f"resource pool {pool!r} is bound to other workspaces; workspace {workspace_id} "
                          f"cannot use it", field)


def usable_pools(s: Session, master: Master, workspace_id: int) -> list[str]:
    """The pools a workspace may use (`det workspace list-pools`, Determined's
    ReadRPsAvailableToWorkspace): the unbound ones and those bound to it, in the master's order."""
    rows = s.execute(select(PoolWorkspaceBinding.pool, PoolWorkspaceBinding.workspace_id)).all()
    bound_to: dict[str, set[int]] = {}
    for pool, ws in rows:
        bound_to.setdefault(pool, set()).add(ws)
    return [p.name for p in master.config.resource_pools
            if p.name not in bound_to or workspace_id in bound_to[p.name]]
