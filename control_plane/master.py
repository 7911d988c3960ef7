"""The master process: configuration, database, clock, and the background loops.

Everything here is wiring; decisions live in pure modules (searcher, scheduler, scaling)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import secrets
import sys
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import event, select
from sqlalchemy.orm import Session, sessionmaker

from control_plane import auth, telemetry
from control_plane.config import MasterConfig
from control_plane.db import migrate
from control_plane.db.engine import make_engine, make_session_factory, read_only, transaction
from control_plane.db.models import ClusterInfo, ResourcePool, User
from control_plane.db.quotas import SharedQuotas
from control_plane.errors import NotLeader
from shipyard_common import private_files

log = logging.getLogger("shipyard.master")

Clock = Callable[[], datetime]


def system_clock() -> datetime:
    return datetime.now(UTC)


# Set in each loop thread: its commits are fenced by the leadership token (Master._fence).
_loop_thread = threading.local()


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class Master:
    def __init__(self, config: MasterConfig, *, clock: Clock = system_clock, master_id: str | None = None) -> None:
        self.config = config
        self.clock = clock
        self.engine = make_engine(config.database_url, pool_size=config.db_pool_size,
                                  pool_timeout_s=config.db_pool_timeout_s)
        self.sessions: sessionmaker[Session] = make_session_factory(self.engine)
        # Reads (token checks, GETs, long-poll checks) that never wait behind a writer on SQLite.
        self.read_sessions: sessionmaker[Session] = make_session_factory(read_only(self.engine))
        event.listen(self.sessions, "after_commit", self._after_commit)
        event.listen(self.sessions, "after_rollback", lambda s: s.info.pop("shipyard_wake", None))
        self.cluster_id = ""
        # One id per det-master: its API workers carry their control process's (workers.py).
        self.master_id = master_id or uuid.uuid4().hex
        self.started_at = clock()
        # From when agents can reach this master: its API answers. An agent's silence counts only
        # from then (loops/placement.py), so API workers slow to start after a restart do not make
        # every agent look lost. A Master serves from its start unless its process says otherwise:
        # det-master clears this until its own API answers (workers.when_serving).
        self.serving_since: datetime | None = self.started_at
        # Set whenever something a loop should react to happens (new allocation, agent event...),
        # so loops act at once instead of waiting for their next tick.
        self.wakeup = threading.Condition()
        self._wake_seq = 0
        self._async_waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = set()
        self._waiters_lock = threading.Lock()
        self.token_secret = b""  # loaded by prepare() from config.token_secret_path, never from the db
        auth.configure_password_hashing(time_cost=config.password_hash_time_cost,
                                        memory_kib=config.password_hash_memory_kib,
                                        parallelism=config.password_hash_parallelism)
        self.login_throttle = auth.LoginThrottle(self.sessions, per_user=config.login_max_failures_per_user,
                                                 per_address=config.login_max_failures_per_address,
                                                 window_s=config.login_failure_window_s)
        # Counters every master process counts together (db/quotas.py): open log searches,
        # request-body memory.
        self.quotas = SharedQuotas(self.sessions)
        self.stopping = threading.Event()
        self.autoscaler: Any = None  # set by runtime.start_background when pools are elastic
        self._threads: list[threading.Thread] = []
        # Set by loops.start_background (services/leadership.py): the loops run only while this
        # process holds the lease, and every transaction they commit is fenced by its token.
        self.leadership: Any = None
        self.leading_since: datetime | None = None
        self._on_leading: list[Callable[[], None]] = []
        # Crosses process boundaries (db/wakebus.py): commits of other master processes wake ours.
        self.wakebus: Any = None
        event.listen(self.sessions, "before_commit", self._fence)

    # -- start-up ---------------------------------------------------------------------------
    def prepare(self) -> None:
        """Migrate, create the cluster id and the first admin, sync pools. Idempotent."""
        private_files.private_dir(self.config.state_dir)
        if (mode := private_files.loose_mode(self.config.state_dir)) is not None:
            log.warning("event=state_dir_readable_by_others path=%s mode=%o hint=chmod_700",
                        self.config.state_dir, mode)
        migrate.upgrade(self.engine)
        self._load_token_key()
        with transaction(self.sessions) as s:
            row = s.get(ClusterInfo, "cluster_id")
            if row is None:
                row = ClusterInfo(key="cluster_id", value=str(uuid.uuid4()))
                s.add(row)
            self.cluster_id = row.value
            self._drop_token_key_from_db(s)
            self._ensure_admin(s)
            self._sync_pools(s)

    def attach(self) -> None:
        """An API worker's start: the control process has prepared the database (prepare()); a
        worker only reads what it needs and changes nothing."""
        self._load_token_key()
        with transaction(self.read_sessions) as s:
            row = s.get(ClusterInfo, "cluster_id")
            if row is None:
                raise SystemExit("the database has not been prepared by the control process")
            self.cluster_id = row.value

    def _load_token_key(self) -> None:
        try:
            self.token_secret = auth.load_token_key(self.config.token_secret_path)
        except auth.TokenKeyError as e:
            raise SystemExit(str(e)) from None

    @staticmethod
    def _drop_token_key_from_db(s: Session) -> None:
        """Older versions kept the token key in the database, where anyone who could read the file
        could mint a token for any allocation. It is not carried over: the key in the file is a new
        one, so that key is worthless from now on. Tokens already issued stay valid (the database
        holds their hashes), so running trials are not disturbed; only new tokens use the new key."""
        legacy = s.get(ClusterInfo, "token_secret")
        if legacy is not None:
            s.delete(legacy)
            log.info("event=token_key_removed_from_database")

    def _ensure_admin(self, s: Session) -> None:
        if s.scalar(select(User).where(User.username == "admin")) is not None:
            return
        password = self.config.admin_password
        generated = password is None
        if generated:
            password = auth.generate_password()
        elif problem := auth.password_problem(password):
            raise SystemExit(f"admin_password {problem}")
        now = self.clock()
        s.add(User(username="admin", password_hash=auth.hash_password(password), admin=True, created_at=now, modified_at=now))
        if generated:
            # Printed once, to the terminal that started the master, never to the log file.
            print(
                f"Created user 'admin' with generated password: {password}\n"
                "It will not be shown again; change it with `det user change-password admin`.",
                file=sys.stderr,
                flush=True,
            )
        log.info("event=admin_created generated_password=%s", generated)

    def _sync_pools(self, s: Session) -> None:
        for pool in self.config.resource_pools:
            row = s.get(ResourcePool, pool.name)
            if row is None:
                row = ResourcePool(name=pool.name)
                s.add(row)
            row.description = pool.description
            row.provider_type = (pool.provider or {}).get("type")
            row.config = pool.model_dump(mode="json")

    # -- loops ------------------------------------------------------------------------------
    def notify(self, session: Session | None = None) -> None:
        """Wake the loops and long-polls. Inside a transaction pass its session: the wake-up then
        happens after the commit, so whoever wakes sees the change (a wake-up before the commit
        would read the old state on PostgreSQL and go back to sleep)."""
        if session is not None:
            if not session.info.get("shipyard_wake") and self.wakebus is not None:
                self.wakebus.publish_in(session)  # the other master processes hear it on commit
            session.info["shipyard_wake"] = True
            return
        self._wake()
        if self.wakebus is not None:
            self.wakebus.publish_now()

    def _after_commit(self, session: Session) -> None:
        if session.info.pop("shipyard_wake", False):
            self._wake()

    # -- leadership -------------------------------------------------------------------------
    def is_leader(self) -> bool:
        return self.leadership is not None and self.leadership.token is not None

    @property
    def leader_token(self) -> int | None:
        return None if self.leadership is None else self.leadership.token

    def _fence(self, session: Session) -> None:
        """Every transaction a loop thread commits checks, inside it, that the lease is still this
        process's (a leader paused past its lease and then resumed cannot write). API requests are
        not fenced: any master process serves them."""
        if self.leadership is not None and getattr(_loop_thread, "name", None):
            try:
                self.leadership.fence(session, self.clock())
            except Exception as e:
                log.warning("event=write_refused_by_fence loop=%s token=%s reason=%r", _loop_thread.name,
                            self.leader_token, str(e))
                raise

    def assert_leading(self) -> None:
        """Right before a call outside the database (a cloud launch or terminate): raise NotLeader
        unless the lease is still ours. The window between this check and the call cannot be
        fenced (the clouds take no token); what lands in it is found by the next leader's
        reconciliation (launch ids are recorded first, so an instance is adopted, not launched twice).
        Only the loops' own calls are fenced."""
        if self.leadership is None or not getattr(_loop_thread, "name", None):
            return  # an API request (e.g. a pool teardown) acts from any master process
        with self.read_sessions() as s, s.begin():
            self.leadership.fence(s, self.clock())

    def lead_step(self) -> None:
        """One round of the lease (create, renew, take over or stand by)."""
        was = self.is_leader()
        self.leadership.step(self.clock())
        if self.is_leader() and not was:
            self.leading_since = self.clock()
            for hook in self._on_leading:
                hook()
            self._wake()  # the loops start at once
        elif was and not self.is_leader():
            self.leading_since = None
        telemetry.record_leader(self.master_id, self.is_leader(), self.leader_token)

    def mark_serving(self) -> None:
        self.serving_since = self.clock()
        log.info("event=api_serving seconds_after_start=%.1f", (self.serving_since - self.started_at).total_seconds())

    def on_leading(self, hook: Callable[[], None]) -> None:
        """Called each time this process becomes the leader (state kept in memory by a loop is
        rebuilt from the database: another leader may have acted since)."""
        self._on_leading.append(hook)

    def start_leadership(self, renew_s: float) -> None:
        self.lead_step()

        def run() -> None:
            while not self.stopping.wait(renew_s):
                try:
                    self.lead_step()
                except Exception:
                    log.exception("event=lease_error")

        t = threading.Thread(target=run, name="leadership", daemon=True)
        t.start()

    def wake_local(self) -> None:
        """Wake this process's loops and long-polls (another process committed something)."""
        self._wake()

    def _wake(self) -> None:
        with self.wakeup:
            self._wake_seq += 1
            self.wakeup.notify_all()
        with self._waiters_lock:
            waiters = list(self._async_waiters)
        for loop, fut in waiters:
            loop.call_soon_threadsafe(_resolve, fut)

    async def wait_async(self, timeout: float) -> None:
        """Wait (without holding a worker thread) until notify() or the timeout."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        key = (loop, fut)
        with self._waiters_lock:
            self._async_waiters.add(key)
        try:
            await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            pass
        finally:
            with self._waiters_lock:
                self._async_waiters.discard(key)

    def derived_token(self, purpose: str) -> str:
        """A token the master can re-derive at any time (e.g. an allocation's session token, which
        is sent again with every repeated start command) while storing only its hash."""
        return hmac.new(self.token_secret, purpose.encode(), hashlib.sha256).hexdigest()

    def wait(self, timeout: float, *, since: int | None = None) -> None:
        """Until a wake-up (after `since`, a `_wake_seq` read earlier; default: from now) or the timeout."""
        with self.wakeup:
            seq = self._wake_seq if since is None else since
            self.wakeup.wait_for(lambda: self._wake_seq != seq or self.stopping.is_set(), timeout=timeout)

    def add_loop(self, name: str, tick: Callable[[], None], interval_s: float, *, min_gap_s: float = 0.0) -> None:
        """`tick` every `interval_s` and on every wake-up, but never sooner than `min_gap_s` after
        the previous tick ended: a busy cluster's stream of wake-ups (hundreds of agent events a
        second) then costs a few ticks a second, each seeing all the changes since the last."""

        def run() -> None:
            _loop_thread.name = name
            while not self.stopping.is_set():
                if self.leadership is not None and not self.is_leader():
                    self.wait(interval_s)  # standing by: another master process runs the loops
                    continue
                started = time.perf_counter()
                try:
                    tick()
                except Exception as e:  # a loop must survive anything; the next tick heals
                    if not isinstance(e, NotLeader):
                        log.exception("event=loop_error loop=%s", name)
                telemetry.observe_loop_tick(name, time.perf_counter() - started)
                seq = self._wake_seq  # a wake-up during the gap is not lost: it ends the wait at once
                if min_gap_s and self.stopping.wait(min_gap_s):
                    return
                self.wait(max(0.0, interval_s - min_gap_s), since=seq)

        t = threading.Thread(target=run, name=f"loop-{name}", daemon=True)
        self._threads.append(t)

    def start_loops(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self.stopping.set()
        self.notify()
        for t in self._threads:
            t.join(timeout=10)
        if self.leadership is not None:
            self.leadership.resign(self.clock())
        if self.wakebus is not None:
            self.wakebus.stop()
        self.quotas.stop()
        self.engine.dispose()

    def new_id(self) -> str:
        return secrets.token_hex(8)
