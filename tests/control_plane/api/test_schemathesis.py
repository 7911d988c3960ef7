"""schemathesis over the whole OpenAPI document of the real app, in process: every operation, as
an admin, as a plain user and unauthenticated, with valid and invalid generated input. Not one
server error, and every answer as the document says (status code, content type, body schema).
SQLite and PostgreSQL, 50 examples per operation and generation mode (schemathesis'
`--max-examples 50`), each sent as an admin, a plain user or unauthenticated (drawn with it)."""

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
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.parameters import ParameterLocation
from schemathesis.specs.openapi._hypothesis import _draw_negated_locations
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from sqlalchemy import select

from control_plane import auth
from control_plane.db.engine import transaction
from control_plane.db.models import User
from tests.conftest import ADMIN_PASSWORD, TEST_PASSWORD_HASHING
from tests.control_plane.api.test_checkpoints import ckpt_body, report_ckpt
from tests.control_plane.api.test_experiments import allocation_headers, create_ok, make_user, only_trial

# Examples per operation (SCHEMATHESIS_EXAMPLES overrides), as schemathesis' `--max-examples 50`:
# like its fuzzing phase, each example is drawn in either generation mode (positive or negative),
# and here sent once, as a caller drawn with it.
EXAMPLES = int(os.environ.get("SCHEMATHESIS_EXAMPLES", "50"))
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
CALLERS = ("admin", "plain", "anonymous")  # "plain": a user without admin rights
SHARDS = 4  # the operations in this many tests per database, each well inside the per-test timeout


@pytest.fixture(scope="module")
def fuzzed_app(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """SQLite here; PostgreSQL in test_schemathesis_postgres.py, a file of its own so that the
    suite's two workers (`--dist loadfile`) run the two databases side by side."""
    yield from fuzzed_master(request, tmp_path_factory, "sqlite")


def fuzzed_master(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                  database: str) -> Iterator[Any]:
    """One master for the whole module (creating one per example would dominate the run), with an
    experiment, its trial, a checkpoint, a model with a version and a plain user, for the generated
    ids to find; with the operations of its OpenAPI document."""
    from control_plane.api.app import create_app
    from control_plane.config import load_config
    from control_plane.master import Master

    tmp: Path = tmp_path_factory.mktemp(f"schemathesis-{database}")
    if database == "sqlite":
        db_url = f"sqlite:///{tmp / 'shipyard.db'}"
    else:
        db_url = request.getfixturevalue("postgres_server").create_database()
    master = Master(load_config(env={}, db_url=db_url, state_dir=str(tmp / "state"), admin_password=ADMIN_PASSWORD,
                                **TEST_PASSWORD_HASHING))
    master.prepare()
    app = create_app(master)
    with TestClient(app) as client:
        admin = {"Authorization": f"Bearer {_token(master, 'admin')}"}
        trial = only_trial(master, create_ok(client, admin)["experiment"]["id"])
        ckpt = report_ckpt(client, allocation_headers(master, trial), ckpt_body(trial, 10))
        client.post("/api/v1/models", headers=admin, json={"name": "m"}).raise_for_status()
        client.post("/api/v1/models/m/versions", headers=admin, json={"checkpointUuid": ckpt}).raise_for_status()
        make_user(client, admin, "plain")
        yield master, app, [result.ok() for result in schemathesis.openapi.from_asgi("/openapi.json", app)
                            .get_all_operations()]
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


def _modes(operation: Any) -> list[GenerationMode]:
    """Positive always; negative where the operation has something to break. schemathesis' own
    choice of what a negative case may break (a path id of plain `type: string` cannot be: any
    string is valid on the wire) finds nothing for an id-only route, and its generator then rejects
    every draw until hypothesis gives up: 459 rejected draws and no request for each such route, the
    largest single cost of the run before this check."""
    everywhere = dict.fromkeys((ParameterLocation.PATH, ParameterLocation.HEADER, ParameterLocation.COOKIE,
                                ParameterLocation.QUERY))
    breakable = _draw_negated_locations(lambda _strategy: True, operation, GenerationMode.NEGATIVE,
                                        explicit=everywhere, body_is_generated=True)
    return [GenerationMode.POSITIVE] + ([GenerationMode.NEGATIVE] if breakable is not None else [])


def _fuzz(master: Any, operation: Any, failures: list[str]) -> int:
    """Send EXAMPLES generated requests of one operation, each in a generation mode and as a caller
    drawn with it (one session per caller for the operation: a session per request cost a database
    write each); returns how many requests were sent. Failures are collected (one per operation), not raised,
    so one run reports every operation that misbehaves. No shrinking (Phase.shrink): a CI gate
    needs the failing request, which the report carries, not the smallest one; derandomized, so a
    run is reproducible."""
    sent = 0
    tokens: dict[str, str] = {}

    modes = st.one_of([operation.as_strategy(generation_mode=mode) for mode in _modes(operation)])

    @given(case=modes, caller=st.sampled_from(CALLERS))
    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])
    def run(case: Any, caller: str) -> None:
        nonlocal sent
        _bounded(case)
        if caller not in tokens:
            tokens[caller] = "" if caller == "anonymous" else _token(master, caller)
        headers = {"Authorization": f"Bearer {tokens[caller]}"} if tokens[caller] else {}
        sent += 1
        case.call_and_validate(headers=headers, checks=CHECKS)

    try:
        run()
    except Unsatisfiable:
        pass  # nothing to generate in this mode
    except (Exception, BaseExceptionGroup) as exc:  # schemathesis' FailureGroup, or an error in the app
        failures.append(f"{operation.label}: {str(exc)[:2000]}")
    return sent


