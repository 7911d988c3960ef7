"""Secrets in stored configs are never shown back (core/expconf/secrets.py): the image registry's
credentials (`environment.registry_auth`) and the storage secret key, in every answer that carries a
config (experiment get, which `det e config` reads, and list, validate-only, trial get, command get,
list and launch, a workspace's storage), to another user and to the owner alike, while the row keeps
them for the agents. Both databases (the `client` fixture)."""

from __future__ import annotations

import json

from control_plane.db.models import Experiment, Task
from tests.control_plane.api.test_experiments import CONFIG, create_ok, make_user

SECRETS = ("hunter2", "YWxpY2U6aHVudGVyMg==", "id-token-1", "reg-token-1", "s3cr3t/VALUE")
REGISTRY_AUTH = {"username": "alice", "password": "hunter2", "auth": "YWxpY2U6aHVudGVyMg==",
                 "identitytoken": "id-token-1", "registrytoken": "reg-token-1", "serveraddress": "registry.example"}
STORAGE = {"type": "s3", "bucket": "ckpts", "access_key": "AKID", "secret_key": "s3cr3t/VALUE"}


def _no_secret(answer: object) -> None:
    text = json.dumps(answer)
    assert not [s for s in SECRETS if s in text], text


def test_registry_credentials_and_storage_keys_are_hidden_from_owner_and_others(client, admin_headers, master) -> None:  # type: ignore[no-untyped-def]
    owner, other = make_user(client, admin_headers, "owner"), make_user(client, admin_headers, "other")
    # Written as a user writes it: originalConfig is this text, redacted.
    config = CONFIG + (
        "environment:\n  image: registry.example/private:1\n  registry_auth:\n"
        + "".join(f"    {k}: {v}\n" for k, v in REGISTRY_AUTH.items())
        + "checkpoint_storage:\n" + "".join(f"  {k}: {v}\n" for k, v in STORAGE.items()))
    created = create_ok(client, owner, config)
    _no_secret(created)
    exp_id = created["experiment"]["id"]
    shown = created["experiment"]["config"]["environment"]["registry_auth"]
    assert shown == {**REGISTRY_AUTH, "email": None, "password": "********", "auth": "********", "identitytoken": "********",
                     "registrytoken": "********"}
    assert "password: \"********\"" in created["experiment"]["originalConfig"]
    _no_secret(create_ok(client, owner, config, validateOnly=True))
    cmd = client.post("/api/v1/commands", headers=owner, json={"config": {
        "entrypoint": ["true"], "resources": {"slots": 0},
        "environment": {"image": "registry.example/private:1", "registry_auth": REGISTRY_AUTH}}})
    assert cmd.status_code == 200, cmd.text
    _no_secret(cmd.json())
    cmd_id = cmd.json()["command"]["id"]
    assert cmd.json()["config"]["environment"]["registry_auth"]["username"] == "alice"
    trials = client.get(f"/api/v1/experiments/{exp_id}/trials", headers=owner).json()["trials"]
    for who in (owner, other):
        for path in (f"/api/v1/experiments/{exp_id}", "/api/v1/experiments", f"/api/v1/trials/{trials[0]['id']}",
                     f"/api/v1/commands/{cmd_id}", "/api/v1/commands"):
            r = client.get(path, headers=who)
            assert r.status_code == 200, (path, r.text)
            _no_secret(r.json())
    # a workspace's storage (every user lists workspaces) and an experiment that takes it
    ws = client.post("/api/v1/workspaces", headers=admin_headers, json={"name": "team", "checkpointStorageConfig": STORAGE})
    assert ws.status_code == 200, ws.text
    _no_secret(ws.json())
    for who in (admin_headers, other):
        for path in ("/api/v1/workspaces", f"/api/v1/workspaces/{ws.json()['workspace']['id']}"):
            r = client.get(path, headers=who)
            assert r.status_code == 200 and "AKID" in r.text, (path, r.text)
            _no_secret(r.json())
    # the stored copies keep them: the agent pulls the image with them
    with master.sessions() as s:
        assert s.get(Experiment, exp_id).config["environment"]["registry_auth"]["password"] == "hunter2"
        assert s.get(Task, cmd_id).config["environment"]["registry_auth"]["password"] == "hunter2"


