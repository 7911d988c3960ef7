"""`security.tls` (cert and key): the master serves HTTPS on its port, as one process and with API
workers; a half-given pair or a missing file is one config error."""

from __future__ import annotations

import ssl
from pathlib import Path

import certifi
import httpx
import pytest
import yaml

from control_plane.config import ConfigError, load_config
from tests.conftest import LiveMaster
from tests.tls_certs import self_signed


@pytest.mark.parametrize("workers", [1, 2])
def test_the_master_serves_https_with_its_certificate(tmp_path: Path, workers: int,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    cert, key = self_signed(tmp_path / "tls")
    config = tmp_path / "master.yaml"
    config.write_text(yaml.safe_dump({"security": {"tls": {"cert": str(cert), "key": str(key)}},
                                      "api_workers": workers}))
    m = LiveMaster(f"sqlite:///{tmp_path / 'db.sqlite'}", tmp_path / "state", config_path=config)
    m.url = f"https://127.0.0.1:{m.port}"
    # LiveMaster.start polls with httpx's defaults, which read SSL_CERT_FILE: trust the test's certificate.
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    try:
        m.start(timeout=60)
        ctx = ssl.create_default_context(cafile=str(cert))
        r = httpx.get(f"{m.url}/api/v1/master", verify=ctx, timeout=10)
        assert r.status_code == 200 and r.json()["clusterName"]
        # The certificate is checked: a client that does not trust it is refused...
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            httpx.get(f"{m.url}/api/v1/master", verify=ssl.create_default_context(cafile=certifi.where()), timeout=10)
        # ...and the port speaks nothing but TLS.
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{m.port}/api/v1/master", timeout=5)
        assert "url=https://" in m.log_path.read_text()
    finally:
        m.stop()


def test_tls_config_is_both_files_or_neither(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    cfg = load_config(env={}, security={"tls": {"cert": str(cert), "key": str(key)}})
    assert cfg.tls and cfg.advertised_url.startswith("https://")
    assert not load_config(env={}).tls and load_config(env={}).advertised_url.startswith("http://")
    with pytest.raises(ConfigError, match=r"security\.tls.*give both or neither"):
        load_config(env={}, security={"tls": {"cert": str(cert)}})
    with pytest.raises(ConfigError, match=r"security\.tls.*key: .*nope.pem is not a readable file"):
        load_config(env={}, security={"tls": {"cert": str(cert), "key": str(tmp_path / "nope.pem")}})
