"""Workspaces and projects, as Determined 0.38.1 has them: every experiment lives in a project and
every project in a workspace. Workspace 1 and its project 1, both `Uncategorized`, are the
cluster's own (no owner, immutable): experiments created without a project land there.

A workspace carries defaults for the experiments created in it: a compute pool (used when the
config names no `resources.resource_pool`) and checkpoint storage (merged under the config's, over
the master's). Archived workspaces and projects take no new experiments or projects; deleting
one is allowed only once it is empty. Who may change what is `access.require_permission`
(roles, services/authz.py).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import TypeAdapter, ValidationError
from sqlalchemy import Select, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, object_session

from control_plane.auth import Principal
from control_plane.core import states as st
from control_plane.core.expconf.checks import storage_problems
from control_plane.core.expconf.models.storage import CheckpointStorage
from control_plane.core.expconf.secrets import PLACEHOLDER, keep_redacted_storage, redacted_left
from control_plane.core.host_access import storage_refusal
from control_plane.core.rbac import Perm
from control_plane.db.models import ConfigTemplate, Experiment, Project, User, Workspace
from control_plane.errors import bad_request, conflict, not_found
from control_plane.master import Master
from control_plane.services import access
from control_plane.services.text import clean_text

log = logging.getLogger("shipyard.workspaces")

DEFAULT_WORKSPACE_ID = 1
DEFAULT_PROJECT_ID = 1
NAME_MAX = 255
KEY_MAX = 5  # Determined's MaxProjectKeyLength
_KEY = re.compile(r"^[A-Za-z0-9]{1,5}$")
_STORAGE = TypeAdapter(CheckpointStorage)


def _name(value: str, field_name: str) -> str:
    if not value or not value.strip():
        raise bad_request("must not be empty", field_name)
    if len(value) > NAME_MAX:
        raise bad_request(f"must be at most {NAME_MAX} characters", field_name)
    return clean_text(value.strip())


def _pool(master: Master, name: str | None, field_name: str) -> str | None:
    """A pool name to keep as a default ("" clears it); it must name a pool of this master."""
    if not name:
        return None
    if master.config.pool(name) is None:
        names = [p.name for p in master.config.resource_pools]
        raise bad_request(f"no resource pool named {name!r}; pools are {names}", field_name)
    return name


def _storage(master: Master, value: dict[str, Any] | None, field_name: str,
             old: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """Checkpoint storage as an experiment config would give it ({} clears it); a secret key shown
    back as REDACTED and sent again keeps `old`'s (the same workspace's), refused where there is none.
    A shared_fs storage off the cluster's root is refused here, as each experiment would refuse it
    (core/host_access.py), unless the master allows task host access."""
    if not value:
        return None
    value = keep_redacted_storage(value, old)
    if redacted_left({"checkpoint_storage": value}) is not None:
        raise bad_request(PLACEHOLDER, f"{field_name}.secret_key")
    try:
        parsed = _STORAGE.validate_python(value)
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        where = ".".join(str(x) for x in first["loc"][1:] if not str(x).startswith("storage="))
        raise bad_request(first["msg"], f"{field_name}.{where}" if where else field_name) from None
    problems = storage_problems(parsed)
    if problems:
        raise bad_request(problems[0].reason, f"{field_name}.{problems[0].path.split('.', 1)[1]}")
    if not master.config.allow_task_host_access:
        refused = storage_refusal(parsed, master.config.default_checkpoint_storage)
        if refused is not None:
            raise bad_request(refused.reason, f"{field_name}.{refused.field.rsplit('.', 1)[1]}")
    return dict(value)


# -- workspaces ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WorkspaceSettings:
    """What a create or an edit sets; None leaves a field as it is ("" / {} clears a default)."""

    name: str | None = None
    default_compute_pool: str | None = None
    default_aux_pool: str | None = None
    checkpoint_storage: dict[str, Any] | None = None


def _apply_settings(s: Session, master: Master, ws: Workspace, change: WorkspaceSettings) -> None:
    if change.name is not None:
        name = _name(change.name, "name")
        taken = s.scalar(select(Workspace.id).where(Workspace.name == name))
        if taken is not None and taken != ws.id:
            raise conflict(f"a workspace named {name!r} already exists")
        ws.name = name
    if change.default_compute_pool is not None:
        ws.default_compute_pool = _pool(master, change.default_compute_pool, "defaultComputePool")
    if change.default_aux_pool is not None:
        ws.default_aux_pool = _pool(master, change.default_aux_pool, "defaultAuxPool")
    if change.checkpoint_storage is not None:
        ws.checkpoint_storage = _storage(master, change.checkpoint_storage, "checkpointStorageConfig",
                                         ws.checkpoint_storage)


def create_workspace(s: Session, master: Master, by: Principal, new: WorkspaceSettings) -> Workspace:
    access.require_user(by)
    ws = Workspace(name="", owner_id=by.user_id, archived=False, immutable=False, created_at=master.clock())
    if new.name is None:
        raise bad_request("is required", "name")
    _apply_settings(s, master, ws, new)
    s.add(ws)
    flush_unique(s, f"a workspace named {ws.name!r}")
    log.info("event=workspace_created workspace_id=%s name=%s by=%s", ws.id, ws.name, by.username)
    return ws


def get_workspace(s: Session, workspace_id: int) -> Workspace:
    ws = s.get(Workspace, workspace_id)
    if ws is None:
        raise not_found(f"workspace {workspace_id}")
    return ws


def flush_unique(s: Session, taken: str) -> None:
    """Flush a new or renamed row whose name is unique: a concurrent request that took the name
    between the check and the write is a 409 like the check's, not a 500."""
    try:
        s.flush()
    except IntegrityError:
        raise conflict(f"{taken} already exists") from None


