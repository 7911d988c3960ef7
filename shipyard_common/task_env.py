"""The environment of a trial process: the master writes it into the TaskSpec (`env`), the agent
passes it on, the harness reads it back (harness/core/_info.py, `ClusterInfo.from_env`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

# Every variable the master sets for a trial (the agent adds CUDA_VISIBLE_DEVICES and its own
# DET_AGENT_ID on top).
TRIAL_ENV_VARS = (
    "DET_MASTER",
    "DET_SESSION_TOKEN",
    "DET_CLUSTER_ID",
    "DET_TRIAL_ID",
    "DET_EXPERIMENT_ID",
    "DET_ALLOCATION_ID",
    "DET_TASK_ID",
    "DET_TASK_TYPE",
    "DET_TRIAL_RUN_ID",
    "DET_TRIAL_SEED",
    "DET_HPARAMS",
    "DET_EXPERIMENT_CONFIG",
    "DET_LATEST_CHECKPOINT",
    "DET_SLOT_IDS",
    "DET_AGENT_ID",
    "DET_USER",
    "DET_STEPS_COMPLETED",
    "DET_RESOURCES_ID",
    "DET_RENDEZVOUS_INFO",
    "C10D_PORT",
    "INTER_TRAIN_PROCESS_COMM_PORT_1",
    "INTER_TRAIN_PROCESS_COMM_PORT_2",
)


@dataclass(frozen=True)
class TrialEnvironment:
    master_url: str
    cluster_id: str
    agent_id: str
    task_id: str
    allocation_id: str
    session_token: str = field(repr=False)
    trial_id: int
    experiment_id: int
    trial_seed: int
    trial_run_id: int
    slot_ids: list[str]
    hparams: dict[str, Any]
    experiment_config: dict[str, Any]
    latest_checkpoint: str | None = None
    task_type: str = "TRIAL"
    # Determined's `determined.core` needs these too: the owner's name (its task session's
    # username) and the steps the latest checkpoint holds (its TrialInfo).
    user: str = ""
    steps_completed: int = 0
    # This process group's part of the trial (one per agent; Determined's resources id is the
    # agent's id here), the rendezvous of all parts (Determined's v1RendezvousInfo: addresses,
    # rank, slots; also served by GET /api/v1/allocations/{id}/resources/{rid}/rendezvous) and
    # the port of the chief's torch.distributed store (Determined's launcher reads C10D_PORT).
    resources_id: str = ""
    rendezvous: dict[str, Any] = field(default_factory=dict)
    c10d_port: int = 29400
    # The two ports of the chief's ZMQ broadcast server in Determined's `core.DistributedContext`
    # (its constants read INTER_TRAIN_PROCESS_COMM_PORT_1/_2; Determined's master offsets them per
    # task so that gangs sharing a host do not collide; default 12360 and 12376).
    comm_port: int = 12360

    def to_env(self) -> dict[str, str]:
        env = {
            "DET_MASTER": self.master_url,
            "DET_CLUSTER_ID": self.cluster_id,
            "DET_AGENT_ID": self.agent_id,
            "DET_SLOT_IDS": json.dumps([str(x) for x in self.slot_ids]),
            "DET_TASK_ID": self.task_id,
            "DET_ALLOCATION_ID": self.allocation_id,
            "DET_SESSION_TOKEN": self.session_token,
            "DET_TRIAL_ID": str(self.trial_id),
            "DET_EXPERIMENT_ID": str(self.experiment_id),
            "DET_TRIAL_SEED": str(self.trial_seed),
            "DET_TRIAL_RUN_ID": str(self.trial_run_id),
            "DET_HPARAMS": json.dumps(self.hparams),
            "DET_EXPERIMENT_CONFIG": json.dumps(self.experiment_config),
            "DET_LATEST_CHECKPOINT": self.latest_checkpoint or "",
            "DET_TASK_TYPE": self.task_type,
            "DET_USER": self.user,
            "DET_STEPS_COMPLETED": str(self.steps_completed),
            "DET_RESOURCES_ID": self.resources_id or self.agent_id,
            "DET_RENDEZVOUS_INFO": json.dumps(self.rendezvous or {"addresses": ["127.0.0.1"], "rank": 0,
                                                                  "slots": [len(self.slot_ids)]}),
            "C10D_PORT": str(self.c10d_port),
            "INTER_TRAIN_PROCESS_COMM_PORT_1": str(self.comm_port),
            "INTER_TRAIN_PROCESS_COMM_PORT_2": str(self.comm_port + 1),
        }
        assert set(env) == set(TRIAL_ENV_VARS)
        return env
