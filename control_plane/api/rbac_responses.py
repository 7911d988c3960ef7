"""The typed answers of groups, roles and pool bindings (api/groups.py, api/rbac.py,
api/pool_bindings.py) in Determined 0.38.1's shapes (v1GroupDetails, v1GroupSearchResult, v1Role,
v1RoleWithAssignments, v1RoleAssignmentSummary), for the OpenAPI document (api/openapi.py RESPONSES)."""

from __future__ import annotations

from control_plane.api.responses import Empty, UserOut
from control_plane.api.wire import Pagination, Wire


class ScopeTypeMask(Wire):
    cluster: bool
    workspace: bool


class PermissionOut(Wire):
    id: str
    name: str
    scope_type_mask: ScopeTypeMask


class RoleOut(Wire):
    role_id: int
    name: str
    permissions: list[PermissionOut]
    scope_type_mask: ScopeTypeMask


class RoleRefOut(Wire):
    role_id: int
    name: str


class RoleAssignmentOut(Wire):
    role: RoleRefOut
    scope_workspace_id: int | None
    scope_cluster: bool


class UserRoleAssignmentOut(Wire):
    user_id: int
    role_assignment: RoleAssignmentOut


class GroupRoleAssignmentOut(Wire):
    group_id: int
    role_assignment: RoleAssignmentOut


class RoleWithAssignmentsOut(Wire):
    role: RoleOut
    user_role_assignments: list[UserRoleAssignmentOut]
    group_role_assignments: list[GroupRoleAssignmentOut]


class RolesResponse(Wire):
    roles: list[RoleOut]
    pagination: Pagination


class RolesWithAssignmentsResponse(Wire):
    roles: list[RoleWithAssignmentsOut]


class AssignmentSummaryOut(Wire):
    role_id: int
    scope_cluster: bool
    scope_workspace_ids: list[int]


class RoleSummaryResponse(Wire):
    roles: list[RoleOut]
    assignments: list[AssignmentSummaryOut]


class GroupDetailsOut(Wire):
    group_id: int
    name: str
    users: list[UserOut]


class GroupResponse(Wire):
    group: GroupDetailsOut


class GroupOut(Wire):
    group_id: int
    name: str


class GroupSearchResultOut(Wire):
    group: GroupOut
    num_members: int


class GetGroupsResponse(Wire):
    groups: list[GroupSearchResultOut]
    pagination: Pagination


class PoolBindingsResponse(Wire):
    workspace_ids: list[int]
    pagination: Pagination


BINDINGS = "/api/v1/resource-pools/{resourcePoolName}/workspace-bindings"
RESPONSES: dict[tuple[str, str], type[Wire]] = {
    ("POST", "/api/v1/groups"): GroupResponse,
    ("POST", "/api/v1/groups/search"): GetGroupsResponse,
    ("GET", "/api/v1/groups/{groupId}"): GroupResponse,
    ("PUT", "/api/v1/groups/{groupId}"): GroupResponse,
    ("DELETE", "/api/v1/groups/{groupId}"): Empty,
    ("POST", "/api/v1/roles/search"): RolesResponse,
    ("POST", "/api/v1/roles/search/by-assignability"): RolesResponse,
    ("POST", "/api/v1/roles/search/by-ids"): RolesWithAssignmentsResponse,
    ("GET", "/api/v1/roles/search/by-user/{userId}"): RolesWithAssignmentsResponse,
    ("GET", "/api/v1/roles/search/by-group/{groupId}"): RoleSummaryResponse,
    ("GET", "/api/v1/permissions/summary"): RoleSummaryResponse,
    ("POST", "/api/v1/roles/add-assignments"): Empty,
    ("POST", "/api/v1/roles/remove-assignments"): Empty,
    ("POST", BINDINGS): Empty,
    ("DELETE", BINDINGS): Empty,
    ("PUT", BINDINGS): Empty,
    ("GET", BINDINGS): PoolBindingsResponse,
}
