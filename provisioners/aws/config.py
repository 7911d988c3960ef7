"""A pool's AWS settings: the `provider:` section of a `type: aws` pool, less the elastic settings.

Checked like every settings section (shipyard_common/settings.py): every problem is reported at once,
with its path in the section. This module imports no AWS SDK: the master's API workers validate every
pool's section to show its effective settings.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field, model_validator

from provisioners.base import Capacity, InstanceOffer, InstanceSummary, ProviderSettings, capacity_of
from provisioners.capacity import DEFAULT_CAPACITY_COOLDOWN_S
from shipyard_common import clouds
from shipyard_common.settings import boolean, check_all, http_url, integer, str_mapping, text, text_list

MAX_TAGS_PER_RESOURCE = 50
RESERVED_TAG_COUNT = 7  # Name + the six shipyard:* tags
MAX_CUSTOM_TAGS = MAX_TAGS_PER_RESOURCE - RESERVED_TAG_COUNT


def _price(value: Any) -> str | None:
    """USD per hour as the decimal text AWS expects. YAML turns `0.90` into a float: accepted."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError('must be a price in USD per hour, e.g. "0.90"')
    try:
        price = Decimal(str(value).strip())
    except InvalidOperation:
        raise ValueError(f"must be a price in USD per hour, got {value!r}") from None
    if not price.is_finite() or price <= 0:
        raise ValueError(f"must be a positive price, got {value!r}")
    return str(price)


def _tag_problem(key: Any, value: Any) -> str | None:
    if not isinstance(key, str) or not key or len(key) > 128:
        return "tag key must be a string of 1 to 128 characters"
    if key.lower().startswith(("aws:", "shipyard:")):
        return "keys starting with 'aws:' or 'shipyard:' are reserved"
    if not isinstance(value, str) or len(value) > 256:
        return "tag value must be a string of at most 256 characters"
    return None


def _at_most_custom_tags(tags: dict[str, str]) -> dict[str, str]:
    if len(tags) > MAX_CUSTOM_TAGS:
        raise ValueError(f"at most {MAX_CUSTOM_TAGS} custom tags (AWS allows {MAX_TAGS_PER_RESOURCE} per resource)")
    return tags


def _some_subnets(subnets: tuple[str, ...] | None) -> tuple[str, ...] | None:
    if subnets is not None and not subnets:
        raise ValueError("must not be empty (omit it to launch into the default VPC)")
    return subnets


