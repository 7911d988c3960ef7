"""Log search (services/logs.py): RE2 patterns and the per-caller limit on open searches."""

from __future__ import annotations

import pytest

from control_plane.auth import Principal, TokenKind
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


def test_open_searches_are_limited_per_caller() -> None:
    alice = Principal(kind=TokenKind.USER, token_id=1, user_id=101, username="alice")
    bob = Principal(kind=TokenKind.USER, token_id=2, user_id=102, username="bob")
    flt = LogFilter(search_text="loss")
    leases = [logs.search_slot(alice, flt) for _ in range(logs.MAX_SEARCHES_PER_USER)]
    with pytest.raises(TooManyRequests):
        logs.search_slot(alice, flt)
    bobs = logs.search_slot(bob, flt)  # another caller is not affected
    assert logs.search_slot(alice, LogFilter()).release() is None  # no search text: no slot taken
    leases.pop().release()
    leases.append(logs.search_slot(alice, flt))  # a freed slot can be taken again
    for lease in [*leases, bobs]:
        lease.release()
    assert logs.SEARCH_SLOTS.open_count("user:101") == logs.SEARCH_SLOTS.open_count("user:102") == 0
