"""What Determined's own `determined.core` (0.38.1) reads on cluster, built from a trial's DET_*
environment (shipyard_common/task_env.py).

In Determined, `prep_container` writes four JSON files under the fixed `/run/determined/info/`
inside each container and `determined.core.init()` reads them (no files: it silently runs
off-cluster). Shipyard's process runtime shares one host between tasks, so the agent writes them
per task, into a private directory inside the task's own directory, and the task's Python finds
them through a `sitecustomize` shim (agent_bootstrap/agent/det_shim/) that points Determined's
readers at that directory (`SHIPYARD_DET_INFO_DIR`) and its shared_fs container path at the
storage's host path. Nothing is written outside the task's directory.
"""

from __future__ import annotations

import json
from typing import Any

INFO_DIR_ENV = "SHIPYARD_DET_INFO_DIR"
INFO_FILES = ("cluster.json", "trial.json", "rendezvous.json", "resources.json")


def info_files(env: dict[str, str], container_addr: str = "127.0.0.1") -> dict[str, dict[str, Any]]:
    """The four files' contents (file name → JSON object), as Determined's `_to_file` writes
    them. A trial across agents has one "container" per agent: its rendezvous comes from the
    master (DET_RENDEZVOUS_INFO, the same answer as the rendezvous endpoint)."""
    slot_ids = [int(x) for x in json.loads(env.get("DET_SLOT_IDS") or "[]")]
    cluster = {
        "master_url": env["DET_MASTER"],
        "cluster_id": env["DET_CLUSTER_ID"],
        "agent_id": env["DET_AGENT_ID"],
        "slot_ids": slot_ids,
        "task_id": env["DET_TASK_ID"],
        "allocation_id": env["DET_ALLOCATION_ID"],
        "session_token": env["DET_SESSION_TOKEN"],
        "task_type": env.get("DET_TASK_TYPE", "TRIAL"),
        "master_cert_name": None,
        "master_cert_file": None,
        "latest_checkpoint": env.get("DET_LATEST_CHECKPOINT") or None,
    }
    trial = {
        "trial_id": int(env["DET_TRIAL_ID"]),
        "experiment_id": int(env["DET_EXPERIMENT_ID"]),
        "trial_seed": int(env["DET_TRIAL_SEED"]),
        "hparams": json.loads(env.get("DET_HPARAMS") or "{}"),
        "config": json.loads(env.get("DET_EXPERIMENT_CONFIG") or "{}"),
        "steps_completed": int(env.get("DET_STEPS_COMPLETED") or 0),
        "trial_run_id": int(env["DET_TRIAL_RUN_ID"]),
        "debug": False,
        "inter_node_network_interface": None,
    }
    rdzv = json.loads(env.get("DET_RENDEZVOUS_INFO") or "{}")
    if rdzv.get("addresses"):
        rendezvous = {"container_addrs": list(rdzv["addresses"]), "container_rank": int(rdzv.get("rank", 0)),
                      "container_slot_counts": [int(n) for n in rdzv.get("slots") or [len(slot_ids)]]}
    else:
        rendezvous = {"container_addrs": [container_addr], "container_rank": 0,
                      "container_slot_counts": [len(slot_ids)]}
    resources = {"gpu_uuids": []}
    return {"cluster.json": cluster, "trial.json": trial, "rendezvous.json": rendezvous,
            "resources.json": resources}