def _mutable(what: str, immutable: bool) -> None:
    if immutable:
        raise conflict(f"{what} is the cluster's default and cannot be changed this way")


def _may_reshape(by: Principal, record: Workspace | Project) -> None:
    """Archiving, deleting or moving: who may change it, and never the cluster's default."""
    is_ws = isinstance(record, Workspace)
    what = f"{'workspace' if is_ws else 'project'} {record.id}"
    access.require_permission(object_session(record), by, Perm.UPDATE_WORKSPACE if is_ws else Perm.UPDATE_PROJECT,
                              workspace_id=record.id if is_ws else record.workspace_id, what=what,
                              owner_id=record.owner_id)
    _mutable(what, record.immutable)


def edit_workspace(s: Session, master: Master, by: Principal, ws: Workspace, change: WorkspaceSettings) -> None:
    access.require_permission(s, by, Perm.UPDATE_WORKSPACE, workspace_id=ws.id, what=f"workspace {ws.id}",
                              owner_id=ws.owner_id)
    if change.name is not None and change.name != ws.name:
        _mutable(f"workspace {ws.id}", ws.immutable)  # renaming Uncategorized
    _apply_settings(s, master, ws, change)
    flush_unique(s, f"a workspace named {ws.name!r}")


def set_workspace_archived(s: Session, by: Principal, ws: Workspace, archived: bool) -> None:
    _may_reshape(by, ws)
    ws.archived = archived
    s.flush()


def delete_workspace(s: Session, by: Principal, ws: Workspace) -> None:
    """Only an empty workspace: its projects and templates deleted or moved first."""
    _may_reshape(by, ws)
    projects = s.scalar(select(func.count()).where(Project.workspace_id == ws.id)) or 0
    templates = s.scalar(select(func.count()).where(ConfigTemplate.workspace_id == ws.id)) or 0
    if projects or templates:
        raise conflict(f"workspace {ws.id} still holds {projects} projects and {templates} templates; "
                       "delete or move them first")
    s.delete(ws)
    s.flush()
    log.info("event=workspace_deleted workspace_id=%s by=%s", ws.id, by.username)