@pytest.mark.parametrize("shard", range(SHARDS))
def test_the_api_answers_as_documented(fuzzed_app: Any, shard: int) -> None:
    answers_as_documented(fuzzed_app, shard)


def answers_as_documented(fuzzed_app: Any, shard: int) -> None:
    """Every operation (a quarter of them per shard), valid and invalid input, as an admin, a
    plain user and unauthenticated: no 5xx, and status, content type and body as the OpenAPI
    document says. Prints the slowest operations (CPU seconds, the app's threads included)."""
    master, _app, operations = fuzzed_app
    assert len(operations) >= 70
    failures: list[str] = []
    timings = []
    started = time.monotonic()
    sent = 0
    for operation in operations[shard::SHARDS]:
        begun = time.process_time()
        sent_now = _fuzz(master, operation, failures)
        sent += sent_now
        timings.append((time.process_time() - begun, sent_now, operation.label))
    print(f"schemathesis shard {shard}: {len(timings)} operations, {EXAMPLES} examples each, {sent} requests, "
          f"{time.monotonic() - started:.1f} s")
    for cpu_s, sent_now, label in sorted(timings, reverse=True)[:8]:
        print(f"  {cpu_s:6.2f} s CPU  {sent_now:3d} requests  {label}")
    assert not failures, f"{len(failures)} operations misbehaved:\n\n" + "\n\n".join(failures)


def _untyped_json_answers(spec: dict[str, Any]) -> list[str]:
    """Every 2xx JSON answer of the document whose schema is not one of the typed models."""
    found = []
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            for code, answer in op["responses"].items():
                if code.startswith("2"):
                    for media, content in (answer.get("content") or {}).items():
                        if media == "application/json" and "$ref" not in content.get("schema", {}):
                            found.append(f"{method.upper()} {path} {code}")
    return found


def test_every_json_answer_is_typed(client) -> None:  # type: ignore[no-untyped-def]
    from control_plane.api.openapi import RESPONSES

    spec = client.get("/openapi.json").json()
    assert _untyped_json_answers(spec) == []
    documented = {(m.upper(), path) for path, ops in spec["paths"].items() for m in ops}
    assert set(RESPONSES) <= documented, sorted(set(RESPONSES) - documented)  # no stale entry


