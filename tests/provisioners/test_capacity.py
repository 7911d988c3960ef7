"""The capacity memory as a pure table: time is passed in (issue 10, item 7)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from provisioners.base import ErrorKind, ErrorScope, ProviderError
from provisioners.capacity import CapacityMemory, all_cooling_error, cooldowns_of

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _capacity(code: str = "InsufficientInstanceCapacity") -> ProviderError:
    return ProviderError(ErrorKind.CAPACITY, "no room", scope=ErrorScope.ZONE, code=code, location="subnet-1")


def test_a_location_cools_down_per_instance_type_until_its_cooldown_ends() -> None:
    memory = CapacityMemory(timedelta(minutes=10))
    memory.exhausted("subnet-1", "p3.2xlarge", _capacity(), T0)

    assert memory.cooling("subnet-1", "p3.2xlarge", T0 + timedelta(minutes=9)) is not None
    assert memory.cooling("subnet-1", "g5.xlarge", T0) is None  # another type may still fit there
    assert memory.available(["subnet-1", "subnet-2"], "p3.2xlarge", T0) == ["subnet-2"]
    assert memory.available(["subnet-1", "subnet-2"], "p3.2xlarge", T0 + timedelta(minutes=10)) == [
        "subnet-1", "subnet-2"]
    assert memory.snapshot(T0 + timedelta(minutes=10)) == []  # ended ones are dropped


def test_repeated_failures_count_and_restart_the_cooldown_and_a_success_clears_it() -> None:
    memory = CapacityMemory(timedelta(minutes=10))
    memory.exhausted("zone-a", "n1", _capacity(), T0)
    again = memory.exhausted("zone-a", "n1", _capacity("ZONE_RESOURCE_POOL_EXHAUSTED"), T0 + timedelta(minutes=10))
    assert again is not None and again.failures == 2 and again.until == T0 + timedelta(minutes=20)
    assert again.to_json() == {"location": "zone-a", "instance_type": "n1", "until": again.until.isoformat(),
                               "code": "ZONE_RESOURCE_POOL_EXHAUSTED", "error": "no room", "failures": 2}
    memory.succeeded("zone-a", "n1")
    assert memory.snapshot(T0) == []


def test_a_zero_cooldown_remembers_nothing() -> None:
    memory = CapacityMemory(timedelta(0))
    assert memory.exhausted("zone-a", "n1", _capacity(), T0) is None
    assert memory.available(["zone-a"], "n1", T0) == ["zone-a"]
    with pytest.raises(ValueError):
        CapacityMemory(timedelta(seconds=-1))


def test_every_location_cooling_is_one_capacity_error_naming_them() -> None:
    memory = CapacityMemory(timedelta(minutes=5))
    for subnet in ("subnet-1", "subnet-2"):
        memory.exhausted(subnet, "p3", _capacity(), T0)
    err = all_cooling_error(memory.snapshot(T0), "p3", "subnet")
    assert (err.kind, err.scope, err.location) == (ErrorKind.CAPACITY, ErrorScope.REGION, "subnet-1,subnet-2")
    assert "every subnet is cooling down" in str(err)


def test_providers_without_memory_report_nothing() -> None:
    assert cooldowns_of(object()) == []


def test_quota_errors_are_labelled_with_their_reach() -> None:
    regional = ProviderError(ErrorKind.QUOTA, "x", scope=ErrorScope.REGION, code="VcpuLimitExceeded",
                             location="us-east-1")
    project = ProviderError(ErrorKind.QUOTA, "x", scope=ErrorScope.CLOUD, code="QUOTA_EXCEEDED", location="proj-1")
    assert str(regional) == "quota (VcpuLimitExceeded) in region us-east-1: x"
    assert str(project) == "quota (QUOTA_EXCEEDED) project-wide (proj-1): x"
    assert str(_capacity()) == "capacity (InsufficientInstanceCapacity) at subnet-1: no room"
