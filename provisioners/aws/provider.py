"""AWS EC2 provider: launch, list and terminate the instances of one resource pool.

Every instance is found again by its tags (cluster, pool, launch id), never from memory, so a
restarted master rebuilds its picture from `list()`. Each RunInstances call carries the master's
launch id as ClientToken: a retry after a lost response returns the instance that was already
started instead of starting a second one.

Errors are sorted into the taxonomy of `provisioners.base` (provisioners/aws/errors.py): capacity
moves the launch on to the next subnet (another zone), and that subnet is skipped by later batches
for `capacity_cooldown_s` (per instance type, provisioners/capacity.py); quota (labelled with the
region: EC2 quotas are per region) / auth / invalid stop the launch and are reported on the pool,
throttling is retried here with jittered backoff and bounded attempts. botocore's own retries are
switched off so that tenacity alone decides how often a call is repeated.

User data carries the agent's credential: it is never logged.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from provisioners.aws.config import AwsPoolConfig
from provisioners.aws.errors import classify_error, error_code, error_message, is_transient, transport_error
from provisioners.base import (
    INSTANCE_NOT_FOUND,
    INSTANCE_STILL_STOPPING,
    MANAGED_BY_VALUE,
    TAG_CAPACITY,
    TAG_CLUSTER,
    TAG_LAUNCH_ID,
    TAG_MANAGED_BY,
    TAG_MASTER,
    TAG_POOL,
    BuiltProvider,
    CloudInstance,
    CloudState,
    ErrorKind,
    ErrorScope,
    InstanceOffer,
    LaunchChoice,
    LaunchResult,
    LaunchSpec,
    Provider,
    ProviderContext,
    ProviderError,
)
from provisioners.capacity import (
    CapacityMemory,
    Cooldown,
    all_cooling_error,
    choice_key,
    launch_with_failover,
)
from provisioners.retry import RetryAttempt, RetryPolicy, call_with_retries
from shipyard_common import clouds

# The package's name: operators filter the provider's log lines by it.
log = logging.getLogger("provisioners.aws")

T = TypeVar("T")

# AWS API limits that shape the calls.
TERMINATE_CHUNK = 1000  # TerminateInstances takes at most 1000 ids per call
DESCRIBE_PAGE_SIZE = 500  # DescribeInstances MaxResults (5..1000)
CLIENT_TOKEN_MAX_LEN = 64  # RunInstances ClientToken: up to 64 ASCII characters

# States that still hold (or may soon hold) capacity or cost. "stopped" is included because the
# Provider contract is "every non-terminated instance": a stopped pool instance (someone stopped it
# by hand) still bills its EBS volumes and must stay visible so that the autoscaler terminates it.
LISTED_STATES = ("pending", "running", "stopping", "stopped", "shutting-down")

_STATE_MAP: dict[str, CloudState] = {
    "pending": CloudState.PENDING,
    "running": CloudState.RUNNING,
    "stopping": CloudState.STOPPING,
    "stopped": CloudState.STOPPED,
    "shutting-down": CloudState.STOPPING,
    "terminated": CloudState.TERMINATED,
}
DESCRIBE_IDS_CHUNK = 1000  # DescribeInstances takes up to 1000 InstanceIds per call



def _kv(**fields: object) -> str:
    """One log line as key=value pairs; values with spaces are quoted."""
    parts = []
    for key, value in fields.items():
        text = ",".join(map(str, value)) if isinstance(value, list | tuple | set | frozenset) else str(value)
        parts.append(f'{key}="{text}"' if " " in text or not text else f"{key}={text}")
    return " ".join(parts)


_INSTANCE_ID_RE = re.compile(r"\bi-[0-9a-f]{8,17}\b")


class AwsProvider(Provider):
    """The instances of one pool of one cluster in one AWS region."""

    def __init__(
        self,
        cfg: AwsPoolConfig,
        *,
        cluster_id: str,
        pool: str,
        master_url: str,
        session: boto3.Session | None = None,
        max_attempts: int = 4,
        call_timeout_s: float = 30,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 10.0,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self._retry = RetryPolicy(max_attempts, backoff_base_s, backoff_max_s)
        self.cfg = cfg
        self.cluster_id = cluster_id
        self.pool = pool
        self.master_url = master_url
        self._slots: dict[str, int] = {t: cfg.instance_slots for t in cfg.types} if cfg.instance_slots else {}
        self._root_device_name: str | None = cfg.root_device_name
        self._clock = clock or (lambda: datetime.now(UTC))
        self.capacity = CapacityMemory(timedelta(seconds=cfg.capacity_cooldown_s))
        session = session or boto3.Session()
        self._ec2 = session.client(
            "ec2",
            region_name=cfg.region,
            endpoint_url=cfg.endpoint_url,
            config=Config(
                connect_timeout=call_timeout_s,
                read_timeout=call_timeout_s,
                # total_max_attempts=1 means exactly one HTTP request per botocore call (botocore's
                # legacy `max_attempts` counts retries, so max_attempts=1 would still retry once).
                retries={"total_max_attempts": 1, "mode": "standard"},
                user_agent_extra="shipyard",
            ),
        )

    # -- public API -------------------------------------------------------------------------

    def resolve_instance_slots(self) -> int:
        """Slots one instance brings (the largest type's, in a pool of several): `instance_slots`,
        else each type's GPU count from the catalogue or DescribeInstanceTypes.

        Raises ProviderError(INVALID) for an instance type AWS does not know in this region, and for
        a type without GPUs when `instance_slots` is not set (a CPU pool must say how many slots)."""
        return max(self._resolve_slots(t) for t in self.cfg.types)

    def offers(self) -> tuple[InstanceOffer, ...]:
        """Each type in each capacity the pool buys, with its slots and regional price."""
        return self.cfg.offers({t: self._resolve_slots(t) for t in self.cfg.types})

    def _resolve_slots(self, instance_type: str) -> int:
        if instance_type in self._slots:
            return self._slots[instance_type]
        if len(self.cfg.types) > 1 and (known := clouds.aws_gpus(instance_type)):
            self._slots[instance_type] = known
            return known
        try:
            resp = self._call(
                "DescribeInstanceTypes", self._ec2.describe_instance_types, InstanceTypes=[instance_type]
            )
        except ClientError as exc:
            if error_code(exc) == "InvalidInstanceType":
                raise ProviderError(
                    ErrorKind.INVALID,
                    f"instance type {instance_type!r} is not offered in {self.cfg.region}",
                    code="InvalidInstanceType",
                    location=self.cfg.region,
                ) from exc
            raise classify_error(exc, self.cfg.region) from exc
        except BotoCoreError as exc:
            raise transport_error(exc, self.cfg.region) from exc
        types = resp.get("InstanceTypes", [])
        if not types:
            raise ProviderError(
                ErrorKind.INVALID,
                f"instance type {instance_type!r} is not offered in {self.cfg.region}",
                code="InvalidInstanceType",
                location=self.cfg.region,
            )
        gpus = sum(int(gpu.get("Count", 0)) for gpu in types[0].get("GpuInfo", {}).get("Gpus", []))
        if gpus <= 0:
            raise ProviderError(
                ErrorKind.INVALID,
                f"instance type {instance_type!r} has no GPUs; set instance_slots to use it for a CPU pool",
                code="NoGpus",
                location=self.cfg.region,
            )
        self._slots[instance_type] = gpus
        log.info(_kv(event="aws_instance_slots", pool=self.pool, instance_type=instance_type, slots=gpus))
        return gpus

    def launch(self, specs: Sequence[LaunchSpec]) -> LaunchResult:
        """One RunInstances per spec, walking the subnets in order on capacity errors.

        Never raises for cloud errors: what launched is returned with the error that stopped the rest."""
        specs = tuple(specs)
        if not specs:
            return LaunchResult(launched=())
        for spec in specs:
            if (
                not spec.launch_id
                or len(spec.launch_id) > CLIENT_TOKEN_MAX_LEN
                or not spec.launch_id.isascii()
            ):
                return LaunchResult(
                    launched=(),
                    error=ProviderError(
                        ErrorKind.INVALID,
                        f"launch id must be 1 to {CLIENT_TOKEN_MAX_LEN} ASCII characters "
                        f"(it is the RunInstances ClientToken), got {spec.launch_id!r}",
                        code="InvalidLaunchId",
                    ),
                )
        try:
            root_device_name = self._resolve_root_device_name()
        except ProviderError as err:
            self._log_launch_failed(err, launched=0, remaining=len(specs))
            return LaunchResult(launched=(), error=err)
        return launch_with_failover(specs, self._default_choices(),
                                    lambda choice, todo: self._launch_choice(choice, todo, root_device_name),
                                    log, self.pool)

    def out_of_capacity(self) -> set[LaunchChoice]:
        """The types and capacities cooling down in every subnet now (the decider plans without them)."""
        now, places = self._clock(), [s or self.cfg.region for s in (self.cfg.subnet_ids or (None,))]
        return {o.choice for o in self.cfg.offers() if self.capacity.everywhere(places, choice_key(o.choice), now)}

    def _default_choices(self) -> tuple[LaunchChoice, ...]:
        """A spec without choices: the pool's types in their capacities, cheapest first."""
        offers = sorted(self.cfg.offers(), key=lambda o: (o.usd_per_hour is None, o.usd_per_hour or 0))
        return tuple(o.choice for o in offers)

    def _launch_choice(self, choice: LaunchChoice, specs: Sequence[LaunchSpec],
                       root_device_name: str) -> LaunchResult:
        """Launch every spec as `choice`, walking the subnets in order on capacity errors."""
        # Subnets that ran out of capacity for this type lately are skipped until their cool-down ends.
        configured: tuple[str | None, ...] = self.cfg.subnet_ids or (None,)
        itype = choice_key(choice)
        now = self._clock()
        subnets = [s for s in configured if self.capacity.cooling(s or self.cfg.region, itype, now) is None]
        skipped = [c for s in configured if (c := self.capacity.cooling(s or self.cfg.region, itype, now))]
        if skipped:
            log.info(_kv(event="aws_launch_subnets_cooling", cluster=self.cluster_id, pool=self.pool,
                         instance_type=itype, subnets=[c.location for c in skipped],
                         until=[c.until.isoformat() for c in skipped]))
        if not subnets:
            err = all_cooling_error(skipped, itype, "subnet")
            self._log_launch_failed(err, launched=0, remaining=len(specs))
            return LaunchResult(launched=(), error=err)
        subnet_index = 0  # only moves forward: a subnet out of capacity is not retried in this call
        capacity_errors: list[ProviderError] = []
        launched: list[CloudInstance] = []
        for n, spec in enumerate(specs):
            while True:
                subnet = subnets[subnet_index]
                try:
                    instance = self._run_instance(spec, subnet, root_device_name)
                except ProviderError as err:
                    if err.kind is not ErrorKind.CAPACITY:
                        self._log_launch_failed(err, launched=len(launched), remaining=len(specs) - n)
                        return LaunchResult(launched=tuple(launched), error=err)
                    capacity_errors.append(err)
                    self.capacity.exhausted(subnet or self.cfg.region, itype, err, self._clock())
                    subnet_index += 1
                    if subnet_index < len(subnets):
                        log.warning(
                            _kv(
                                event="aws_launch_subnet_failover",
                                cluster=self.cluster_id,
                                pool=self.pool,
                                launch_id=spec.launch_id,
                                subnet=err.location,
                                code=err.code,
                                next_subnet=subnets[subnet_index],
                            )
                        )
                        continue
                    final = self._out_of_capacity(capacity_errors, len(configured), itype)
                    self._log_launch_failed(final, launched=len(launched), remaining=len(specs) - n)
                    return LaunchResult(launched=tuple(launched), error=final)
                self.capacity.succeeded(subnet or self.cfg.region, itype)
                launched.append(instance)
                break
        return LaunchResult(launched=tuple(launched))

    def capacity_cooldowns(self) -> list[Cooldown]:
        """The subnets this provider skips now, and until when (shown on the pool)."""
        return self.capacity.snapshot(self._clock())

    def list(self) -> list[CloudInstance]:
        """Every non-terminated instance tagged with this cluster and pool."""
        filters = [
            {"Name": f"tag:{TAG_MANAGED_BY}", "Values": [MANAGED_BY_VALUE]},
            {"Name": f"tag:{TAG_CLUSTER}", "Values": [self.cluster_id]},
            {"Name": f"tag:{TAG_POOL}", "Values": [self.pool]},
            {"Name": "instance-state-name", "Values": list(LISTED_STATES)},
        ]

        def describe_all() -> list[CloudInstance]:
            paginator = self._ec2.get_paginator("describe_instances")
            pages = paginator.paginate(Filters=filters, PaginationConfig={"PageSize": DESCRIBE_PAGE_SIZE})
            return [
                _to_cloud_instance(raw)
                for page in pages
                for reservation in page.get("Reservations", [])
                for raw in reservation.get("Instances", [])
            ]

        try:
            # A throttled page restarts the listing: a partial list would look like lost instances.
            return self._call("DescribeInstances", describe_all)
        except ClientError as exc:
            raise classify_error(exc, self.cfg.region) from exc
        except BotoCoreError as exc:
            raise transport_error(exc, self.cfg.region) from exc

    def describe(self, ids: Sequence[str]) -> dict[str, CloudInstance | None]:
        """Each instance by id, whatever its state (a terminated one stays visible for about an
        hour), or None for an id AWS does not know. Right after RunInstances AWS may answer
        "not found" for an instance it has (eventual consistency): the caller weighs that."""
        unique = list(dict.fromkeys(ids))
        out: dict[str, CloudInstance | None] = {}
        for start in range(0, len(unique), DESCRIBE_IDS_CHUNK):
            out.update(self._describe_chunk(unique[start : start + DESCRIBE_IDS_CHUNK]))
        return out

    def terminate(self, ids: Sequence[str]) -> None:
        """Terminate instances; ids that AWS no longer knows are skipped, not errors. With
        `keep_stopped_disks`, the volumes of the stopped (or stopping) ones are kept: their
        DeleteOnTermination is turned off first, and a failure to do so leaves the instance for the
        next call rather than losing its disks."""
        unique = tuple(dict.fromkeys(ids))
        for start in range(0, len(unique), TERMINATE_CHUNK):
            chunk = unique[start : start + TERMINATE_CHUNK]
            if self.cfg.keep_stopped_disks:
                self._keep_volumes_of_stopped(chunk)
            self._terminate_chunk(chunk)

    def stop(self, ids: Sequence[str]) -> None:
        """Park instances: StopInstances keeps their EBS volumes (provisioners.base.Parker). Ids
        already stopping or stopped, terminated, shutting down or unknown to AWS are skipped (one
        DescribeInstances per chunk finds them, so that a terminated one is never stopped again).
        Raises ProviderError as `classify_error` sorts StopInstances' refusal: UnsupportedOperation
        (a spot instance, an instance-store root) is INVALID, IncorrectInstanceState (pending) UNKNOWN."""
        unique = tuple(dict.fromkeys(ids))
        for chunk_start in range(0, len(unique), TERMINATE_CHUNK):
            raw = self._describe_raw(unique[chunk_start : chunk_start + TERMINATE_CHUNK])
            todo = [i for i, r in raw.items() if r is not None and _state_name(r) in ("pending", "running")]
            skipped = {i: _state_name(r) if r is not None else "not_found" for i, r in raw.items() if i not in todo}
            if skipped:
                log.info(_kv(event="aws_stop_skipped", cluster=self.cluster_id, pool=self.pool,
                             instances=[f"{i}:{s}" for i, s in skipped.items()]))
            try:
                if todo:
                    self._park_call("StopInstances", todo, self.cfg.region)
            except ProviderError as err:
                if err.code != INSTANCE_NOT_FOUND:
                    raise
                # AWS stopped none of them: gone since the lookup (or not yet consistent). One by
                # one, those it does not know are skipped.
                for instance_id in todo if len(todo) > 1 else ():
                    self.stop([instance_id])

    def start(self, ids: Sequence[str]) -> None:
        """Start parked (stopped) instances again, one StartInstances per subnet so that a capacity
        error names the subnet it hit (provisioners.base.Parker). Pending or running ids are
        skipped. Every startable subnet is tried; the first error is then raised: CAPACITY (scope
        ZONE, location the subnet) as for a launch; UNKNOWN with INSTANCE_STILL_STOPPING for one
        still stopping; INVALID with INSTANCE_NOT_FOUND for one AWS does not know or that is
        terminated or shutting down."""
        unique = tuple(dict.fromkeys(ids))
        errors: list[ProviderError] = []
        by_subnet: dict[str, list[str]] = {}
        for chunk_start in range(0, len(unique), TERMINATE_CHUNK):
            for instance_id, raw in self._describe_raw(unique[chunk_start : chunk_start + TERMINATE_CHUNK]).items():
                state = _state_name(raw) if raw is not None else "not_found"
                location = _location(raw) if raw is not None else self.cfg.region
                if state == "stopped":
                    by_subnet.setdefault(location, []).append(instance_id)
                elif state == "stopping":
                    errors.append(ProviderError(
                        ErrorKind.UNKNOWN, f"instance {instance_id} is still stopping: start it once stopped",
                        scope=ErrorScope.ZONE, code=INSTANCE_STILL_STOPPING, location=location))
                elif state not in ("pending", "running"):
                    errors.append(ProviderError(
                        ErrorKind.INVALID, f"instance {instance_id} cannot be started: {state}",
                        scope=ErrorScope.ZONE, code=INSTANCE_NOT_FOUND, location=location))
        for location, todo in by_subnet.items():
            for chunk_start in range(0, len(todo), TERMINATE_CHUNK):
                try:
                    self._park_call("StartInstances", todo[chunk_start : chunk_start + TERMINATE_CHUNK], location)
                except ProviderError as err:
                    errors.append(err)
        for err in errors:
            log.warning(_kv(event="aws_start_failed", cluster=self.cluster_id, pool=self.pool, kind=err.kind.value,
                            code=err.code, location=err.location, error=err.args[0]))
        if errors:
            raise errors[0]

    # -- internals --------------------------------------------------------------------------

    def _park_call(self, op: str, ids: Sequence[str], location: str) -> None:
        """One StopInstances or StartInstances; a refusal is raised classified at `location` (the
        subnet for a start: capacity is per zone), its message naming the instances."""
        fn = self._ec2.stop_instances if op == "StopInstances" else self._ec2.start_instances
        try:
            resp = self._call(op, fn, InstanceIds=list(ids))
        except ClientError as exc:
            err = classify_error(exc, location)
            if error_code(exc) == "InvalidInstanceID.NotFound":
                err = ProviderError(ErrorKind.INVALID, err.args[0], scope=ErrorScope.ZONE, code=INSTANCE_NOT_FOUND,
                                    location=location)
            raise ProviderError(err.kind, f"{op} {','.join(ids)}: {err.args[0]}", scope=err.scope, code=err.code,
                                location=err.location) from exc
        except BotoCoreError as exc:
            raise transport_error(exc, location) from exc
        key = "StoppingInstances" if op == "StopInstances" else "StartingInstances"
        log.info(_kv(event="aws_instances_stopping" if op == "StopInstances" else "aws_instances_starting",
                     cluster=self.cluster_id, pool=self.pool, location=location,
                     instances=[f"{i.get('InstanceId')}:{i.get('CurrentState', {}).get('Name')}"
                                for i in resp.get(key, [])]))

    def _call(self, op: str, fn: Callable[..., T], /, **kwargs: Any) -> T:
        """Call `fn`, repeating it on throttling and transient faults (provisioners/retry.py); the
        last exception is re-raised as is."""

        def on_retry(r: RetryAttempt) -> None:
            code = error_code(r.error) if isinstance(r.error, ClientError) else type(r.error).__name__
            log.warning(
                _kv(
                    event="aws_call_retry",
                    op=op,
                    cluster=self.cluster_id,
                    pool=self.pool,
                    attempt=r.attempt,
                    max_attempts=r.max_attempts,
                    code=code,
                    sleep_s=f"{r.sleep_s:.3f}",
                )
            )

        return call_with_retries(lambda: fn(**kwargs), policy=self._retry, is_transient=is_transient,
                                 on_retry=on_retry)

    def _resolve_root_device_name(self) -> str:
        if self._root_device_name is not None:
            return self._root_device_name
        image_id = self.cfg.image_id
        try:
            resp = self._call("DescribeImages", self._ec2.describe_images, ImageIds=[image_id])
        except ClientError as exc:
            raise classify_error(exc, self.cfg.region) from exc
        except BotoCoreError as exc:
            raise transport_error(exc, self.cfg.region) from exc
        images = resp.get("Images", [])
        if not images or not images[0].get("RootDeviceName"):
            raise ProviderError(
                ErrorKind.INVALID,
                f"image {image_id!r} not found in {self.cfg.region} (or has no root device)",
                code="InvalidAMIID.NotFound",
                location=self.cfg.region,
            )
        self._root_device_name = str(images[0]["RootDeviceName"])
        return self._root_device_name

    def _instance_tags(self, launch_id: str) -> dict[str, str]:
        # Custom tags first so that a custom Name wins, shipyard:* tags last so that nothing can
        # override the tags that `list()` and the orphan sweep rely on.
        return {
            "Name": f"shipyard-{self.cluster_id}-{self.pool}",
            **self.cfg.tags,
            TAG_MANAGED_BY: MANAGED_BY_VALUE,
            TAG_CLUSTER: self.cluster_id,
            TAG_POOL: self.pool,
            TAG_MASTER: self.master_url,
            TAG_LAUNCH_ID: launch_id,
        }

    def _choice(self, spec: LaunchSpec) -> LaunchChoice:
        return spec.choices[0] if spec.choices else self._default_choices()[0]

    def _spec_tags(self, spec: LaunchSpec) -> dict[str, str]:
        """The instance's tags: the pool's, and how it was bought (spot or on-demand)."""
        return {**self._instance_tags(spec.launch_id), TAG_CAPACITY: "spot" if self._choice(spec).spot else "on-demand"}

    def _run_instances_params(
        self, spec: LaunchSpec, subnet: str | None, root_device_name: str
    ) -> dict[str, Any]:
        cfg = self.cfg
        choice = self._choice(spec)
        tag_list = [{"Key": k, "Value": v} for k, v in self._spec_tags(spec).items()]
        params: dict[str, Any] = {
            "ImageId": cfg.image_id,
            "InstanceType": choice.instance_type,
            "MinCount": 1,
            "MaxCount": 1,
            "ClientToken": spec.launch_id,
            "UserData": spec.user_data,  # botocore base64-encodes it
            "InstanceInitiatedShutdownBehavior": "terminate",  # `shutdown` in the agent ends the bill
            "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},  # IMDSv2 only
            "BlockDeviceMappings": [
                {
                    "DeviceName": root_device_name,
                    "Ebs": {
                        "VolumeSize": cfg.root_volume_size_gb,
                        "VolumeType": "gp3",
                        "DeleteOnTermination": True,
                    },
                }
            ],
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": tag_list},
                {"ResourceType": "volume", "Tags": tag_list},
            ],
        }
        if subnet is not None:
            params["SubnetId"] = subnet
        if cfg.security_group_ids:
            params["SecurityGroupIds"] = list(cfg.security_group_ids)
        if cfg.iam_instance_profile:
            key = "Arn" if cfg.iam_instance_profile.startswith("arn:") else "Name"
            params["IamInstanceProfile"] = {key: cfg.iam_instance_profile}
        if cfg.ssh_key_name:
            params["KeyName"] = cfg.ssh_key_name
        if choice.spot:
            spot_options: dict[str, Any] = {
                "SpotInstanceType": "one-time",
                "InstanceInterruptionBehavior": "terminate",
            }
            if cfg.spot_max_price is not None:
                spot_options["MaxPrice"] = cfg.spot_max_price
            params["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": spot_options}
            # The spot request RunInstances creates carries the tags too: an IAM policy conditioned on
            # the request's tags (det deploy's) then allows it like the instance.
            params["TagSpecifications"].append({"ResourceType": "spot-instances-request", "Tags": tag_list})
        return params

    def _run_instance(self, spec: LaunchSpec, subnet: str | None, root_device_name: str) -> CloudInstance:
        location = subnet or self.cfg.region
        params = self._run_instances_params(spec, subnet, root_device_name)
        try:
            resp = self._call("RunInstances", self._ec2.run_instances, **params)
        except ClientError as exc:
            err = classify_error(exc, location)
            if err.kind is ErrorKind.QUOTA:
                # EC2 quotas are per region: another subnet would not escape it.
                err = ProviderError(err.kind, err.args[0], scope=ErrorScope.REGION, code=err.code,
                                    location=self.cfg.region)
            raise err from exc
        except BotoCoreError as exc:
            raise transport_error(exc, location) from exc
        raw = resp["Instances"][0]
        instance = _to_cloud_instance(raw, known_tags=self._spec_tags(spec))
        log.info(
            _kv(
                event="aws_instance_launched",
                cluster=self.cluster_id,
                pool=self.pool,
                instance_id=instance.id,
                launch_id=spec.launch_id,
                subnet=instance.location or location,
                instance_type=instance.instance_type,
                spot=instance.spot,
            )
        )
        return instance

    def _out_of_capacity(self, errors: Sequence[ProviderError], n_subnets: int, itype: str) -> ProviderError:
        tried = ", ".join(f"{e.location} ({e.code})" for e in errors)
        return ProviderError(
            ErrorKind.CAPACITY,
            f"no capacity for {itype} in any subnet: {tried}",
            scope=ErrorScope.ZONE if n_subnets == 1 else ErrorScope.REGION,
            code=errors[-1].code,
            location=",".join(dict.fromkeys(e.location for e in errors)),
        )

    def _log_launch_failed(self, err: ProviderError, *, launched: int, remaining: int) -> None:
        log.warning(
            _kv(
                event="aws_launch_failed",
                cluster=self.cluster_id,
                pool=self.pool,
                kind=err.kind.value,
                code=err.code,
                location=err.location,
                launched=launched,
                not_launched=remaining,
            )
        )

    def _describe_chunk(self, chunk: Sequence[str]) -> dict[str, CloudInstance | None]:
        raw = self._describe_raw(chunk)
        out = {i: _to_cloud_instance(r) if r is not None else None for i, r in raw.items()}
        log.info(_kv(event="aws_described", cluster=self.cluster_id, pool=self.pool,
                     states=",".join(f"{i}:{c.state if c is not None else 'not_found'}" for i, c in out.items())))
        return out

    def _describe_raw(self, chunk: Sequence[str]) -> dict[str, Mapping[str, Any] | None]:
        """Each id's DescribeInstances item as AWS returns it, or None for an id AWS does not know."""
        remaining = list(chunk)
        out: dict[str, Mapping[str, Any] | None] = {}
        while remaining:
            try:
                resp = self._call("DescribeInstances", self._ec2.describe_instances, InstanceIds=remaining)
            except ClientError as exc:
                if error_code(exc) not in ("InvalidInstanceID.NotFound", "InvalidInstanceID.Malformed"):
                    raise classify_error(exc, self.cfg.region) from exc
                # As with TerminateInstances, AWS names the unknown ids and describes none of them.
                unknown = set(_INSTANCE_ID_RE.findall(error_message(exc))) & set(remaining)
                if not unknown:
                    if len(remaining) > 1:
                        for instance_id in remaining:  # unparseable message: one id at a time
                            out.update(self._describe_raw([instance_id]))
                        return out
                    unknown = set(remaining)
                out.update({i: None for i in unknown})
                remaining = [i for i in remaining if i not in unknown]
                continue
            except BotoCoreError as exc:
                raise transport_error(exc, self.cfg.region) from exc
            found = {raw["InstanceId"]: raw
                     for reservation in resp.get("Reservations", []) for raw in reservation.get("Instances", [])}
            out.update({i: found.get(i) for i in remaining})
            return out
        return out

    def _keep_volumes_of_stopped(self, chunk: Sequence[str]) -> None:
        """Turn DeleteOnTermination off on every volume of the chunk's stopped or stopping instances
        (a filter rather than InstanceIds: ids AWS no longer knows are not an error here)."""
        filters = [
            {"Name": "instance-id", "Values": list(chunk)},
            {"Name": "instance-state-name", "Values": ["stopping", "stopped"]},
        ]
        try:
            resp = self._call("DescribeInstances", self._ec2.describe_instances, Filters=filters)
            for raw in (i for r in resp.get("Reservations", []) for i in r.get("Instances", [])):
                devices = [(m["DeviceName"], m.get("Ebs", {}).get("VolumeId"))
                           for m in raw.get("BlockDeviceMappings", [])
                           if m.get("Ebs", {}).get("DeleteOnTermination")]
                if not devices:
                    continue
                self._call(
                    "ModifyInstanceAttribute",
                    self._ec2.modify_instance_attribute,
                    InstanceId=raw["InstanceId"],
                    BlockDeviceMappings=[{"DeviceName": d, "Ebs": {"DeleteOnTermination": False}} for d, _ in devices],
                )
                log.info(_kv(event="aws_stopped_instance_volumes_kept", cluster=self.cluster_id, pool=self.pool,
                             instance_id=raw["InstanceId"], state=raw.get("State", {}).get("Name"),
                             volume_ids=[v for _, v in devices if v]))
        except ClientError as exc:
            raise classify_error(exc, self.cfg.region) from exc
        except BotoCoreError as exc:
            raise transport_error(exc, self.cfg.region) from exc

    def _terminate_chunk(self, chunk: Sequence[str]) -> None:
        remaining = list(chunk)
        while remaining:
            try:
                self._call("TerminateInstances", self._ec2.terminate_instances, InstanceIds=remaining)
            except ClientError as exc:
                if error_code(exc) != "InvalidInstanceID.NotFound":
                    raise classify_error(exc, self.cfg.region) from exc
                # AWS names the unknown ids in the message and terminates none of the chunk:
                # drop those ids and send the rest again.
                gone = set(_INSTANCE_ID_RE.findall(error_message(exc))) & set(remaining)
                if not gone:
                    if len(remaining) == 1:
                        gone = set(remaining)
                    else:
                        # Unparseable message: one call per id finds out which ones are gone.
                        for instance_id in remaining:
                            self._terminate_chunk([instance_id])
                        return
                log.info(
                    _kv(
                        event="aws_terminate_already_gone",
                        cluster=self.cluster_id,
                        pool=self.pool,
                        instance_ids=sorted(gone),
                    )
                )
                remaining = [i for i in remaining if i not in gone]
                continue
            except BotoCoreError as exc:
                raise transport_error(exc, self.cfg.region) from exc
            log.info(
                _kv(
                    event="aws_instances_terminated",
                    cluster=self.cluster_id,
                    pool=self.pool,
                    instance_ids=remaining,
                )
            )
            return


