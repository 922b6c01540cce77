"""Configuration: every environment variable, as :mod:`wsfleet.settings_spec` declares it
(name, default, bounds), parsed and validated once into a frozen dataclass. Nothing else
in the runtime reads ``os.environ``.

A bad value raises :class:`ConfigError` whose message names the variable, so that a
misconfigured task fails at start-up with one readable line instead of later.
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass
from typing import Any, Callable, Mapping, TypeVar

from . import metrics_names, schema, tracing
from .leases import SessionTiming, TimingError
from .settings_spec import (
    ALLOWED_WS_HOSTS,
    AWS_DEFAULT_REGION,
    AWS_ENDPOINT_URL,
    AWS_REGION,
    AWS_XRAY_SDK_ENABLED,
    CHECKPOINT_SECONDS,
    CONSUMER_BUCKET_NAME,
    CONSUMER_PREFIX,
    CONSUMER_TABLE_NAME,
    ECS_CONTAINER_METADATA_URI_V4,
    FLUSH_INTERVAL_MS,
    HEARTBEAT_SECONDS,
    LEASE_SECONDS,
    MAX_BUFFERED_BYTES,
    MAX_CLOCK_SKEW_MS,
    MAX_CONNECTIONS,
    QUARANTINE_AFTER,
    MAX_FRAME_BYTES,
    MESSAGE_TTL_DAYS,
    MESSAGES_BUCKET_NAME,
    MESSAGES_DELIVERY_STREAM_NAME,
    MESSAGES_STREAM_NAME,
    MESSAGES_TABLE_NAME,
    METRICS_NAMESPACE,
    METRICS_SECONDS,
    OTEL_BSP_EXPORT_TIMEOUT,
    OTEL_BSP_MAX_EXPORT_BATCH_SIZE,
    OTEL_BSP_MAX_QUEUE_SIZE,
    OTEL_BSP_SCHEDULE_DELAY,
    OTEL_EXPORTER_OTLP_ENDPOINT,
    OTEL_EXPORTER_OTLP_PROTOCOL,
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
    OTEL_EXPORTER_OTLP_TRACES_PROTOCOL,
    OTEL_TRACES_EXPORTER,
    QUEUE_URL,
    REBALANCE,
    REBALANCE_TOLERANCE,
    RECONCILE_SECONDS,
    SECRET_HOSTS_REQUIRED,
    UPSTREAM_PROXY,
    SERVICE_NAME,
    SESSIONS_TABLE_NAME,
    SHUTDOWN_SECONDS,
    SINK,
    STATE_SHARDS,
    SWEEP_SECONDS,
    TABLE_NAME,
    TRACING,
    TRACING_FILE,
    UPSTREAM_SECRET_PREFIX,
    VARIABLES,
    WORKER_ID,
    ConfigError,
)
from .upstream_spec import SECRET_NAME_CHARS
from . import budget
from .proxy_tunnel import Proxy, ProxyError, parse_proxy

# The worker's frame limit (worker.connection and worker.writer default to it).
DEFAULT_MAX_FRAME_BYTES = VARIABLES[MAX_FRAME_BYTES].default
MIN_MAX_FRAME_BYTES, MAX_MAX_FRAME_BYTES = VARIABLES[MAX_FRAME_BYTES].low, VARIABLES[MAX_FRAME_BYTES].high

T = TypeVar("T")


def _required(env: Mapping[str, str], name: str) -> str:
    value = env.get(name, "").strip()
    if not value:
        raise ConfigError(f"{name} is required but not set")
    return value


def _parsed(env: Mapping[str, str], name: str, default: T, parse: Callable[[str], T], what: str) -> T:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return parse(raw.strip())
    except ValueError:
        raise ConfigError(f"{name} must be {what}, got {raw!r}") from None


def _positive_float(env: Mapping[str, str], name: str) -> float:
    value = _parsed(env, name, VARIABLES[name].default, float, "a number of seconds")
    if not value > 0 or value != value or value == float("inf"):
        raise ConfigError(f"{name} must be a positive number of seconds, got {env.get(name)!r}")
    return value


def _int_in(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    """A whole number within the variable's declared bounds; ``default``: one worked out
    at start-up, where the declaration has none."""
    spec = VARIABLES[name]
    value = _parsed(env, name, spec.default if default is None else default, int, "a whole number")
    low, high = spec.low, spec.high
    if not low <= value <= high:
        raise ConfigError(f"{name} must be between {low} and {high}, got {value}")
    return value


def _flag(env: Mapping[str, str], name: str) -> bool:
    raw = env.get(name, "").strip().lower()
    if not raw:
        return VARIABLES[name].default
    if raw in ("1", "true", "on", "yes"):
        return True
    if raw in ("0", "false", "off", "no"):
        return False
    raise ConfigError(f"{name} must be on or off (1/0, true/false), got {env.get(name)!r}")


def _fraction(env: Mapping[str, str], name: str) -> float:
    value = _parsed(env, name, VARIABLES[name].default, float, "a number between 0 and 1")
    if not VARIABLES[name].low <= value <= VARIABLES[name].high:
        raise ConfigError(f"{name} must be between 0 and 1, got {env.get(name)!r}")
    return value


def _text(env: Mapping[str, str], name: str) -> str:
    return env.get(name, "").strip() or VARIABLES[name].default


def session_timing(env: Mapping[str, str]) -> SessionTiming:
    """``LEASE_SECONDS``, ``HEARTBEAT_SECONDS`` and ``MAX_CLOCK_SKEW_MS``, each in its
    bounds, together as :class:`SessionTiming` allows them."""
    lease = _positive_float(env, LEASE_SECONDS)
    heartbeat = _positive_float(env, HEARTBEAT_SECONDS)
    skew = _int_in(env, MAX_CLOCK_SKEW_MS)
    try:
        return SessionTiming.checked(lease_s=lease, heartbeat_s=heartbeat, max_clock_skew_ms=skew)
    except TimingError as error:
        raise ConfigError(error.sentence(lease=LEASE_SECONDS, heartbeat=HEARTBEAT_SECONDS, skew=MAX_CLOCK_SKEW_MS)) from None


def _region(env: Mapping[str, str]) -> str:
    region = env.get(AWS_REGION, "").strip() or env.get(AWS_DEFAULT_REGION, "").strip()
    if not region:
        raise ConfigError(f"{AWS_REGION} is required but not set")
    return region


def _endpoint(env: Mapping[str, str]) -> str | None:
    url = env.get(AWS_ENDPOINT_URL, "").strip()
    if url and not url.startswith(("http://", "https://")):
        raise ConfigError(f"{AWS_ENDPOINT_URL} must be an http(s) URL, got {url!r}")
    return url or None


def max_buffered_bytes(env: Mapping[str, str], max_frame_bytes: int) -> int | None:
    """``MAX_BUFFERED_BYTES``: a whole number of bytes, ``off`` (None: no byte bound), or
    by default half of what the task's memory (its cgroup limit) leaves beside the frame
    decoder, else 256 MiB."""
    raw = env.get(MAX_BUFFERED_BYTES, "").strip()
    if raw.lower() == "off":
        return None
    default = budget.default_budget_bytes(budget.task_memory_bytes(), max_frame_bytes)
    return _int_in(env, MAX_BUFFERED_BYTES, default)


def allowed_ws_hosts(env: Mapping[str, str]) -> tuple[str, ...]:
    hosts = tuple(h.strip().lower() for h in env.get(ALLOWED_WS_HOSTS, "").split(",") if h.strip())
    for host in hosts:
        if "*" in host and not (host.startswith("*.") and "*" not in host[2:] and len(host) > 2):
            raise ConfigError(f"{ALLOWED_WS_HOSTS} entries must be host names or '*.domain' patterns, got {host!r}")
    return hosts


def upstream_proxy(env: Mapping[str, str]) -> Proxy | None:
    """``UPSTREAM_PROXY``: the HTTP proxy upstream sockets tunnel through; None (the
    default): none, whatever the environment's other proxy variables say."""
    try:
        return parse_proxy(env.get(UPSTREAM_PROXY, ""))
    except ProxyError as exc:
        raise ConfigError(f"{UPSTREAM_PROXY} {exc}") from None


