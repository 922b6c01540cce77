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
from typing import Any, Mapping

from aws_cdk import RemovalPolicy
from aws_cdk import aws_logs as logs

from stacks.settings_parts import (
    CAPACITY_MODES,
    MAX_STREAM_RETENTION_HOURS,
    MIN_STREAM_RETENTION_HOURS,
    PROVISIONED,
    STREAM_KMS_AWS_MANAGED,
    STREAM_KMS_CHOICES,
    ConsumerSettings,
    MessagesCapacity,
    SettingsError,
    TracingSettings,
    WarmThroughput,
    check_types,
)
from wsfleet import config, schema, settings_spec
from wsfleet.proxy_tunnel import ProxyError, parse_proxy
from wsfleet.leases import SessionTiming, TimingError
from wsfleet.plan import environments as plan_environments
from wsfleet.plan import limits as plan_limits
from wsfleet.plan import sinks as plan_sinks
from wsfleet.settings_spec import ConfigError

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

# The VPC is a /16 with two public /24 subnets: two worker subnets fit it down to /18
# (16,379 task addresses each); /24 (251) is the smallest worth having.
VPC_CIDR_MASK = 16
WORKER_SUBNET_MASKS = range(18, 25)
AVAILABILITY_ZONES = plan_environments.AVAILABILITY_ZONES  # the VPC's: a worker subnet and at most one NAT gateway in each
# The defaults of the settings a plan reads: declared with the plan (which reads the same
# environment files), so that a setting a file leaves out is the same to both.
_PLAN = plan_environments.DEFAULTS
# An image reference: [registry[:port]/]path[:tag][@sha256:digest], lowercase path parts.
_IMAGE_REFERENCE = re.compile(
    r"(?:[a-z0-9.-]+(?::\d+)?/)?[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*"
    r"(?::[\w][\w.-]{0,127})?(?:@sha256:[0-9a-f]{64})?"
)
IMAGE_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")


