"""Tasks other than trials (issue 29): commands, notebooks and TensorBoards. Launched into a pool as one pending
allocation, which the placement loop schedules like a trial's (priority, queue, fair share; not
preempted: it cannot checkpoint), the agent runs with its runtime (process or Docker) and whose
logs, exit and kill go the allocations' ways. A task's state and exit are its allocation's.

A task belongs to a workspace (issue 30, Determined's `workspaceId`; 1, Uncategorized, by default):
launching needs CREATE_NSC there (Editor; every user is Editor of Uncategorized), killing needs its
owner or UPDATE_NSC there, and its pool must be one the workspace may use (pool_bindings). Reading a
task (list, get, logs) is open to every user, as experiments are (services/authz.py); its proxy, its
context archive and a shell's key stay its owner's and admins'.

Every function works inside the caller's transaction and raises control_plane.errors."""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from control_plane.auth import Principal, TokenKind
from control_plane.core import states as st
from control_plane.core.containers import task_container_spec
from control_plane.core.expconf import ConfigInvalid
from control_plane.core.expconf.secrets import PLACEHOLDER, redacted_left
from control_plane.core.host_access import host_parts_refusal
from control_plane.core.rbac import DEFAULT_WORKSPACE_ID, Perm
from control_plane.core.task_config import (
    READY_ON_ADDRESS,
    SERVING_KINDS,
    TASK_TYPES,
    TaskConfig,
    config_dict,
    description_of,
    parse_task_config,
)
from control_plane.db.models import Agent, Allocation, ModelDefinition, Task, User, Workspace
from control_plane.errors import FieldProblem, Invalid, bad_request, forbidden, not_found, unauthenticated
from control_plane.master import Master
from control_plane.services import (
    allocations,
    authz,
    lifecycle,
    pool_bindings,
    pool_capacity,
    shells,
    tensorboards,
)
from shipyard_common.agent_protocol import TaskSpec
from shipyard_common.model_def import ModelDefInvalid, pack_model_definition, validate_model_definition

log = logging.getLogger("shipyard.tasks")
# What a TensorBoard task reads (harness/tensorboard/serve.py): a JSON list of its trials' sources.
TENSORBOARD_SOURCES_ENV = "SHIPYARD_TENSORBOARD_SOURCES"

_LAUNCHER = Path(__file__).resolve().parents[2] / "shipyard_common" / "jupyter_launch.py"


@dataclass(frozen=True)
class TaskView:
    task: Task
    alloc: Allocation
    username: str

    @property
    def ready(self) -> bool:
        """Serving: a notebook or TensorBoard once it reported its address, a command once running."""
        if self.alloc.state != st.AllocationState.RUNNING:
            return False
        return self.task.kind not in READY_ON_ADDRESS or self.task.proxy_address is not None


def _problems(e: ConfigInvalid) -> Invalid:
    details = [FieldProblem(f"config.{fe.path}" if fe.path else "config", fe.reason) for fe in e.errors]
    return Invalid("invalid task configuration: " + "; ".join(f"{d.field}: {d.reason}" for d in details), details)


def _context(s: Session, master: Master, files: Sequence[dict[str, Any]]) -> int | None:
    """The uploaded context (`-c DIR`, Determined's file list) as an archive row, or None."""
    if not files:
        return None
    try:
        checked = validate_model_definition(list(files), max_bytes=master.config.model_def_max_bytes)
        archive = pack_model_definition(checked)
    except ModelDefInvalid as e:
        raise Invalid(f"files: {e.path}: {e.reason}", [FieldProblem(f"files.{e.path}", e.reason)]) from None
    md = ModelDefinition(archive=archive, size_bytes=len(archive), sha256=hashlib.sha256(archive).hexdigest(),
                         file_count=len(checked))
    s.add(md)
    s.flush()
    return md.id


def _workspace(s: Session, p: Principal, workspace_id: int | None) -> Workspace:
    """The workspace a new task goes to (0 or None: Uncategorized), if the caller may create there."""
    ws = s.get(Workspace, workspace_id or DEFAULT_WORKSPACE_ID)
    if ws is None:
        raise bad_request(f"workspace {workspace_id} does not exist", "workspaceId")
    authz.require(s, p, Perm.CREATE_NSC, workspace_id=ws.id, what=f"workspace {ws.id}")
    if ws.archived:
        raise bad_request(f"workspace {ws.id} is archived; it takes no new tasks", "workspaceId")
    return ws


