"""The JSON conventions all parties share: timestamps and non-finite floats."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

from hypothesis import given
from hypothesis import strategies as st

from shipyard_common.wire import NONFINITE_STRINGS, encode_float, rfc3339, rfc3339_epoch


def test_non_finite_floats_travel_as_strings_and_come_back() -> None:
    assert encode_float(1.5) == 1.5 and encode_float(-0.0) == 0.0
    for x in (math.nan, math.inf, -math.inf):
        text = encode_float(x)
        assert isinstance(text, str)
        back = NONFINITE_STRINGS[text]
        assert (math.isnan(back) and math.isnan(x)) or back == x
    assert [encode_float(x) for x in (math.nan, math.inf, -math.inf)] == ["NaN", "Infinity", "-Infinity"]


def test_rfc3339_is_utc_with_microseconds_and_a_z() -> None:
    naive = datetime(2024, 5, 1, 12, 0, 0)
    assert rfc3339(naive) == "2024-05-01T12:00:00.000000Z"  # naive is taken as UTC (the database's)
    aware = datetime(2024, 5, 1, 14, 0, 0, 123456, tzinfo=timezone(timedelta(hours=2)))
    assert rfc3339(aware) == "2024-05-01T12:00:00.123456Z"


@given(st.integers(min_value=0, max_value=4_000_000_000), st.integers(min_value=0, max_value=999_999))
def test_the_epoch_form_matches_the_datetime_form(seconds: int, micros: int) -> None:
    t = datetime.fromtimestamp(seconds, timezone.utc).replace(microsecond=micros)
    epoch = seconds + micros / 1_000_000
    got = datetime.strptime(rfc3339_epoch(epoch), "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)
    want = datetime.strptime(rfc3339(t), "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)
    # The epoch form truncates what float seconds cannot hold exactly: at most a microsecond apart.
    assert abs((got - want).total_seconds()) <= 1e-6
