"""services/logs.py and services/users.py called directly, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select

from control_plane import auth
from control_plane.auth import Principal, TokenKind
from control_plane.db.engine import transaction
from control_plane.db.models import Allocation, Token, Trial
from control_plane.errors import Conflict, Invalid, NotFound, PermissionDenied
from control_plane.services import logs, users
from control_plane.services.logs import LogFilter, LogLine, LogTarget
from control_plane.services.users import NewUser, UserChange
from tests.control_plane.services.builders import admin, create_experiment


def test_who_may_ship_a_tasks_logs(master) -> None:  # type: ignore[no-untyped-def]
    exp_id = create_experiment(master)
    with transaction(master.sessions) as s:
        trial = s.scalar(select(Trial).where(Trial.experiment_id == exp_id))
        alloc = s.scalar(select(Allocation).where(Allocation.trial_id == trial.id))
        alloc.agent_id = "a1"
        task, alloc_id, pool = trial.task_id, alloc.id, alloc.pool
    own = Principal(kind=TokenKind.ALLOCATION, token_id=0, trial_id=trial.id, allocation_id=alloc_id)
    agent = Principal(kind=TokenKind.AGENT, token_id=0, pool=pool, agent_id="a1")
    with master.read_sessions() as s:
        for p in (admin(master), own, agent):
            logs.require_log_writer(s, p, [LogTarget(task, alloc_id)])
        refused = [
            (Principal(kind=TokenKind.USER, token_id=0, user_id=5, username="u"), [LogTarget(task)]),
            (own, [LogTarget(task, "another-allocation")]),
            (Principal(kind=TokenKind.AGENT, token_id=0, pool=pool, agent_id="a2"), [LogTarget(task)]),
            (Principal(kind=TokenKind.AGENT, token_id=0, pool="elsewhere"), [LogTarget(task)]),
        ]
        for p, targets in refused:
            with pytest.raises(PermissionDenied):
                logs.require_log_writer(s, p, targets)
        with pytest.raises(NotFound) as err:
            logs.require_log_writer(s, admin(master), [LogTarget(task), LogTarget("no-such-task")])
        assert "logs[1].taskId" in err.value.message
        # a trial's own lines in one query; a line for an unknown task still answers 404 first
        with pytest.raises(NotFound) as err:
            logs.require_log_writer(s, own, [LogTarget(task), LogTarget("no-such-task")])
        assert "logs[1].taskId" in err.value.message


def test_lines_are_stored_clean_and_read_back_by_filter(master) -> None:  # type: ignore[no-untyped-def]
    exp_id = create_experiment(master)
    with master.read_sessions() as s:
        task = s.scalar(select(Trial.task_id).where(Trial.experiment_id == exp_id))
    t0 = master.clock()
    long_line = "é" * (logs.MAX_LOG_LINE_BYTES // 2 + 10) + "\n"
    who = admin(master)

    def ship(*lines: LogLine) -> None:
        logs.post(master, lambda _s: who, [LogTarget(line.task_id) for line in lines], lambda: list(lines))

    ship(LogLine(task, "hello\x00world\n", level="warn", timestamp=t0),
         LogLine(task, long_line, level="LOG_LEVEL_ERROR", rank=1, timestamp=t0 + timedelta(seconds=1)),
         LogLine(task, "Epoch 3 done\n", stdtype="stderr", timestamp=t0 + timedelta(seconds=2)))
    with pytest.raises(Invalid) as err:  # all or nothing: "x" is not stored either
        ship(LogLine(task, "x"), LogLine(task, "y", level="LOUD"))
    assert err.value.details[0].field == "logs[1].level"

    with master.read_sessions() as s:
        page = logs.log_page(s, task, LogFilter(), None, desc=False, batch=10)
        assert [r.level for r in page.rows] == ["WARNING", "ERROR", "INFO"] and page.fetched == 3
        assert page.rows[0].log == "hello\ufffdworld\n"
        assert page.rows[1].log.endswith("more bytes dropped]\n")
        assert len(page.rows[1].log.encode()) < logs.MAX_LOG_LINE_BYTES + 100
        assert [r.log for r in logs.log_page(s, task, LogFilter(search_text="EPOCH"), None, desc=False, batch=10).rows] \
            == ["Epoch 3 done\n"]
        regex = LogFilter(search_text=r"^h.*d$", enable_regex=True)
        assert [r.log for r in logs.log_page(s, task, regex, None, desc=False, batch=10).rows] == ["hello\ufffdworld\n"]
        newest = logs.log_page(s, task, LogFilter(after=t0), None, desc=True, batch=1)
        assert [r.stdtype for r in newest.rows] == ["stderr"]
        rest = logs.log_page(s, task, LogFilter(after=t0), newest.cursor, desc=True, batch=5)
        assert [r.rank for r in rest.rows] == [1]
        assert logs.task_over(s, task, None) is False  # its allocation is still live
    with pytest.raises(Invalid) as err:
        LogFilter(search_text="(", enable_regex=True)
    assert err.value.details[0].field == "searchText"


def test_password_rules(master) -> None:  # type: ignore[no-untyped-def]
    for password, hashed in ((None, False), ("", False), (auth.client_hash(""), True), ("short", False)):
        with pytest.raises(Invalid) as err, transaction(master.sessions) as s:
            users.create_user(s, master, NewUser("bob", password, is_hashed=hashed))
        assert err.value.details[0].field == "password"
    with transaction(master.sessions) as s:
        bob = users.create_user(s, master, NewUser("bob", "a-long-enough-pw-1"))
        bob_id = bob.id
    with pytest.raises(PermissionDenied), transaction(master.sessions) as s:
        users.login(s, master, "bob", "wrong", is_hashed=False)
    with pytest.raises(PermissionDenied), transaction(master.sessions) as s:
        users.login(s, master, "nobody", "wrong", is_hashed=False)
    with transaction(master.sessions) as s:
        users.login(s, master, "bob", "a-long-enough-pw-1", is_hashed=False)
    # (one login per transaction: the throttle records attempts in a transaction of its own, which
    # on SQLite waits for any write transaction the caller holds)
    with transaction(master.sessions) as s:
        token, _ = users.login(s, master, "bob", "a-long-enough-pw-1", is_hashed=False)
        kept = auth.resolve_token(s, token, now=master.clock())
    bob_p = Principal(kind=TokenKind.USER, token_id=kept.token_id, user_id=bob_id, username="bob")

    # A password change ends the user's other sessions, not the one it came from.
    with transaction(master.sessions) as s:
        users.set_password(s, master, bob_p, bob_id, auth.client_hash("another-pw-22"), is_hashed=False)
    with master.read_sessions() as s:
        live = [t.id for t in s.scalars(select(Token).where(Token.user_id == bob_id, Token.revoked_at.is_(None)))]
        assert live == [kept.token_id]
    with transaction(master.sessions) as s:
        users.login(s, master, "bob", auth.client_hash("another-pw-22"), is_hashed=True)  # taken as a hash


def test_who_may_change_a_user(master) -> None:  # type: ignore[no-untyped-def]
    with transaction(master.sessions) as s:
        bob_id = users.create_user(s, master, NewUser("bob", "a-long-enough-pw-1")).id
        users.create_user(s, master, NewUser("carol", "a-long-enough-pw-1"))
    bob = Principal(kind=TokenKind.USER, token_id=0, user_id=bob_id, username="bob")
    root = admin(master)
    for by, change, error in (
        (bob, UserChange(admin=True), PermissionDenied),
        (bob, UserChange(username="robert"), PermissionDenied),
        (root, UserChange(username="carol"), Conflict),  # taken
    ):
        with pytest.raises(error), transaction(master.sessions) as s:
            users.change_user(s, master, by, bob_id, change)
    with pytest.raises(Invalid), transaction(master.sessions) as s:
        users.change_user(s, master, root, root.user_id, UserChange(active=False))
    with pytest.raises(PermissionDenied), transaction(master.sessions) as s:
        users.set_password(s, master, bob, root.user_id, "a-long-enough-pw-2", is_hashed=False)
    with transaction(master.sessions) as s:
        assert users.change_user(s, master, bob, bob_id, UserChange(display_name="Bob")).display_name == "Bob"
        users.change_user(s, master, root, bob_id, UserChange(active=False))
    with pytest.raises(PermissionDenied) as err, transaction(master.sessions) as s:
        users.login(s, master, "bob", "a-long-enough-pw-1", is_hashed=False)
    assert err.value.message == "invalid credentials"  # as for a wrong password (no oracle)
    with master.read_sessions() as s:
        found, total = users.list_users(s, users.UserFilter(active=True), 0, 1)
        assert total == 2 and [u.username for u in found] == ["admin"]