def upstream_secret_prefix(env: Mapping[str, str]) -> str:
    """The Secrets Manager name prefix that ``secret_headers`` ARNs must be under; empty:
    no secret is allowed. The stacks grant the worker GetSecretValue on the same prefix."""
    prefix = env.get(UPSTREAM_SECRET_PREFIX, "").strip()
    if len(prefix) > 256 or not re.fullmatch(r"[%s]*" % SECRET_NAME_CHARS, prefix):
        raise ConfigError(
            f"{UPSTREAM_SECRET_PREFIX} must be a Secrets Manager name prefix (letters, digits and /_+=.@-, "
            f"at most 256), got {prefix!r}"
        )
    return prefix


def sinks(env: Mapping[str, str]) -> tuple[str, ...]:
    """``SINK``: where frames go, a comma-separated set of ``dynamodb`` (the messages
    table, the default), ``kinesis`` (the stream ``MESSAGES_STREAM_NAME``) and
    ``firehose`` (the delivery stream ``MESSAGES_DELIVERY_STREAM_NAME``), in the order
    of :data:`schema.SINKS` whatever order it was written in."""
    raw = env.get(SINK, "").strip()
    if not raw:
        return schema.DEFAULT_SINKS
    named = [part.strip().lower() for part in raw.split(",")]
    unknown = [n for n in named if n not in schema.SINKS]
    if unknown or "" in named:
        raise ConfigError(f"{SINK} must be one or more of {', '.join(schema.SINKS)}, comma-separated, got {raw!r}")
    return tuple(n for n in schema.SINKS if n in named)


