"""The record. Everything the master knows survives in these tables; a master killed at any
instant restarts from them alone."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

from control_plane.core.states import AgentState, CheckpointState, PoolState


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware datetimes on both SQLite (which drops tzinfo) and PostgreSQL."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime stored")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: JSON(), list[Any]: JSON()}


class ClusterInfo(Base):
    __tablename__ = "cluster_info"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class User(Base):
    __tablename__ = "users"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    username: Mapped[str] = mapped_column(String(128), unique=True)
    password_hash: Mapped[str] = mapped_column(String(255))
    admin: Mapped[bool] = mapped_column(Boolean, default=False)
    active: Mapped[bool] = mapped_column(Boolean, default=True)
    display_name: Mapped[str | None] = mapped_column(String(255), nullable=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    modified_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_auth_at: Mapped[datetime | None] = mapped_column(nullable=True)


LIVE_AGENT_CREDENTIAL = "kind = 'agent_credential' AND revoked_at IS NULL"


class Token(Base):
    """Bearer tokens. Only a hash is stored. `kind` scopes what the token can touch:
    user (as its user), agent (one pool), allocation (one trial/allocation), bootstrap (one
    instance launch in one pool, short-lived)."""

    __tablename__ = "tokens"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    kind: Mapped[str] = mapped_column(String(16))
    user_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), nullable=True)
    pool: Mapped[str | None] = mapped_column(String(64), nullable=True)
    agent_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    allocation_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    trial_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    launch_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column(nullable=True)
    revoked_at: Mapped[datetime | None] = mapped_column(nullable=True)

    # One live credential per agent id: two enrolments racing for a new id cannot both win
    # (services/agents.py answers the loser 409). Migration 0002.
    __table_args__ = (
        Index("uq_tokens_live_agent_credential", "agent_id", unique=True,
              sqlite_where=text(LIVE_AGENT_CREDENTIAL), postgresql_where=text(LIVE_AGENT_CREDENTIAL)),
    )


class ModelDefinition(Base):
    __tablename__ = "model_definitions"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    archive: Mapped[bytes] = mapped_column(LargeBinary)  # tar.gz
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    file_count: Mapped[int] = mapped_column(Integer)


class Experiment(Base):
    __tablename__ = "experiments"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(255))
    description: Mapped[str] = mapped_column(Text, default="")
    notes: Mapped[str] = mapped_column(Text, default="")
    labels: Mapped[list[Any]] = mapped_column(default=list)
    config: Mapped[dict[str, Any]] = mapped_column()  # fully defaulted
    original_config: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(32), index=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    archived: Mapped[bool] = mapped_column(Boolean, default=False)
    model_definition_id: Mapped[int] = mapped_column(ForeignKey("model_definitions.id"))
    # Its project (migration 0016; 1 is Uncategorized). No foreign key: SQLite cannot add one to an
    # existing table in place; services/workspaces.py checks the project exists and keeps a
    # project with experiments from deletion.
    project_id: Mapped[int] = mapped_column(Integer, default=1, server_default="1", index=True)
    parent_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    resource_pool: Mapped[str] = mapped_column(String(64))
    priority: Mapped[int | None] = mapped_column(Integer, nullable=True)
    weight: Mapped[float] = mapped_column(Float, default=1.0)
    job_id: Mapped[str] = mapped_column(String(64), unique=True)
    queue_position: Mapped[float | None] = mapped_column(Float, nullable=True)
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    searcher_state: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    searcher_event_seq: Mapped[int] = mapped_column(Integer, default=0)
    warnings: Mapped[list[Any]] = mapped_column(default=list)
    start_time: Mapped[datetime] = mapped_column(default=utcnow)
    end_time: Mapped[datetime | None] = mapped_column(nullable=True)


class Trial(Base):
    __tablename__ = "trials"
    __table_args__ = (UniqueConstraint("experiment_id", "request_id"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"), index=True)
    request_id: Mapped[str] = mapped_column(String(64))
    hparams: Mapped[dict[str, Any]] = mapped_column()
    seed: Mapped[int] = mapped_column(BigInteger)
    state: Mapped[str] = mapped_column(String(32), index=True)
    restarts: Mapped[int] = mapped_column(Integer, default=0)
    run_id: Mapped[int] = mapped_column(Integer, default=0)
    task_id: Mapped[str] = mapped_column(String(64), unique=True)
    searcher_target_length: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    searcher_closed: Mapped[bool] = mapped_column(Boolean, default=False)
    # The op length whose validation has been fed to the searcher (None: none yet).
    searcher_completed_length: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    rung: Mapped[int] = mapped_column(Integer, default=0)
    steps_completed: Mapped[int] = mapped_column(BigInteger, default=0)
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    best_validation: Mapped[float | None] = mapped_column(Float, nullable=True)
    latest_validation: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    latest_checkpoint_uuid: Mapped[str | None] = mapped_column(String(64), nullable=True)
    exit_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    start_time: Mapped[datetime] = mapped_column(default=utcnow)
    end_time: Mapped[datetime | None] = mapped_column(nullable=True)


class Metric(Base):
    """One report of a group of metrics for a trial at a step. (trial, group, step) is unique:
    a retried report is idempotent and a later run's report of the same step replaces it."""

    __tablename__ = "metrics"
    __table_args__ = (UniqueConstraint("trial_id", "group_name", "steps_completed"),)
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id", ondelete="CASCADE"))
    group_name: Mapped[str] = mapped_column(String(64))
    steps_completed: Mapped[int] = mapped_column(BigInteger)
    trial_run_id: Mapped[int] = mapped_column(Integer, default=0)
    metrics: Mapped[dict[str, Any]] = mapped_column()
    report_time: Mapped[datetime] = mapped_column(default=utcnow)