@dataclass(frozen=True, kw_only=True)
class EnvironmentSettings:
    """Everything that differs between environments. Defaults suit a small dev fleet."""

    name: str

    # --- data ----------------------------------------------------------------------
    retain_data: bool = False  # prod: RETAIN, deletion protection, point-in-time recovery
    # Messages expire through DynamoDB TTL, and the messages bucket's objects with them;
    # 0 keeps both for ever.
    message_ttl_days: int = _PLAN["message_ttl_days"]
    log_retention: logs.RetentionDays = logs.RetentionDays.ONE_WEEK

    # --- where frames go (SINK; CONTRACT section 4) --------------------------------------
    # "dynamodb" (the messages table), "kinesis" (the messages stream), "firehose" (the
    # delivery stream into S3, for Athena) or several, comma-separated; parsed by the
    # runtime's own config.sinks. The messages table is
    # deployed whatever the sink (emptying a stack of it is an operator's decision).
    sink: str = _PLAN["sink"]
    # How the messages table is billed: None (on-demand), or [messages_capacity] with
    # billing = "provisioned" and autoscaling's bounds and target (`wsfleet plan` prices both).
    messages_capacity: MessagesCapacity | None = _PLAN["messages_capacity"]
    # The messages stream, where kinesis is a sink: encrypted, kept this long; on-demand
    # (it sizes itself) or provisioned with stream_shards shards (`wsfleet plan` sizes them).
    stream_retention_hours: int = MIN_STREAM_RETENTION_HOURS
    stream_kms: str = STREAM_KMS_AWS_MANAGED
    stream_mode: str = _PLAN["stream_mode"]
    stream_shards: int | None = _PLAN["stream_shards"]
    # The reference consumer on the stream; None: none deployed.
    consumer: ConsumerSettings | None = None

    # --- session timing (the worker's LEASE_SECONDS, ...; see CONTRACT section 2) ------
    lease_seconds: float = _PLAN["lease_seconds"]  # session lease
    heartbeat_seconds: float = _PLAN["heartbeat_seconds"]  # session renewal interval
    reconcile_seconds: float = 10  # scan of the FREE# shards for connections nobody owns
    checkpoint_seconds: float = _PLAN["checkpoint_seconds"]  # longest time between checkpoints of a busy connection
    # How long a frame may wait for others to share a write (FLUSH_INTERVAL_MS): on the
    # stream a connection's frames of one flush are one Kinesis record, billed per KB.
    flush_interval_ms: int = _PLAN["flush_interval_ms"]
    max_clock_skew_ms: int = 1000
    state_shards: int = _PLAN["state_shards"]

    # --- worker fleet ----------------------------------------------------------------
    worker_cpu: int = _PLAN["worker_cpu"]  # Fargate CPU units
    worker_memory_mib: int = _PLAN["worker_memory_mib"]
    max_connections_per_worker: int = _PLAN["max_connections_per_worker"]
    # Rebalancing (REBALANCE, REBALANCE_TOLERANCE): a worker more than this fraction above
    # its fair share hands the excess over to workers under theirs, a few at a time.
    rebalance: bool = True
    rebalance_tolerance: float = 0.1
    # Target tracking keeps the average ActiveConnections per task near this value;
    # the headroom up to max_connections_per_worker absorbs a failed-over task's share.
    target_connections_per_worker: int = _PLAN["target_connections_per_worker"]
    min_workers: int = _PLAN["min_workers"]
    max_workers: int = _PLAN["max_workers"]
    use_fargate_spot: bool = _PLAN["use_fargate_spot"]  # Spot's 2-minute SIGTERM notice is our normal failover path
    # The tasks' CPU: "arm64" (Graviton, 20 % cheaper than x86_64 for the same size) or
    # "x86_64", which Fargate Spot requires. The worker image is built for it at deploy.
    worker_architecture: str = _PLAN["worker_architecture"]
    # The image the worker's is built on (runtime/Dockerfile's PYTHON_IMAGE): a Python 3.11
    # image, best pinned by digest ("python:3.11-slim@sha256:..."), so that a rebuild can
    # never pull other bytes than were reviewed. A tag alone is a synth warning.
    worker_base_image: str = "python:3.11-slim"
    shutdown_seconds: int = 25  # the worker's graceful-shutdown budget (SHUTDOWN_SECONDS)
    stop_timeout_seconds: int = 45  # container stopTimeout: SIGKILL after this
    metrics_seconds: int = 60
    # The WebSocket frame limit (MAX_FRAME_BYTES): a larger frame becomes a skip marker.
    max_frame_bytes: int = config.DEFAULT_MAX_FRAME_BYTES

    # --- router and API ----------------------------------------------------------------
    allowed_ws_hosts: tuple[str, ...] = ()  # empty: the router accepts no upstream at all
    api_rate_limit: int = _PLAN["api_rate_limit"]  # requests per second, stage-wide
    api_burst_limit: int = _PLAN["api_burst_limit"]

    # --- upstream credentials ----------------------------------------------------------
    # The Secrets Manager name prefix START's secret_headers ARNs must be under
    # (UPSTREAM_SECRET_PREFIX of the router and the worker); the worker may read exactly the
    # secrets of this account and region under it. None: wsfleet/<name>/; "": no secret at all.
    upstream_secret_prefix: str | None = None
    # Customer-managed KMS keys of those secrets, if any (the aws/secretsmanager key needs no
    # grant): the worker may decrypt with them only through Secrets Manager, for those secrets.
    upstream_secret_kms_key_arns: tuple[str, ...] = ()
    # SECRET_HOSTS_REQUIRED: a secret without a wsfleet:hosts tag (the hosts it may be sent
    # to) is refused; off, an untagged secret may go to any allowed host.
    secret_hosts_required: bool = False
    # UPSTREAM_PROXY: an HTTP egress proxy every upstream socket tunnels through
    # (http://host:port); "": none (the worker never uses the environment's proxy variables
    # for upstream sockets). No credentials here: the task definition shows its environment.
    upstream_proxy: str = ""

    # --- network ---------------------------------------------------------------------
    nat_gateways: int = _PLAN["nat_gateways"]  # 1: cheapest; one per AZ: no single-AZ egress outage
    # Each address of a NAT gateway holds about 55,000 connections to one upstream IP and
    # port at a time: the primary, and secondary ones (each an Elastic IP: see quotas).
    nat_addresses_per_gateway: int = _PLAN["nat_addresses_per_gateway"]
    # The worker subnets' size (one per AZ): a rolling deploy runs up to twice the tasks,
    # each with an address of its own.
    worker_subnet_mask: int = _PLAN["worker_subnet_mask"]

    # --- capacity --------------------------------------------------------------------
    # What the connections table and its by_owner index absorb at once: a crash's
    # acquisitions and a scale-in's handoffs come in seconds, faster than on-demand grows
    # (`wsfleet plan` sizes the burst). None: a new on-demand table's (12,000 / 4,000).
    connections_warm_throughput: WarmThroughput | None = _PLAN["connections_warm_throughput"]
    owner_index_warm_throughput: WarmThroughput | None = _PLAN["owner_index_warm_throughput"]
    # The adjustable AWS quotas this environment needs raised before it is deployed (names
    # of wsfleet.plan.limits.DEFAULT_QUOTAS): synth checks the plan against them.
    quotas: Mapping[str, float] = field(default_factory=lambda: dict(_PLAN["quotas"]))

    # --- upgrading an existing stack (docs/operations.md) -----------------------------
    # The sessions table keeps the ring index stacks before issue 22 deployed ("by_ring",
    # KEYS_ONLY) beside "by_ring_load", and the workers may query both: deploy once with
    # it (the new index is added while the old workers still run on the old one), then
    # once without it (the old index is dropped). Usually given as
    # `-c keep_legacy_ring_index=on` for the first deploy.
    keep_legacy_ring_index: bool = False

    # --- operations ------------------------------------------------------------------
    alarm_topic_arn: str | None = None  # an existing SNS topic; None: alarms without actions

    # --- tracing ---------------------------------------------------------------------
    # Every environment on otel (or off) before XRAY_SDK_END_OF_SUPPORT (docs/tracing.md).
    tracing: TracingSettings = field(default_factory=TracingSettings)

    def __post_init__(self) -> None:
        check_types(self)
        if not _NAME.match(self.name):
            raise SettingsError(f"name must be lower-case letters, digits and '-', got {self.name!r}")
        try:
            SessionTiming.checked(
                lease_s=self.lease_seconds, heartbeat_s=self.heartbeat_seconds, max_clock_skew_ms=self.max_clock_skew_ms
            )
        except TimingError as error:
            raise SettingsError(
                error.sentence(lease="lease_seconds", heartbeat="heartbeat_seconds", skew="max_clock_skew_ms")
            ) from None
        try:
            proxy = parse_proxy(self.upstream_proxy)
        except ProxyError as exc:
            raise SettingsError(f"upstream_proxy {exc}") from None
        if proxy is not None and proxy.authorization:
            raise SettingsError(
                "upstream_proxy must not hold credentials: the task definition shows its environment to anyone "
                "who may describe it (allow the tasks' addresses at the proxy instead)"
            )
        if not self.reconcile_seconds > 0:
            raise SettingsError("reconcile_seconds must be positive")
        # A checkpoint more often than the session renewal would bring back the
        # per-connection write per heartbeat that session leases do away with.
        if not self.checkpoint_seconds >= self.heartbeat_seconds:
            raise SettingsError("checkpoint_seconds must be at least heartbeat_seconds")
        if not 0 <= self.flush_interval_ms <= 10_000:
            raise SettingsError(f"flush_interval_ms must be from 0 to 10000 (FLUSH_INTERVAL_MS), got {self.flush_interval_ms}")
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
        if self.worker_architecture not in plan_limits.ARCHITECTURES:
            raise SettingsError(
                f"worker_architecture must be one of {', '.join(plan_limits.ARCHITECTURES)}, got {self.worker_architecture!r}"
            )
        if not _IMAGE_REFERENCE.fullmatch(self.worker_base_image):
            raise SettingsError(
                f"worker_base_image must be an image reference such as \"python:3.11-slim\" or "
                f"\"python:3.11-slim@sha256:<64 hex digits>\", got {self.worker_base_image!r}"
            )
        if self.use_fargate_spot and self.worker_architecture != plan_limits.SPOT_ARCHITECTURE:
            raise SettingsError(
                f"use_fargate_spot needs worker_architecture = \"{plan_limits.SPOT_ARCHITECTURE}\": Fargate Spot runs "
                f"only {plan_limits.SPOT_ARCHITECTURE} tasks (or turn Spot off and keep {self.worker_architecture})"
            )
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
        try:  # the router's own reading of ALLOWED_WS_HOSTS: what it would refuse at start-up
            config.allowed_ws_hosts({settings_spec.ALLOWED_WS_HOSTS: ",".join(self.allowed_ws_hosts)})
        except ConfigError as error:
            raise SettingsError(str(error).replace(settings_spec.ALLOWED_WS_HOSTS, "allowed_ws_hosts")) from None
        self._check_sink()
        self._check_capacity_modes(self.sinks)
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
        """These settings as ``wsfleet plan`` reads an environment (from its file: the
        same mapping, :func:`wsfleet.plan.environments.plan_settings`)."""
        values = {key: getattr(self, key) for key in plan_environments.DEFAULTS}
        for key in ("connections_warm_throughput", "owner_index_warm_throughput", "messages_capacity"):
            if values[key] is not None:
                values[key] = dataclasses.asdict(values[key])
        return plan_environments.plan_settings(values)

    @property
    def capacity_connections(self) -> int:
        """The fleet these settings are built for: max_workers at the scaling target."""
        return self.max_workers * self.target_connections_per_worker

    def _check_sink(self) -> None:
        if not self.sink.strip():
            raise SettingsError(f"sink must name one or more of {', '.join(schema.SINKS)}, comma-separated")
        try:
            chosen = config.sinks({settings_spec.SINK: self.sink})
        except ConfigError as error:
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

    def _check_capacity_modes(self, chosen: tuple[str, ...]) -> None:
        """The messages table's billing and the stream's mode, and what each needs."""
        if self.stream_mode not in CAPACITY_MODES:
            raise SettingsError(
                f"stream_mode must be {' or '.join(repr(m) for m in CAPACITY_MODES)}, got {self.stream_mode!r}"
            )
        if self.stream_mode == PROVISIONED and self.stream_shards is None:
            raise SettingsError(
                f"stream_mode = \"{PROVISIONED}\" needs stream_shards, the shards to deploy (`wsfleet plan --env "
                f"{self.name} --connections N --rate R` sizes them)"
            )
        if self.stream_mode != PROVISIONED and self.stream_shards is not None:
            raise SettingsError(
                f"stream_shards applies only to stream_mode = \"{PROVISIONED}\": an on-demand stream sizes itself"
            )
        if self.stream_shards is not None and not 1 <= self.stream_shards <= plan_sinks.PROVISIONED_SHARD_QUOTA:
            raise SettingsError(
                f"stream_shards must be between 1 and {plan_sinks.PROVISIONED_SHARD_QUOTA:,} (the account's shard "
                f"quota), got {self.stream_shards}"
            )
        if self.stream_mode == PROVISIONED and schema.SINK_KINESIS not in chosen:
            raise SettingsError(f"stream_mode = \"{PROVISIONED}\" needs a stream: sink must include kinesis, got {self.sink!r}")
        capacity = self.messages_capacity
        if capacity is not None and not isinstance(capacity, MessagesCapacity):
            raise SettingsError(f"messages_capacity must be a MessagesCapacity(billing=...) or None, got {capacity!r}")
        if capacity is not None and capacity.provisioned:
            if schema.SINK_DYNAMODB not in chosen:
                raise SettingsError(
                    f"messages_capacity.billing = \"{PROVISIONED}\" needs sink to include dynamodb: a table no frame "
                    f"goes to would pay for its capacity all the same, got sink {self.sink!r}"
                )
            capacity.check(plan_limits.quotas_for({}, self.quotas)["table_units"])

    @property
    def sinks(self) -> tuple[str, ...]:
        """The sinks as the worker parses SINK: in ``schema.SINKS`` order."""
        return config.sinks({settings_spec.SINK: self.sink})

    @property
    def has_stream(self) -> bool:
        return schema.SINK_KINESIS in self.sinks

    @property
    def has_delivery(self) -> bool:
        return schema.SINK_FIREHOSE in self.sinks

    @property
    def stores_in_table(self) -> bool:
        return schema.SINK_DYNAMODB in self.sinks

    def _check_secrets(self) -> None:
        prefix = self.secret_prefix
        try:
            parsed = config.upstream_secret_prefix({settings_spec.UPSTREAM_SECRET_PREFIX: prefix})
        except ConfigError as error:
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
        return SessionTiming.checked(
            lease_s=self.lease_seconds, heartbeat_s=self.heartbeat_seconds, max_clock_skew_ms=self.max_clock_skew_ms
        )

    @property
    def failover_bound_seconds(self) -> int:
        """How long a STARTED connection may stay unowned after its owner dies
        (:meth:`SessionTiming.failover_bound_s`)."""
        return self.session_timing.failover_bound_s(round(self.reconcile_seconds * 1000))
