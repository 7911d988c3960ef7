"""Loading experiments and trials, and who may read or change them (and workspaces, projects and
templates: `require_changer`)."""

from __future__ import annotations

from sqlalchemy.orm import Session

from control_plane.auth import Principal, TokenKind
from control_plane.db.models import Experiment, Trial
from control_plane.errors import forbidden, not_found


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
    """Changing an experiment (or its trials' data) needs its owner or an admin."""
    require_owner_of(p, exp.id, exp.owner_id)


def require_owner_of(p: Principal, experiment_id: int, owner_id: int | None) -> None:
    """`require_owner` from the experiment's id and owner (hot paths read just those)."""
    require_changer(p, f"experiment {experiment_id}", owner_id)


def require_changer(p: Principal, what: str, owner_id: int | None) -> None:
    """Who may change or delete a record (an experiment, a workspace, a project, a template): its
    owner or an admin; one without an owner (the cluster's own, such as workspace 1) only an
    admin. The one owner rule, which roles per workspace will replace."""
    if p.kind is not TokenKind.USER:
        raise forbidden(f"a {p.kind.value} token cannot do this")
    if p.admin:
        return
    if owner_id is None:
        raise forbidden(f"{what} belongs to the cluster; only an admin can change it")
    if p.user_id != owner_id:
        raise forbidden(f"{what} belongs to another user")


def require_user(p: Principal) -> None:
    """Reading and creating workspaces, projects and templates: any user (Determined without RBAC)."""
    if p.kind is not TokenKind.USER:
        raise forbidden(f"a {p.kind.value} token cannot do this")


def require_trial_writer(p: Principal, trial: Trial, exp: Experiment) -> None:
    """Reports about a trial come from its own allocation, or from the experiment's owner/admin."""
    require_trial_writer_of(p, trial.id, exp.id, exp.owner_id)


def require_trial_writer_of(p: Principal, trial_id: int, experiment_id: int, owner_id: int | None) -> None:
    """`require_trial_writer` from the ids alone (hot paths read just those)."""
    if p.kind is TokenKind.ALLOCATION:
        if p.trial_id != trial_id:
            raise forbidden("this token belongs to another trial")
        return
    require_owner_of(p, experiment_id, owner_id)