class TaskLog(Base):
    __tablename__ = "task_logs"
    __table_args__ = (Index("ix_task_logs_task_id_id", "task_id", "id"),)
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    task_id: Mapped[str] = mapped_column(String(64))
    allocation_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    agent_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    rank: Mapped[int | None] = mapped_column(Integer, nullable=True)
    timestamp: Mapped[datetime] = mapped_column(default=utcnow)
    level: Mapped[str] = mapped_column(String(16), default="INFO")
    stdtype: Mapped[str] = mapped_column(String(16), default="stdout")
    source: Mapped[str] = mapped_column(String(32), default="task")
    log: Mapped[str] = mapped_column(Text)


class MasterLog(Base):
    """The master's own log lines, from every process (leader and API workers), for `det master
    logs`; the newest `master_log_retention` kept (services/master_logs.py)."""

    __tablename__ = "master_logs"
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    timestamp: Mapped[datetime] = mapped_column(default=utcnow)
    level: Mapped[str] = mapped_column(String(16))
    process: Mapped[str] = mapped_column(String(32))
    message: Mapped[str] = mapped_column(Text)


class ClusterMessage(Base):
    """Determined's cluster-wide message (`det master cluster-message`): the newest row that has not
    ended is the cluster's (services/cluster_messages.py); older rows are its history."""

    __tablename__ = "cluster_messages"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    created_by: Mapped[int] = mapped_column(ForeignKey("users.id"))
    message: Mapped[str] = mapped_column(Text)
    start_time: Mapped[datetime] = mapped_column()
    end_time: Mapped[datetime | None] = mapped_column(nullable=True)
    created_time: Mapped[datetime] = mapped_column(default=utcnow, index=True)


class Checkpoint(Base):
    __tablename__ = "checkpoints"
    uuid: Mapped[str] = mapped_column(String(64), primary_key=True)
    trial_id: Mapped[int | None] = mapped_column(ForeignKey("trials.id", ondelete="SET NULL"), nullable=True, index=True)
    experiment_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)
    task_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    allocation_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    state: Mapped[str] = mapped_column(String(32), default=CheckpointState.COMPLETED)  # a CheckpointState
    report_time: Mapped[datetime] = mapped_column(default=utcnow)
    steps_completed: Mapped[int] = mapped_column(BigInteger, default=0)
    resources: Mapped[dict[str, Any]] = mapped_column(default=dict)  # relative path -> size
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", JSON, default=dict)
    storage: Mapped[dict[str, Any]] = mapped_column(default=dict)  # the checkpoint_storage used
    size_bytes: Mapped[int] = mapped_column(BigInteger, default=0)