def _default_pool(master: Master, ws: Workspace, slots: int) -> str:
    """Determined's ResolveResourcePool for a task that names no pool: its workspace's default aux
    pool for 0 slots, its default compute pool otherwise, else the cluster's default."""
    own = ws.default_aux_pool if slots == 0 else ws.default_compute_pool
    return own or master.config.default_resource_pool


def launch(s: Session, master: Master, p: Principal, kind: str, raw_config: Any,
           files: Sequence[dict[str, Any]] = (), workspace_id: int | None = None) -> TaskView:
    """Store the task and its pending allocation (one transaction); placement does the rest."""
    if p.kind is not TokenKind.USER or p.user_id is None:
        raise forbidden(f"a {p.kind.value} token cannot launch tasks")
    ws = _workspace(s, p, workspace_id)
    try:
        cfg = parse_task_config(kind, raw_config, default_pool="")
    except ConfigInvalid as e:
        raise _problems(e) from None
    if not cfg.resources.resource_pool:
        resources = cfg.resources.model_copy(update={"resource_pool": _default_pool(master, ws, cfg.resources.slots)})
        cfg = cfg.model_copy(update={"resources": resources})
    pool = master.config.pool(cfg.resources.resource_pool)
    if pool is None:
        names = [x.name for x in master.config.resource_pools]
        raise bad_request(f"no resource pool named {cfg.resources.resource_pool!r}; pools are {names}",
                          "config.resources.resource_pool")
    pool_bindings.require_usable(s, pool.name, ws.id, "config.resources.resource_pool")
    if cfg.resources.slots:
        unservable = pool_capacity.unservable_reason(s, master, pool.name, cfg.resources.slots)
        if unservable is not None:
            raise bad_request(unservable, "config.resources.slots")
    if not master.config.allow_task_host_access:
        refusal = host_parts_refusal(cfg.bind_mounts, cfg.resources.devices, cfg.environment.add_capabilities)
        if refusal is not None:
            raise bad_request(refusal.reason, refusal.field)
    if (left := redacted_left(config_dict(cfg))) is not None:  # a config shown back and sent again
        raise bad_request(PLACEHOLDER, f"config.{left}")
    task_id = str(uuid.uuid4())
    now = master.clock()
    cfg = cfg.model_copy(update={"description": description_of(kind, cfg, task_id)})
    task = Task(id=task_id, kind=kind, owner_id=p.user_id, description=cfg.description or "",
                config=config_dict(cfg), pool=pool.name, workspace_id=ws.id, context_id=_context(s, master, files), created_at=now)
    s.add(task)
    default_priority = pool.scheduler.default_priority
    alloc = Allocation(id=f"{task_id}.1", task_id=task_id, pool=pool.name, slots_needed=cfg.resources.slots,
                       priority=cfg.resources.priority or default_priority, weight=cfg.resources.weight,
                       state=st.AllocationState.PENDING, run_id=1, created_at=now)
    s.add(alloc)
    log.info("event=task_launched task_id=%s kind=%s pool=%s slots=%s workspace_id=%s", task_id, kind, pool.name,
             alloc.slots_needed, ws.id)
    master.notify(s)
    return TaskView(task, alloc, p.username or "")


def _view(s: Session, task: Task) -> TaskView:
    alloc = s.scalars(select(Allocation).where(Allocation.task_id == task.id).order_by(Allocation.run_id.desc())).first()
    if alloc is None:
        raise not_found(f"task {task.id} has no allocation")
    user = s.get(User, task.owner_id)
    return TaskView(task, alloc, user.username if user else "")


def get(s: Session, p: Principal, task_id: str, kind: str | None = None) -> TaskView:
    """The task, for any user (reads are open) or its own allocation's token."""
    task = s.get(Task, task_id)
    if task is None or (kind is not None and task.kind != kind) or not _may_read(p, task):
        raise not_found(f"{kind or 'task'} {task_id}")
    return _view(s, task)


def _own_allocation(p: Principal, task: Task) -> bool:
    return p.kind is TokenKind.ALLOCATION and p.allocation_id is not None and p.allocation_id.startswith(task.id + ".")


