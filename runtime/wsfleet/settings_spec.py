"""Every environment variable the product reads, declared once: its name, type, default,
bounds, a one-line doc, and who reads it (the worker, the router, the consumer). No I/O,
and nothing of wsfleet imported: the floor everything else stands on.

From :data:`VARIABLES` come the start-up validation (:mod:`wsfleet.config`, which parses
them into frozen dataclasses), the tables of docs/configuration.md (:func:`markdown_table`;
a test fails when they drift, ``python -m wsfleet.settings_spec`` rewrites them) and
the stacks' container and Lambda environments (``stacks/``: :meth:`Variable.text` writes
a value as the runtime parses it, :func:`environment` refuses a variable its reader does
not read).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

WORKER, ROUTER, CONSUMER = "worker", "router", "consumer"
READERS = (WORKER, ROUTER, CONSUMER)
_SERVICE = (WORKER, ROUTER)  # the worker and the router read the same resources

# The kinds of value, as docs/configuration.md shows them.
NAME, TEXT, SECONDS, WHOLE, FLAG, FRACTION, LIST, URL = (
    "name", "text", "seconds", "whole number", "on/off", "fraction", "comma-separated", "URL",
)  # fmt: skip


# The names, for the modules that read or set them (each declared in _VARIABLES below).
TABLE_NAME = "TABLE_NAME"
SESSIONS_TABLE_NAME = "SESSIONS_TABLE_NAME"
QUEUE_URL = "QUEUE_URL"
MESSAGES_BUCKET_NAME = "MESSAGES_BUCKET_NAME"
SINK = "SINK"
MESSAGES_TABLE_NAME = "MESSAGES_TABLE_NAME"
MESSAGES_STREAM_NAME = "MESSAGES_STREAM_NAME"
MESSAGES_DELIVERY_STREAM_NAME = "MESSAGES_DELIVERY_STREAM_NAME"
AWS_REGION = "AWS_REGION"
AWS_DEFAULT_REGION = "AWS_DEFAULT_REGION"
AWS_ENDPOINT_URL = "AWS_ENDPOINT_URL"
WORKER_ID = "WORKER_ID"
ECS_CONTAINER_METADATA_URI_V4 = "ECS_CONTAINER_METADATA_URI_V4"
LEASE_SECONDS = "LEASE_SECONDS"
HEARTBEAT_SECONDS = "HEARTBEAT_SECONDS"
MAX_CLOCK_SKEW_MS = "MAX_CLOCK_SKEW_MS"
CHECKPOINT_SECONDS = "CHECKPOINT_SECONDS"
RECONCILE_SECONDS = "RECONCILE_SECONDS"
SWEEP_SECONDS = "SWEEP_SECONDS"
MAX_CONNECTIONS = "MAX_CONNECTIONS"
REBALANCE = "REBALANCE"
REBALANCE_TOLERANCE = "REBALANCE_TOLERANCE"
METRICS_NAMESPACE = "METRICS_NAMESPACE"
SERVICE_NAME = "SERVICE_NAME"
STATE_SHARDS = "STATE_SHARDS"
SHUTDOWN_SECONDS = "SHUTDOWN_SECONDS"
METRICS_SECONDS = "METRICS_SECONDS"
MESSAGE_TTL_DAYS = "MESSAGE_TTL_DAYS"
FLUSH_INTERVAL_MS = "FLUSH_INTERVAL_MS"
MAX_FRAME_BYTES = "MAX_FRAME_BYTES"
MAX_BUFFERED_BYTES = "MAX_BUFFERED_BYTES"
QUARANTINE_AFTER = "QUARANTINE_AFTER"
UPSTREAM_SECRET_PREFIX = "UPSTREAM_SECRET_PREFIX"
ALLOWED_WS_HOSTS = "ALLOWED_WS_HOSTS"
SECRET_HOSTS_REQUIRED = "SECRET_HOSTS_REQUIRED"
UPSTREAM_PROXY = "UPSTREAM_PROXY"
TRACING = "TRACING"
TRACING_FILE = "TRACING_FILE"
AWS_XRAY_SDK_ENABLED = "AWS_XRAY_SDK_ENABLED"
OTEL_TRACES_EXPORTER = "OTEL_TRACES_EXPORTER"
OTEL_EXPORTER_OTLP_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
OTEL_EXPORTER_OTLP_PROTOCOL = "OTEL_EXPORTER_OTLP_PROTOCOL"
OTEL_EXPORTER_OTLP_TRACES_PROTOCOL = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
OTEL_BSP_MAX_QUEUE_SIZE = "OTEL_BSP_MAX_QUEUE_SIZE"
OTEL_BSP_MAX_EXPORT_BATCH_SIZE = "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"
OTEL_BSP_SCHEDULE_DELAY = "OTEL_BSP_SCHEDULE_DELAY"
OTEL_BSP_EXPORT_TIMEOUT = "OTEL_BSP_EXPORT_TIMEOUT"
OTEL_SERVICE_NAME = "OTEL_SERVICE_NAME"
OTEL_TRACES_SAMPLER = "OTEL_TRACES_SAMPLER"
OTEL_TRACES_SAMPLER_ARG = "OTEL_TRACES_SAMPLER_ARG"
OPENTELEMETRY_COLLECTOR_CONFIG_URI = "OPENTELEMETRY_COLLECTOR_CONFIG_URI"
CONSUMER_BUCKET_NAME = "CONSUMER_BUCKET_NAME"
CONSUMER_TABLE_NAME = "CONSUMER_TABLE_NAME"
CONSUMER_PREFIX = "CONSUMER_PREFIX"


class ConfigError(ValueError):
    """A configuration value is missing or invalid; the message names the variable."""


@dataclass(frozen=True)
class Variable:
    name: str
    kind: str  # one of the kinds above
    default: Any  # what an unset variable means (None: required, or worked out at start-up)
    doc: str  # one line, for docs/configuration.md (links relative to docs/)
    readers: tuple[str, ...]
    low: float | None = None  # bounds, inclusive, where the kind has them
    high: float | None = None
    shown: str = ""  # the docs' default where it is not simply ``default``
    stack: tuple[str, ...] = ()  # readers whose environment the stacks always set it in
    standard: bool = False  # a platform's or the SDK's variable: named below the tables

    def text(self, value: Any) -> str:
        """``value`` written as the runtime parses it: 10 -> "10", 2.5 -> "2.5", True -> "on"."""
        if self.kind in (SECONDS, FRACTION):
            return f"{value:g}"
        if self.kind == FLAG:
            return "on" if value else "off"
        if self.kind == LIST:
            return ",".join(value)
        return str(value)

    @property
    def default_text(self) -> str:
        if self.shown:
            return self.shown
        if self.default is None:
            return "required"
        if self.default in ("", ()):
            return "empty"
        return f"`{self.text(self.default)}`"


_VARIABLES = (
    # --- resources (the stacks name them) -------------------------------------------------
    Variable(TABLE_NAME, NAME, None, "the connections table", _SERVICE, stack=_SERVICE),
    Variable(SESSIONS_TABLE_NAME, NAME, None, "the worker sessions table", _SERVICE, stack=_SERVICE),
    Variable(QUEUE_URL, NAME, None, "the START-hint queue", _SERVICE, stack=_SERVICE),
    Variable(
        MESSAGES_BUCKET_NAME, NAME, None,
        'S3 bucket for data too large for a messages item (see [Messages: one item per seq](design.md#messages-one-item-per-seq-large-data-in-s3))',
        _SERVICE, stack=_SERVICE,
    ),
    Variable(
        SINK, TEXT, "dynamodb",
        "where frames go: `dynamodb` (the messages table), `kinesis` (the stream), `firehose` (the delivery "
        "stream into S3), or several comma-separated, such as `dynamodb,kinesis` "
        '(see [Where frames go](sinks.md)); the stacks set it from the environment\'s `sink`',
        _SERVICE,
    ),
    Variable(
        MESSAGES_TABLE_NAME, NAME, None, "the messages table", _SERVICE, shown="required where `SINK` has `dynamodb`"
    ),
    Variable(
        MESSAGES_STREAM_NAME, NAME, None, "the messages stream: its name or ARN", _SERVICE,
        shown="required where `SINK` has `kinesis`",
    ),
    Variable(
        MESSAGES_DELIVERY_STREAM_NAME, NAME, None, "the Firehose delivery stream: its name", (WORKER,),
        shown="required where `SINK` has `firehose`",
    ),
    Variable(
        AWS_REGION, NAME, None, "standard SDK variable (Lambda sets it itself)", READERS,
        shown="required (else `AWS_DEFAULT_REGION`)", stack=(WORKER,),
    ),
    Variable(AWS_DEFAULT_REGION, NAME, None, "where `AWS_REGION` is not set", READERS, standard=True),
    Variable(AWS_ENDPOINT_URL, URL, None, "standard SDK variable; the embedded default sets it", READERS, shown="none"),
    # --- the worker ---------------------------------------------------------------------
    Variable(
        WORKER_ID, TEXT, None, "names the worker in its sessions and in `lease_owner` (at most 256 characters)",
        (WORKER,), shown="ECS task id, else `hostname-pid`",
    ),
    Variable(
        ECS_CONTAINER_METADATA_URI_V4, URL, None, "set by ECS: where the worker finds its task id", (WORKER,),
        standard=True,
    ),
    Variable(
        LEASE_SECONDS, SECONDS, 10.0, "session lease (at least twice `HEARTBEAT_SECONDS`)", (WORKER,), stack=(WORKER,)
    ),
    Variable(HEARTBEAT_SECONDS, SECONDS, 2.5, "session renewal interval", (WORKER,), stack=(WORKER,)),
    Variable(
        MAX_CLOCK_SKEW_MS, WHOLE, 1000,
        "safety margin for wall-clock expiry (below `LEASE_SECONDS` minus `HEARTBEAT_SECONDS`)",
        (WORKER,), low=0, high=60_000, stack=(WORKER,),
    ),
    Variable(
        CHECKPOINT_SECONDS, SECONDS, 120.0,
        "longest time between checkpoint writes of a connection that receives frames", (WORKER,), stack=(WORKER,),
    ),
    Variable(
        RECONCILE_SECONDS, SECONDS, 10.0,
        "scan of the `FREE#` partitions for STARTED connections nobody owns (jittered down to ¾; doubled after "
        "each scan that finds nothing, up to 8x, back to 1x at a find or a hint); the owner-index audit runs every "
        "three scans. A worker at its fair share leaves a connection it finds free to workers under theirs, unless "
        "it was already free at its previous scan",
        (WORKER,), stack=(WORKER,),
    ),
    Variable(
        SWEEP_SECONDS, SECONDS, 600.0,
        "the reachability sweep (by one worker for the fleet) starts a pass over every connection at most this often",
        (WORKER,),
    ),
    Variable(MAX_CONNECTIONS, WHOLE, 100, "per worker", (WORKER,), low=1, high=100_000, stack=(WORKER,)),
    Variable(
        REBALANCE, FLAG, True,
        "shed connections above this worker's fair share to workers under theirs (`off` to only ever take new and "
        "orphaned ones)",
        (WORKER,), stack=(WORKER,),
    ),
    Variable(
        REBALANCE_TOLERANCE, FRACTION, 0.1,
        "how far above its fair share (a fraction of it, at least one connection) a worker may be before it sheds",
        (WORKER,), low=0, high=1, stack=(WORKER,),
    ),
    Variable(
        METRICS_NAMESPACE, TEXT, "WsFleet", "the CloudWatch namespace of its metrics",
        (WORKER, CONSUMER), stack=(WORKER, CONSUMER),
    ),
    Variable(
        SERVICE_NAME, TEXT, None, "the metrics' dimension `ServiceName`", (WORKER, CONSUMER),
        shown="`wsfleet-worker`; the consumer: `wsfleet-consumer`", stack=(WORKER, CONSUMER),
    ),
    Variable(
        STATE_SHARDS, WHOLE, 4, "`FREE#<shard>` partitions of `by_owner` (worker and router must agree)",
        _SERVICE, low=1, high=256, stack=_SERVICE,
    ),
    Variable(
        SHUTDOWN_SECONDS, SECONDS, 25.0, "graceful-shutdown budget; keep it below the container's stopTimeout",
        (WORKER,), stack=(WORKER,),
    ),
    Variable(METRICS_SECONDS, SECONDS, 60.0, "metric publishing interval", (WORKER,), stack=(WORKER,)),
    Variable(
        MESSAGE_TTL_DAYS, WHOLE, 0, "when > 0, messages carry `expires_at` for DynamoDB TTL", (WORKER,),
        low=0, high=3650, stack=(WORKER,),
    ),
    Variable(
        FLUSH_INTERVAL_MS, WHOLE, 100,
        "how long a frame may wait to share a batch write (and, on the stream, one Kinesis record with its "
        "connection's other frames)", (WORKER,), low=0, high=10_000, stack=(WORKER,),
    ),
    Variable(
        MAX_FRAME_BYTES, WHOLE, 32 * 1024 * 1024,
        "the WebSocket frame limit (the socket's `max_size`): a larger frame is not taken (see [Frames](design.md#frames-a-frame-never-fails-a-connection))",
        # Below the largest item's data no frame would be large; above, one frame is more
        # than a task's memory.
        (WORKER,), low=4096, high=512 * 1024 * 1024, shown="33554432 (32 MiB)", stack=(WORKER,),
    ),
    Variable(
        QUARANTINE_AFTER, WHOLE, 3,
        "the crash-loop breaker: a connection that was the prime suspect of this many consecutive deaths of its owners "
        "within 15 minutes is quarantined (not taken again until a new START; see [The crash-loop breaker](design.md#the-crash-loop-breaker))",
        (WORKER,), low=2, high=100,
    ),
    Variable(
        MAX_BUFFERED_BYTES, WHOLE, None,
        "frame bytes the worker holds at once, in its sockets and its writer (see [Memory under large frames](design.md#memory-under-large-frames)); "
        "`off` only to compare with the unbounded behaviour",
        (WORKER,), low=1024 * 1024, high=1 << 40,
        shown="half of what the task's memory (cgroup `memory.max`) leaves beside the frame decoder, else 268435456 (256 MiB)", stack=(WORKER,),
    ),
    Variable(
        UPSTREAM_SECRET_PREFIX, TEXT, "",
        "Secrets Manager name prefix a START's `secret_headers` may name (router and worker check it; empty allows "
        'no secret; see [The upstream object](api.md#the-upstream-object-credentials-a-subscribe-message-other-frame-shapes))',
        _SERVICE, shown="empty (the stacks: `wsfleet/<env>/`)", stack=_SERVICE,
    ),
    Variable(
        ALLOWED_WS_HOSTS, LIST, (),
        "the router's allow-list (host names or `*.domain`); the worker checks what an upstream host name resolves "
        "to and connects to that checked address: an internal one (loopback, private, link-local, metadata, ...) "
        "only for a host or address listed exactly",
        _SERVICE, stack=_SERVICE,
    ),
    Variable(
        UPSTREAM_PROXY, URL, "",
        "an HTTP proxy (`http://[user:password@]host:port`) every upstream socket tunnels through (CONNECT to the "
        "address the worker checked); empty: none, and the environment's `HTTPS_PROXY` and the like never reroute "
        "an upstream socket (they are for the AWS calls)",
        (WORKER,), shown="empty", stack=(WORKER,),
    ),
    Variable(
        SECRET_HOSTS_REQUIRED, FLAG, False,
        "`on`: a secret is sent only to the hosts its `wsfleet:hosts` tag lists and an untagged secret is refused; "
        '`off`: an untagged one may go to any allowed host (see [Security model](security.md))',
        (WORKER,), shown="`off` (the stacks: `on` in prod)", stack=(WORKER,),
    ),
    # --- tracing (docs/tracing.md) ---------------------------------------------------------
    Variable(
        TRACING, TEXT, "xray-sdk",
        "`xray-sdk` (the AWS X-Ray SDK and daemon), `otel` (OpenTelemetry, honours the standard `OTEL_*` "
        'variables) or `off` (see [Tracing](tracing.md))',
        _SERVICE, stack=_SERVICE,
    ),
    Variable(
        TRACING_FILE, TEXT, "",
        "with `TRACING=otel` only: append the spans to this file as OTLP JSON lines instead of exporting them "
        "(local runs; needs `requirements-dev.txt`)",
        _SERVICE,
    ),
    Variable(
        AWS_XRAY_SDK_ENABLED, TEXT, "", "`false` turns `xray-sdk` off, as it always has", _SERVICE, standard=True
    ),
    Variable(OTEL_TRACES_EXPORTER, TEXT, "otlp", "`otlp`, `console` or `none`", _SERVICE, standard=True),
    Variable(OTEL_EXPORTER_OTLP_ENDPOINT, URL, "", "where OTLP goes (+ `/v1/traces`)", _SERVICE, standard=True),
    Variable(
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, URL, "http://localhost:4318/v1/traces", "where OTLP spans go",
        _SERVICE, standard=True,
    ),
    Variable(OTEL_EXPORTER_OTLP_PROTOCOL, TEXT, "", "only `http/protobuf`", _SERVICE, standard=True),
    Variable(OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, TEXT, "", "only `http/protobuf`", _SERVICE, standard=True),
    # The batch processor's, read by the SDK itself: checked at start (config), since the
    # SDK raises on one out of its range and silently takes its default for a non-number.
    Variable(
        OTEL_BSP_MAX_QUEUE_SIZE, WHOLE, 2048, "spans queued", _SERVICE, low=1, high=65536, standard=True
    ),  # spans of 1-2 KB each: the queue stays bounded in memory
    Variable(
        OTEL_BSP_MAX_EXPORT_BATCH_SIZE, WHOLE, 512, "spans per export, at most the queue", _SERVICE,
        low=1, high=65536, standard=True,
    ),
    Variable(
        OTEL_BSP_SCHEDULE_DELAY, WHOLE, 5000, "milliseconds", _SERVICE, low=1, high=3_600_000, standard=True
    ),
    Variable(
        OTEL_BSP_EXPORT_TIMEOUT, WHOLE, 30000, "milliseconds", _SERVICE, low=1, high=3_600_000, standard=True
    ),
    # Read by the OpenTelemetry SDK (or the ADOT Lambda extension) alone; the stacks set them.
    Variable(OTEL_SERVICE_NAME, TEXT, "", "the spans' service", _SERVICE, standard=True),
    Variable(OTEL_TRACES_SAMPLER, TEXT, "", "the sampler", _SERVICE, standard=True),
    Variable(OTEL_TRACES_SAMPLER_ARG, TEXT, "", "the sampler's ratio", _SERVICE, standard=True),
    Variable(
        OPENTELEMETRY_COLLECTOR_CONFIG_URI, TEXT, "", "the ADOT Lambda extension's configuration", (ROUTER,),
        standard=True,
    ),
    # --- the reference consumer (wsfleet.consumer) -------------------------------------------
    Variable(CONSUMER_BUCKET_NAME, NAME, None, "its output bucket", (CONSUMER,), stack=(CONSUMER,)),
    Variable(
        CONSUMER_TABLE_NAME, NAME, None,
        "its delivery state (partition key `connection_id`, `schema.consumer_table_spec`)", (CONSUMER,),
        stack=(CONSUMER,),
    ),
    Variable(
        CONSUMER_PREFIX, TEXT, "frames/",
        "the objects' key prefix: `<prefix><connection_id>/...` (S3 key characters, at most 512, no leading `/`)",
        (CONSUMER,), stack=(CONSUMER,),
    ),
)
VARIABLES: dict[str, Variable] = {v.name: v for v in _VARIABLES}


def read_by(reader: str) -> tuple[Variable, ...]:
    return tuple(v for v in _VARIABLES if reader in v.readers)


def set_by_stacks(reader: str) -> frozenset[str]:
    """What the stacks always set in ``reader``'s environment (a stack test checks it)."""
    return frozenset(v.name for v in _VARIABLES if reader in v.stack)


