"""The elastic settings of a resource pool: the one home of their defaults.

A pool's `provider:` section holds these settings, common to every provider, beside the provider's
own (region, instance type …: its config model in `provisioners/`). `provisioners.factory.resolve`
reads both, applies the provider's defaults that depend on its section (a static pool keeps all its
hosts), and is the only way anything — the autoscaler, the API, the CLI through it, the web UI —
learns a pool's effective settings. The scale decider's limits (`control_plane.core.scaling`) take
their defaults from here too.

Unset `max_instances` is 5 (Determined's default): a pool never grows without a bound nobody set.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Optional

from pydantic import Field, model_validator

from shipyard_common.consolidation_settings import ConsolidationSection, ConsolidationSettings
from shipyard_common.settings import Duration, StrictSettings

DEFAULT_MIN_INSTANCES = 0
DEFAULT_MAX_INSTANCES = 5
#: The idle period is short because a relaunch only costs one boot (about 90 s on AWS/GCP GPU
#: images) while every idle minute bills a whole GPU instance; benchmarks/elastic_trace.py measures
#: the trade-off on a day of trial arrivals.
DEFAULT_MAX_IDLE_AGENT_PERIOD = timedelta(minutes=5)
DEFAULT_MAX_AGENT_STARTING_PERIOD = timedelta(minutes=20)
DEFAULT_MAX_DISCONNECTED_PERIOD = timedelta(minutes=10)
DEFAULT_LAUNCH_ERROR_BACKOFF = timedelta(seconds=30)
DEFAULT_LAUNCH_ERROR_BACKOFF_MAX = timedelta(minutes=30)
DEFAULT_BOOTSTRAP_TOKEN_TTL = timedelta(minutes=30)
DEFAULT_LAUNCH_PROBE_INTERVAL = timedelta(minutes=5)
#: How far back the demand arrivals are looked at to predict the next one (scale-down hysteresis).
DEFAULT_ARRIVAL_WINDOW = timedelta(minutes=30)
#: How long an instance may be missing from a lagging cloud list before it is presumed gone.
DEFAULT_LIST_MISS_GRACE = timedelta(minutes=3)
#: How long a stopped instance stays in the warm pool: a day of its disks costs cents, and an older
#: one runs the agent it was launched with.
DEFAULT_WARM_POOL_MAX_AGE = timedelta(hours=24)


class ElasticSettings(StrictSettings):
    """What every elastic pool's `provider:` section may set besides the provider's own fields."""

    type: str
    min_instances: int = Field(DEFAULT_MIN_INSTANCES, ge=0)
    max_instances: int = Field(DEFAULT_MAX_INSTANCES, ge=0)
    # An idle agent's instance is terminated after this long (see the hysteresis: arrival_window).
    max_idle_agent_period: Duration = DEFAULT_MAX_IDLE_AGENT_PERIOD
    # An instance whose agent has not connected this long after launch is replaced.
    max_agent_starting_period: Duration = DEFAULT_MAX_AGENT_STARTING_PERIOD
    # An instance whose agent has been disconnected this long is replaced (its work presumed lost).
    max_disconnected_period: Duration = DEFAULT_MAX_DISCONNECTED_PERIOD
    # After a failed launch the pool waits this long, doubling up to the max.
    launch_error_backoff: Duration = DEFAULT_LAUNCH_ERROR_BACKOFF
    launch_error_backoff_max: Duration = DEFAULT_LAUNCH_ERROR_BACKOFF_MAX
    # The URL the pool's agents reach the master at; None: the master's advertised URL.
    master_url: Optional[str] = None
    # Shell run by cloud-init before the agent starts.
    startup_script: str = ""
    # Options of the agents the pool boots (checked by agent_bootstrap.cloud_init).
    agent: dict[str, Any] = Field(default_factory=dict)
    # At most this many launches per decision; None: as many as the demand needs.
    max_launch_per_decision: Optional[int] = Field(None, ge=1)
    # The lifetime of the one-use token an instance enrols its agent with.
    bootstrap_token_ttl: Duration = DEFAULT_BOOTSTRAP_TOKEN_TTL
    # How long an instance may be missing from the cloud's lists before it is presumed gone; None:
    # DEFAULT_LIST_MISS_GRACE, or at once for providers whose list is consistent.
    list_miss_grace: Optional[Duration] = None
    # During a long launch backoff (quota), one instance is launched this often to see whether the
    # error is over, rather than waiting for the whole backoff.
    launch_probe_interval: Duration = DEFAULT_LAUNCH_PROBE_INTERVAL
    # Idle policy: the demand arrivals of this window predict the next one, and an instance idle past
    # max_idle_agent_period is kept while idling until that arrival costs less than a relaunch (the
    # pool's measured boots, the waiting slots), up to twice max_idle_agent_period, the hard bound
    # (control_plane/core/scaling/idle.py). 0 turns it off: idle instances go after max_idle_agent_period.
    arrival_window: Duration = DEFAULT_ARRIVAL_WINDOW
    # Moving work off an instance by checkpoint and resume to terminate it, under a disruption budget
    # (shipyard_common/consolidation_settings.py; off by default).
    consolidation: ConsolidationSection = Field(default_factory=ConsolidationSettings)
    # The warm pool: up to this many idle on-demand instances are stopped instead of terminated
    # (their disks kept, billing) and started again, faster than a launch boots, before the pool
    # launches anything; 0: idle instances are terminated. Needs a provider that stops and starts
    # instances (aws, gcp); spot instances are always terminated.
    warm_pool_size: int = Field(0, ge=0)
    # A stopped instance older than this is terminated.
    warm_pool_max_age: Duration = DEFAULT_WARM_POOL_MAX_AGE

    @model_validator(mode="after")
    def _bounds(self) -> ElasticSettings:
        if self.min_instances > self.max_instances:
            raise ValueError(f"min_instances ({self.min_instances}) is greater than max_instances ({self.max_instances})")
        return self


#: The keys of a `provider:` section that are elastic settings; the rest is the provider's own.
COMMON_KEYS = frozenset(ElasticSettings.model_fields)