def messages_stream_name(env: Mapping[str, str], chosen: tuple[str, ...]) -> str:
    """``MESSAGES_STREAM_NAME``: required when ``SINK`` has kinesis; "" otherwise."""
    if schema.SINK_KINESIS not in chosen:
        return env.get(MESSAGES_STREAM_NAME, "").strip()
    name = env.get(MESSAGES_STREAM_NAME, "").strip()
    if not name:
        raise ConfigError(f"{MESSAGES_STREAM_NAME} is required when {SINK} is {','.join(chosen)}")
    # A stream name (1-128 of [a-zA-Z0-9_.-]) or its ARN.
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,128}|arn:[a-z-]+:kinesis:[a-z0-9-]+:\d{12}:stream/[A-Za-z0-9_.-]{1,128}", name):
        raise ConfigError(f"{MESSAGES_STREAM_NAME} must be a Kinesis stream name or ARN, got {name!r}")
    return name


def messages_delivery_stream_name(env: Mapping[str, str], chosen: tuple[str, ...]) -> str:
    """``MESSAGES_DELIVERY_STREAM_NAME``: required when ``SINK`` has firehose; "" otherwise."""
    name = env.get(MESSAGES_DELIVERY_STREAM_NAME, "").strip()
    if schema.SINK_FIREHOSE not in chosen:
        return name
    if not name:
        raise ConfigError(f"{MESSAGES_DELIVERY_STREAM_NAME} is required when {SINK} is {','.join(chosen)}")
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name):
        raise ConfigError(f"{MESSAGES_DELIVERY_STREAM_NAME} must be a Firehose stream name (1-64 of A-Z a-z 0-9 _ . -), got {name!r}")
    return name


def messages_table_name(env: Mapping[str, str], chosen: tuple[str, ...]) -> str:
    """``MESSAGES_TABLE_NAME``: required when ``SINK`` has dynamodb; "" otherwise."""
    if schema.SINK_DYNAMODB in chosen:
        return _required(env, MESSAGES_TABLE_NAME)
    return env.get(MESSAGES_TABLE_NAME, "").strip()


def _resources(env: Mapping[str, str], chosen: tuple[str, ...]) -> dict[str, Any]:
    """What the worker and the router both read: the tables, bucket, queue and endpoint."""
    return dict(
        table_name=_required(env, TABLE_NAME), sessions_table_name=_required(env, SESSIONS_TABLE_NAME),
        messages_table_name=messages_table_name(env, chosen), messages_bucket_name=_required(env, MESSAGES_BUCKET_NAME),
        queue_url=_required(env, QUEUE_URL), region=_region(env), endpoint_url=_endpoint(env),
    )


