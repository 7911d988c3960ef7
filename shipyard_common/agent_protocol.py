"""The agent protocol (docs/PROTOCOL.md), defined once for both ends: the master's API parses and
answers with these models, the agent sends and parses the same ones.

Strictness follows the direction: what the agent sends (registration, events) is a StrictWire, so a
field the master does not know is refused with its name; what the master sends (the registration
answer, commands, task specs) is a lenient Wire, so a newer master can add fields without breaking
older agents.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal, Optional, Union, get_args

from pydantic import AliasChoices, Field, ValidationError, field_serializer, field_validator

from shipyard_common.wire import rfc3339
from shipyard_common.wire_model import StrictWire, Wire

# The paths of the protocol, relative to the master's URL.
TOKENS_PATH = "/api/v1/agents/tokens"
REGISTER_PATH = "/api/v1/agents/register"
COMMANDS_PATH = "/api/v1/agents/{agentId}/commands"
EVENTS_PATH = "/api/v1/agents/{agentId}/events"
# The agent reports its cloud's interruption notice (spot two-minute warning, GCE preemption).
INTERRUPTION_PATH = "/api/v1/agents/{agentId}/interruption"
# Admin: forget an agent's enrolment (revoke its credential) so that it can enrol again.
ENROLMENT_PATH = "/api/v1/agents/{agentId}/enrolment"

# How a task's life is reported, in the order it goes through it. "pulling" is reported by runtimes
# that fetch an image first; the process runtime goes from "starting" to "running".
TaskEventType = Literal["pulling", "starting", "running", "exited"]
TASK_EVENT_TYPES: tuple[str, ...] = get_args(TaskEventType)
SlotType = Literal["cuda", "cpu", "rocm"]

MAX_EVENT_MESSAGE = 8192
MAX_EVENTS_PER_POST = 10_000
MAX_SLOTS = 1024
# An agent's id, as registered and as an agent token may name it (the master's Agent.id column).
AgentId = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")]


class SlotInfo(StrictWire):
    id: str = Field(min_length=1, max_length=64)
    type: SlotType = "cpu"
    uuid: Optional[str] = None
    brand: Optional[str] = None
    memory_mb: Optional[int] = None


class RegisterRequest(StrictWire):
    agent_id: AgentId
    # Bounded by the master's columns (Agent.pool, .version, .instance_id).
    resource_pool: str = Field(max_length=64)
    version: str = Field(default="", max_length=64)
    addresses: list[str] = Field(default_factory=list)
    instance_id: Optional[str] = Field(default=None, max_length=128)
    slots: list[SlotInfo] = Field(default_factory=list, max_length=MAX_SLOTS)
    # The allocations whose tasks this agent still runs: the master keeps those it still wants
    # there and lists the others in the answer's `kill`.
    running_allocations: list[str] = Field(default_factory=list)


class RegisterResponse(Wire):
    session_id: str = Field(min_length=1)
    heartbeat_interval_s: Optional[float] = Field(default=None, validation_alias=AliasChoices(
        "heartbeatIntervalS", "heartbeatIntervalSeconds", "heartbeat_interval_s"))
    kill: list[str] = Field(default_factory=list)
    cluster_id: Optional[str] = None
    # Set only when this registration enrolled the agent (its first, or the first after an admin
    # reset): the agent's own credential, bound to its id. The agent keeps it (0600) and presents
    # it from then on; the enrolment token no longer registers this agent id.
    agent_credential: Optional[str] = Field(default=None, repr=False)
    # The longest wait between reconnect attempts the master allows: it declares an agent lost
    # only after this plus its heartbeat timeout, so the agent never waits longer.
    reconnect_backoff_max_s: Optional[float] = Field(default=None, gt=0)


class ContainerMount(Wire):
    host_path: str = Field(min_length=1)
    container_path: str = Field(min_length=1)
    read_only: bool = False
    # Left out when the host path is missing on the agent (a TensorBoard's trial that wrote no events there).
    optional: bool = False


class ContainerDevice(Wire):
    """A host device in the container (Docker's --device host:container:mode)."""

    host_path: str = Field(min_length=1)
    container_path: str = Field(min_length=1)
    mode: str = Field(default="mrw", pattern="^[rwm]{1,3}$")


class ContainerSpec(Wire):
    """How to run a task in a container, from the experiment config. Agents whose runtime is
    `docker` use it; an agent running tasks as processes refuses a task whose `image` is set."""

    # `environment.image` for the agent's device type; None: the agent's default image.
    image: Optional[str] = None
    force_pull: bool = False
    # `environment.registry_auth` (Docker's names: username, password, serveraddress, ...).
    registry_auth: Optional[dict[str, str]] = Field(default=None, repr=False)
    shm_size_bytes: Optional[int] = Field(default=None, ge=0)
    memory_bytes: Optional[int] = Field(default=None, ge=0)
    # shared_fs checkpoint storage and `bind_mounts`, in the container at the paths given.
    mounts: list[ContainerMount] = Field(default_factory=list)
    # The directory a shared_fs checkpoint storage writes into (host_path + storage_path): the
    # agent creates it, writable by every task user, when it is missing.
    checkpoint_path: Optional[str] = None
    # The cluster's own shared_fs checkpoint storage root (the master's config, not the task's):
    # the agent makes a missing writable bind source or checkpoint directory only below it or its
    # work dir (agent/host_paths.py). None: the master stores checkpoints elsewhere.
    storage_root: Optional[str] = None
    # `environment.add_capabilities` / `drop_capabilities` and `resources.devices` (the master sends
    # the first and the last only where its allow_task_host_access let the config through).
    cap_add: list[str] = Field(default_factory=list)
    cap_drop: list[str] = Field(default_factory=list)
    devices: list[ContainerDevice] = Field(default_factory=list)


class TaskSpec(Wire):
    allocation_id: str = Field(min_length=1)
    task_id: str = ""
    trial_id: Optional[int] = None
    experiment_id: Optional[int] = None
    run_id: Optional[int] = None
    entrypoint: Union[list[str], str]
    env: dict[str, str] = Field(default_factory=dict)
    slot_ids: list[str] = Field(default_factory=list)
    token: Optional[str] = Field(default=None, repr=False)
    model_definition_path: Optional[str] = None
    kill_grace_seconds: Optional[float] = Field(default=None, ge=0)
    # The Shipyard user the task belongs to: a root agent runs it as that user's OS uid (issue 27).
    user_id: Optional[int] = None
    # Container settings (environment.image & co.); None from a master that predates them.
    container: Optional[ContainerSpec] = None

    @field_validator("env", mode="before")
    @classmethod
    def _env_strings(cls, v: object) -> object:
        # Environment values are strings; a number or bool from a config is passed as its text.
        if isinstance(v, dict):
            return {str(k): ("" if val is None else (str(val).lower() if isinstance(val, bool) else str(val)))
                    for k, val in v.items()}
        return v

    @field_validator("slot_ids", mode="before")
    @classmethod
    def _slot_strings(cls, v: object) -> object:
        return [str(s) for s in v] if isinstance(v, list) else v

    @property
    def argv(self) -> list[str]:
        """The command to run: an argv list as is, a string through `sh -c`."""
        if isinstance(self.entrypoint, str):
            return ["sh", "-c", self.entrypoint]
        return list(self.entrypoint)


class StartCommand(Wire):
    type: Literal["start"] = "start"
    allocation_id: str
    spec: TaskSpec


class KillCommand(Wire):
    type: Literal["kill"] = "kill"
    allocation_id: str
    grace_seconds: Optional[float] = Field(default=None, ge=0)


Command = Union[StartCommand, KillCommand]


class CommandsResponse(Wire):
    commands: list[Command] = Field(default_factory=list)


class TaskEvent(Wire):
    allocation_id: str
    type: TaskEventType
    # Bounded like the master's Integer columns (out of range would be a database error, not a 400).
    pid: Optional[int] = Field(default=None, ge=0, le=2**31 - 1)
    exit_code: Optional[int] = Field(default=None, ge=-(2**31), le=2**31 - 1)
    message: Optional[str] = Field(default=None, max_length=MAX_EVENT_MESSAGE)
    time: Optional[datetime] = None

    @field_serializer("time")
    def _time(self, value: datetime | None) -> Optional[str]:
        return None if value is None else rfc3339(value)


class EventsRequest(StrictWire):
    session_id: str
    events: list[TaskEvent] = Field(default_factory=list, max_length=MAX_EVENTS_PER_POST)


InterruptionAction = Literal["terminate", "stop", "hibernate", "preempt", "rebalance"]


class InterruptionRequest(StrictWire):
    """The agent's instance is going away (`action` terminate/stop/hibernate on AWS, preempt on
    GCP) at `deadline`, or may soon (`rebalance`: AWS's recommendation, no deadline)."""

    session_id: str
    cloud: Literal["aws", "gcp"]
    action: InterruptionAction
    deadline: Optional[datetime] = None
    detail: str = Field(default="", max_length=1000)

    @field_serializer("deadline")
    def _deadline(self, value: datetime | None) -> Optional[str]:
        return None if value is None else rfc3339(value)


def parse_command(raw: dict[str, object]) -> Command:
    """One command of a long-poll answer; raises ValueError with a readable reason, so the agent can
    refuse one bad command and carry on with the others."""
    kind = raw.get("type")
    try:
        if kind == "start":
            return StartCommand.model_validate(raw)
        if kind == "kill":
            return KillCommand.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise ValueError(f"{loc}: {err['msg']}") from None
    raise ValueError(f"unknown command type {kind!r}")
