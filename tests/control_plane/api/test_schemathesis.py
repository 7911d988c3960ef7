"""schemathesis over the whole OpenAPI document of the real app, in process: every operation, as
an admin, as a plain user and unauthenticated, with valid and invalid generated input. Not one
server error, and every answer as the document says (status code, content type, body schema).
SQLite and PostgreSQL; a bounded number of examples per operation keeps it to a few minutes."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from sqlalchemy import select

from control_plane import auth
from control_plane.db.engine import transaction
from control_plane.db.models import User
from tests.conftest import ADMIN_PASSWORD
from tests.control_plane.api.test_checkpoints import ckpt_body, report_ckpt
from tests.control_plane.api.test_experiments import allocation_headers, create_ok, make_user, only_trial

# Examples per operation and caller (SCHEMATHESIS_EXAMPLES overrides, for a deeper run).
EXAMPLES = int(os.environ.get("SCHEMATHESIS_EXAMPLES", "6"))
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
CALLERS = ("admin", "plain", "anonymous")  # "plain": a user without admin rights


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def fuzzed_app(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One master per database for the whole module (creating one per example would dominate the
    run), with an experiment, its trial, a checkpoint, a model with a version and a plain user, for
    the generated ids to find."""
    from control_plane.api.app import create_app
    from control_plane.config import load_config
    from control_plane.master import Master

    tmp: Path = tmp_path_factory.mktemp(f"schemathesis-{request.param}")
    if request.param == "sqlite":
        db_url = f"sqlite:///{tmp / 'shipyard.db'}"
    else:
        db_url = request.getfixturevalue("postgres_server").create_database()
    master = Master(load_config(env={}, db_url=db_url, state_dir=str(tmp / "state"), admin_password=ADMIN_PASSWORD))
    master.prepare()
    app = create_app(master)
    with TestClient(app) as client:
        admin = {"Authorization": f"Bearer {_token(master, 'admin')}"}
        trial = only_trial(master, create_ok(client, admin)["experiment"]["id"])
        ckpt = report_ckpt(client, allocation_headers(master, trial), ckpt_body(trial, 10))
        client.post("/api/v1/models", headers=admin, json={"name": "m"}).raise_for_status()
        client.post("/api/v1/models/m/versions", headers=admin, json={"checkpointUuid": ckpt}).raise_for_status()
        make_user(client, admin, "plain")
        yield master, app
    master.stop()


def _token(master, username: str) -> str:  # type: ignore[no-untyped-def]
    """A fresh session for the user, made active again first: generated requests may well have
    deactivated it, changed its password or logged it out, and each operation starts clean."""
    with transaction(master.sessions) as s:
        user = s.scalar(select(User).where(User.username == username))
        user.active = True
        user.admin = username == "admin"
        return auth.issue_token(s, auth.TokenKind.USER, now=master.clock(), ttl=timedelta(hours=1), user_id=user.id)


def _bounded(case: Any) -> None:
    """Keep generated requests from waiting: a log follow lasts as long as its trial, and the
    long-polls up to their timeout (the absence of a wait is not what this test is about)."""
    if isinstance(case.query, dict):
        if "follow" in case.query:
            case.query["follow"] = False
        if "timeoutSeconds" in case.query:
            case.query["timeoutSeconds"] = 0


def _fuzz(master: Any, operation: Any, mode: GenerationMode, failures: list[str]) -> int:
    """Send EXAMPLES generated requests of one operation, each as every caller; returns how many
    requests were sent. Failures are collected (one per operation and mode), not raised, so one
    run reports every operation that misbehaves."""
    sent = 0

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])
    def run(case: Any) -> None:
        nonlocal sent
        _bounded(case)
        for caller in CALLERS:
            headers = {} if caller == "anonymous" else {"Authorization": f"Bearer {_token(master, caller)}"}
            sent += 1
            case.call_and_validate(headers=headers, checks=CHECKS)

    try:
        run()
    except Unsatisfiable:
        pass  # nothing to generate in this mode (no parameters that can be made invalid)
    except (Exception, BaseExceptionGroup) as exc:  # schemathesis' FailureGroup, or an error in the app
        failures.append(f"{operation.label} [{mode.value}]: {str(exc)[:2000]}")
    return sent


def test_the_api_answers_as_documented(fuzzed_app: Any) -> None:
    """Every operation, valid and invalid input, as an admin, a plain user and unauthenticated: no
    5xx, and status, content type and body as the OpenAPI document says."""
    master, app = fuzzed_app
    api = schemathesis.openapi.from_asgi("/openapi.json", app)
    operations = [result.ok() for result in api.get_all_operations()]
    assert len(operations) >= 70
    failures: list[str] = []
    started = time.monotonic()
    sent = sum(_fuzz(master, op, mode, failures) for op in operations for mode in GenerationMode)
    print(f"schemathesis: {len(operations)} operations, {EXAMPLES} examples per operation and mode, "
          f"{sent} requests, {time.monotonic() - started:.1f} s")
    assert not failures, f"{len(failures)} operations misbehaved:\n\n" + "\n\n".join(failures)


def test_typed_answers_match_their_documented_schema(client, admin_headers, master) -> None:  # type: ignore[no-untyped-def]
    """Every operation with a typed 200 (openapi.RESPONSES), called on real records (an
    experiment, its trial, a checkpoint, a model and a version): the body validates against the
    documented schema, so the document tells the truth beyond what random ids happen to reach."""
    from jsonschema import Draft202012Validator

    from control_plane.api.openapi import RESPONSES

    exp_id = create_ok(client, admin_headers)["experiment"]["id"]
    trial = only_trial(master, exp_id)
    ckpt = report_ckpt(client, allocation_headers(master, trial), ckpt_body(trial, 10))
    assert client.post("/api/v1/models", headers=admin_headers, json={"name": "m"}).status_code == 200
    r = client.post("/api/v1/models/m/versions", headers=admin_headers, json={"checkpointUuid": ckpt})
    assert r.status_code == 200, r.text
    values = {"experimentId": exp_id, "trialId": trial.id, "id": exp_id, "checkpointUuid": ckpt,
              "modelName": "m", "modelVersionNum": 1}
    spec = client.get("/openapi.json").json()
    checked = 0
    for (method, path), model in RESPONSES.items():
        if method != "GET":
            continue
        url = path.format(**values)
        if path == "/api/v1/trials/{id}/checkpoints":
            url = path.format(id=trial.id)
        got = client.get(url, headers=admin_headers)
        assert got.status_code == 200, (url, got.text)
        documented = spec["paths"][path]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
        validator = Draft202012Validator({**documented, "components": spec["components"]})
        problems = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(got.json())]
        assert not problems, (url, model.__name__, problems[:5])
        checked += 1
    assert checked >= 10
