"""Per-environment settings: what differs between dev and prod, typed and checked once.

``app.py`` creates one :class:`EnvironmentSettings` per environment and hands it to the
stacks; nothing else in ``stacks/`` chooses a size, a timing or a retention. The worker
and the router receive their share only through the environment variables the service
stack sets from these values.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from aws_cdk import RemovalPolicy
from aws_cdk import aws_logs as logs

from wsfleet import config, schema, tracing
from wsfleet.plan import limits as plan_limits
from wsfleet.plan import model as plan
from wsfleet.leases import SessionTiming

# Fargate rejects a container stopTimeout above 120 s.
FARGATE_MAX_STOP_TIMEOUT_SECONDS = 120

_NAME = re.compile(r"^[a-z][a-z0-9-]{0,19}$")
# An alias would not do: IAM authorizes kms:Decrypt on the key's own ARN.
_KMS_KEY_ARN = re.compile(r"arn:aws[a-z-]*:kms:[a-z0-9-]+:[0-9]{12}:key/[A-Za-z0-9-]{1,128}")
_FARGATE_MEMORY_MIB = {
    256: (512, 1024, 2048),
    512: range(1024, 4097, 1024),
    1024: range(2048, 8193, 1024),
    2048: range(4096, 16385, 1024),
    4096: range(8192, 30721, 1024),
}


class SettingsError(ValueError):
    """An environment's settings are inconsistent; the message names the setting."""


# What a setting of each simple annotated type must hold ("X | None": that or None): a
# bool is no number here, a float no whole number, and inf or nan no number of seconds.
_TYPES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "int": (lambda value: type(value) is int, "a whole number"),
    "float": (lambda value: type(value) in (int, float) and math.isfinite(value), "a finite number"),
    "bool": (lambda value: type(value) is bool, "True or False"),
    "str": (lambda value: isinstance(value, str), "a string"),
    "tuple[str, ...]": (
        lambda value: isinstance(value, tuple) and all(isinstance(item, str) for item in value),
        "a tuple of strings",
    ),
    "ConsumerSettings": (lambda value: isinstance(value, ConsumerSettings), "a ConsumerSettings(...)"),
    # A number of days is no RetentionDays: CDK's own type check stops the synth with a
    # TypeError traceback from deep inside a LogGroup.
    "logs.RetentionDays": (lambda value: isinstance(value, logs.RetentionDays), "a logs.RetentionDays member"),
}


def _check_types(settings: Any, prefix: str = "") -> None:
    """Every setting of a type in ``_TYPES`` holds one, checked before anything compares
    them: a string, a float, a bool or None in ``max_workers`` (say) stops the synth with a
    sentence naming it instead of a TypeError further on, or a template CloudFormation
    refuses. ``prefix`` names the settings' owner (``consumer.``)."""
    for setting in dataclasses.fields(settings):
        value = getattr(settings, setting.name)
        kind = str(setting.type).removesuffix(" | None")
        optional = kind != setting.type
        if kind not in _TYPES or (optional and value is None):
            continue
        accepts, what = _TYPES[kind]
        if not accepts(value):
            also = " or None" if optional else ""
            raise SettingsError(f"{prefix}{setting.name} must be {what}{also}, got {value!r}")


# The VPC is a /16 with two public /24 subnets: two worker subnets fit it down to /18
# (16,379 task addresses each); /24 (251) is the smallest worth having.
VPC_CIDR_MASK = 16
WORKER_SUBNET_MASKS = range(18, 25)
AVAILABILITY_ZONES = 2  # the VPC's: a worker subnet and at most one NAT gateway in each