class ResourcePool(Base):
    __tablename__ = "resource_pools"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    description: Mapped[str] = mapped_column(Text, default="")
    provider_type: Mapped[str | None] = mapped_column(String(16), nullable=True)
    config: Mapped[dict[str, Any]] = mapped_column(default=dict)
    state: Mapped[str] = mapped_column(String(32), default=PoolState.OK)  # a PoolState
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    backoff_until: Mapped[datetime | None] = mapped_column(nullable=True)
    launch_failures: Mapped[int] = mapped_column(Integer, default=0)
    last_decision: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    last_decision_at: Mapped[datetime | None] = mapped_column(nullable=True)


class Agent(Base):
    __tablename__ = "agents"
    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    pool: Mapped[str] = mapped_column(String(64), index=True)
    state: Mapped[str] = mapped_column(String(32), default=AgentState.CONNECTED)  # an AgentState
    slots: Mapped[list[Any]] = mapped_column(default=list)  # [{id, type, uuid, brand, memoryMb}]
    session_id: Mapped[str] = mapped_column(String(64))
    instance_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    addresses: Mapped[list[Any]] = mapped_column(default=list)
    version: Mapped[str] = mapped_column(String(64), default="")
    registered_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_seen: Mapped[datetime] = mapped_column(default=utcnow)
    disconnected_at: Mapped[datetime | None] = mapped_column(nullable=True)
    idle_since: Mapped[datetime | None] = mapped_column(nullable=True)
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    # Set by `det agent disable --drain` (with enabled False): its work may finish, and what still
    # runs after `agent_drain_timeout_s` is preempted. NULL when not draining. Migration 0004.
    drain_started_at: Mapped[datetime | None] = mapped_column(nullable=True)
    # The cloud's interruption notice the agent reported (spot warning, GCE preemption; migration
    # 0012): when, its action (terminate/stop/hibernate/preempt, or rebalance: a hint) and deadline.
    interruption_at: Mapped[datetime | None] = mapped_column(nullable=True)
    interruption_action: Mapped[str | None] = mapped_column(String(16), nullable=True)
    interruption_deadline: Mapped[datetime | None] = mapped_column(nullable=True)


