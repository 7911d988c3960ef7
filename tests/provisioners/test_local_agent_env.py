"""The local provider's agents get an allowlist of the master's environment (shipyard_common/host_env.py):
their own settings, none of the master's secrets."""

from __future__ import annotations

import os

import pytest

from provisioners import local
from tests.shipyard_common.test_host_env import BASICS, MASTER_ENV


def test_local_provider_agents_get_their_own_settings_and_none_of_the_masters_secrets(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "environ", dict(MASTER_ENV))
    env = local._agent_env()
    assert set(env) == BASICS | {"DOCKER_HOST", "DET_AGENT_TOKEN", "DET_AGENT_AGENT_RECONNECT_BACKOFF_MAX"}
    assert env["PATH"] == "/usr/bin"