@dataclass
class WorkspaceFilter:
    name: str | None = None  # case-insensitive, whole name
    name_case_sensitive: str | None = None
    archived: bool | None = None
    user_ids: list[int] = field(default_factory=list)
    usernames: list[str] = field(default_factory=list)


def _owned_by(q: Select[Any], owner_col: Any, user_ids: Sequence[int], usernames: Sequence[str]) -> Select[Any]:
    if user_ids:
        q = q.where(owner_col.in_(user_ids))
    if usernames:
        q = q.where(owner_col.in_(select(User.id).where(User.username.in_(usernames))))
    return q


def list_workspaces(s: Session, flt: WorkspaceFilter, *, by_name: bool = False, desc: bool = False) -> list[Workspace]:
    q = select(Workspace)
    if flt.name:
        q = q.where(func.lower(Workspace.name) == flt.name.lower())
    if flt.name_case_sensitive:
        q = q.where(Workspace.name == flt.name_case_sensitive)
    if flt.archived is not None:
        q = q.where(Workspace.archived == flt.archived)
    q = _owned_by(q, Workspace.owner_id, flt.user_ids, flt.usernames)
    col = Workspace.name if by_name else Workspace.id
    return list(s.scalars(q.order_by(col.desc() if desc else col)))


@dataclass
class WorkspaceCounts:
    projects: int = 0
    experiments: int = 0


def workspace_counts(s: Session, ids: Sequence[int]) -> dict[int, WorkspaceCounts]:
    out = {i: WorkspaceCounts() for i in ids}
    if not ids:
        return out
    for wid, n in s.execute(select(Project.workspace_id, func.count()).where(Project.workspace_id.in_(ids))
                            .group_by(Project.workspace_id)):
        out[wid].projects = int(n)
    for wid, n in s.execute(select(Project.workspace_id, func.count(Experiment.id))
                            .join(Experiment, Experiment.project_id == Project.id)
                            .where(Project.workspace_id.in_(ids)).group_by(Project.workspace_id)):
        out[wid].experiments = int(n)
    return out


# -- projects --------------------------------------------------------------------------------------
def _key(s: Session, wanted: str | None, name: str) -> str:
    """Determined's project key: up to 5 letters or digits, upper case, unique. Without one, made
    from the name (its first letters and digits), numbered when taken."""
    if wanted:
        if not _KEY.match(wanted):
            raise bad_request(f"must be 1 to {KEY_MAX} letters or digits", "key")
        key = wanted.upper()
        if s.scalar(select(Project.id).where(Project.key == key)) is not None:
            raise conflict(f"a project with key {key!r} already exists")
        return key
    base = ("".join(c for c in name.upper() if c.isascii() and c.isalnum()) or "PROJ")[:KEY_MAX]
    taken = set(s.scalars(select(Project.key)))
    if base not in taken:
        return base
    for n in range(1, 100_000):
        suffix = str(n)
        key = base[: KEY_MAX - len(suffix)] + suffix
        if key not in taken:
            return key
    raise conflict("no free project key; give one with key")


def create_project(s: Session, master: Master, by: Principal, ws: Workspace, name: str,
                   description: str = "", key: str | None = None) -> Project:
    access.require_permission(s, by, Perm.CREATE_PROJECT, workspace_id=ws.id, what=f"workspace {ws.id}")
    if ws.archived:
        raise conflict(f"workspace {ws.id} is archived; it takes no new projects")
    name = _name(name, "name")
    if s.scalar(select(Project.id).where(Project.workspace_id == ws.id, Project.name == name)) is not None:
        raise conflict(f"workspace {ws.id} already has a project named {name!r}")
    p = Project(name=name, key=_key(s, key, name), description=clean_text(description), workspace_id=ws.id,
                owner_id=by.user_id, archived=False, immutable=False, notes=[], created_at=master.clock())
    s.add(p)
    flush_unique(s, f"a project named {name!r} or with key {p.key!r}")
    log.info("event=project_created project_id=%s workspace_id=%s name=%s by=%s", p.id, ws.id, p.name, by.username)
    return p


