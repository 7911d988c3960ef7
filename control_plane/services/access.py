"""Loading experiments and trials, and who may read or change them (and workspaces, projects and
templates: `require_permission`). The decisions are services/authz.py's (roles, core/rbac.py)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session, object_session

from control_plane.auth import Principal, TokenKind
from control_plane.core.rbac import Perm
from control_plane.db.models import Experiment, Trial
from control_plane.errors import forbidden, not_found
from control_plane.services import authz


def get_experiment(s: Session, experiment_id: int, *, for_update: bool = False) -> Experiment:
    """With for_update, the row is locked (PostgreSQL; SQLite transactions already are) and
    re-read, so values loaded before the lock cannot be stale."""
    exp = s.get(Experiment, experiment_id, with_for_update=for_update or None, populate_existing=for_update)
    if exp is None:
        raise not_found(f"experiment {experiment_id}")
    return exp


def get_trial(s: Session, trial_id: int, *, for_update: bool = False) -> Trial:
    trial = s.get(Trial, trial_id, with_for_update=for_update or None, populate_existing=for_update)
    if trial is None:
        raise not_found(f"trial {trial_id}")
    return trial


def require_read_trial(p: Principal, trial: Trial) -> None:
    """Users may read every trial (Determined without RBAC); an allocation token only its own."""
    if p.kind is TokenKind.USER:
        return
    if p.kind is TokenKind.ALLOCATION:
        if p.trial_id != trial.id:
            raise forbidden("this token belongs to another trial")
        return
    raise forbidden(f"a {p.kind.value} token cannot do this")


def require_read_experiment(s: Session, p: Principal, exp: Experiment) -> None:
    if p.kind is TokenKind.USER:
        return
    if p.kind is TokenKind.ALLOCATION and p.trial_id is not None:
        trial = s.get(Trial, p.trial_id)
        if trial is not None and trial.experiment_id == exp.id:
            return
        raise forbidden("this token belongs to another experiment")
    raise forbidden(f"a {p.kind.value} token cannot do this")


def require_owner(p: Principal, exp: Experiment) -> None:
    """Changing an experiment (or its trials' data): its owner, an admin, or a role allowing it
    in the experiment's workspace (services/authz.py)."""
    s = object_session(exp)
    require_owner_of(p, exp.id, exp.owner_id, s=s, project_id=exp.project_id)


def require_owner_of(p: Principal, experiment_id: int, owner_id: int | None, *, s: Session | None = None,
                     project_id: int | None = None) -> None:
    """`require_owner` from the experiment's id and owner (hot paths read just those): the owner
    and admins pass with no query; anyone else is asked of their roles (with `s`)."""
    if authz.allowed_without_query(p, Perm.UPDATE_EXPERIMENT, owner_id):
        return
    if p.kind is not TokenKind.USER:
        raise forbidden(f"a {p.kind.value} token cannot do this")
    if s is None:
        raise forbidden(f"experiment {experiment_id} belongs to another user")
    if project_id is None:
        project_id = s.scalar(select(Experiment.project_id).where(Experiment.id == experiment_id))
    authz.require(s, p, Perm.UPDATE_EXPERIMENT, workspace_id=authz.workspace_of_project(s, project_id or 1),
                  what=f"experiment {experiment_id}", owner_id=owner_id)


def require_permission(s: Session, p: Principal, perm: Perm, *, workspace_id: int | None, what: str,
                       owner_id: int | None = None) -> None:
    """Who may create, change or delete a record (a workspace, a project, a template, an
    experiment): its owner, or a role allowing `perm` in its workspace (`authz.require`). A
    record without an owner (the cluster's own, such as workspace 1) only by a role."""
    authz.require(s, p, perm, workspace_id=workspace_id, what=what, owner_id=owner_id)


def require_user(p: Principal) -> None:
    """Reading workspaces, projects and templates, and creating workspaces: any user (reads are
    open, services/authz.py)."""
    if p.kind is not TokenKind.USER:
        raise forbidden(f"a {p.kind.value} token cannot do this")


def require_trial_writer(p: Principal, trial: Trial, exp: Experiment) -> None:
    """Reports about a trial come from its own allocation, or from the experiment's owner/admin."""
    if p.kind is TokenKind.ALLOCATION:
        require_trial_writer_of(p, trial.id, exp.id, exp.owner_id)
        return
    require_owner(p, exp)


def require_trial_writer_of(p: Principal, trial_id: int, experiment_id: int, owner_id: int | None,
                            s: Session | None = None) -> None:
    """`require_trial_writer` from the ids alone (hot paths read just those)."""
    if p.kind is TokenKind.ALLOCATION:
        if p.trial_id != trial_id:
            raise forbidden("this token belongs to another trial")
        return
    require_owner_of(p, experiment_id, owner_id, s=s)