def environment(reader: str, values: Mapping[str, str]) -> dict[str, str]:
    """``values`` as ``reader``'s environment, refused if it names a variable ``reader``
    does not read (a stack's typo would otherwise deploy a setting nothing reads)."""
    unread = sorted(set(values) - {v.name for v in read_by(reader)})
    if unread:
        raise ConfigError(f"the {reader} reads no {', '.join(unread)} (wsfleet.settings_spec)")
    return dict(values)


# --- the docs' tables -----------------------------------------------------------------------


def markdown_table(reader: str) -> str:
    """docs/configuration.md's table of what ``reader`` reads, from :data:`VARIABLES`: the product's
    own variables one row each, the standard ones named after it."""

    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    rows = ["| variable | default | meaning |", "|---|---|---|"]
    rows += [
        f"| `{v.name}` | {cell(v.default_text)} | {cell(v.doc)} |" for v in read_by(reader) if not v.standard
    ]
    standard = ", ".join(f"`{v.name}`" for v in read_by(reader) if v.standard)
    return "\n".join(rows) + f"\n\nAlso read, as their platform or SDK defines them: {standard}."


DOCS = "docs/configuration.md"  # where the tables are, from the checkout's root


def _block(reader: str) -> str:
    return f"variables-{reader}"


def rewrite(text: str) -> str:
    """``text`` (docs/configuration.md) with each ``<!-- variables-<reader> -->`` block regenerated."""
    for reader in READERS:
        name = _block(reader)
        pattern = re.compile(rf"(<!-- {name} -->\n).*?(<!-- /{name} -->)", flags=re.DOTALL)
        table = markdown_table(reader)
        text = pattern.sub(lambda m, table=table: m.group(1) + table + "\n" + m.group(2), text)
    return text


def main(argv: list[str]) -> int:
    """``python -m wsfleet.settings_spec [FILE]``: rewrite the tables of variables in FILE
    (docs/configuration.md)."""
    (path,) = argv or [DOCS]
    readme = Path(path)
    before = readme.read_text(encoding="utf-8")
    after = rewrite(before)
    readme.write_text(after, encoding="utf-8")
    print("rewritten" if after != before else "already current")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
