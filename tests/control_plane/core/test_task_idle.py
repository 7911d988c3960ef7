"""core/task_idle.py: a notebook is idle only when neither the proxy nor Jupyter saw activity for
the timeout and no kernel executes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from control_plane.core.task_idle import Activity, idle_reason

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_idle_after_the_timeout_from_the_latest_activity_of_either_kind() -> None:
    assert idle_reason(Activity(T0, None, None, 0), at(59), 60) is None
    reason = idle_reason(Activity(T0, None, None, 0), at(60), 60)
    assert reason is not None and "idle for 60s" in reason and "idle timeout 60s" in reason
    assert idle_reason(Activity(T0, at(30), None, 0), at(60), 60) is None  # proxy traffic
    assert idle_reason(Activity(T0, None, at(30), 0), at(60), 60) is None  # Jupyter's own activity
    assert idle_reason(Activity(T0, at(10), at(20), 0), at(80), 60) is not None


def test_a_running_cell_is_never_idle() -> None:
    assert idle_reason(Activity(T0, None, None, 1), at(10_000), 60) is None


def test_a_tensorboard_is_idle_by_proxy_traffic_alone() -> None:
    tb = Activity(T0, at(30), None, 0, has_kernels=False)
    assert idle_reason(tb, at(89), 60) is None
    reason = idle_reason(tb, at(90), 60)
    assert reason is not None and "no traffic through the master's proxy;" in reason and "kernel" not in reason
