"""`PATCH /api/v1/models/{name}` as Determined 0.38.1 has it (body: a v1PatchModel): description,
labels, metadata (replaced whole) and notes, by the model's owner or an admin; on SQLite and
PostgreSQL (the `client` fixture)."""

from __future__ import annotations

from tests.conftest import login
from tests.ui.test_ui_http import make_user


def test_patch_model_changes_what_it_names_for_owner_or_admin(client, admin_headers) -> None:  # type: ignore[no-untyped-def]
    make_user(client, admin_headers, "bob")
    bob = login(client, "bob", "bob-password-1")
    make_user(client, admin_headers, "eve", "eve-password-1")
    eve = login(client, "eve", "eve-password-1")
    r = client.post("/api/v1/models", headers=bob, json={"name": "m1", "description": "old", "labels": ["a"],
                                                         "metadata": {"k": 1}, "notes": "n0"})
    assert r.status_code == 200, r.text
    r = client.patch("/api/v1/models/m1", headers=bob, json={"description": "new", "metadata": {"k": 2, "z": [1]}})
    assert r.status_code == 200, r.text
    m = r.json()["model"]
    # Named fields change; absent ones (labels, notes) are kept.
    assert (m["description"], m["metadata"], m["labels"], m["notes"]) == ("new", {"k": 2, "z": [1]}, ["a"], "n0")
    r = client.patch("/api/v1/models/m1", headers=admin_headers,
                     json={"labels": ["x", "y", "x"], "notes": "# notes", "description": None, "name": "m1"})
    assert r.status_code == 200, r.text
    got = client.get("/api/v1/models/m1", headers=eve).json()["model"]
    assert (got["description"], got["labels"], got["notes"]) == ("new", ["x", "y"], "# notes")
    # Another user is refused and nothing changes; a rename, bad input and an unknown model say why.
    r = client.patch("/api/v1/models/m1", headers=eve, json={"description": "mine"})
    assert r.status_code == 403 and "belongs to another user" in r.json()["message"], r.text
    assert client.get("/api/v1/models/m1", headers=eve).json()["model"]["description"] == "new"
    for body, field in (({"name": "m2"}, "name"), ({"metadata": [1]}, "metadata"),
                        ({"description": "d" * 10_001}, "description"), ({"labels": [""]}, "labels[0]")):
        r = client.patch("/api/v1/models/m1", headers=bob, json=body)
        assert r.status_code == 400 and field in r.text, (body, r.text)
    assert client.patch("/api/v1/models/nope", headers=bob, json={"notes": "x"}).status_code == 404
