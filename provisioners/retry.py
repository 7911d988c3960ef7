"""The one retry wrapper around cloud calls: bounded attempts, jittered exponential waits.

Which errors are worth another attempt stays each cloud's call (`is_transient`), and so does the
log line (`on_retry`), so that a provider's logs keep naming its own operation and error code."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import tenacity

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 4
    base_s: float = 0.5  # the first wait is random in [0, base_s]; each retry doubles the range
    max_s: float = 10.0  # no single wait is longer

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.base_s < 0 or self.max_s < 0:
            raise ValueError("base_s and max_s must not be negative")


@dataclass(frozen=True)
class RetryAttempt:
    """Passed to `on_retry` before each wait."""

    attempt: int  # the attempt that just failed, from 1
    max_attempts: int
    error: BaseException
    sleep_s: float


def call_with_retries(
    fn: Callable[[], T],
    *,
    policy: RetryPolicy,
    is_transient: Callable[[BaseException], bool],
    on_retry: Callable[[RetryAttempt], None] | None = None,
    deadline: float | None = None,
) -> T:
    """Call `fn`, repeating it while it raises a transient error, at most `policy.max_attempts`
    times and (when `deadline`, a `time.monotonic()` value, is given) starting no attempt after the
    deadline. The last exception is re-raised as it is."""

    def stop(state: tenacity.RetryCallState) -> bool:
        if state.attempt_number >= policy.max_attempts:
            return True
        return deadline is not None and time.monotonic() >= deadline

    def before_sleep(state: tenacity.RetryCallState) -> None:
        if on_retry is None or state.outcome is None:
            return
        error = state.outcome.exception()
        assert error is not None  # tenacity only sleeps after a failed attempt
        on_retry(RetryAttempt(state.attempt_number, policy.max_attempts, error,
                              state.next_action.sleep if state.next_action else 0.0))

    retrying = tenacity.Retrying(
        stop=stop,
        wait=tenacity.wait_random_exponential(multiplier=policy.base_s, max=policy.max_s),
        retry=tenacity.retry_if_exception(is_transient),
        before_sleep=before_sleep,
        reraise=True,
    )
    return retrying(fn)
