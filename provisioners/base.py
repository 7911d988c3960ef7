"""The one seam every place instances come from sits behind.

A provider is `launch / list / terminate` plus one error taxonomy that the autoscaler acts on.
Providers hold no state that matters: instances are found again by their cloud tags, so a
restarted master rebuilds its picture from `list()`.

Each provider module (or package) declares itself once as `PROVIDER_TYPE` (a `ProviderType`, at the
end of this module): its type name, config model (a `ProviderSettings`), constructor and what
user-data it takes. The registry (provisioners/registry.py) maps a pool's `provider.type` to that
declaration; a cloud's package declares it in its `__init__`, which imports no SDK.
"""

from __future__ import annotations

import enum
import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar, Protocol, Self

# The taxonomy lives in the shared package so that the master's pure backoff core can read it
# without importing a provider; every provider imports it from here.
from shipyard_common.provider_errors import ErrorKind as ErrorKind
from shipyard_common.provider_errors import ErrorScope as ErrorScope
from shipyard_common.settings import SettingsError, StrictSettings, validate

# Tag keys written on every instance. AWS takes them as tags; GCP labels only allow [a-z0-9_-],
# so the GCP provider maps ':' to '-' (see `label_key`).
TAG_MANAGED_BY = "shipyard:managed-by"
TAG_CLUSTER = "shipyard:cluster-id"
TAG_POOL = "shipyard:pool"
TAG_MASTER = "shipyard:master"
TAG_LAUNCH_ID = "shipyard:launch-id"
TAG_CAPACITY = "shipyard:capacity"  # spot | on-demand, as the instance was bought
MANAGED_BY_VALUE = "shipyard"


def label_key(tag_key: str) -> str:
    """GCP label form of a tag key: lowercase, ':' → '-'."""
    return tag_key.replace(":", "-").lower()


class CloudState(enum.StrEnum):
    """An instance as the cloud reports it. The master's own record of an instance has more steps
    (requested before the launch call, ...): control_plane.core.states.InstanceState."""

    PENDING = "pending"  # accepted by the cloud, not yet running
    RUNNING = "running"
    STOPPING = "stopping"  # shutting down / being deleted
    # Powered off but still there (AWS stopped, GCE TERMINATED or SUSPENDED): no agent runs, yet its
    # disks (and, on AWS, Elastic IPs) keep billing. Listed so that the autoscaler deletes it.
    STOPPED = "stopped"
    TERMINATED = "terminated"  # gone for good (AWS keeps reporting it for about an hour)