def get_project(s: Session, project_id: int) -> Project:
    p = s.get(Project, project_id)
    if p is None:
        raise not_found(f"project {project_id}")
    return p


@dataclass(frozen=True)
class ProjectEdit:
    name: str | None = None
    description: str | None = None
    key: str | None = None


def edit_project(s: Session, by: Principal, p: Project, change: ProjectEdit) -> None:
    access.require_permission(s, by, Perm.UPDATE_PROJECT, workspace_id=p.workspace_id, what=f"project {p.id}",
                              owner_id=p.owner_id)
    if change.name is not None and change.name != p.name:
        _mutable(f"project {p.id}", p.immutable)
        name = _name(change.name, "name")
        if s.scalar(select(Project.id).where(Project.workspace_id == p.workspace_id, Project.name == name,
                                             Project.id != p.id)) is not None:
            raise conflict(f"workspace {p.workspace_id} already has a project named {name!r}")
        p.name = name
    if change.description is not None:
        p.description = clean_text(change.description)
    if change.key is not None and change.key.upper() != p.key:
        p.key = _key(s, change.key, p.name)
    flush_unique(s, f"a project named {p.name!r} or with key {p.key!r}")


NOTES_MAX = 100
NOTE_MAX = 100_000


def set_project_notes(s: Session, by: Principal, p: Project, notes: Sequence[tuple[str, str]]) -> list[dict[str, str]]:
    """Replace the project's notes (Determined's PutProjectNotes: the whole list at once)."""
    access.require_permission(s, by, Perm.UPDATE_PROJECT, workspace_id=p.workspace_id, what=f"project {p.id}",
                              owner_id=p.owner_id)
    if len(notes) > NOTES_MAX:
        raise bad_request(f"at most {NOTES_MAX} notes", "notes")
    for i, (name, contents) in enumerate(notes):
        if len(name) > NAME_MAX or len(contents) > NOTE_MAX:
            raise bad_request(f"a note's name is at most {NAME_MAX} characters, its contents {NOTE_MAX}",
                              f"notes[{i}]")
    p.notes = [{"name": clean_text(n), "contents": clean_text(c)} for n, c in notes]
    s.flush()
    return list(p.notes)


def set_project_archived(s: Session, by: Principal, p: Project, archived: bool) -> None:
    _may_reshape(by, p)
    if not archived and get_workspace(s, p.workspace_id).archived:
        raise conflict(f"workspace {p.workspace_id} is archived; unarchive it first")
    p.archived = archived
    s.flush()


def delete_project(s: Session, by: Principal, p: Project) -> None:
    """Only an empty project: its experiments deleted or moved first."""
    _may_reshape(by, p)
    n = s.scalar(select(func.count()).where(Experiment.project_id == p.id)) or 0
    if n:
        raise conflict(f"project {p.id} still holds {n} experiments; delete or move them first")
    s.delete(p)
    s.flush()
    log.info("event=project_deleted project_id=%s by=%s", p.id, by.username)


def move_project(s: Session, by: Principal, p: Project, dest: Workspace) -> None:
    """Who may change the project, and create projects in the destination (as Determined's
    MoveProject): an Editor of one workspace moves nothing into a workspace where they hold no role."""
    _may_reshape(by, p)
    access.require_permission(s, by, Perm.CREATE_PROJECT, workspace_id=dest.id, what=f"workspace {dest.id}")
    if dest.archived:
        raise conflict(f"workspace {dest.id} is archived; it takes no projects")
    if s.scalar(select(Project.id).where(Project.workspace_id == dest.id, Project.name == p.name)) is not None:
        raise conflict(f"workspace {dest.id} already has a project named {p.name!r}")
    p.workspace_id = dest.id
    s.flush()


@dataclass
class ProjectFilter:
    workspace_id: int = 0  # 0: every workspace
    name: str | None = None
    archived: bool | None = None
    user_ids: list[int] = field(default_factory=list)
    usernames: list[str] = field(default_factory=list)


