"""`GET /checkpoints/{uuid}`: a checkpoint's files as one archive, read by the master from the
checkpoint's storage (what Determined's `det checkpoint download --mode master` fetches; the real
client against S3 and GCS is in tests/compat/)."""

from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path

from control_plane.core import states as st
from control_plane.db.engine import transaction
from control_plane.db.models import Checkpoint
from tests.control_plane.api.test_checkpoints import ckpt_body, report_ckpt
from tests.control_plane.api.test_experiments import CONFIG, allocation_headers, create_ok, only_trial


def test_download_through_the_master(client, admin_headers, master, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # The cluster's own root: another host path needs allow_task_host_access (test_storage_host_access).
    tmp_path = Path(master.config.default_checkpoint_storage["host_path"])
    config = CONFIG + f"checkpoint_storage:\n  type: shared_fs\n  host_path: {tmp_path}\n"
    trial = only_trial(master, create_ok(client, admin_headers, config)["experiment"]["id"])
    uuid = report_ckpt(client, allocation_headers(master, trial), ckpt_body(trial, 10))
    (tmp_path / uuid / "opt").mkdir(parents=True)
    (tmp_path / uuid / "model.pt").write_bytes(b"m" * 1000)
    (tmp_path / uuid / "opt" / "state.pt").write_bytes(b"s" * 24)

    r = client.get(f"/checkpoints/{uuid}", headers={**admin_headers, "Accept": "application/gzip"})
    assert r.status_code == 200 and r.headers["content-type"] == "application/gzip", r.text
    with tarfile.open(fileobj=io.BytesIO(r.content)) as tf:
        files = {m.name: tf.extractfile(m).read() for m in tf.getmembers() if m.isfile()}  # type: ignore[union-attr]
    assert files == {"model.pt": b"m" * 1000, "opt/state.pt": b"s" * 24}

    r = client.get(f"/checkpoints/{uuid}", headers={**admin_headers, "Accept": "application/zip"})
    assert r.status_code == 200 and r.headers["content-type"] == "application/zip"
    assert sorted(zipfile.ZipFile(io.BytesIO(r.content)).namelist()) == ["model.pt", "opt/", "opt/state.pt"]

    bad = client.get(f"/checkpoints/{uuid}", headers={**admin_headers, "Accept": "text/html"})
    assert bad.status_code == 400 and "Accept" in bad.text
    assert client.get(f"/checkpoints/{uuid}").status_code == 401
    missing = client.get("/checkpoints/00000000-0000-4000-8000-000000000000", headers=admin_headers)
    assert missing.status_code == 404

    # Files gone from the storage: 404; a deleted checkpoint: 409 with its state.
    (tmp_path / uuid / "model.pt").unlink()
    (tmp_path / uuid / "opt" / "state.pt").unlink()
    (tmp_path / uuid / "opt").rmdir()
    (tmp_path / uuid).rmdir()
    assert client.get(f"/checkpoints/{uuid}", headers=admin_headers).status_code == 404
    with transaction(master.sessions) as s:
        s.get(Checkpoint, uuid).state = st.CheckpointState.DELETED
    gone = client.get(f"/checkpoints/{uuid}", headers=admin_headers)
    assert gone.status_code == 409 and "STATE_DELETED" in gone.text