class AwsPoolConfig(ProviderSettings):
    TYPE = "aws"

    region: Annotated[str, text()]
    image_id: Annotated[str, text()]
    # One type (`instance_type`) or several (`instance_types`: the scale decider launches the
    # cheapest combination that fits, and fails over between them on capacity errors).
    # Required unless instance_types is given (then it is None), so that it is reported with the rest.
    instance_type: Annotated[str | None, text(optional=True)]
    instance_types: Annotated[tuple[str, ...] | None, text_list(optional=True)] = None
    # spot | on-demand | spot-then-on-demand; None: `spot` says (true: spot, false: on-demand).
    capacity: Annotated[str | None, text(optional=True)] = None
    # One type's slots; None: the number of GPUs (the catalogue's, else DescribeInstanceTypes').
    instance_slots: Annotated[int | None, integer(1, 1024, optional=True)] = None
    # Failover order; None: the default VPC.
    subnet_ids: Annotated[tuple[str, ...] | None, text_list(optional=True), AfterValidator(_some_subnets)] = None
    security_group_ids: Annotated[tuple[str, ...], text_list(null_is_empty=True)] = ()
    iam_instance_profile: Annotated[str | None, text(optional=True)] = None  # profile name or ARN
    ssh_key_name: Annotated[str | None, text(optional=True)] = None
    root_volume_size_gb: Annotated[int, integer(1, 16384)] = 100
    # Device name of the AMI's root volume. None: looked up once with DescribeImages. A wrong name
    # does not resize the root volume, it silently attaches a second one.
    root_device_name: Annotated[str | None, text(optional=True)] = None
    spot: Annotated[bool, boolean()] = False
    # USD per hour; None: capped at the on-demand price.
    spot_max_price: Annotated[str | None, BeforeValidator(_price)] = None
    tags: Annotated[
        dict[str, str], str_mapping(_tag_problem, what="tag key to value"), AfterValidator(_at_most_custom_tags)
    ] = Field(default_factory=dict)
    endpoint_url: Annotated[str | None, http_url(optional=True)] = None  # tests and private endpoints
    # A subnet that answered "no capacity" is skipped by later launches for this long (0: never).
    capacity_cooldown_s: Annotated[int, integer(0, 86400)] = DEFAULT_CAPACITY_COOLDOWN_S
    # An instance found stopped (by hand, not by this master) is still terminated; true keeps its
    # EBS volumes (DeleteOnTermination turned off first), false deletes them with it.
    keep_stopped_disks: Annotated[bool, boolean()] = False

    @model_validator(mode="before")
    @classmethod
    def _one_or_several_types(cls, data: Any) -> Any:
        if isinstance(data, dict) and "instance_type" not in data and data.get("instance_types") is not None:
            return {**data, "instance_type": None}
        return data

    @property
    def types(self) -> tuple[str, ...]:
        """The instance types the pool may launch (`instance_type` is a list of one)."""
        return self.instance_types or ((self.instance_type,) if self.instance_type else ())

    @property
    def capacity_mode(self) -> Capacity:
        mode, _ = capacity_of(self.capacity, self.spot, "spot" in self.model_fields_set)
        return mode or Capacity.ON_DEMAND

    def slots_of(self, instance_type: str) -> int | None:
        """A type's slots: `instance_slots`, else its GPUs when the catalogue knows the type."""
        return self.instance_slots if self.instance_slots is not None else (clouds.aws_gpus(instance_type) or None)

    def offers(self, slots: dict[str, int] | None = None) -> tuple[InstanceOffer, ...]:
        """Every type in every capacity the pool buys, priced for its region (slots: `slots` or
        `slots_of`, 0 when unknown)."""
        out = []
        for itype in self.types:
            price = clouds.regional_price("aws", self.region, itype)
            n = (slots or {}).get(itype) or self.slots_of(itype) or 0
            for spot in self.capacity_mode.spot_choices:
                out.append(InstanceOffer(itype, n, spot, price.usd_per_hour(spot) if price else None))
        return tuple(out)

    def summary(self) -> InstanceSummary:
        """Without `instance_slots`, the slots are the type's GPUs, known here when the catalogue
        (shipyard_common/clouds.py) lists the type; else only once DescribeInstanceTypes answered.
        A pool of several types shows the largest."""
        known = [n for t in self.types if (n := self.slots_of(t))]
        slots = max(known) if len(known) == len(self.types) and known else None
        return InstanceSummary(self.region, self.image_id, ", ".join(self.types),
                               self.capacity_mode is not Capacity.ON_DEMAND, slots,
                               self.offers() if len(self.types) > 1 or self.capacity else (), self.capacity_mode.value)

    @model_validator(mode="after")
    def _fields_agree(self) -> AwsPoolConfig:
        _, capacity_problem = capacity_of(self.capacity, self.spot, "spot" in self.model_fields_set)
        check_all([
            *([("root_device_name", "is required when image_id is an SSM parameter")]
              if self.image_id.startswith("resolve:ssm:") and self.root_device_name is None else []),
            *([("spot_max_price", "only applies to spot pools (set capacity: spot or spot-then-on-demand)")]
              if self.spot_max_price is not None and not capacity_problem
              and self.capacity_mode is Capacity.ON_DEMAND else []),
            *([("capacity", capacity_problem)] if capacity_problem else []),
            *self._type_problems(),
        ])
        return self

    def _type_problems(self) -> list[tuple[str, str]]:
        if self.instance_type is None and not self.instance_types:
            return [("instance_type", "required (or instance_types: a list of types)")]
        if self.instance_type is not None and self.instance_types is not None:
            return [("instance_types", "give instance_type or instance_types, not both")]
        if self.instance_types is not None and not self.instance_types:
            return [("instance_types", "must not be empty")]
        if len(self.types) == 1:
            return []
        if self.instance_slots is not None:
            return [("instance_slots", "applies to a pool of one type; with instance_types each type's slots are "
                                       "its GPUs")]
        return [(f"instance_types[{i}]", f"{t!r} has no GPUs; a pool of several types takes GPU types "
                                        "(or one type with instance_slots)")
                for i, t in enumerate(self.types) if clouds.aws_gpus(t) == 0]