class Allocation(Base):
    """A request for `slots_needed` slots for a task, placed whole: on one agent, or across whole
    agents (`placement`)."""

    __tablename__ = "allocations"
    # The autoscaler reads a pool's recent arrivals every tick (scale-down hysteresis). Migration 0003.
    __table_args__ = (Index("ix_allocations_pool_created_at", "pool", "created_at"),)
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    task_id: Mapped[str] = mapped_column(String(64), index=True)
    trial_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)
    experiment_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    pool: Mapped[str] = mapped_column(String(64), index=True)
    slots_needed: Mapped[int] = mapped_column(Integer)
    priority: Mapped[int] = mapped_column(Integer, default=42)
    weight: Mapped[float] = mapped_column(Float, default=1.0)
    # pending → assigned → pulling → starting → running → terminating → terminated
    state: Mapped[str] = mapped_column(String(32), index=True)
    agent_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    slot_ids: Mapped[list[Any]] = mapped_column(default=list)
    run_id: Mapped[int] = mapped_column(Integer, default=0)
    # The checkpoint this run resumed from: never garbage-collected.
    restored_checkpoint_uuid: Mapped[str | None] = mapped_column(String(64), nullable=True)
    kill_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    preempt_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    # When the graceful stop was asked: the preemption grace runs from here (migration 0006).
    preempt_requested_at: Mapped[datetime | None] = mapped_column(nullable=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    assigned_at: Mapped[datetime | None] = mapped_column(nullable=True)
    started_at: Mapped[datetime | None] = mapped_column(nullable=True)
    ended_at: Mapped[datetime | None] = mapped_column(nullable=True)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    exit_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    # Why it ended, for restart accounting: "exited" (the process's own doing) or an
    # infrastructure cause ("agent_lost", "preempted", "killed", "instance_terminated").
    end_cause: Mapped[str | None] = mapped_column(String(32), nullable=True)
    # A gang across agents: every part, the chief first ([{"agent": id, "slots": [...]}]); `agent_id`
    # and `slot_ids` are the chief's. NULL on one agent. Migration 0005.
    placement: Mapped[list[Any] | None] = mapped_column(JSON(none_as_null=True), nullable=True)
    # Why a pending allocation waits (the scheduler's latest word); NULL once placed. Migration 0005.
    waiting_reason: Mapped[str | None] = mapped_column(Text, nullable=True)


class Instance(Base):
    """A cloud/local instance the master launched. The row is written before the launch call,
    keyed by `launch_id`, so a crash between launch and record is healed from cloud tags."""

    __tablename__ = "instances"
    launch_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    pool: Mapped[str] = mapped_column(String(64), index=True)
    provider: Mapped[str] = mapped_column(String(16))
    instance_id: Mapped[str | None] = mapped_column(String(128), nullable=True, unique=True)
    # requested → starting → running → stopping → terminated (running → parking → parked → starting: warm pool)
    state: Mapped[str] = mapped_column(String(32), index=True)
    location: Mapped[str] = mapped_column(String(128), default="")
    instance_type: Mapped[str] = mapped_column(String(64), default="")
    # spot | on-demand: planned by the decision, then as launched ("" before migration 0014).
    capacity: Mapped[str] = mapped_column(String(16), default="", server_default="")
    private_ip: Mapped[str | None] = mapped_column(String(64), nullable=True)
    agent_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    requested_at: Mapped[datetime] = mapped_column(default=utcnow)
    launched_at: Mapped[datetime | None] = mapped_column(nullable=True)
    terminate_requested_at: Mapped[datetime | None] = mapped_column(nullable=True)
    terminated_at: Mapped[datetime | None] = mapped_column(nullable=True)
    terminate_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    # The warm pool: when it was last parked (stopped, disks kept), last started again from there,
    # and when its agent first registered after that start (migration 0023).
    parked_at: Mapped[datetime | None] = mapped_column(nullable=True)
    resumed_at: Mapped[datetime | None] = mapped_column(nullable=True)
    resume_connected_at: Mapped[datetime | None] = mapped_column(nullable=True)


class Model(Base):
    __tablename__ = "models"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(255), unique=True)
    description: Mapped[str] = mapped_column(Text, default="")
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", JSON, default=dict)
    labels: Mapped[list[Any]] = mapped_column(default=list)
    notes: Mapped[str] = mapped_column(Text, default="")
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    archived: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    modified_at: Mapped[datetime] = mapped_column(default=utcnow)


class ModelVersion(Base):
    __tablename__ = "model_versions"
    __table_args__ = (UniqueConstraint("model_id", "version"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"))
    version: Mapped[int] = mapped_column(Integer)
    checkpoint_uuid: Mapped[str] = mapped_column(ForeignKey("checkpoints.uuid"))
    name: Mapped[str] = mapped_column(String(255), default="")
    comment: Mapped[str] = mapped_column(Text, default="")
    notes: Mapped[str] = mapped_column(Text, default="")
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", JSON, default=dict)
    labels: Mapped[list[Any]] = mapped_column(default=list)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class LeaderLease(Base):
    """Which master process runs the control loops (core/lease.py, services/leadership.py). One
    row per lease name; `token` is the fencing token, one more at every change of holder."""

    __tablename__ = "leader_lease"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str] = mapped_column(String(64))
    token: Mapped[int] = mapped_column(BigInteger)
    expires_at: Mapped[datetime]
    acquired_at: Mapped[datetime]
    renewed_at: Mapped[datetime]
    # Where the leader runs (host, pid, URL): what `GET /api/v1/master` and /metrics show.
    address: Mapped[str] = mapped_column(String(255), default="")
    # The holder held its liveness lock at its last renewal (core/lease.py).
    holder_locked: Mapped[bool] = mapped_column(Boolean, default=True)


class LoginFailure(Base):
    """A failed (or not yet verified) login: which username, from which address, for the login
    throttle (auth.LoginThrottle), which counts them per (address, username) and per address. In
    the database so that every master process counts the same failures. Rows older than the
    throttle's window are deleted as attempts come in."""

    __tablename__ = "login_failures"
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    address: Mapped[str] = mapped_column(String(255))  # "" when the client's address is unknown
    username: Mapped[str] = mapped_column(String(128))
    at: Mapped[float] = mapped_column(Float)  # seconds since the epoch

    __table_args__ = (Index("ix_login_failures_address", "address", "username", "at"),
                      Index("ix_login_failures_at", "at"))


class WakeSignal(Base):
    """SQLite only: a change other master processes should wake up for bumps `seq` in its own
    transaction; each process polls the row (db/wakebus.py). PostgreSQL uses NOTIFY instead."""

    __tablename__ = "wake_signal"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger, default=0)