class ProviderError(Exception):
    def __init__(
        self,
        kind: ErrorKind,
        message: str,
        *,
        scope: ErrorScope = ErrorScope.REGION,
        code: str = "",
        location: str = "",
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.scope = scope
        self.code = code  # the cloud's own error code, e.g. InsufficientInstanceCapacity
        self.location = location  # subnet id or zone the error applies to

    def where(self) -> str:
        """The error's reach in words: a quota names its region or project, so that an admin knows
        which limit to raise; a capacity error names the subnet or zone."""
        if self.kind is ErrorKind.QUOTA and self.scope is ErrorScope.CLOUD:
            return f"project-wide{f' ({self.location})' if self.location else ''}"
        if self.kind is ErrorKind.QUOTA and self.scope is ErrorScope.REGION and self.location:
            return f"in region {self.location}"
        return f"at {self.location}" if self.location else ""

    def __str__(self) -> str:
        where = f" {self.where()}" if self.where() else ""
        code = f" ({self.code})" if self.code else ""
        return f"{self.kind.value}{code}{where}: {self.args[0]}"


class Capacity(enum.StrEnum):
    """A pool's `capacity`: what its instances are bought as. `spot: true` is `capacity: spot`."""

    SPOT = "spot"
    ON_DEMAND = "on-demand"
    SPOT_THEN_ON_DEMAND = "spot-then-on-demand"  # spot, and on demand when no spot capacity is left

    @property
    def spot_choices(self) -> tuple[bool, ...]:
        """Whether each way to buy an instance is spot, in the order they are tried."""
        return {Capacity.SPOT: (True,), Capacity.ON_DEMAND: (False,),
                Capacity.SPOT_THEN_ON_DEMAND: (True, False)}[self]


def capacity_of(capacity: str | None, spot: bool, spot_set: bool) -> tuple[Capacity | None, str | None]:
    """A pool's effective capacity from its `capacity` and legacy `spot` settings, or the problem
    with them: `spot: true` means `capacity: spot`; an explicit `spot` that says otherwise than
    `capacity` is refused rather than guessed."""
    if capacity is None:
        return (Capacity.SPOT if spot else Capacity.ON_DEMAND), None
    try:
        mode = Capacity(capacity)
    except ValueError:
        return None, f"must be one of {', '.join(c.value for c in Capacity)}, got {capacity!r}"
    if spot_set and (mode is Capacity.SPOT) != spot:
        return None, (f"contradicts spot: {str(spot).lower()} (spot: true means capacity: spot; "
                      f"set one of them)")
    return mode, None


@dataclass(frozen=True)
class LaunchChoice:
    """One way to launch an instance: an instance (machine) type, bought spot or on demand."""

    instance_type: str
    spot: bool = False


@dataclass(frozen=True)
class InstanceOffer:
    """An instance type a pool may launch in one capacity, the slots it brings and its estimated
    price in USD per hour (None: not in the price catalogue): what the scale decider chooses from."""

    instance_type: str
    slots: int
    spot: bool
    usd_per_hour: float | None

    @property
    def choice(self) -> LaunchChoice:
        return LaunchChoice(self.instance_type, self.spot)


def offers_of(provider: object, *, available: bool = False) -> tuple[InstanceOffer, ...]:
    """The offers of a provider that launches several types or capacities; () when it launches one.
    `available`: without those out of capacity in every location now (`out_of_capacity()`, the
    choices cooling down everywhere), so that a decision does not plan on them."""
    offers = getattr(provider, "offers", None)
    found = tuple(offers()) if callable(offers) else ()
    out = getattr(provider, "out_of_capacity", None)
    if available and callable(out):
        gone = out()
        found = tuple(o for o in found if o.choice not in gone)
    return found


@dataclass(frozen=True)
class LaunchSpec:
    """One instance to launch. `launch_id` is chosen by the master and recorded before the call;
    it is the idempotency key (AWS ClientToken / GCE requestId) and is tagged on the instance so
    that a crash between launch and record can be healed by the orphan sweep. `choices`: the
    types and capacities to try, in order, moving on when the cloud has no capacity for one in any
    location; (): the pool's own types in their capacities, cheapest first."""

    launch_id: str
    user_data: str
    choices: tuple[LaunchChoice, ...] = ()


@dataclass(frozen=True)
class CloudInstance:
    id: str  # the cloud's instance id (AWS i-..., GCE instance name)
    state: CloudState
    launched_at: datetime
    launch_id: str | None = None
    private_ip: str | None = None
    public_ip: str | None = None
    location: str = ""  # subnet id or zone
    instance_type: str = ""
    spot: bool = False
    tags: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class LaunchResult:
    launched: tuple[CloudInstance, ...]
    # Partial failures (e.g. capacity in every subnet after some succeeded) are reported here,
    # not raised, so the caller records what did launch.
    error: ProviderError | None = None


class Provider(Protocol):
    """launch / list / terminate. Every call is bounded in time and attempts."""

    def launch(self, specs: Sequence[LaunchSpec]) -> LaunchResult: ...

    def list(self) -> list[CloudInstance]:
        """Every non-terminated instance carrying this cluster's and this pool's tags, stopped ones
        included (they still bill and are ours to delete)."""
        ...

    def terminate(self, ids: Sequence[str]) -> None:
        """Idempotent: terminating an instance that is already gone is not an error."""
        ...


class Describer(Protocol):
    """Optional for a provider: look instances up by id, which answers where a list cannot. A list is
    eventually consistent (an instance launched a moment ago, or deleted, may be missing from it or
    still in it); a lookup by id says directly whether the cloud still has the instance.

    `describe(ids)` returns, for each id asked, the instance as the cloud reports it (a deleted one
    that the cloud still shows has state TERMINATED) or None when the cloud does not know the id.
    Raises ProviderError when the cloud cannot be asked."""

    def describe(self, ids: Sequence[str]) -> dict[str, CloudInstance | None]: ...


def describer(provider: object) -> Describer | None:
    """The provider's `describe`, if it has one."""
    return provider if callable(getattr(provider, "describe", None)) else None  # type: ignore[return-value]


# `ProviderError.code` of a `Parker.start` of an instance the cloud no longer has (the taxonomy has
# no "not found" kind: it is ErrorKind.INVALID with this code, the same on every cloud).
INSTANCE_NOT_FOUND = "InstanceNotFound"
# `ProviderError.code` of a `Parker.start` of an instance still powering off (ErrorKind.UNKNOWN:
# retry later, once `list()` shows it STOPPED).
INSTANCE_STILL_STOPPING = "InstanceStillStopping"


class Parker(Protocol):
    """Optional for a provider: stop instances keeping their disks (a warm pool) and start them again.
    A parked instance costs its disks only and starts faster than a fresh launch; it keeps its id,
    tags and location (subnet or zone). Every call is bounded in time and attempts. With several
    ids, each is tried and the first error is raised (its message names the instance).

    `stop(ids)` asks the cloud to power the instances off, keeping their boot disks; `list()` and
    `describe()` then show STOPPING, and STOPPED once the cloud has powered it off. Idempotent: an
    instance already stopping or stopped is not an error, nor is one the cloud no longer has
    (terminated, deleted: the master's reconcile finds out from `list()`/`describe()`). Raises
    ProviderError when the cloud refuses (a spot instance that cannot be stopped: INVALID, e.g. AWS
    UnsupportedOperation; an instance in a state that cannot be stopped now, e.g. AWS pending:
    UNKNOWN, try again later) or cannot be reached (THROTTLED / UNKNOWN / AUTH as for any call).

    `start(ids)` starts stopped instances again; `list()` shows them PENDING, then RUNNING. One
    already pending or running is not an error. Raises ProviderError:
    - CAPACITY (scope ZONE, location = the instance's subnet or zone), classified exactly as a
      launch's capacity error (AWS InsufficientInstanceCapacity, GCE ZONE_RESOURCE_POOL_EXHAUSTED...):
      the master may terminate the parked instance and launch elsewhere;
    - UNKNOWN with code INSTANCE_STILL_STOPPING (or the cloud's own code when the cloud refused,
      e.g. AWS IncorrectInstanceState, GCE resourceNotReady) while the instance is still powering
      off: transient, start it again later;
    - INVALID with code INSTANCE_NOT_FOUND (scope ZONE) for an instance the cloud no longer has, or
      one being terminated;
    - QUOTA / THROTTLED / AUTH / UNKNOWN as for a launch, when the cloud refuses or cannot be reached.
    """

    def stop(self, ids: Sequence[str]) -> None: ...

    def start(self, ids: Sequence[str]) -> None: ...


def parker(provider: object) -> Parker | None:
    """The provider's stop/start, if it has both."""
    if callable(getattr(provider, "stop", None)) and callable(getattr(provider, "start", None)):
        return provider  # type: ignore[return-value]
    return None


# -- how a provider module declares itself (provisioners/registry.py maps type names to these) ----


class UserDataKind(enum.StrEnum):
    """What a provider hands an instance at launch (`LaunchSpec.user_data`)."""

    CLOUD_INIT = "cloud_init"  # rendered cloud-init user-data (agent_bootstrap.cloud_init)
    TOKEN = "token"  # only the bootstrap token: the provider starts the agent itself (process, SSH)


class ProviderConfig(Protocol):
    """A provider's own config model: built from the pool's `provider:` section minus the elastic
    settings common to all providers; raises shipyard_common.settings.SettingsError listing every
    problem, with paths relative to the section (`zones[1]`, `max_instances`)."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self: ...


@dataclass(frozen=True)
class InstanceSummary:
    """What the API, the CLI and the web UI say about a pool's instances, from its typed config."""

    location: str = ""  # the region, or the first zone of the failover order
    image: str = ""
    instance_type: str = ""
    spot: bool = False
    slots_per_instance: int | None = None  # None: known only once the provider is built (an unlisted AWS type)
    # A pool of several types: each with its slots (None: unknown until built) and price.
    offers: tuple[InstanceOffer, ...] = ()
    capacity: str = ""  # spot | on-demand | spot-then-on-demand


class ProviderSettings(StrictSettings):
    """The base of every provider's config model (a `ProviderConfig`): a strict pydantic model checked
    by `shipyard_common.settings.validate`, so that every provider reports its problems the same way.
    Its module imports no cloud SDK: the master's API workers read every pool's settings."""

    TYPE: ClassVar[str]  # the `provider.type` it configures

    def summary(self) -> InstanceSummary:
        """The pool's instances as the pages show them; each provider says what it knows."""
        return InstanceSummary()

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """The config of a pool's section (elastic settings taken out). A `type` key may stay if it
        names this provider. SettingsError lists every problem."""
        if not isinstance(data, Mapping):
            raise SettingsError([("", f"must be a mapping, got {type(data).__name__}")])
        own = {k: v for k, v in data.items() if k != "type"}
        problems = [] if data.get("type", cls.TYPE) == cls.TYPE else [
            ("type", f"expected {cls.TYPE!r}, got {data.get('type')!r}")]
        try:
            config = validate(cls, own)
        except SettingsError as e:
            raise SettingsError([*problems, *e.problems]) from None
        if problems:
            raise SettingsError(problems)
        return config


@dataclass(frozen=True)
class ProviderContext:
    """Everything a provider is built with besides its own config."""

    cluster_id: str
    pool: str
    master_url: str
    state_dir: Path
    agent_options: Mapping[str, Any]  # the pool's `agent:` section


@dataclass(frozen=True)
class BuiltProvider:
    provider: Provider
    slots_per_instance: int


def lazy_build(module: str, name: str = "build") -> Callable[[Any, ProviderContext], BuiltProvider]:
    """A `ProviderType.build` that imports `module` (and with it the cloud's SDK) when the first
    provider is built, so that reading a type's config model imports no SDK."""

    def build(cfg: Any, ctx: ProviderContext) -> BuiltProvider:
        builder: Callable[[Any, ProviderContext], BuiltProvider] = getattr(importlib.import_module(module), name)
        return builder(cfg, ctx)

    return build


def lazy_exports(package: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """A package's module `__getattr__` (PEP 562) for the names its SDK-importing submodules define:
    `names` maps a name to its submodule, imported on first use (`from provisioners.gcp import
    GcpProvider` imports the GCP SDK; `from provisioners.gcp import GcpPoolConfig` does not)."""

    def __getattr__(attr: str) -> Any:
        if attr not in names:
            raise AttributeError(f"module {package!r} has no attribute {attr!r}")
        return getattr(importlib.import_module(f"{package}.{names[attr]}"), attr)

    return __getattr__


@dataclass(frozen=True)
class ProviderType:
    """One place instances come from, declared once by its module as `PROVIDER_TYPE`."""

    name: str  # the pool config's `provider.type`
    config: type[ProviderConfig]
    # Builds the provider; may raise ProviderError (e.g. resolving an instance type's GPUs). A cloud's
    # module builds through `lazy_build`, so that its SDK is imported only here.
    build: Callable[[Any, ProviderContext], BuiltProvider]
    user_data: UserDataKind
    # Bytes of user-data the cloud accepts (before base64); None: no limit worth checking.
    user_data_limit: int | None = None
    # Whether the pool's `agent:` options reach an agent config this provider writes.
    takes_agent_options: bool = True
    # Elastic settings defaults that depend on the provider's own section (a static pool keeps all
    # its hosts): `provider:` section -> defaults for min_instances, max_instances...
    settings_defaults: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None
    # Whether `list()` reflects every launch and termination at once (a local process table, a
    # static host list). Cloud lists lag, so an instance missing from one list is only presumed
    # gone after the pool's `list_miss_grace`; a consistent list is proof at once.
    consistent_list: bool = False
    # Whether its provider stops and starts instances (`Parker`): only then may a pool keep a warm
    # pool (`warm_pool_size`).
    parks: bool = False
