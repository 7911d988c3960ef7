"""Roles and permissions (Determined's RBAC, reduced to what Shipyard's routes check): which roles
exist, what each allows, and whether a user holding some roles may do one thing. Pure: the
service (services/authz.py) loads who holds what.

Roles keep Determined's ids and names: ClusterAdmin 1, WorkspaceAdmin 2, Viewer 4, Editor 5. A role
is held in one workspace or cluster-wide (a cluster-wide role applies in every workspace).

The default roles every cluster has, so that a cluster without assignments behaves as before
RBAC (`implied_grants`): an admin is ClusterAdmin; the creator of a workspace is its
WorkspaceAdmin; every user is Editor of Uncategorized (workspace 1) for creating there and for
changing what they own, not what others own (today's rule; an assignment of Editor covers every
record of the workspace, as in Determined). Ownership also stands on its own: the owner of an
experiment, project, template or workspace may always change it (`OWNER_MAY`), so a role given
later never takes away what a user made.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

DEFAULT_WORKSPACE_ID = 1


class Perm(enum.StrEnum):
    """Determined's v1PermissionType names (without the PERMISSION_TYPE_ prefix)."""

    ADMINISTRATE_USER = "ADMINISTRATE_USER"
    CREATE_EXPERIMENT = "CREATE_EXPERIMENT"
    VIEW_EXPERIMENT_ARTIFACTS = "VIEW_EXPERIMENT_ARTIFACTS"
    VIEW_EXPERIMENT_METADATA = "VIEW_EXPERIMENT_METADATA"
    UPDATE_EXPERIMENT = "UPDATE_EXPERIMENT"
    UPDATE_EXPERIMENT_METADATA = "UPDATE_EXPERIMENT_METADATA"
    DELETE_EXPERIMENT = "DELETE_EXPERIMENT"
    CREATE_NSC = "CREATE_NSC"
    VIEW_NSC = "VIEW_NSC"
    UPDATE_NSC = "UPDATE_NSC"
    UPDATE_GROUP = "UPDATE_GROUP"
    CREATE_WORKSPACE = "CREATE_WORKSPACE"
    VIEW_WORKSPACE = "VIEW_WORKSPACE"
    UPDATE_WORKSPACE = "UPDATE_WORKSPACE"
    DELETE_WORKSPACE = "DELETE_WORKSPACE"
    SET_WORKSPACE_CHECKPOINT_STORAGE_CONFIG = "SET_WORKSPACE_CHECKPOINT_STORAGE_CONFIG"
    SET_WORKSPACE_DEFAULT_RESOURCE_POOL = "SET_WORKSPACE_DEFAULT_RESOURCE_POOL"
    CREATE_PROJECT = "CREATE_PROJECT"
    VIEW_PROJECT = "VIEW_PROJECT"
    UPDATE_PROJECT = "UPDATE_PROJECT"
    DELETE_PROJECT = "DELETE_PROJECT"
    ASSIGN_ROLES = "ASSIGN_ROLES"
    VIEW_MODEL_REGISTRY = "VIEW_MODEL_REGISTRY"
    EDIT_MODEL_REGISTRY = "EDIT_MODEL_REGISTRY"
    CREATE_MODEL_REGISTRY = "CREATE_MODEL_REGISTRY"
    VIEW_MASTER_LOGS = "VIEW_MASTER_LOGS"
    VIEW_MASTER_CONFIG = "VIEW_MASTER_CONFIG"
    UPDATE_AGENTS = "UPDATE_AGENTS"
    VIEW_TEMPLATES = "VIEW_TEMPLATES"
    UPDATE_TEMPLATES = "UPDATE_TEMPLATES"
    CREATE_TEMPLATES = "CREATE_TEMPLATES"
    DELETE_TEMPLATES = "DELETE_TEMPLATES"
    UPDATE_ROLES = "UPDATE_ROLES"
    MODIFY_RP_WORKSPACE_BINDINGS = "MODIFY_RP_WORKSPACE_BINDINGS"


# Permissions that only make sense cluster-wide (Determined's scopeTypeMask {cluster only}).
CLUSTER_ONLY = frozenset({
    Perm.ADMINISTRATE_USER, Perm.UPDATE_GROUP, Perm.CREATE_WORKSPACE, Perm.VIEW_MASTER_LOGS,
    Perm.VIEW_MASTER_CONFIG, Perm.UPDATE_AGENTS, Perm.UPDATE_ROLES, Perm.MODIFY_RP_WORKSPACE_BINDINGS,
})

# What the owner of a record may always do to it.
OWNER_MAY = frozenset({
    Perm.UPDATE_EXPERIMENT, Perm.UPDATE_EXPERIMENT_METADATA, Perm.DELETE_EXPERIMENT, Perm.UPDATE_NSC,
    Perm.UPDATE_PROJECT, Perm.DELETE_PROJECT, Perm.UPDATE_TEMPLATES, Perm.DELETE_TEMPLATES,
    Perm.UPDATE_WORKSPACE, Perm.DELETE_WORKSPACE, Perm.SET_WORKSPACE_CHECKPOINT_STORAGE_CONFIG,
    Perm.SET_WORKSPACE_DEFAULT_RESOURCE_POOL, Perm.EDIT_MODEL_REGISTRY,
})

_VIEW = frozenset({Perm.VIEW_EXPERIMENT_ARTIFACTS, Perm.VIEW_EXPERIMENT_METADATA, Perm.VIEW_NSC, Perm.VIEW_WORKSPACE,
                   Perm.VIEW_PROJECT, Perm.VIEW_MODEL_REGISTRY, Perm.VIEW_TEMPLATES})