class QuotaLease(Base):
    """A share of a counter every master process counts together (db/quotas.py): one open
    log search of a caller, or the bytes of a large request body being held. Each lease expires
    unless the process holding it renews it, so the shares of a process that died come back on
    their own."""

    __tablename__ = "quota_leases"
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    key: Mapped[str] = mapped_column(String(255))  # what is counted: "log_search:user:5", "body:<host>:all"
    amount: Mapped[int] = mapped_column(BigInteger)
    holder: Mapped[str] = mapped_column(String(128))  # the process: "<host>:<pid>:<random>"
    expires_at: Mapped[float] = mapped_column(Float)  # seconds since the epoch

    __table_args__ = (Index("ix_quota_leases_key", "key", "expires_at"), Index("ix_quota_leases_expires", "expires_at"))


class ScalingEvent(Base):
    """One autoscaler decision that changed something (a launch with its types and capacities,
    terminations with their reasons and causes, consolidation moves), or a run of steady ticks
    collapsed into one row (`ticks` of them, `at` to `until`). Written by the leader's autoscaler,
    read by every API worker (services/scaling_history.py), pruned by age and count. Migration 0015."""

    __tablename__ = "scaling_events"
    __table_args__ = (Index("ix_scaling_events_pool_id", "pool", "id"),)
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    pool: Mapped[str] = mapped_column(String(64))
    at: Mapped[datetime] = mapped_column()
    until: Mapped[datetime] = mapped_column()
    kind: Mapped[str] = mapped_column(String(16))  # launch | terminate | scale | consolidate | steady
    launch: Mapped[int] = mapped_column(Integer, default=0)
    terminate: Mapped[int] = mapped_column(Integer, default=0)
    ticks: Mapped[int] = mapped_column(Integer, default=1)
    detail: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class ConsolidationMove(Base):
    """One allocation moved off an instance by consolidation (loops/autoscaler/consolidate.py):
    asked to checkpoint and stop so that it resumes on another instance, and its instance emptied
    and terminated. The pool's disruption budget counts these rows; `det resource-pool describe` and
    the web UI show the recent ones. Migration 0013."""

    __tablename__ = "consolidation_moves"
    __table_args__ = (Index("ix_consolidation_moves_pool_at", "pool", "at"),)
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    pool: Mapped[str] = mapped_column(String(64))
    at: Mapped[datetime] = mapped_column()
    launch_id: Mapped[str] = mapped_column(String(64))  # the instance emptied
    instance_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    agent_id: Mapped[str] = mapped_column(String(128))
    allocation_id: Mapped[str] = mapped_column(String(64))
    trial_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    reason: Mapped[str] = mapped_column(Text)
    saving: Mapped[float] = mapped_column(Float)  # estimated, per hour, in `saving_unit`
    saving_unit: Mapped[str] = mapped_column(String(16))  # "$/h", or "slot-h/h" when prices are unknown
    # A replacement: the new instance launched for the work (migration 0022); `pending` until its
    # agent has connected and the work was asked to move, `abandoned` if that never happened.
    replacement_launch_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    pending: Mapped[bool] = mapped_column(Boolean, default=False)
    abandoned: Mapped[bool] = mapped_column(Boolean, default=False)