def _to_cloud_instance(
    raw: Mapping[str, Any], *, known_tags: Mapping[str, str] | None = None
) -> CloudInstance:
    tags = dict(known_tags or {})
    tags.update({t["Key"]: t["Value"] for t in raw.get("Tags", [])})
    launched_at = raw.get("LaunchTime")
    if isinstance(launched_at, datetime):
        launched_at = launched_at.astimezone(UTC) if launched_at.tzinfo else launched_at.replace(tzinfo=UTC)
    else:  # absent only in malformed responses; the instance exists, so keep it visible
        launched_at = datetime.now(UTC)
    state_name = raw.get("State", {}).get("Name", "pending")
    return CloudInstance(
        id=raw["InstanceId"],
        # An unknown future state is treated as pending: visible, not yet capacity.
        state=_STATE_MAP.get(state_name, CloudState.PENDING),
        launched_at=launched_at,
        launch_id=tags.get(TAG_LAUNCH_ID),
        private_ip=raw.get("PrivateIpAddress") or None,
        public_ip=raw.get("PublicIpAddress") or None,
        location=_location(raw),
        instance_type=raw.get("InstanceType", ""),
        spot=raw.get("InstanceLifecycle") == "spot",
        tags=tags,
    )


def _state_name(raw: Mapping[str, Any]) -> str:
    return str(raw.get("State", {}).get("Name", "pending"))


def _location(raw: Mapping[str, Any]) -> str:
    """The instance's subnet (its zone where it has none)."""
    return str(raw.get("SubnetId") or raw.get("Placement", {}).get("AvailabilityZone", ""))


def build(cfg: AwsPoolConfig, ctx: ProviderContext) -> BuiltProvider:
    aws = AwsProvider(cfg, cluster_id=ctx.cluster_id, pool=ctx.pool, master_url=ctx.master_url)
    return BuiltProvider(aws, aws.resolve_instance_slots())
