"""The token key lives outside the database, and the master's state is private (0600 files, 0700
directories), on SQLite and PostgreSQL.

The regression: the key allocation tokens are derived from was a row of `cluster_info` in a
world-readable `shipyard.db`, so anyone who could read the file could compute
HMAC(key, "allocation:" + id) for any allocation id (which every user can list) and act as that trial."""

from __future__ import annotations

import hashlib
import hmac
import stat
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import MetaData, create_engine, select

from control_plane import auth
from control_plane.api.app import create_app
from control_plane.config import load_config
from control_plane.db.engine import transaction
from control_plane.db.models import Allocation, ClusterInfo, Token
from control_plane.master import Master
from control_plane.services import allocations
from tests.conftest import ADMIN_PASSWORD, LiveMaster
from tests.control_plane.services.builders import create_experiment


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def issue_token_of_a_running_trial(master: Master) -> tuple[Allocation, str]:
    """What placement does for a trial it starts: its allocation's token, recorded by hash."""
    create_experiment(master)
    with transaction(master.sessions) as s:
        alloc = s.scalar(select(Allocation))
        return alloc, allocations.ensure_allocation_token(s, master, alloc)


def every_text_in_the_database(db_url: str) -> list[str]:
    """Everything an attacker with a copy of the database can read: each text value of each row."""
    engine = create_engine(db_url)
    meta = MetaData()
    meta.reflect(engine)
    found = []
    with engine.connect() as c:
        for table in meta.sorted_tables:
            for row in c.execute(table.select()):
                found += [v for v in row if isinstance(v, str) and v]
    engine.dispose()
    return found


def candidate_keys(text: str) -> list[bytes]:
    keys = [text.encode()]
    try:
        keys.append(bytes.fromhex(text))
    except ValueError:
        pass
    return keys


def test_a_copy_of_the_database_mints_no_allocation_token(master: Master, db_url: str) -> None:
    alloc, real = issue_token_of_a_running_trial(master)
    with TestClient(create_app(master)) as client:
        url = f"/api/v1/trials/{alloc.trial_id}/searcher/operation"
        assert client.get(url, headers={"Authorization": f"Bearer {real}"}).status_code == 200
        texts = every_text_in_the_database(db_url)
        assert texts, "the database was read"
        forged = {hmac.new(key, f"allocation:{alloc.id}".encode(), hashlib.sha256).hexdigest()
                  for text in texts for key in candidate_keys(text)}
        assert real not in forged
        for token in forged:
            assert client.get(url, headers={"Authorization": f"Bearer {token}"}).status_code == 401
    with master.read_sessions() as s:
        assert s.get(ClusterInfo, "token_secret") is None
    key_hex = master.token_secret.hex()
    assert master.config.token_secret_path.read_text().strip() == key_hex
    if db_url.startswith("sqlite"):
        db_file = Path(db_url.split("///", 1)[1])
        raw = b"".join(p.read_bytes() for p in db_file.parent.glob(db_file.name + "*"))
        assert key_hex.encode() not in raw and master.token_secret not in raw


def test_the_masters_state_is_private(master: Master, db_url: str) -> None:
    state = master.config.state_dir
    assert mode(state) == 0o700
    assert mode(master.config.token_secret_path) == 0o600
    if db_url.startswith("sqlite"):
        db_file = Path(db_url.split("///", 1)[1])
        files = sorted(db_file.parent.glob(db_file.name + "*"))  # the database, its -wal and -shm
        assert db_file in files
        for f in files:
            assert mode(f) == 0o600, f


def test_an_old_database_loses_its_key_and_running_trials_keep_theirs(master_config, db_url: str) -> None:  # type: ignore[no-untyped-def]
    # An older master: the key in cluster_info, no key file, a trial running with a token from it.
    old = Master(master_config)
    old.prepare()
    legacy = bytes(range(32))
    with transaction(old.sessions) as s:
        s.add(ClusterInfo(key="token_secret", value=legacy.hex()))
    old.token_secret = legacy
    alloc, running_token = issue_token_of_a_running_trial(old)
    old.stop()
    master_config.token_secret_path.unlink()
    if db_url.startswith("sqlite"):
        Path(db_url.split("///", 1)[1]).chmod(0o644)  # as older versions created it

    m = Master(master_config)
    m.prepare()
    try:
        with m.read_sessions() as s:
            assert s.get(ClusterInfo, "token_secret") is None
            # the running trial's token still works: its hash is in the database
            assert auth.resolve_token(s, running_token, now=m.clock()) is not None
        assert mode(master_config.token_secret_path) == 0o600
        if db_url.startswith("sqlite"):
            assert mode(Path(db_url.split("///", 1)[1])) == 0o600
        # The old key, readable by anyone who had the old file, mints nothing new.
        assert m.token_secret != legacy
        create_experiment(m)
        with transaction(m.sessions) as s:
            fresh = s.scalar(select(Allocation).where(Allocation.id != alloc.id))
            token = allocations.ensure_allocation_token(s, m, fresh)
        assert token != hmac.new(legacy, f"allocation:{fresh.id}".encode(), hashlib.sha256).hexdigest()
        # the start command is repeated: the same token, recorded once
        with transaction(m.sessions) as s:
            assert allocations.ensure_allocation_token(s, m, fresh) == token
            assert len(s.scalars(select(Token).where(Token.allocation_id == fresh.id)).all()) == 1
    finally:
        m.stop()


def test_masters_sharing_a_database_share_the_key_file(db_url: str, tmp_path: Path) -> None:
    shared = tmp_path / "secrets" / "token-secret"
    env = {"SHIPYARD_TOKEN_SECRET_FILE": str(shared)}
    masters = [Master(load_config(env=env, db_url=db_url, state_dir=str(tmp_path / f"m{i}"),
                                  admin_password=ADMIN_PASSWORD)) for i in range(2)]
    try:
        for m in masters:
            m.prepare()
        assert masters[0].token_secret == masters[1].token_secret == bytes.fromhex(shared.read_text())
        assert not (tmp_path / "m0" / "token-secret").exists()
        alloc, token = issue_token_of_a_running_trial(masters[0])
        with transaction(masters[1].sessions) as s:
            assert allocations.ensure_allocation_token(s, masters[1], s.get(Allocation, alloc.id)) == token
    finally:
        for m in masters:
            m.stop()


def test_a_bad_key_file_stops_the_master_with_its_name(master_config) -> None:  # type: ignore[no-untyped-def]
    master_config.token_secret_path.parent.mkdir(parents=True, exist_ok=True)
    master_config.token_secret_path.write_text("short\n")
    m = Master(master_config)
    try:
        with pytest.raises(SystemExit) as err:
            m.prepare()
        assert str(master_config.token_secret_path) in str(err.value)
    finally:
        m.stop()


@pytest.mark.integration
def test_a_real_master_creates_its_state_private(db_url: str, tmp_path: Path) -> None:
    if db_url.startswith("sqlite"):
        db_url = f"sqlite:///{tmp_path / 'fresh' / 'db' / 'shipyard.db'}"  # a directory that does not exist yet
    lm = LiveMaster(db_url, tmp_path / "state")
    lm.start()
    try:
        assert mode(tmp_path / "state" / "token-secret") == 0o600
        if db_url.startswith("sqlite"):
            assert mode(tmp_path / "fresh") == mode(tmp_path / "fresh" / "db") == 0o700
            for f in (tmp_path / "fresh" / "db").iterdir():  # the database, its -wal and -shm
                assert mode(f) == 0o600, f
    finally:
        lm.stop()
