"""The allowlist of what a host process hands on (shipyard_common/host_env.py): the local provider's
agents get none of the master's secrets (tests/provisioners/test_local_agent_env.py: the master's side,
Python 3.11+), an agent's process-runtime tasks none of the agent's. Run on every agent Python."""

from __future__ import annotations

from agent_bootstrap.agent.daemon import task_environment
from shipyard_common import host_env
from shipyard_common.agent_protocol import TaskSpec

MASTER_ENV = {
    "PATH": "/usr/bin", "HOME": "/root", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TZ": "UTC",
    "PYTHONPATH": "/src", "https_proxy": "http://proxy:3128", "SSL_CERT_FILE": "/etc/ca.pem",
    "STORAGE_EMULATOR_HOST": "http://127.0.0.1:9023", "AWS_ENDPOINT_URL_S3": "http://moto:5000",
    "AWS_DEFAULT_REGION": "us-east-1", "NCCL_SOCKET_IFNAME": "eth0", "SHIPYARD_RETRY_WAIT_MAX_S": "1",
    "HF_HOME": "/mnt/cache/hf", "HF_HUB_OFFLINE": "1", "HF_TOKEN": "hf_secret", "WANDB_API_KEY": "wandb-secret",
    # secrets and settings that are nobody else's business
    "SHIPYARD_DB_URL": "postgresql://shipyard:dbpw@db/shipyard", "SHIPYARD_ADMIN_PASSWORD": "pw",
    "SHIPYARD_TOKEN_SECRET_FILE": "/etc/shipyard/key", "AWS_ACCESS_KEY_ID": "AKIA", "AWS_SECRET_ACCESS_KEY": "sk",
    "AWS_SESSION_TOKEN": "st", "AWS_PROFILE": "admin", "GOOGLE_APPLICATION_CREDENTIALS": "/root/sa.json",
    "GITHUB_TOKEN": "ghp", "DOCKER_HOST": "unix:///run/docker.sock", "DET_AGENT_TOKEN": "agent-token",
    "DET_AGENT_AGENT_RECONNECT_BACKOFF_MAX": "1",
}
SECRETS = {"SHIPYARD_DB_URL", "SHIPYARD_ADMIN_PASSWORD", "SHIPYARD_TOKEN_SECRET_FILE", "AWS_ACCESS_KEY_ID",
           "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "GOOGLE_APPLICATION_CREDENTIALS", "GITHUB_TOKEN",
           "HF_TOKEN", "WANDB_API_KEY"}
BASICS = {"PATH", "HOME", "LANG", "LC_ALL", "TZ", "PYTHONPATH", "https_proxy", "SSL_CERT_FILE", "STORAGE_EMULATOR_HOST",
          "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION", "NCCL_SOCKET_IFNAME", "SHIPYARD_RETRY_WAIT_MAX_S", "HF_HOME",
          "HF_HUB_OFFLINE"}


def test_tasks_inherit_the_host_basics_and_storage_endpoints_never_credentials_or_settings() -> None:
    assert set(host_env.inherited(MASTER_ENV)) == BASICS


def test_a_process_task_gets_the_allowlist_its_spec_and_the_agents_additions() -> None:
    spec = TaskSpec(allocation_id="a.1", entrypoint=["true"], env={
        "DET_ALLOCATION_ID": "a.1", "AWS_ACCESS_KEY_ID": "the-experiments-own", "PATH": "/venv/bin:/bin"})
    env = task_environment(MASTER_ENV, spec, [], "agent-1")
    assert not (SECRETS - {"AWS_ACCESS_KEY_ID"}) & set(env)
    assert "DET_AGENT_TOKEN" not in env and "DOCKER_HOST" not in env
    # what the experiment asks for (environment_variables reach the spec) is its to have
    assert env["AWS_ACCESS_KEY_ID"] == "the-experiments-own" and env["PATH"] == "/venv/bin:/bin"
    assert env["STORAGE_EMULATOR_HOST"] == "http://127.0.0.1:9023" and env["DET_AGENT_ID"] == "agent-1"