def _may_read(p: Principal, task: Task) -> bool:
    return p.kind is TokenKind.USER or _own_allocation(p, task)


def _may_use(p: Principal, task: Task) -> bool:
    """Its proxy and its context archive: its owner, an admin, or its own allocation."""
    return _own_allocation(p, task) or (p.kind is TokenKind.USER and (p.admin or p.user_id == task.owner_id))


def list_tasks(s: Session, p: Principal, kind: str, usernames: Sequence[str] = (), *,
               workspace_id: int | None = None, everyone: bool = False) -> list[TaskView]:
    """Tasks of `kind`: every user's with `everyone` (the API: reads are open), else the caller's own
    (an admin's: everyone's; the web page's list); optionally of the named users or one workspace."""
    q = select(Task).where(Task.kind == kind).order_by(Task.created_at)
    if not (everyone or p.admin):
        q = q.where(Task.owner_id == p.user_id)
    if workspace_id:
        q = q.where(Task.workspace_id == workspace_id)
    if usernames:
        q = q.join(User, User.id == Task.owner_id).where(User.username.in_(list(usernames)))
    return [_view(s, t) for t in s.scalars(q)]


def kill(s: Session, master: Master, p: Principal, task_id: str, kind: str | None = None) -> TaskView:
    """A queued task ends now; a placed one is killed by its agent (its exit ends it). Its owner, or a
    role allowing UPDATE_NSC in its workspace."""
    view = get(s, p, task_id, kind)
    authz.require(s, p, Perm.UPDATE_NSC, workspace_id=view.task.workspace_id, what=f"{view.task.kind} {task_id}",
                  owner_id=view.task.owner_id)
    alloc = view.alloc
    if alloc.state == st.AllocationState.PENDING:
        allocations.end_allocation(s, master, alloc, cause=st.ExitCause.KILLED, reason="killed before it started",
                                   exit_code=None)
    elif alloc.state in st.ALLOC_ON_AGENT and not alloc.kill_requested:
        alloc.kill_requested = True
        log.info("event=kill_requested allocation_id=%s reason=%r", alloc.id, "task killed by its user")
        master.notify(s)
    return view


def set_priority(s: Session, master: Master, p: Principal, task_id: str, kind: str, priority: int) -> TaskView:
    """Determined's SetCommandPriority (and the notebook's, shell's, TensorBoard's): the priority of a
    task that is queued or running (1–99, lower first) orders it against the pool's other jobs; a task
    is never preempted, so a running one keeps running. Who may kill it may change it (UPDATE_NSC)."""
    view = get(s, p, task_id, kind)
    authz.require(s, p, Perm.UPDATE_NSC, workspace_id=view.task.workspace_id, what=f"{view.task.kind} {task_id}",
                  owner_id=view.task.owner_id)
    if not 1 <= priority <= 99:
        raise bad_request("must be between 1 and 99 (lower runs first)", "priority")
    if view.alloc.state not in st.ALLOC_LIVE:
        raise bad_request(f"{view.task.kind} {task_id} has ended", "priority")
    cfg = config_of(view.task)
    view.task.config = config_dict(cfg.model_copy(update={"resources": cfg.resources.model_copy(update={"priority": priority})}))
    view.alloc.priority = priority
    log.info("event=task_priority_set task_id=%s priority=%d", task_id, priority)
    master.notify(s)
    return view


def set_proxy_address(s: Session, p: Principal, allocation_id: str, address: str) -> None:
    """The task says where it serves (host:port): only its own allocation may."""
    if p.kind is not TokenKind.ALLOCATION or p.allocation_id != allocation_id:
        raise forbidden("only the task's own allocation token can set its address")
    alloc = s.get(Allocation, allocation_id)
    task = s.get(Task, alloc.task_id) if alloc is not None else None
    if alloc is None or task is None:
        raise not_found(f"allocation {allocation_id}")
    if task.kind not in READY_ON_ADDRESS:
        raise bad_request(f"a {task.kind} serves nothing through the master's proxy", "proxyAddress")
    user, at, hostport = address.rpartition("@")
    host, _, port = hostport.rpartition(":")
    shell = task.kind == shells.KIND
    if not host or not port.isdigit() or not 0 < int(port) < 65536 or shell != bool(at and user):
        raise bad_request("must be user@host:port" if shell else "must be host:port", "proxyAddress")
    # Only the agent running it: the master relays to this address (a shell's as raw TCP), so
    # anywhere else would let a task aim the master at the cloud's metadata service or its database.
    agent = s.get(Agent, alloc.agent_id) if alloc.agent_id else None
    if agent is None or host not in (agent.addresses or []):
        raise bad_request(f"must be an address of the agent running the task ({', '.join(agent.addresses or []) if agent else 'none'})",
                          "proxyAddress")
    # Once: the launcher reports where it listens before any user code can run there; code the
    # user runs later (a notebook cell, a shell session holds the token too) cannot point the
    # master's proxy, or a shell's tunnel, at another host.
    if task.proxy_address is not None and task.proxy_address != address:
        raise bad_request(f"task {task.id} already serves at its reported address; it cannot move", "proxyAddress")
    task.proxy_address = address
    log.info("event=task_address task_id=%s address=%s", task.id, address)


