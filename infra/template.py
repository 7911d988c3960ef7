"""`det deploy aws|gcp up --master-config-template PATH`: master.yaml settings of the user's, merged over
the master.yaml the stack renders (Determined's `--master-config-template-path`, which there is a
whole master.yaml template; here it is the part the user wants different, so a new `det deploy` still
brings its own pools, database and storage).

The rule: one value, one place.

- Mappings merge key by key, the template's value winning; lists and scalars are replaced whole.
- `resource_pools` merge by `name`: an entry named `compute` or `aux` merges into that pool (its
  `scheduler.fitting_policy`, `description`, `provider.agent` options, ...); another name adds a pool
  of agents that join by themselves (no `provider:`: det deploy creates no cloud identity for it).
- What the deploy must own is refused, one line naming the key: where the master listens and how it
  is reached (`host`, `port`, `master_url`, `security`), its database and secrets (`db_url`,
  `admin_password`), its state (`state_dir`, `cluster_name`), the checkpoint storage's location
  (`type`, `bucket`, `host_path`, ...; `--shared-fs` chooses it), and the pools' cloud identity
  (region, network, subnets, security groups, IAM, tags and labels, startup script).
- What a flag sets is refused too, naming the flag (`--max-dynamic-agents`, `--scheduler-type`, ...):
  `describe`'s costs and the stack's settings stay the truth.

The merged result is checked against the master's own config model by the CLI (cli/deploy_template.py)
before any cloud call; this module stays pure (the programs import nothing from the master).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

DEPLOY_POOLS = ("compute", "aux")
_NETWORK = "det deploy's own (the cluster's address, database and secrets)"
_OWNED_TOP: dict[str, str] = {
    "host": _NETWORK, "port": _NETWORK, "master_url": _NETWORK, "security": "set by --master-tls-cert/--master-tls-key",
    "db_url": _NETWORK, "admin_password": _NETWORK + "; give --admin-password",
    "state_dir": "det deploy's own (the master's disk)", "cluster_name": "set by --cluster-id",
}
_STORAGE = "set by --shared-fs (the cluster's bucket or shared file system)"
_OWNED_STORAGE = ("type", "bucket", "host_path", "prefix", "endpoint_url", "access_key", "secret_key")
_IDENTITY = "det deploy's own (the cluster's cloud identity and network)"
_OWNED_PROVIDER: dict[str, str] = {
    **{k: _IDENTITY for k in (
        "type", "region", "project", "zones", "subnet_ids", "security_group_ids", "iam_instance_profile",
        "service_account_email", "network", "subnetwork", "network_tags", "tags", "labels", "name_prefix",
        "endpoint_url", "api_endpoint", "startup_script", "ssh_key_name", "ssh_keys", "root_device_name")},
    "instance_type": "set by --compute-agent-instance-type / --aux-agent-instance-type",
    "machine_type": "set by --compute-agent-instance-type / --aux-agent-instance-type",
    "image_id": "set by --agent-ami", "boot_disk_source_image": "det deploy's own (the agents' image)",
    "gpu_type": "set by --gpu-type", "gpu_num": "set by --gpu-num", "instance_slots": "det deploy's own",
    "spot": "set by --spot", "spot_max_price": "set by --spot-max-price",
    "min_instances": "set by --min-dynamic-agents", "max_instances": "set by --max-dynamic-agents / --max-aux-agents",
    "max_idle_agent_period": "set by --max-idle-agent-period",
    "max_agent_starting_period": "set by --max-agent-starting-period",
    "min_cpu_platform": "set by --min-cpu-platform-agent",
}
_OWNED_AGENT: dict[str, str] = {
    "container_image_cpu": "set by --cpu-env-image", "container_image_cuda": "set by --gpu-env-image",
    "slot_type": "det deploy's own (the pool's instance type)", "slots": "det deploy's own (the pool's instance type)",
}
_OWNED_POOL: dict[str, str] = {"container_runtime": "set by --container-runtime"}
_OWNED_SCHEDULER: dict[str, str] = {"type": "set by --scheduler-type", "preemption": "set by --preemption-enabled"}


class TemplateError(ValueError):
    """The template is refused; the message names the key (and the flag that sets it, if one does)."""


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise TemplateError(f"{where}: must be a mapping, got {type(value).__name__}")
    return value


def _refuse(section: Mapping[str, Any], owned: Mapping[str, str], where: str) -> None:
    for key in section:
        if key in owned:
            raise TemplateError(f"{where}{key} is {owned[key]}")


def check(template: Any) -> dict[str, Any]:
    """The template if it only says what the deploy does not own; TemplateError names the first key
    that it may not set."""
    t = _mapping(template, "the template")
    for key in t:
        if not isinstance(key, str):
            raise TemplateError(f"{key!r}: keys are names")
    _refuse(t, _OWNED_TOP, "")
    storage = t.get("checkpoint_storage")
    if storage is not None:
        _refuse(_mapping(storage, "checkpoint_storage"), dict.fromkeys(_OWNED_STORAGE, _STORAGE), "checkpoint_storage.")
    pools = t.get("resource_pools")
    if pools is not None:
        if not isinstance(pools, list):
            raise TemplateError(f"resource_pools: must be a list of pools, got {type(pools).__name__}")
        for i, pool in enumerate(pools):
            _check_pool(_mapping(pool, f"resource_pools[{i}]"), i)
    return dict(t)


def _check_pool(pool: Mapping[str, Any], i: int) -> None:
    name = pool.get("name")
    if not isinstance(name, str) or not name:
        raise TemplateError(f"resource_pools[{i}].name: required (compute, aux, or a new pool's name)")
    where = f"resource_pools[{name}]."
    if name not in DEPLOY_POOLS:
        if "provider" in pool:
            raise TemplateError(f"{where}provider: det deploy gives cloud agents to its pools "
                                f"({', '.join(DEPLOY_POOLS)}) only; a new pool's agents join by themselves")
        return
    _refuse(pool, _OWNED_POOL, where)
    if pool.get("scheduler") is not None:
        _refuse(_mapping(pool["scheduler"], f"{where}scheduler"), _OWNED_SCHEDULER, f"{where}scheduler.")
    provider = pool.get("provider")
    if provider is not None:
        _refuse(_mapping(provider, f"{where}provider"), _OWNED_PROVIDER, f"{where}provider.")
        if provider.get("agent") is not None:
            _refuse(_mapping(provider["agent"], f"{where}provider.agent"), _OWNED_AGENT, f"{where}provider.agent.")


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def apply(config: dict[str, Any], template: Mapping[str, Any]) -> dict[str, Any]:
    """`config` (the rendered master.yaml) with the (checked) template merged over it."""
    if not template:
        return config
    pools = template.get("resource_pools")
    merged = _merge(config, {k: v for k, v in template.items() if k != "resource_pools"})
    if pools:
        by_name = {p["name"]: i for i, p in enumerate(merged["resource_pools"])}
        out = [dict(p) for p in merged["resource_pools"]]
        for pool in pools:
            if pool["name"] in by_name:
                out[by_name[pool["name"]]] = _merge(out[by_name[pool["name"]]], pool)
            else:
                out.append(copy.deepcopy(dict(pool)))
        merged["resource_pools"] = out
    return merged