def tracing_mode(env: Mapping[str, str]) -> str:
    """``TRACING`` [xray-sdk]: xray-sdk, otel or off (see :mod:`wsfleet.tracing`). In
    xray-sdk mode ``AWS_XRAY_SDK_ENABLED=false`` means off, as it always has: nothing is
    recorded and the SDK is not even imported."""
    raw = env.get(TRACING, "").strip().lower()
    mode = raw or tracing.XRAY_SDK
    if mode not in tracing.MODES:
        raise ConfigError(f"{TRACING} must be one of {', '.join(tracing.MODES)}, got {env.get(TRACING)!r}")
    if mode == tracing.XRAY_SDK and env.get(AWS_XRAY_SDK_ENABLED, "").strip().lower() == "false":
        return tracing.OFF
    return mode


def tracing_settings(env: Mapping[str, str]) -> tracing.Settings:
    """``TRACING``; with otel, ``TRACING_FILE`` (local runs: spans as OTLP JSON lines in
    that file instead of exported), the exporters ``OTEL_TRACES_EXPORTER`` names
    (comma-separated, [otlp]; none for none) and where OTLP goes
    (``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, else ``OTEL_EXPORTER_OTLP_ENDPOINT`` +
    /v1/traces). The SDK reads the other ``OTEL_*`` variables itself."""
    mode = tracing_mode(env)
    path = env.get(TRACING_FILE, "").strip()
    if path and mode != tracing.OTEL:
        raise ConfigError(f"{TRACING_FILE} needs {TRACING}=otel, got {TRACING}={mode}")
    if mode != tracing.OTEL:
        return tracing.Settings(mode)
    raw = env.get(OTEL_TRACES_EXPORTER, "").strip() or tracing.OTLP
    names = tuple(dict.fromkeys(n.strip() for n in raw.split(",") if n.strip()))
    names = () if names == ("none",) else names
    for name in names:
        if name not in tracing.OTLP_NAMES and not tracing.exporter_installed(name):
            raise ConfigError(f"{OTEL_TRACES_EXPORTER} names an exporter that is not installed: {name!r} (use otlp, console or none)")
    for name in (OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, OTEL_EXPORTER_OTLP_PROTOCOL):
        protocol = env.get(name, "").strip()
        if protocol and protocol != "http/protobuf":
            raise ConfigError(f"{name} must be http/protobuf (the OTLP exporter shipped), got {protocol!r}")
    check_batch_processor(env)
    return tracing.Settings(mode, file=path, exporters=names, endpoint=otlp_traces_endpoint(env))


def check_batch_processor(env: Mapping[str, str]) -> None:
    """The ``OTEL_BSP_*`` variables as the SDK's batch span processor will read them
    (its defaults where unset): whole numbers, the queue at most
    declared (65536 spans of 1-2 KB each: bounded in memory), and an export batch no
    larger than the queue."""
    queue = _int_in(env, OTEL_BSP_MAX_QUEUE_SIZE)
    batch = _int_in(env, OTEL_BSP_MAX_EXPORT_BATCH_SIZE)
    if batch > queue:
        raise ConfigError(
            f"{OTEL_BSP_MAX_EXPORT_BATCH_SIZE} must be at most {OTEL_BSP_MAX_QUEUE_SIZE} ({queue}), got {batch}"
        )
    for name in (OTEL_BSP_SCHEDULE_DELAY, OTEL_BSP_EXPORT_TIMEOUT):
        _int_in(env, name)  # milliseconds


def otlp_traces_endpoint(env: Mapping[str, str]) -> str:
    """Where the OTLP exporter sends spans, as the SDK resolves it."""
    endpoint = env.get(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, "").strip()
    if endpoint:
        return endpoint
    base = env.get(OTEL_EXPORTER_OTLP_ENDPOINT, "").strip()
    return base.rstrip("/") + "/v1/traces" if base else tracing.DEFAULT_OTLP_ENDPOINT


def state_shards(env: Mapping[str, str]) -> int:
    return _int_in(env, STATE_SHARDS)


