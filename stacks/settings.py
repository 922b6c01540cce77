"""Per-environment settings: what differs between dev and prod, typed and checked once.

``app.py`` creates one :class:`EnvironmentSettings` per environment and hands it to the
stacks; nothing else in ``stacks/`` chooses a size, a timing or a retention. The worker
and the router receive their share only through the environment variables the service
stack sets from these values.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from aws_cdk import RemovalPolicy
from aws_cdk import aws_logs as logs

from wsfleet import config, schema
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

    # --- operations ------------------------------------------------------------------
    alarm_topic_arn: str | None = None  # an existing SNS topic; None: alarms without actions

    def __post_init__(self) -> None:
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
        if not 1 <= self.nat_gateways <= 2:
            raise SettingsError("nat_gateways must be 1 or 2 (the VPC spans two AZs)")
        self._check_secrets()

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
