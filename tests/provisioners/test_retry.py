"""The shared retry wrapper: bounded attempts, only transient errors, a deadline, a hook per retry."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from provisioners.retry import RetryAttempt, RetryPolicy, call_with_retries

NO_WAIT = RetryPolicy(max_attempts=3, base_s=0.0, max_s=0.0)


class Transient(Exception):
    pass


class Fatal(Exception):
    pass


def flaky(failures: list[Exception]) -> tuple[list[int], Callable[[], str]]:
    calls: list[int] = []

    def fn() -> str:
        calls.append(len(calls) + 1)
        if failures:
            raise failures.pop(0)
        return "ok"

    return calls, fn


def is_transient(e: BaseException) -> bool:
    return isinstance(e, Transient)


def test_transient_errors_are_retried_and_each_retry_reported() -> None:
    calls, fn = flaky([Transient("a"), Transient("b")])
    seen: list[RetryAttempt] = []
    assert call_with_retries(fn, policy=NO_WAIT, is_transient=is_transient, on_retry=seen.append) == "ok"
    assert calls == [1, 2, 3]
    assert [(r.attempt, r.max_attempts, str(r.error)) for r in seen] == [(1, 3, "a"), (2, 3, "b")]


def test_attempts_are_bounded_and_the_last_error_is_raised_as_is() -> None:
    calls, fn = flaky([Transient("1"), Transient("2"), Transient("3"), Transient("4")])
    with pytest.raises(Transient, match="3"):
        call_with_retries(fn, policy=NO_WAIT, is_transient=is_transient)
    assert calls == [1, 2, 3]


def test_other_errors_are_not_retried() -> None:
    calls, fn = flaky([Fatal("no")])
    with pytest.raises(Fatal):
        call_with_retries(fn, policy=NO_WAIT, is_transient=is_transient)
    assert calls == [1]


def test_no_attempt_starts_after_the_deadline() -> None:
    calls, fn = flaky([Transient("1"), Transient("2")])
    with pytest.raises(Transient, match="1"):
        call_with_retries(fn, policy=NO_WAIT, is_transient=is_transient,
                          deadline=time.monotonic() - 1)
    assert calls == [1]


def test_waits_are_jittered_and_capped() -> None:
    policy = RetryPolicy(max_attempts=6, base_s=0.001, max_s=0.004)
    seen: list[RetryAttempt] = []
    _, fn = flaky([Transient(str(i)) for i in range(5)])
    call_with_retries(fn, policy=policy, is_transient=is_transient, on_retry=seen.append)
    assert len(seen) == 5 and all(0 <= r.sleep_s <= 0.004 for r in seen)


def test_the_policy_refuses_zero_attempts() -> None:
    with pytest.raises(ValueError, match="max_attempts"):
        RetryPolicy(max_attempts=0)