@dataclass(frozen=True)
class WorkerConfig:
    table_name: str
    sessions_table_name: str
    messages_table_name: str
    messages_bucket_name: str
    queue_url: str
    region: str
    endpoint_url: str | None
    worker_id: str | None  # None: resolved at start-up from ECS metadata or hostname-pid
    ecs_metadata_uri: str | None
    lease_ms: int  # session lease
    heartbeat_ms: int  # session renewal interval
    reconcile_ms: int  # scan for STARTED connections nobody owns
    checkpoint_ms: int  # longest time between checkpoints of a connection receiving frames
    max_connections: int
    max_clock_skew_ms: int
    metrics_namespace: str
    service_name: str
    state_shards: int
    shutdown_seconds: float
    metrics_seconds: float
    message_ttl_days: int
    flush_interval_ms: int  # how long a received frame may wait to share a batch write
    # The router's allow-list: here only its exact names and addresses matter, as the
    # ones allowed to resolve to an internal address (see validation.check_resolved).
    allowed_ws_hosts: tuple[str, ...] = ()
    rebalance: bool = VARIABLES[REBALANCE].default  # shed connections above this worker's fair share
    # The band above the fair share (a fraction of it) that is left alone.
    rebalance_tolerance: float = VARIABLES[REBALANCE_TOLERANCE].default
    # The fleet's reachability sweep starts a pass over every connection this often.
    sweep_ms: int = round(VARIABLES[SWEEP_SECONDS].default * 1000)
    # Consecutive deaths of its owners, each naming it the prime suspect, that quarantine a connection.
    quarantine_after: int = VARIABLES[QUARANTINE_AFTER].default
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES  # the WebSocket frame limit
    # Frame bytes held at once, sockets and writer (wsfleet.budget); None: unbounded
    # (websockets' default queue, no receive gate, the writer's count caps only).
    max_buffered_bytes: int | None = budget.FALLBACK_BYTES
    upstream_secret_prefix: str = ""  # secret_headers ARNs must name secrets under it
    sinks: tuple[str, ...] = schema.DEFAULT_SINKS  # where frames go (schema.SINKS)
    messages_stream_name: str = ""  # the Kinesis stream, when sinks has kinesis
    messages_delivery_stream_name: str = ""  # the Firehose stream, when sinks has firehose
    tracing: tracing.Settings = tracing.Settings()  # TRACING and what goes with it
    secret_hosts_required: bool = False  # an untagged secret (no wsfleet:hosts) is refused
    upstream_proxy: Proxy | None = None  # UPSTREAM_PROXY: the HTTP proxy upstream sockets tunnel through

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "WorkerConfig":
        env = os.environ if env is None else env
        timing = session_timing(env)
        worker_id = env.get(WORKER_ID, "").strip() or None
        if worker_id is not None and len(worker_id) > 256:
            raise ConfigError(f"{WORKER_ID} must be at most 256 characters")
        chosen = sinks(env)
        return cls(
            **_resources(env, chosen),
            worker_id=worker_id,
            ecs_metadata_uri=env.get(ECS_CONTAINER_METADATA_URI_V4, "").strip() or None,
            lease_ms=timing.lease_ms,
            heartbeat_ms=timing.heartbeat_ms,
            reconcile_ms=round(_positive_float(env, RECONCILE_SECONDS) * 1000),
            checkpoint_ms=round(_positive_float(env, CHECKPOINT_SECONDS) * 1000),
            max_connections=_int_in(env, MAX_CONNECTIONS),
            quarantine_after=_int_in(env, QUARANTINE_AFTER),
            max_clock_skew_ms=timing.max_clock_skew_ms,
            metrics_namespace=_text(env, METRICS_NAMESPACE),
            service_name=env.get(SERVICE_NAME, "").strip() or "wsfleet-worker",
            state_shards=state_shards(env),
            shutdown_seconds=_positive_float(env, SHUTDOWN_SECONDS),
            metrics_seconds=_positive_float(env, METRICS_SECONDS),
            message_ttl_days=_int_in(env, MESSAGE_TTL_DAYS),
            flush_interval_ms=_int_in(env, FLUSH_INTERVAL_MS),
            allowed_ws_hosts=allowed_ws_hosts(env),
            rebalance=_flag(env, REBALANCE),
            rebalance_tolerance=_fraction(env, REBALANCE_TOLERANCE),
            sweep_ms=round(_positive_float(env, SWEEP_SECONDS) * 1000),
            max_frame_bytes=_int_in(env, MAX_FRAME_BYTES),
            max_buffered_bytes=max_buffered_bytes(env, _int_in(env, MAX_FRAME_BYTES)),
            upstream_secret_prefix=upstream_secret_prefix(env),
            sinks=chosen,
            messages_stream_name=messages_stream_name(env, chosen),
            messages_delivery_stream_name=messages_delivery_stream_name(env, chosen),
            tracing=tracing_settings(env),
            secret_hosts_required=_flag(env, SECRET_HOSTS_REQUIRED),
            upstream_proxy=upstream_proxy(env),
        )

    def default_worker_id(self) -> str:
        return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class RouterConfig:
    table_name: str
    sessions_table_name: str
    messages_table_name: str
    messages_bucket_name: str
    queue_url: str
    region: str
    endpoint_url: str | None
    allowed_ws_hosts: tuple[str, ...]
    state_shards: int
    upstream_secret_prefix: str = ""  # secret_headers ARNs must name secrets under it
    # Where the workers send frames: the read API answers only where the table is one.
    sinks: tuple[str, ...] = schema.DEFAULT_SINKS
    messages_stream_name: str = ""
    tracing: tracing.Settings = tracing.Settings()  # TRACING and what goes with it

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "RouterConfig":
        env = os.environ if env is None else env
        hosts = allowed_ws_hosts(env)
        chosen = sinks(env)
        return cls(
            **_resources(env, chosen),
            allowed_ws_hosts=hosts,
            state_shards=state_shards(env),
            upstream_secret_prefix=upstream_secret_prefix(env),
            sinks=chosen,
            messages_stream_name=messages_stream_name(env, chosen),
            tracing=tracing_settings(env),
        )