def test_typed_answers_match_their_documented_schema(client, admin_headers, master) -> None:  # type: ignore[no-untyped-def]
    """Operations with a typed 200 (openapi.RESPONSES), called on real records (an experiment, its
    trial running on a registered agent, a checkpoint, a model and a version, a user): the body
    validates against the documented schema, so the document tells the truth beyond what random
    ids happen to reach. Every GET, and the writes that answer more than `{}`."""
    from jsonschema import Draft202012Validator

    from control_plane.api.openapi import RESPONSES
    from control_plane.loops import placement

    spec = client.get("/openapi.json").json()
    checked: set[tuple[str, str]] = set()

    def check(method: str, path: str, headers: dict[str, str] | None = None, **kwargs: Any) -> Any:
        url = path.format(**values)
        got = client.request(method, url, headers=admin_headers if headers is None else headers, **kwargs)
        assert got.status_code == 200, (method, url, got.text)
        documented = spec["paths"][path][method.lower()]["responses"]["200"]["content"]["application/json"]
        validator = Draft202012Validator({**documented["schema"], "components": spec["components"]})
        problems = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(got.json())]
        assert not problems, (method, url, RESPONSES[(method, path)].__name__, problems[:5])
        checked.add((method, path))
        return got.json()

    exp_id = create_ok(client, admin_headers)["experiment"]["id"]
    trial = only_trial(master, exp_id)
    trial_auth = allocation_headers(master, trial)
    ckpt = report_ckpt(client, trial_auth, ckpt_body(trial, 10))
    assert client.post("/api/v1/models", headers=admin_headers, json={"name": "m"}).status_code == 200
    r = client.post("/api/v1/models/m/versions", headers=admin_headers, json={"checkpointUuid": ckpt})
    assert r.status_code == 200, r.text
    values: dict[str, Any] = {"experimentId": exp_id, "trialId": trial.id, "id": exp_id, "checkpointUuid": ckpt,
                              "modelName": "m", "modelVersionNum": 1, "username": "admin", "name": "default",
                              "label": "l1", "agentId": "a1", "resourcesId": "a1", "templateName": "t",
                              "workspaceId": 1, "projectId": 1}
    check("POST", "/api/v1/templates/{templateName}", json={"name": "t", "config": {"max_restarts": 1}})
    # An agent enrols and the trial is placed on it: the commands carry a start with its task spec.
    pool_token = check("POST", "/api/v1/agents/tokens", json={"resourcePool": "default"})["token"]
    enrolled = check("POST", "/api/v1/agents/register", headers={"Authorization": f"Bearer {pool_token}"}, json={
        "agentId": "a1", "resourcePool": "default", "slots": [{"id": "0", "type": "cpu"}]})
    placement.tick(master)
    agent_auth = {"Authorization": f"Bearer {enrolled['agentCredential']}"}
    (start,) = check("GET", "/api/v1/agents/{agentId}/commands", headers=agent_auth,
                     params={"sessionId": enrolled["sessionId"], "timeoutSeconds": 0})["commands"]
    values["allocationId"] = start["allocationId"]
    check("POST", "/api/v1/agents/{agentId}/events", headers=agent_auth, json={
        "sessionId": enrolled["sessionId"], "events": [{"allocationId": start["allocationId"], "type": "running"}]})
    report = {"group": "training", "metrics": {"trialId": trial.id, "trialRunId": 1, "stepsCompleted": 5,
                                               "metrics": {"avgMetrics": {"loss": 0.5}, "batchMetrics": [{"loss": 1}]}}}
    check("POST", "/api/v1/trials/{trialId}/metrics/batch", headers=trial_auth, json={"reports": [report]})
    # A command with an uploaded context and a notebook (api/ntsc.py), queued.
    context = [{"path": "hello.txt", "type": 48, "content": "aGk=", "mode": 0o644, "mtime": 0, "uid": 0, "gid": 0}]
    cmd = check("POST", "/api/v1/commands", json={"config": {"entrypoint": ["true"], "resources": {"slots": 0}},
                                                  "files": context})["command"]
    nb = check("POST", "/api/v1/notebooks", json={"config": {"resources": {"slots": 0}}})["notebook"]
    tb = check("POST", "/api/v1/tensorboards", json={"experimentIds": [exp_id],
                                                     "config": {"resources": {"slots": 0}}})["tensorboard"]
    shell = check("POST", "/api/v1/shells", json={"config": {"resources": {"slots": 0}}})["shell"]
    values.update(commandId=cmd["id"], notebookId=nb["id"], taskId=cmd["id"], tensorboardId=tb["id"],
                  shellId=shell["id"])
    me = check("GET", "/api/v1/me")
    values["userId"] = me["user"]["id"]
    values["groupId"] = check("POST", "/api/v1/groups", json={"name": "typed-group"})["group"]["groupId"]
    values["resourcePoolName"] = "default"
    for (method, path) in RESPONSES:
        if method == "GET" and (method, path) not in checked:
            check(method, path, headers=trial_auth if "/searcher/" in path or "/signals/" in path else None)
    # The rendezvous with the allocation's own token (the trial process asks it).
    check("GET", "/api/v1/allocations/{allocationId}/resources/{resourcesId}/rendezvous",
          headers={"Authorization": f"Bearer {start['spec']['token']}"})
    check("POST", "/api/v1/experiments", json={"config": client.get(f"/api/v1/experiments/{exp_id}",
                                                                      headers=admin_headers).json()["experiment"]["originalConfig"],
                                               "validateOnly": True})
    check("PATCH", "/api/v1/experiments/{experimentId}", json={"notes": "n"})
    check("PUT", "/api/v1/experiments/{experimentId}/labels/{label}")
    check("DELETE", "/api/v1/experiments/{experimentId}/labels/{label}")
    check("POST", "/api/v1/checkpoints/{checkpointUuid}/metadata", json={"checkpoint": {"metadata": {"k": "v"}}})
    plain = check("POST", "/api/v1/users", json={"user": {"username": "typed"}, "password": "typed-password-1"})
    values["userId"] = plain["user"]["id"]
    check("PATCH", "/api/v1/users/{userId}", json={"displayName": "T"})
    check("POST", "/api/v1/users/{userId}/password", json="typed-password-2")
    login_answer = check("POST", "/api/v1/auth/login", headers={}, json={"username": "typed", "password": "typed-password-2"})
    check("POST", "/api/v1/auth/logout", headers={"Authorization": f"Bearer {login_answer['token']}"})
    check("DELETE", "/api/v1/agents/{agentId}/enrolment")
    check("POST", "/api/v1/commands/{commandId}/kill")
    check("POST", "/api/v1/notebooks/{notebookId}/kill")
    check("POST", "/api/v1/shells/{shellId}/kill")
    check("POST", "/api/v1/tensorboards/{tensorboardId}/kill")
    gets = {k for k in RESPONSES if k[0] == "GET"}
    assert gets <= checked and len(checked) >= len(gets) + 16