@dataclass(frozen=True)
class WarmThroughput:
    """Read and write units per second a table or index absorbs at once (DynamoDB's warm
    throughput): at least a new on-demand table's, at most the account's table quota."""

    read_units_per_second: int
    write_units_per_second: int

    def check(self, setting: str, table_quota: float) -> None:
        for kind, value, least in (
            ("read", self.read_units_per_second, plan_limits.DEFAULT_WARM_READS),
            ("write", self.write_units_per_second, plan_limits.DEFAULT_WARM_WRITES),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= table_quota:
                raise SettingsError(
                    f"{setting}: {kind}_units_per_second must be between {least:,} (a new on-demand table's) and "
                    f"{table_quota:,.0f} (the table quota; raise it in quotas), got {value!r}"
                )

    def as_plan(self) -> dict[str, int]:
        return {"read": self.read_units_per_second, "write": self.write_units_per_second}


# Kinesis keeps records 24 hours at least and 365 days at most.
MIN_STREAM_RETENTION_HOURS, MAX_STREAM_RETENTION_HOURS = 24, 8760
STREAM_KMS_AWS_MANAGED = "aws-managed"  # the aws/kinesis key: no key policy or grant to keep
STREAM_KMS_CUSTOMER_MANAGED = "customer-managed"  # a key of the stack's own, rotated yearly
STREAM_KMS_CHOICES = (STREAM_KMS_AWS_MANAGED, STREAM_KMS_CUSTOMER_MANAGED)
# Where the reference consumer's event source mapping starts reading a stream it has not
# read before: the oldest record kept (nothing the workers put before it was created is
# missed), or only records put after it.
CONSUMER_STARTING_POSITIONS = ("TRIM_HORIZON", "LATEST")
# Lambda's limits for a Kinesis event source mapping.
MAX_CONSUMER_BATCH_SIZE = 10_000
MAX_CONSUMER_BATCHING_WINDOW_SECONDS = 300
MAX_CONSUMER_RETRY_ATTEMPTS = 10_000


@dataclass(frozen=True, kw_only=True)
class ConsumerSettings:
    """The reference consumer (``wsfleet.consumer.handler``): a Lambda function on the
    messages stream that delivers each (connection, seq) once to an S3 bucket of its own."""

    # A batch costs one S3 object and one state write per connection in it, whatever
    # its number of records: a batch must hold many frames of each connection for the
    # consumer to cost less than the messages table (`wsfleet plan` prices it). So the
    # batch is as large as Lambda allows (records; Lambda cuts it at 6 MB of payload),
    # and waits up to the window for records to gather.
    batch_size: int = MAX_CONSUMER_BATCH_SIZE
    max_batching_window_seconds: int = 30
    starting_position: str = "TRIM_HORIZON"
    # A failing batch is split in two and each half retried, so that one record the
    # consumer cannot handle holds up as few others as possible.
    bisect_on_error: bool = True
    # None: retry a failing batch until its records leave the stream (the iterator-age
    # alarm fires long before); a number: give up after that many retries, and the batch's
    # shard and sequence numbers go to the failure queue (its records are not delivered).
    retry_attempts: int | None = None
    prefix: str = config.DEFAULT_CONSUMER_PREFIX  # CONSUMER_PREFIX: the output objects' key prefix
    output_ttl_days: int = 0  # output objects expire after this many days; 0 keeps them
    # The consumer is this far behind the stream's newest record: alarm.
    iterator_age_alarm_seconds: int = 600

    def __post_init__(self) -> None:
        _check_types(self, "consumer.")
        if not 1 <= self.batch_size <= MAX_CONSUMER_BATCH_SIZE:
            raise SettingsError(f"consumer.batch_size must be between 1 and {MAX_CONSUMER_BATCH_SIZE}")
        if not 0 <= self.max_batching_window_seconds <= MAX_CONSUMER_BATCHING_WINDOW_SECONDS:
            raise SettingsError(
                f"consumer.max_batching_window_seconds must be between 0 and {MAX_CONSUMER_BATCHING_WINDOW_SECONDS}"
            )
        if self.starting_position not in CONSUMER_STARTING_POSITIONS:
            raise SettingsError(
                f"consumer.starting_position must be {' or '.join(CONSUMER_STARTING_POSITIONS)}, "
                f"got {self.starting_position!r}"
            )
        if self.retry_attempts is not None and not 0 <= self.retry_attempts <= MAX_CONSUMER_RETRY_ATTEMPTS:
            raise SettingsError(
                f"consumer.retry_attempts must be None (until the records expire) or between 0 and "
                f"{MAX_CONSUMER_RETRY_ATTEMPTS}"
            )
        # The consumer's own parser (CONSUMER_PREFIX): the stack grants PutObject under
        # exactly what it will write under.
        try:
            parsed = config.consumer_prefix({config.CONSUMER_PREFIX: self.prefix})
        except config.ConfigError as error:
            raise SettingsError(f"consumer.prefix: {error}") from None
        if parsed != self.prefix:
            raise SettingsError(f"consumer.prefix must be a non-empty S3 key prefix without blanks, got {self.prefix!r}")
        if self.output_ttl_days < 0:
            raise SettingsError("consumer.output_ttl_days must be 0 (no expiry) or more")
        if self.iterator_age_alarm_seconds < 60:
            raise SettingsError("consumer.iterator_age_alarm_seconds must be at least 60")


# --- tracing (TRACING; README "Tracing") -------------------------------------------
# The runtime's own names for its modes (wsfleet.tracing decides what each does).
TRACING_XRAY_SDK, TRACING_OTEL, TRACING_OFF = tracing.XRAY_SDK, tracing.OTEL, tracing.OFF
TRACING_MODES = tracing.MODES
# In otel, how the router's spans reach X-Ray: through the AWS-managed ADOT collector
# extension layer, or exported by the function itself to X-Ray's OTLP endpoint.
LAMBDA_OTEL_LAYER, LAMBDA_OTEL_SDK = "layer", "sdk"
LAMBDA_OTEL_PATHS = (LAMBDA_OTEL_LAYER, LAMBDA_OTEL_SDK)
# The X-Ray SDKs and daemon are in maintenance mode; AWS ends their support on this day.
XRAY_SDK_END_OF_SUPPORT = "2027-02-25"


@dataclass(frozen=True, kw_only=True)
class TracingSettings:
    """How the worker and the router trace (the ``TRACING`` they are given), and what the
    stacks deploy for it (``stacks/tracing.py``): ``xray-sdk`` an X-Ray daemon sidecar,
    ``otel`` an ADOT collector sidecar and, for the router, ``lambda_otel``'s path,
    ``off`` nothing at all."""

    mode: str = TRACING_XRAY_SDK
    lambda_otel: str = LAMBDA_OTEL_LAYER  # only read in otel
    # In otel, the share of the traces the fleet starts itself that are kept
    # (OTEL_TRACES_SAMPLER_ARG); a trace that comes in (an API call, a hint) keeps its
    # caller's decision.
    sample_ratio: float = 0.05

    def __post_init__(self) -> None:
        if self.mode not in TRACING_MODES:
            raise SettingsError(f"tracing.mode must be {', '.join(TRACING_MODES)}, got {self.mode!r}")
        if self.lambda_otel not in LAMBDA_OTEL_PATHS:
            raise SettingsError(
                f"tracing.lambda_otel must be {' or '.join(LAMBDA_OTEL_PATHS)}, got {self.lambda_otel!r}"
            )
        ratio = self.sample_ratio
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio <= 1:
            raise SettingsError(f"tracing.sample_ratio must be a number between 0 and 1, got {ratio!r}")


@dataclass(frozen=True, kw_only=True)
class EnvironmentSettings:
    """Everything that differs between environments. Defaults suit a small dev fleet."""

    name: str

    # --- data ----------------------------------------------------------------------
    retain_data: bool = False  # prod: RETAIN, deletion protection, point-in-time recovery
    # Messages expire through DynamoDB TTL, and the messages bucket's objects with them;
    # 0 keeps both for ever.
    message_ttl_days: int = 7
    log_retention: logs.RetentionDays = logs.RetentionDays.ONE_WEEK

    # --- where frames go (SINK; CONTRACT section 4) --------------------------------------
    # "dynamodb" (the messages table), "kinesis" (the messages stream) or both,
    # comma-separated; parsed by the runtime's own config.sinks. The messages table is
    # deployed whatever the sink (emptying a stack of it is an operator's decision).
    sink: str = ",".join(schema.DEFAULT_SINKS)
    # The messages stream, where kinesis is a sink: on-demand, encrypted, kept this long.
    stream_retention_hours: int = MIN_STREAM_RETENTION_HOURS
    stream_kms: str = STREAM_KMS_AWS_MANAGED
    # The reference consumer on the stream; None: none deployed.
    consumer: ConsumerSettings | None = None

    # --- session timing (the worker's LEASE_SECONDS, ...; see CONTRACT section 2) ------
    lease_seconds: float = 10  # session lease
    heartbeat_seconds: float = 2.5  # session renewal interval
    reconcile_seconds: float = 10  # scan of the FREE# shards for connections nobody owns
    checkpoint_seconds: float = 120  # longest time between checkpoints of a busy connection
    max_clock_skew_ms: int = 1000
    state_shards: int = schema.DEFAULT_STATE_SHARDS

    # --- worker fleet ----------------------------------------------------------------
    worker_cpu: int = 256  # Fargate CPU units
    worker_memory_mib: int = 512
    max_connections_per_worker: int = 100
    # Rebalancing (REBALANCE, REBALANCE_TOLERANCE): a worker more than this fraction above
    # its fair share hands the excess over to workers under theirs, a few at a time.
    rebalance: bool = True
    rebalance_tolerance: float = 0.1
    # Target tracking keeps the average ActiveConnections per task near this value;
    # the headroom up to max_connections_per_worker absorbs a failed-over task's share.
    target_connections_per_worker: int = 70
    min_workers: int = 1
    max_workers: int = 4
    use_fargate_spot: bool = False  # Spot's 2-minute SIGTERM notice is our normal failover path
    shutdown_seconds: int = 25  # the worker's graceful-shutdown budget (SHUTDOWN_SECONDS)
    stop_timeout_seconds: int = 45  # container stopTimeout: SIGKILL after this
    metrics_seconds: int = 60
    # The WebSocket frame limit (MAX_FRAME_BYTES): a larger frame becomes a skip marker.
    max_frame_bytes: int = config.DEFAULT_MAX_FRAME_BYTES

    # --- router and API ----------------------------------------------------------------
    allowed_ws_hosts: tuple[str, ...] = ()  # empty: the router accepts no upstream at all
    api_rate_limit: int = 50  # requests per second, stage-wide
    api_burst_limit: int = 100

    # --- upstream credentials ----------------------------------------------------------
    # The Secrets Manager name prefix START's secret_headers ARNs must be under
    # (UPSTREAM_SECRET_PREFIX of the router and the worker); the worker may read exactly the
    # secrets of this account and region under it. None: wsfleet/<name>/; "": no secret at all.
    upstream_secret_prefix: str | None = None
    # Customer-managed KMS keys of those secrets, if any (the aws/secretsmanager key needs no
    # grant): the worker may decrypt with them only through Secrets Manager, for those secrets.
    upstream_secret_kms_key_arns: tuple[str, ...] = ()

    # --- network ---------------------------------------------------------------------
    nat_gateways: int = 1  # 1: cheapest; one per AZ: no single-AZ egress outage
    # Each address of a NAT gateway holds about 55,000 connections to one upstream IP and
    # port at a time: the primary, and secondary ones (each an Elastic IP: see quotas).
    nat_addresses_per_gateway: int = 1
    # The worker subnets' size (one per AZ): a rolling deploy runs up to twice the tasks,
    # each with an address of its own.
    worker_subnet_mask: int = 20

    # --- capacity --------------------------------------------------------------------
    # What the connections table and its by_owner index absorb at once: a crash's
    # acquisitions and a scale-in's handoffs come in seconds, faster than on-demand grows
    # (`wsfleet plan` sizes the burst). None: a new on-demand table's (12,000 / 4,000).
    connections_warm_throughput: WarmThroughput | None = None
    owner_index_warm_throughput: WarmThroughput | None = None
    # The adjustable AWS quotas this environment needs raised before it is deployed (names
    # of wsfleet.plan_limits.DEFAULT_QUOTAS): synth checks the plan against them.
    quotas: Mapping[str, float] = field(default_factory=dict)

    # --- upgrading an existing stack (README, "Upgrading an existing stack") -----------
    # The sessions table keeps the ring index stacks before issue 22 deployed ("by_ring",
    # KEYS_ONLY) beside "by_ring_load", and the workers may query both: deploy once with
    # it (the new index is added while the old workers still run on the old one), then
    # once without it (the old index is dropped). Usually given as
    # `-c keep_legacy_ring_index=on` for the first deploy.
    keep_legacy_ring_index: bool = False

    # --- operations ------------------------------------------------------------------
    alarm_topic_arn: str | None = None  # an existing SNS topic; None: alarms without actions

    # --- tracing ---------------------------------------------------------------------
    # Every environment on otel (or off) before XRAY_SDK_END_OF_SUPPORT (README "Tracing").
    tracing: TracingSettings = field(default_factory=TracingSettings)

    def __post_init__(self) -> None:
        _check_types(self)
        if not _NAME.match(self.name):
            raise SettingsError(f"name must be lower-case letters, digits and '-', got {self.name!r}")
        if self.lease_seconds < 2 * self.heartbeat_seconds:
            raise SettingsError("lease_seconds must be at least twice heartbeat_seconds")
        if not 0 <= self.max_clock_skew_ms < (self.lease_seconds - self.heartbeat_seconds) * 1000:
            raise SettingsError("max_clock_skew_ms must be below lease_seconds minus heartbeat_seconds")
        if not self.reconcile_seconds > 0:
            raise SettingsError("reconcile_seconds must be positive")
        # A checkpoint more often than the session renewal would bring back the
        # per-connection write per heartbeat that session leases do away with.
        if not self.checkpoint_seconds >= self.heartbeat_seconds:
            raise SettingsError("checkpoint_seconds must be at least heartbeat_seconds")
        if not 0 <= self.rebalance_tolerance <= 1:
            raise SettingsError("rebalance_tolerance must be between 0 and 1")
        if not 1 <= self.state_shards <= schema.MAX_STATE_SHARDS:
            raise SettingsError(f"state_shards must be between 1 and {schema.MAX_STATE_SHARDS}")
        if not self.shutdown_seconds < self.stop_timeout_seconds <= FARGATE_MAX_STOP_TIMEOUT_SECONDS:
            raise SettingsError(
                "stop_timeout_seconds must exceed shutdown_seconds (the worker's graceful "
                f"shutdown) and be at most {FARGATE_MAX_STOP_TIMEOUT_SECONDS} (Fargate's limit)"
            )
        if not 1 <= self.min_workers <= self.max_workers:
            raise SettingsError("min_workers must be at least 1 and at most max_workers")
        if not 0 < self.target_connections_per_worker < self.max_connections_per_worker:
            raise SettingsError("target_connections_per_worker must be below max_connections_per_worker")
        if self.worker_memory_mib not in _FARGATE_MEMORY_MIB.get(self.worker_cpu, ()):
            raise SettingsError(
                f"worker_cpu={self.worker_cpu} with worker_memory_mib={self.worker_memory_mib} "
                "is not a Fargate task size"
            )
        if not config.MIN_MAX_FRAME_BYTES <= self.max_frame_bytes <= config.MAX_MAX_FRAME_BYTES:
            raise SettingsError(
                f"max_frame_bytes must be between {config.MIN_MAX_FRAME_BYTES} and {config.MAX_MAX_FRAME_BYTES} "
                "(what the worker accepts as MAX_FRAME_BYTES)"
            )
        if self.message_ttl_days < 0:
            raise SettingsError("message_ttl_days must be 0 (no expiry) or more")
        if not 0 < self.api_rate_limit <= self.api_burst_limit:
            raise SettingsError("api_rate_limit must be positive and at most api_burst_limit")
        if not 1 <= self.nat_gateways <= plan_limits.MAX_NAT_GATEWAYS:
            raise SettingsError("nat_gateways must be 1 or 2 (the VPC spans two AZs)")
        self._check_capacity()
        self._check_secrets()
        self._check_sink()
        if not isinstance(self.tracing, TracingSettings):
            raise SettingsError(f"tracing must be a TracingSettings(mode=..., ...), got {self.tracing!r}")

    def _check_capacity(self) -> None:
        if not 1 <= self.nat_addresses_per_gateway <= plan_limits.MAX_NAT_ADDRESSES_PER_GATEWAY:
            raise SettingsError(
                f"nat_addresses_per_gateway must be between 1 and {plan_limits.MAX_NAT_ADDRESSES_PER_GATEWAY} "
                "(a NAT gateway's most Elastic IP addresses)"
            )
        if self.worker_subnet_mask not in WORKER_SUBNET_MASKS:
            raise SettingsError(
                f"worker_subnet_mask must be between /{WORKER_SUBNET_MASKS.start} and /{WORKER_SUBNET_MASKS.stop - 1} "
                f"(two of them and the public subnets fit the VPC's /{VPC_CIDR_MASK}), got {self.worker_subnet_mask!r}"
            )
        if not isinstance(self.quotas, Mapping):
            raise SettingsError(f"quotas must map quota names to numbers, got {self.quotas!r}")
        try:
            quotas = plan_limits.quotas_for({}, self.quotas)
        except ValueError as error:
            raise SettingsError(f"quotas: {error}") from None
        for name, value in self.quotas.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise SettingsError(f"quotas: {name} must be a positive number, got {value!r}")
        for setting in ("connections_warm_throughput", "owner_index_warm_throughput"):
            warm = getattr(self, setting)
            if warm is not None and not isinstance(warm, WarmThroughput):
                raise SettingsError(
                    f"{setting} must be a WarmThroughput(read_units_per_second=..., write_units_per_second=...) "
                    f"or None (a new on-demand table's), got {warm!r}"
                )
            if warm is not None:
                warm.check(setting, quotas["table_units"])

    @property
    def plan_settings(self) -> dict[str, Any]:
        """These settings as ``wsfleet plan`` reads an environment (``plan.ENVIRONMENTS``
        holds a copy: the runtime cannot import the stacks)."""
        warm = {"connections_warm": self.connections_warm_throughput, "owner_index_warm": self.owner_index_warm_throughput}
        return {
            "max_per_worker": self.max_connections_per_worker,
            "target_per_worker": self.target_connections_per_worker,
            "shards": self.state_shards,
            "checkpoint_s": self.checkpoint_seconds,
            "message_ttl_days": self.message_ttl_days,
            "min_workers": self.min_workers,
            "max_workers": self.max_workers,
            "worker_cpu": self.worker_cpu,
            "worker_memory_mib": self.worker_memory_mib,
            "api_rate_limit": self.api_rate_limit,
            "api_burst_limit": self.api_burst_limit,
            "nat_gateways": self.nat_gateways,
            "nat_addresses_per_gateway": self.nat_addresses_per_gateway,
            "worker_subnet_mask": self.worker_subnet_mask,
            "azs": AVAILABILITY_ZONES,
            "lease_s": self.lease_seconds,
            "heartbeat_s": self.heartbeat_seconds,
            "spot": self.use_fargate_spot,
            **{key: value.as_plan() if value else None for key, value in warm.items()},
            "quotas": dict(self.quotas),
        }

    @property
    def capacity_connections(self) -> int:
        """The fleet these settings are built for: max_workers at the scaling target."""
        return self.max_workers * self.target_connections_per_worker

    def _check_sink(self) -> None:
        if not self.sink.strip():
            raise SettingsError(f"sink must name {' or '.join(schema.SINKS)}, or both comma-separated")
        try:
            chosen = config.sinks({config.SINK: self.sink})
        except config.ConfigError as error:
            raise SettingsError(f"sink: {error}") from None
        if not MIN_STREAM_RETENTION_HOURS <= self.stream_retention_hours <= MAX_STREAM_RETENTION_HOURS:
            raise SettingsError(
                f"stream_retention_hours must be between {MIN_STREAM_RETENTION_HOURS} and "
                f"{MAX_STREAM_RETENTION_HOURS} (what Kinesis keeps), got {self.stream_retention_hours}"
            )
        if self.stream_kms not in STREAM_KMS_CHOICES:
            raise SettingsError(f"stream_kms must be {' or '.join(STREAM_KMS_CHOICES)}, got {self.stream_kms!r}")
        if schema.SINK_KINESIS not in chosen:
            if self.consumer is not None:
                raise SettingsError(f"consumer needs a stream to read: sink must include kinesis, got {self.sink!r}")
            return
        # A record on the stream may point at an object in the messages bucket (large
        # data): the object must outlive the record.
        if self.message_ttl_days and self.message_ttl_days * 24 < self.stream_retention_hours:
            raise SettingsError(
                "message_ttl_days must keep the messages bucket's objects at least as long as the stream "
                f"keeps the records that point at them (stream_retention_hours={self.stream_retention_hours})"
            )
        if self.consumer and self.consumer.iterator_age_alarm_seconds >= self.stream_retention_hours * 3600:
            raise SettingsError(
                "consumer.iterator_age_alarm_seconds must be below stream_retention_hours: the alarm is "
                "there to fire before records leave the stream undelivered"
            )

    @property
    def sinks(self) -> tuple[str, ...]:
        """The sinks as the worker parses SINK: in ``schema.SINKS`` order."""
        return config.sinks({config.SINK: self.sink})

    @property
    def has_stream(self) -> bool:
        return schema.SINK_KINESIS in self.sinks

    @property
    def stores_in_table(self) -> bool:
        return schema.SINK_DYNAMODB in self.sinks

    def _check_secrets(self) -> None:
        prefix = self.secret_prefix
        try:
            parsed = config.upstream_secret_prefix({config.UPSTREAM_SECRET_PREFIX: prefix})
        except config.ConfigError as error:
            raise SettingsError(f"upstream_secret_prefix: {error}") from None
        if parsed != prefix:  # the runtime strips blanks: the grant must be on what it checks
            raise SettingsError(f"upstream_secret_prefix must not start or end with blanks, got {prefix!r}")
        for arn in self.upstream_secret_kms_key_arns:
            if not _KMS_KEY_ARN.fullmatch(arn):
                raise SettingsError(
                    f"upstream_secret_kms_key_arns entries must be KMS key ARNs "
                    f"(arn:aws:kms:<region>:<account>:key/<id>), got {arn!r}"
                )
        if self.upstream_secret_kms_key_arns and not prefix:
            raise SettingsError("upstream_secret_kms_key_arns needs an upstream_secret_prefix: no secret is allowed")

    @property
    def secret_prefix(self) -> str:
        """UPSTREAM_SECRET_PREFIX: the setting, or by default ``wsfleet/<name>/``."""
        if self.upstream_secret_prefix is None:
            return f"wsfleet/{self.name}/"
        return self.upstream_secret_prefix

    @property
    def removal_policy(self) -> RemovalPolicy:
        return RemovalPolicy.RETAIN if self.retain_data else RemovalPolicy.DESTROY

    @property
    def service_name(self) -> str:
        """The worker's SERVICE_NAME: the ``ServiceName`` dimension of its metrics."""
        return f"wsfleet-{self.name}-worker"

    @property
    def consumer_service_name(self) -> str:
        """The reference consumer's SERVICE_NAME: the ``ServiceName`` of its metrics."""
        return f"wsfleet-{self.name}-consumer"

    @property
    def session_timing(self) -> SessionTiming:
        """The workers' session timing, as they derive it from their environment."""
        return SessionTiming(
            lease_ms=round(self.lease_seconds * 1000),
            heartbeat_ms=round(self.heartbeat_seconds * 1000),
            max_clock_skew_ms=self.max_clock_skew_ms,
        )

    @property
    def failover_bound_seconds(self) -> int:
        """How long a STARTED connection may stay unowned after its owner dies:

            lease + skew margin + watch window + 2 x reconcile

        A crashed worker's session expires a lease after its last renewal. A watcher
        may end it once it is past the skew margin, and then takes or frees (and hints)
        its connections at once. Its watchers read it less than a watch window apart
        (``SessionTiming.watch_pause_s``), so one read normally lands between the first
        missed renewal and that moment and the end is on time; a watcher that comes to
        it later (a read failed) ends it at its next read, about a window late. A freed
        connection whose hint is lost is found by the next scan of the FREE# shards
        (pauses of at most ``reconcile_seconds``). The second interval is room: for a
        scan that had just passed its shard, takeover jitter, retries under throttling,
        and a worker that dies before its predecessors have refreshed their view of the
        ring (``wsfleet.worker.takeover.RING_REFRESH_S``) to watch it.
        """
        watch_window_s = self.session_timing.watch_window_ms() / 1000
        return math.ceil(
            self.lease_seconds + self.max_clock_skew_ms / 1000 + watch_window_s + 2 * self.reconcile_seconds
        )


# The settings an operator may override at synth time without editing app.py, e.g.
#   cdk synth -c env=prod -c sink=dynamodb,kinesis -c consumer=on
CONTEXT_OVERRIDES = ("sink", "stream_retention_hours", "stream_kms", "consumer", "keep_legacy_ring_index")
_ON, _OFF = ("on", "true", "yes", "1"), ("off", "false", "no", "0")


def with_context(settings: EnvironmentSettings, lookup: Callable[[str], Any]) -> EnvironmentSettings:
    """``settings`` with the CONTEXT_OVERRIDES that ``lookup`` (the app's
    ``node.try_get_context``) has a value for. ``consumer=on`` deploys the reference
    consumer with the environment's own consumer settings, or the defaults where it has
    none. A bad value is a SettingsError naming the context key."""
    changes: dict[str, Any] = {}
    for key in CONTEXT_OVERRIDES:
        value = lookup(key)
        if value is None:
            continue
        text = str(value).strip()  # the CLI passes strings; cdk.json may hold numbers or booleans
        if key == "consumer":
            if text.lower() in _ON:
                changes[key] = settings.consumer or ConsumerSettings()
            elif text.lower() in _OFF:
                changes[key] = None
            else:
                raise SettingsError(f"-c consumer must be on or off, got {value!r}")
        elif key == "keep_legacy_ring_index":
            if text.lower() not in _ON + _OFF:
                raise SettingsError(f"-c keep_legacy_ring_index must be on or off, got {value!r}")
            changes[key] = text.lower() in _ON
        elif key == "stream_retention_hours":
            try:
                changes[key] = int(text)
            except ValueError:
                raise SettingsError(f"-c stream_retention_hours must be a whole number of hours, got {value!r}") from None
        else:
            changes[key] = text
    if not changes:
        return settings
    try:
        return dataclasses.replace(settings, **changes)
    except SettingsError as error:
        given = " ".join(f"-c {k}={lookup(k)}" for k in changes)
        raise SettingsError(f"{error} (with {given})") from None


def check_plan(settings: EnvironmentSettings, measured: plan.Measured | None = None) -> None:
    """Refuse settings that ``wsfleet plan`` says cannot work at the fleet they are built
    for (:attr:`EnvironmentSettings.capacity_connections`), with the environment's quotas:
    a SettingsError with one sentence per limit exceeded, furthest over first, each naming
    what moves it. The plan's own checks (``plan_limits.evaluate``), not a copy of them."""
    connections = settings.capacity_connections
    result = plan_limits.evaluate(measured or plan.load_measured(), settings.plan_settings, connections=connections)
    if result["refusals"]:
        raise SettingsError(
            f"the plan at {connections:,} connections (max_workers {settings.max_workers} x "
            f"target_connections_per_worker {settings.target_connections_per_worker}) exceeds "
            f"{len(result['refusals'])} limit(s), see `wsfleet plan --env {settings.name} --connections {connections}`:\n"
            + "\n".join(f"  {sentence}." for sentence in result["refusals"])
        )
