"""The schemathesis run of test_schemathesis.py on PostgreSQL: a file of its own, so that the
suite's two workers (`--dist loadfile`) run the two databases side by side."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.control_plane.api.test_schemathesis import SHARDS, answers_as_documented, fuzzed_master


@pytest.fixture(scope="module")
def fuzzed_app(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    yield from fuzzed_master(request, tmp_path_factory, "postgres")


@pytest.mark.parametrize("shard", range(SHARDS))
def test_the_api_answers_as_documented_on_postgres(fuzzed_app: Any, shard: int) -> None:
    answers_as_documented(fuzzed_app, shard)