class Task(Base):
    """A task other than a trial (issue 29): a command or a notebook, owned by a user, run by one
    allocation (`allocations.task_id` is this id) that the same placement path schedules. Its state
    and exit are its allocation's; `proxy_address` is where it serves (the task reports it: `POST
    /api/v1/allocations/{id}/proxy_address`), which the master's proxy at /proxy/<id>/ forwards to;
    `last_activity_at` is the latest traffic through that proxy (idle timeouts). Migration 0017."""

    __tablename__ = "tasks"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))  # command | notebook
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    description: Mapped[str] = mapped_column(Text, default="")
    config: Mapped[dict[str, Any]] = mapped_column()  # as launched, defaults filled
    pool: Mapped[str] = mapped_column(String(64))
    # Its workspace (the launch's workspaceId; 1, Uncategorized, by default): whose roles may kill
    # it and whose pool bindings apply. Migration 0020.
    workspace_id: Mapped[int] = mapped_column(Integer, default=1, server_default="1", index=True)
    context_id: Mapped[int | None] = mapped_column(ForeignKey("model_definitions.id"), nullable=True)
    proxy_address: Mapped[str | None] = mapped_column(String(255), nullable=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_activity_at: Mapped[datetime | None] = mapped_column(nullable=True)


class Workspace(Base):
    """A team's home: projects (and through them experiments), templates, and defaults for the
    experiments created in it (compute pool, checkpoint storage). Id 1, `Uncategorized`, is the
    cluster's own (no owner, immutable). Migration 0016."""

    __tablename__ = "workspaces"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(255), unique=True)
    owner_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"), nullable=True)
    archived: Mapped[bool] = mapped_column(Boolean, default=False)
    immutable: Mapped[bool] = mapped_column(Boolean, default=False)
    default_compute_pool: Mapped[str | None] = mapped_column(String(64), nullable=True)
    default_aux_pool: Mapped[str | None] = mapped_column(String(64), nullable=True)
    checkpoint_storage: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True), nullable=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Project(Base):
    """Experiments grouped in a workspace; id 1, `Uncategorized`, in workspace 1. Migration 0016."""

    __tablename__ = "projects"
    __table_args__ = (UniqueConstraint("workspace_id", "name"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(255))
    key: Mapped[str] = mapped_column(String(32), unique=True)
    description: Mapped[str] = mapped_column(Text, default="")
    workspace_id: Mapped[int] = mapped_column(ForeignKey("workspaces.id"), index=True)
    owner_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"), nullable=True)
    archived: Mapped[bool] = mapped_column(Boolean, default=False)
    immutable: Mapped[bool] = mapped_column(Boolean, default=False)
    notes: Mapped[list[Any]] = mapped_column(default=list)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ConfigTemplate(Base):
    """A named experiment-config base (`det template`): an experiment created with it gets the
    template's config under its own (core/expconf/merge.py). Migration 0016."""

    __tablename__ = "templates"
    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    workspace_id: Mapped[int] = mapped_column(ForeignKey("workspaces.id"))
    owner_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"), nullable=True)
    config: Mapped[dict[str, Any]] = mapped_column()
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class UserGroup(Base):
    """A named set of users (`det user-group`), to assign roles to many at once. Migration 0018."""

    __tablename__ = "user_groups"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(255), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class UserGroupMember(Base):
    __tablename__ = "user_group_members"
    group_id: Mapped[int] = mapped_column(ForeignKey("user_groups.id", ondelete="CASCADE"), primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), primary_key=True, index=True)


class RoleAssignment(Base):
    """A role (core/rbac.py's ids) held by one user or one group, in one workspace or (no
    workspace) cluster-wide. The default roles every cluster has (admins ClusterAdmin, everyone
    Editor of Uncategorized, a workspace's creator its WorkspaceAdmin) are implied, not stored.
    Migration 0018."""

    __tablename__ = "role_assignments"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    role_id: Mapped[int] = mapped_column(Integer)
    user_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), nullable=True, index=True)
    group_id: Mapped[int | None] = mapped_column(ForeignKey("user_groups.id", ondelete="CASCADE"), nullable=True,
                                                 index=True)
    workspace_id: Mapped[int | None] = mapped_column(ForeignKey("workspaces.id", ondelete="CASCADE"), nullable=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class PoolWorkspaceBinding(Base):
    """A resource pool bound to a workspace: a pool with bindings takes only their workspaces'
    experiments. Migration 0018."""

    __tablename__ = "pool_workspace_bindings"
    pool: Mapped[str] = mapped_column(String(64), primary_key=True)
    workspace_id: Mapped[int] = mapped_column(ForeignKey("workspaces.id", ondelete="CASCADE"), primary_key=True)