PROJECT_SORTS = ("SORT_BY_UNSPECIFIED", "SORT_BY_CREATION_TIME", "SORT_BY_LAST_EXPERIMENT_START_TIME",
                 "SORT_BY_NAME", "SORT_BY_DESCRIPTION", "SORT_BY_ID")


def list_projects(s: Session, flt: ProjectFilter, *, sort_by: str = "SORT_BY_ID", desc: bool = False) -> list[Project]:
    q = select(Project)
    if flt.workspace_id:
        q = q.where(Project.workspace_id == flt.workspace_id)
    if flt.name:
        q = q.where(Project.name == flt.name)
    if flt.archived is not None:
        q = q.where(Project.archived == flt.archived)
    q = _owned_by(q, Project.owner_id, flt.user_ids, flt.usernames)
    last = select(func.max(Experiment.start_time)).where(Experiment.project_id == Project.id).scalar_subquery()
    col = {"SORT_BY_CREATION_TIME": Project.created_at, "SORT_BY_LAST_EXPERIMENT_START_TIME": last,
           "SORT_BY_NAME": Project.name, "SORT_BY_DESCRIPTION": Project.description}.get(sort_by, Project.id)
    return list(s.scalars(q.order_by(col.desc() if desc else col, Project.id)))


@dataclass
class ProjectCounts:
    experiments: int = 0
    active: int = 0
    last_started: datetime | None = None


def project_counts(s: Session, ids: Sequence[int]) -> dict[int, ProjectCounts]:
    out = {i: ProjectCounts() for i in ids}
    if not ids:
        return out
    for pid, state, n, last in s.execute(
        select(Experiment.project_id, Experiment.state, func.count(), func.max(Experiment.start_time))
        .where(Experiment.project_id.in_(ids)).group_by(Experiment.project_id, Experiment.state)
    ):
        c = out[pid]
        c.experiments += int(n)
        if state not in st.EXP_TERMINAL:
            c.active += int(n)
        if last is not None and (c.last_started is None or last > c.last_started):
            c.last_started = last
    return out


# -- experiments' homes ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Home:
    project: Project
    workspace: Workspace


def home(s: Session, project_id: int) -> Home:
    p = get_project(s, project_id)
    return Home(p, get_workspace(s, p.workspace_id))


def home_for_new_experiment(s: Session, project_id: int | None, field_name: str = "projectId") -> Home:
    """Where a new (or moved) experiment goes: the project asked for (Uncategorized if none), which
    must exist and, with its workspace, not be archived."""
    pid = project_id or DEFAULT_PROJECT_ID
    p = s.get(Project, pid)
    if p is None:
        raise bad_request(f"project {pid} does not exist", field_name)
    ws = get_workspace(s, p.workspace_id)
    if p.archived or ws.archived:
        what = f"project {p.id}" if p.archived else f"workspace {ws.id}"
        raise bad_request(f"{what} is archived; it takes no new experiments", field_name)
    return Home(p, ws)


def move_experiment(s: Session, by: Principal, exp: Experiment, destination_project_id: int) -> None:
    access.require_owner(by, exp)
    dest = home_for_new_experiment(s, destination_project_id, "destinationProjectId")
    access.require_permission(s, by, Perm.CREATE_EXPERIMENT, workspace_id=dest.workspace.id,
                              what=f"project {dest.project.id}")
    exp.project_id = dest.project.id
    s.flush()
    log.info("event=experiment_moved experiment_id=%s project_id=%s by=%s", exp.id, dest.project.id, by.username)


def homes(s: Session, project_ids: Sequence[int]) -> dict[int, Home]:
    """Projects and their workspaces for a page of experiments, in two queries."""
    projects = {p.id: p for p in s.scalars(select(Project).where(Project.id.in_(set(project_ids))))}
    spaces = {w.id: w for w in s.scalars(select(Workspace).where(
        Workspace.id.in_({p.workspace_id for p in projects.values()})))}
    return {pid: Home(p, spaces[p.workspace_id]) for pid, p in projects.items()}