_EDIT = _VIEW | {Perm.CREATE_EXPERIMENT, Perm.UPDATE_EXPERIMENT, Perm.UPDATE_EXPERIMENT_METADATA,
                 Perm.DELETE_EXPERIMENT, Perm.CREATE_NSC, Perm.UPDATE_NSC, Perm.CREATE_PROJECT, Perm.UPDATE_PROJECT,
                 Perm.DELETE_PROJECT, Perm.EDIT_MODEL_REGISTRY, Perm.CREATE_MODEL_REGISTRY, Perm.CREATE_TEMPLATES,
                 Perm.UPDATE_TEMPLATES, Perm.DELETE_TEMPLATES}
_WS_ADMIN = _EDIT | {Perm.UPDATE_WORKSPACE, Perm.DELETE_WORKSPACE, Perm.SET_WORKSPACE_CHECKPOINT_STORAGE_CONFIG,
                     Perm.SET_WORKSPACE_DEFAULT_RESOURCE_POOL, Perm.ASSIGN_ROLES}


@dataclass(frozen=True)
class Role:
    id: int
    name: str
    permissions: frozenset[Perm]
    workspace_scoped: bool  # may be assigned in one workspace (ClusterAdmin: cluster-wide only)


CLUSTER_ADMIN = Role(1, "ClusterAdmin", frozenset(Perm), False)
WORKSPACE_ADMIN = Role(2, "WorkspaceAdmin", frozenset(_WS_ADMIN), True)
VIEWER = Role(4, "Viewer", frozenset(_VIEW), True)
EDITOR = Role(5, "Editor", frozenset(_EDIT), True)
ROLES: tuple[Role, ...] = (CLUSTER_ADMIN, WORKSPACE_ADMIN, VIEWER, EDITOR)
ROLES_BY_ID = {r.id: r for r in ROLES}
ROLES_BY_NAME = {r.name: r for r in ROLES}
# Weakest first: the role a denial names as the one needed.
_BY_STRENGTH = (VIEWER, EDITOR, WORKSPACE_ADMIN, CLUSTER_ADMIN)


@dataclass(frozen=True)
class Grant:
    """One role held, in one workspace or (workspace_id None) cluster-wide. `own_only`: the
    implied Editor of Uncategorized, which changes only the user's own records."""

    role_id: int
    workspace_id: int | None
    own_only: bool = False


@dataclass(frozen=True)
class Target:
    """What is asked for: in which workspace (None: the cluster itself), and the owner of the
    record to change (None: creating, or a record of the cluster's own)."""

    workspace_id: int | None
    owner_id: int | None = None


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str = ""


def implied_grants(*, admin: bool, workspace_id: int | None, workspace_owner_id: int | None,
                   user_id: int | None) -> list[Grant]:
    """The default roles (module docstring) of one user, as far as `workspace_id` is concerned."""
    grants = [Grant(CLUSTER_ADMIN.id, None)] if admin else []
    if workspace_id == DEFAULT_WORKSPACE_ID:
        grants.append(Grant(EDITOR.id, DEFAULT_WORKSPACE_ID, own_only=True))
    elif workspace_id is not None and user_id is not None and workspace_owner_id == user_id:
        grants.append(Grant(WORKSPACE_ADMIN.id, workspace_id))
    return grants


def applies(grant: Grant, workspace_id: int | None) -> bool:
    return grant.workspace_id is None or grant.workspace_id == workspace_id


def decide(perm: Perm, user_id: int | None, grants: Iterable[Grant], target: Target, what: str) -> Decision:
    """May a user holding `grants` do `perm` to `what` (in `target`)? The reason of a denial names
    the roles held there and the weakest role that would do."""
    owns = user_id is not None and target.owner_id == user_id
    if owns and perm in OWNER_MAY:
        return Decision(True)
    held: list[Role] = []
    for g in grants:
        role = ROLES_BY_ID.get(g.role_id)
        if role is None or not applies(g, target.workspace_id):
            continue
        if perm in CLUSTER_ONLY and g.workspace_id is not None:
            continue
        if not g.own_only:
            held.append(role)
        if perm not in role.permissions:
            continue
        if g.own_only and perm in OWNER_MAY:
            continue  # the owner rule above is all it gives
        return Decision(True)
    return Decision(False, _denial(perm, held, target, what))


def _denial(perm: Perm, held: list[Role], target: Target, what: str) -> str:
    need = next(r for r in _BY_STRENGTH if perm in r.permissions)
    where = "the cluster" if target.workspace_id is None or perm in CLUSTER_ONLY else f"workspace {target.workspace_id}"
    names = sorted({r.name for r in held})
    has = f"has {' and '.join(names)} on {where}" if names else f"has no role on {where}"
    if target.owner_id is not None and perm in OWNER_MAY:
        return f"{what} belongs to another user, and this user {has}; changing it needs {need.name}"
    return f"this user {has}; {perm.value.lower().replace('_', ' ')} needs {need.name}"


def permissions_json(role: Role) -> list[dict[str, object]]:
    """Determined's v1Permission list of a role."""
    return [{"id": f"PERMISSION_TYPE_{p.value}", "name": p.value.lower().replace("_", " "),
             "scopeTypeMask": {"cluster": True, "workspace": p not in CLUSTER_ONLY}}
            for p in sorted(role.permissions)]


def role_json(role: Role) -> dict[str, object]:
    """Determined's v1Role."""
    return {"roleId": role.id, "name": role.name, "permissions": permissions_json(role),
            "scopeTypeMask": {"cluster": True, "workspace": role.workspace_scoped}}