def context_archive(s: Session, p: Principal, task_id: str) -> bytes:
    task = s.get(Task, task_id)
    if task is None or not _may_use(p, task) or task.context_id is None:
        raise not_found(f"context of task {task_id}")
    md = s.get(ModelDefinition, task.context_id)
    assert md is not None
    return md.archive


# Proxy traffic refreshes a task's last activity at most this often (one write, not one per request).
ACTIVITY_RESOLUTION = timedelta(seconds=10)


def proxy_target(s: Session, p: Principal, task_id: str, now: datetime, *,
                 by_cookie: bool = False) -> tuple[str, bool]:
    """Where /proxy/<task id>/ forwards (host:port) for its owner or an admin, and whether its last
    activity is older than ACTIVITY_RESOLUTION (the caller then records this use: `touch`).

    A browser's session (`by_cookie`) reaches its own user's tasks only, an admin's too: a task's
    pages run on the master's origin, so a page another user's task serves would act with the
    admin's session there (read the web UI's forms, call /proxy/ of every notebook, which the master
    opens with each one's Jupyter token). An admin reaches another user's task with a token in the
    Authorization header (the API, a script), which no page can make a browser send."""
    task = s.get(Task, task_id)
    if task is None or p.kind is not TokenKind.USER or not _may_use(p, task) or (by_cookie and p.user_id != task.owner_id):
        raise not_found(f"task {task_id}")
    address, state = _serving_address(s, task)
    if address is None:
        raise not_found(f"task {task_id} is not serving ({state})")
    return address, task.last_activity_at is None or now - task.last_activity_at >= ACTIVITY_RESOLUTION


def config_of(task: Task) -> TaskConfig:
    """The task's config as launched (stored as `config_dict` of its typed TaskConfig)."""
    return TaskConfig.model_validate(task.config)


def shell_target(s: Session, task_id: str) -> str:
    """A running shell's sshd (`user@host:port`) for a tunnel without a session (the master's
    shell_tunnel_auth: ssh_key): sshd, not the master, decides who gets in, by the owner's key."""
    task = s.get(Task, task_id)
    address = _serving_address(s, task)[0] if task is not None and task.kind == "shell" else None
    if address is None:
        raise unauthenticated()  # no session: nothing said of which tasks or shells exist
    return address


def _serving_address(s: Session, task: Task) -> tuple[str | None, str | None]:
    """(where the task serves, or None unless its latest allocation runs and it reported an address;
    that allocation's state)."""
    state = s.scalar(select(Allocation.state).where(Allocation.task_id == task.id)
                     .order_by(Allocation.run_id.desc()).limit(1))
    return (task.proxy_address if state == st.AllocationState.RUNNING else None), state


def touch(s: Session, task_id: str, now: datetime) -> None:
    task = s.get(Task, task_id)
    if task is not None and (task.last_activity_at is None or task.last_activity_at < now):
        task.last_activity_at = now


def jupyter_token(master: Master, task_id: str) -> str:
    """The token Jupyter requires (the master adds it to proxied requests; never given out)."""
    return master.derived_token(f"jupyter:{task_id}")