def test_a_config_shown_back_and_saved_again_keeps_its_secrets_or_is_refused(client, admin_headers, master) -> None:  # type: ignore[no-untyped-def]
    """`det template describe` then `det template set`, a workspace's storage read and sent back:
    the placeholder stands for the same record's stored secret and keeps it. Where no stored value
    stands behind it (a new experiment, command, template or workspace), it is refused with the field,
    never stored as the secret."""
    from control_plane.db.models import ConfigTemplate, Workspace
    from tests.control_plane.api.test_experiments import create

    tpl = {"checkpoint_storage": STORAGE, "environment": {"registry_auth": REGISTRY_AUTH}}
    assert client.post("/api/v1/templates/t1", headers=admin_headers, json={"name": "t1", "config": tpl}).status_code == 200
    shown = client.get("/api/v1/templates/t1", headers=admin_headers).json()["template"]["config"]
    _no_secret(shown)
    shown["description"] = "edited"
    r = client.patch("/api/v1/templates/t1", headers=admin_headers, json=shown)
    assert r.status_code == 200, r.text
    with master.sessions() as s:
        stored = s.get(ConfigTemplate, "t1").config
    assert stored["checkpoint_storage"] == STORAGE and stored["description"] == "edited"
    assert stored["environment"]["registry_auth"]["password"] == "hunter2"
    ws = client.post("/api/v1/workspaces", headers=admin_headers, json={"name": "w1", "checkpointStorageConfig": STORAGE})
    ws_id = ws.json()["workspace"]["id"]
    storage = client.get(f"/api/v1/workspaces/{ws_id}", headers=admin_headers).json()["workspace"]["checkpointStorageConfig"]
    assert storage["secret_key"] == "********"
    r = client.patch(f"/api/v1/workspaces/{ws_id}", headers=admin_headers, json={"checkpointStorageConfig": storage})
    assert r.status_code == 200, r.text
    with master.sessions() as s:
        assert s.get(Workspace, ws_id).checkpoint_storage["secret_key"] == "s3cr3t/VALUE"
    # Not to another destination: whoever may edit the record must not send the secret elsewhere.
    moved = {**shown, "environment": {"registry_auth": {**shown["environment"]["registry_auth"],
                                                          "serveraddress": "registry.attacker"}}}
    r = client.patch("/api/v1/templates/t1", headers=admin_headers, json=moved)
    assert r.status_code == 400 and "config.environment.registry_auth.password" in r.text, r.text
    r = client.patch(f"/api/v1/workspaces/{ws_id}", headers=admin_headers,
                     json={"checkpointStorageConfig": {**storage, "endpoint_url": "http://attacker:9000"}})
    assert r.status_code == 400 and "checkpointStorageConfig.secret_key" in r.text, r.text
    # Nothing behind the placeholder: refused, naming the field.
    hidden_storage = {**STORAGE, "secret_key": "********"}
    refusals = (
        (create(client, admin_headers, CONFIG + "checkpoint_storage:\n" + "".join(
            f"  {k}: '{v}'\n" for k, v in hidden_storage.items())), "config.checkpoint_storage.secret_key"),
        (client.post("/api/v1/commands", headers=admin_headers, json={"config": {
            "entrypoint": ["true"], "environment": {"registry_auth": {**REGISTRY_AUTH, "password": "********"}}}}),
         "config.environment.registry_auth.password"),
        (client.post("/api/v1/templates/t2", headers=admin_headers,
                     json={"name": "t2", "config": {"checkpoint_storage": hidden_storage}}),
         "config.checkpoint_storage.secret_key"),
        (client.post("/api/v1/workspaces", headers=admin_headers,
                     json={"name": "w2", "checkpointStorageConfig": hidden_storage}),
         "checkpointStorageConfig.secret_key"))
    for r, field in refusals:
        assert r.status_code == 400 and "placeholder shown for a hidden secret" in r.text, r.text
        assert field in [d["field"] for d in r.json()["details"]], r.json()