@dataclass(frozen=True)
class ConsumerConfig:
    """The reference consumer's settings (Lambda handler ``wsfleet.consumer.handler``)."""

    bucket_name: str  # where the delivered frames go, one object per (connection, batch)
    table_name: str  # its delivery state per connection (schema.consumer_table_spec)
    prefix: str  # the objects' key prefix: <prefix><connection_id>/...
    region: str
    endpoint_url: str | None
    # Its metrics' namespace and ServiceName (the stacks set wsfleet-<env>-consumer, so
    # that two environments in one account do not add up their counts).
    metrics_namespace: str = metrics_names.DEFAULT_NAMESPACE
    service_name: str = metrics_names.CONSUMER_SERVICE_NAME

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "ConsumerConfig":
        env = os.environ if env is None else env
        return cls(
            bucket_name=_required(env, CONSUMER_BUCKET_NAME),
            table_name=_required(env, CONSUMER_TABLE_NAME),
            prefix=consumer_prefix(env),
            region=_region(env),
            endpoint_url=_endpoint(env),
            metrics_namespace=_text(env, METRICS_NAMESPACE),
            service_name=env.get(SERVICE_NAME, "").strip() or metrics_names.CONSUMER_SERVICE_NAME,
        )


def consumer_prefix(env: Mapping[str, str]) -> str:
    """``CONSUMER_PREFIX`` [frames/]: S3 key characters only, relative (no leading /),
    short enough that a connection id and an object name fit under S3's 1,024 bytes."""
    raw = env.get(CONSUMER_PREFIX)
    prefix = VARIABLES[CONSUMER_PREFIX].default if raw is None or raw.strip() == "" else raw.strip()
    if len(prefix) > 512 or prefix.startswith("/") or not re.fullmatch(r"[A-Za-z0-9!_.*'()/=-]*", prefix):
        raise ConfigError(
            f"{CONSUMER_PREFIX} must be an S3 key prefix of letters, digits and !_.*'()/=- (at most 512, "
            f"not starting with /), got {raw!r}"
        )
    return prefix
