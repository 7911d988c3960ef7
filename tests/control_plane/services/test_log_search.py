"""Log search (services/logs.py): RE2 patterns and the per-caller limit on open searches."""

from __future__ import annotations

import pytest

from control_plane.auth import Principal, TokenKind
from control_plane.db.engine import make_engine, make_session_factory
from control_plane.db.migrate import upgrade
from control_plane.db.quotas import Claim, QuotaFull, SharedQuotas
from control_plane.errors import Invalid, TooManyRequests
from control_plane.services import logs
from control_plane.services.logs import LogFilter


class _Row:
    def __init__(self, log: str) -> None:
        self.log = log


def test_search_uses_re2_semantics() -> None:
    flt = LogFilter(search_text="(a+)+$", enable_regex=True)
    # linear-time matching: a line Python's `re` would backtrack on for ever is just "no match"
    assert not flt.keep(_Row("a" * 100_000 + "!"))
    assert flt.keep(_Row("x" + "a" * 100_000 + "\n"))  # `$` is the end of the line, before its newline
    assert type(flt.regex).__module__.startswith("re2")


@pytest.mark.parametrize("pattern", [r"(a)\1", "(?<=a)b", "(?!a)", "[", "a{1001}"])
def test_what_re2_refuses_is_invalid_naming_search_text(pattern: str) -> None:
    with pytest.raises(Invalid) as err:
        LogFilter(search_text=pattern, enable_regex=True)
    assert [d.field for d in err.value.details] == ["searchText"]
    assert "RE2" in err.value.message


def test_open_searches_are_limited_per_caller(db_url: str) -> None:
    """Counted in the database: two processes' SharedQuotas (two holders) share the cap."""
    engine = make_engine(db_url)
    upgrade(engine)
    sessions = make_session_factory(engine)
    here, there = SharedQuotas(sessions), SharedQuotas(sessions)  # two API workers
    alice = Principal(kind=TokenKind.USER, token_id=1, user_id=101, username="alice")
    bob = Principal(kind=TokenKind.USER, token_id=2, user_id=102, username="bob")
    flt = LogFilter(search_text="loss")
    leases = [logs.search_slot(q, alice, flt) for q in (here, there) * (logs.MAX_SEARCHES_PER_USER // 2)]
    for q in (here, there):
        with pytest.raises(TooManyRequests):
            logs.search_slot(q, alice, flt)
    bobs = logs.search_slot(there, bob, flt)  # another caller is not affected
    assert logs.search_slot(here, alice, LogFilter()).release() is None  # no search text: no slot taken
    leases.pop().release()
    leases.append(logs.search_slot(here, alice, flt))  # a freed slot can be taken again, by any process
    for lease in [*leases, bobs]:
        lease.release()
    assert here.used("log_search:user:101") == there.used("log_search:user:102") == 0
    here.stop()
    there.stop()
    engine.dispose()


def test_a_dead_holders_slots_come_back_after_the_ttl(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A worker that crashed never gives its leases back: they expire; a live holder renews its own."""
    engine = make_engine(f"sqlite:///{tmp_path / 'q.db'}")
    upgrade(engine)
    sessions = make_session_factory(engine)
    now = [1000.0]
    dead, live = (SharedQuotas(sessions, ttl_s=30, clock=lambda: now[0]) for _ in range(2))
    claim = [Claim("log_search:user:7", 2)]
    dead.take(claim, 1)
    kept = live.take(claim, 1)
    with pytest.raises(QuotaFull):
        live.take(claim, 1)
    now[0] += 20
    live.renew()  # what the live holder's keeper thread does every ttl/3
    now[0] += 15  # the dead holder's lease is 35 s old, the live one's 15 s
    live.take(claim, 1)
    assert live.used("log_search:user:7") == 2
    assert kept.ids
    dead.stop()
    live.stop()
    engine.dispose()