def task_spec(s: Session, master: Master, alloc: Allocation, agent: Agent, slot_ids: list[str],
              device: str) -> TaskSpec:
    """What the agent runs for a command or a notebook: its entrypoint, the environment Determined
    gives tasks (DET_MASTER, DET_SESSION_TOKEN, DET_TASK_ID, ...) and its context archive."""
    task = s.get(Task, alloc.task_id)
    if task is None:
        raise not_found(f"task {alloc.task_id}")
    cfg = config_of(task)
    token = allocations.ensure_allocation_token(s, master, alloc)
    owner = s.get(User, task.owner_id)
    env = cfg.environment.environment_variables.as_dict(device)
    env.update({"DET_MASTER": master.config.advertised_url, "DET_CLUSTER_ID": master.cluster_id,
                "DET_TASK_ID": task.id, "DET_ALLOCATION_ID": alloc.id, "DET_SESSION_TOKEN": token,
                "DET_TASK_TYPE": TASK_TYPES.get(task.kind, "GENERIC"), "DET_USER": owner.username if owner else "",
                "DET_RESOURCES_ID": agent.id})
    read_only: list[str] = []
    if task.kind == "notebook":
        argv: list[str] | str = ["python3", "-c", _LAUNCHER.read_text()]
        env.update({"SHIPYARD_PROXY_BASE": f"/proxy/{task.id}/", "JUPYTER_TOKEN": jupyter_token(master, task.id)})
    elif task.kind == "tensorboard":  # the harness's launcher (the agent puts it on PYTHONPATH)
        argv = ["python3", "-m", "harness.tensorboard.serve"]
        sources = tensorboards.sources(s, master.cluster_id, cfg.trial_ids, task.owner_id)
        read_only = tensorboards.shared_fs_paths(sources)
        env.update({"SHIPYARD_PROXY_BASE": f"/proxy/{task.id}/", "SHIPYARD_TASK_TOKEN": jupyter_token(master, task.id),
                    TENSORBOARD_SOURCES_ENV: json.dumps(sources)})
    elif task.kind == shells.KIND:
        argv, shell_env = shells.launch_spec(master, task.id)
        env.update(shell_env)
    else:
        argv = cfg.entrypoint if isinstance(cfg.entrypoint, str) else list(cfg.entrypoint or [])
    return TaskSpec(allocation_id=alloc.id, task_id=task.id, run_id=alloc.run_id, entrypoint=argv, env=env,
                    slot_ids=slot_ids, token=token,
                    model_definition_path=f"/api/v1/tasks/{task.id}/context" if task.context_id else None,
                    kill_grace_seconds=master.config.task_kill_grace_s, user_id=task.owner_id,
                    container=task_container_spec(cfg, device, read_only))


@dataclass(frozen=True)
class IdleCandidate:
    task_id: str
    kind: str
    address: str
    timeout_s: float
    ready_at: datetime
    proxy_at: datetime | None


def idle_candidates(s: Session, master: Master) -> list[IdleCandidate]:
    """Serving notebooks and TensorBoards with an idle timeout (their config's idle_timeout, else the
    master's notebook_idle_timeout_s or tensorboard_timeout_s)."""
    out = []
    rows = s.execute(select(Task, Allocation).join(Allocation, Allocation.task_id == Task.id).where(
        Task.kind.in_(SERVING_KINDS), Task.proxy_address.is_not(None), Allocation.state == st.AllocationState.RUNNING,
        Allocation.kill_requested.is_(False)))
    for task, alloc in rows:
        own = config_of(task).idle_timeout_s
        default = (master.config.tensorboard_timeout_s if task.kind == "tensorboard"
                   else master.config.notebook_idle_timeout_s)
        timeout = own or default
        if timeout and task.proxy_address:
            out.append(IdleCandidate(task.id, task.kind, task.proxy_address, float(timeout),
                                     alloc.started_at or alloc.assigned_at or alloc.created_at, task.last_activity_at))
    return out


def stop_idle(s: Session, master: Master, task_id: str, reason: str) -> None:
    """Stop a notebook or TensorBoard found idle, with a line in its logs saying why."""
    alloc = s.scalars(select(Allocation).where(Allocation.task_id == task_id,
                                               Allocation.state == st.AllocationState.RUNNING)).first()
    if alloc is None or alloc.kill_requested:
        return
    alloc.kill_requested = True
    lifecycle.master_line(s, master, alloc, reason, level="INFO")
    log.info("event=task_idle_stop task_id=%s reason=%r", task_id, reason)
    master.notify(s)

