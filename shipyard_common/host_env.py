"""What a host process hands on of its own environment to the processes it starts for others: the
local provider to its agents (the master's environment), an agent to its process-runtime tasks.

An allowlist, decided per class of variable, because these environments hold secrets (the
master's SHIPYARD_DB_URL, SHIPYARD_ADMIN_PASSWORD, its cloud keys; the agent's DET_AGENT_TOKEN):

  inherited   the host's basics (PATH, HOME, USER, LANG, LC_*, TZ, TMPDIR, TERM), the Python
              environment (PYTHONPATH, VIRTUAL_ENV), libraries and GPUs (LD_LIBRARY_PATH,
              CUDA_HOME, NCCL_*), the network (proxies, SSL_CERT_FILE and the CA bundles), where
              storage is but never who may use it (STORAGE_EMULATOR_HOST, AWS_ENDPOINT_URL*,
              AWS_REGION, GOOGLE_CLOUD_PROJECT, GCE_METADATA_HOST) and the harness's own tuning
              (SHIPYARD_RETRY_WAIT_MAX_S, SHIPYARD_METRICS_*; harness/core/_session.py, _reporter.py),
              the machine's model caches, mirrors and offline switches (HF_HOME, TORCH_HOME,
              XDG_CACHE_HOME, HF_ENDPOINT, HF_HUB_OFFLINE ...), OMP_NUM_THREADS, a conda prefix;
  not         everything else: credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
              AWS_SESSION_TOKEN, AWS_PROFILE, GOOGLE_APPLICATION_CREDENTIALS ...), the master's
              SHIPYARD_* settings, the agent's DET_AGENT_* settings, anything unknown. A task gets
              storage credentials from its checkpoint_storage config, its
              environment.environment_variables, or the machine's instance role (the metadata
              service), as in Determined.
"""

from __future__ import annotations

from collections.abc import Mapping

_NAMES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM",
    "PYTHONPATH", "VIRTUAL_ENV", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH",
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "no_proxy", "all_proxy",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
    "STORAGE_EMULATOR_HOST", "GOOGLE_CLOUD_PROJECT", "GCE_METADATA_HOST", "GCE_METADATA_IP",
    "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_CA_BUNDLE",
    "SHIPYARD_RETRY_WAIT_MAX_S", "SHIPYARD_METRICS_FLUSH_TIMEOUT_S", "SHIPYARD_METRICS_SPOOL_MAX_BYTES",
    # Where the machine keeps model and compiler caches (a shared disk on a GPU host), its mirrors
    # and offline switches, threads per process, a conda environment: no credentials among them
    # (HF_TOKEN, WANDB_API_KEY, PIP_INDEX_URL with a password belong in environment_variables).
    "HF_HOME", "HF_HUB_CACHE", "HF_DATASETS_CACHE", "TRANSFORMERS_CACHE", "TORCH_HOME", "XDG_CACHE_HOME",
    "TRITON_CACHE_DIR", "HF_ENDPOINT", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE",
    "OMP_NUM_THREADS", "CONDA_PREFIX", "CONDA_DEFAULT_ENV",
})
_PREFIXES = ("LC_", "NCCL_", "AWS_ENDPOINT_URL")

# What the local provider's agents need on top: their own settings and their Docker engine.
AGENT_PREFIXES = ("DET_AGENT_",)
AGENT_NAMES = frozenset({"DOCKER_HOST", "DOCKER_CERT_PATH", "DOCKER_TLS_VERIFY"})


def inherited(env: Mapping[str, str]) -> dict[str, str]:
    """The part of `env` a started process inherits (the allowlist above)."""
    return {k: v for k, v in env.items() if k in _NAMES or k.startswith(_PREFIXES)}


def for_agent(env: Mapping[str, str]) -> dict[str, str]:
    """What an agent process started by the master's machine gets of the master's environment:
    what tasks inherit, plus the agent's own DET_AGENT_* settings and Docker engine address."""
    out = inherited(env)
    out.update({k: v for k, v in env.items() if k in AGENT_NAMES or k.startswith(AGENT_PREFIXES)})
    return out
