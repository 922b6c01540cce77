"""The environment variables the service stack gives the worker task, the router and the
reference consumer: their names and how a value is written come from the runtime's
declaration (``wsfleet.settings_spec``), which refuses a variable its reader does not read.
The runtime gets its settings only this way (CONTRACT section 2)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stacks import tracing
from stacks.settings import EnvironmentSettings
from wsfleet import budget, metrics_names, schema
from wsfleet import settings_spec as spec

METRICS_NAMESPACE = metrics_names.DEFAULT_NAMESPACE


@dataclass(frozen=True)
class Resources:
    """What the runtime is told to use, as the stack knows them (tokens at synth)."""

    connections_table_name: str
    sessions_table_name: str
    messages_table_name: str
    messages_bucket_name: str
    queue_url: str
    messages_stream_name: str | None  # None: kinesis is not a sink
    stores_in_table: bool
    messages_delivery_stream_name: str | None = None  # None: firehose is not a sink


def _text(name: str, value: Any) -> str:
    return spec.VARIABLES[name].text(value)


def _sink(settings: EnvironmentSettings, resources: Resources) -> dict[str, str]:
    """SINK and what it names, for the worker and the router alike. Where the sink is the
    default (the table alone) SINK is left unset, as before there was a choice; where the
    table is not a sink its name is not given: nothing reads it then. The delivery
    stream's name is the worker's alone (:func:`worker`)."""
    variables = {}
    if resources.stores_in_table:
        variables[spec.MESSAGES_TABLE_NAME] = resources.messages_table_name
    if settings.sinks != schema.DEFAULT_SINKS:
        variables[spec.SINK] = ",".join(settings.sinks)
    if resources.messages_stream_name is not None:
        variables[spec.MESSAGES_STREAM_NAME] = resources.messages_stream_name
    return variables


def router(settings: EnvironmentSettings, resources: Resources, region: str) -> dict[str, str]:
    return spec.environment(
        spec.ROUTER,
        {
            spec.TABLE_NAME: resources.connections_table_name,
            spec.SESSIONS_TABLE_NAME: resources.sessions_table_name,
            **_sink(settings, resources),
            spec.MESSAGES_BUCKET_NAME: resources.messages_bucket_name,
            spec.QUEUE_URL: resources.queue_url,
            spec.ALLOWED_WS_HOSTS: _text(spec.ALLOWED_WS_HOSTS, settings.allowed_ws_hosts),
            spec.STATE_SHARDS: _text(spec.STATE_SHARDS, settings.state_shards),
            # The router only checks that secret_headers ARNs are under it; it reads no secret.
            spec.UPSTREAM_SECRET_PREFIX: settings.secret_prefix,
            **tracing.router_environment(settings.tracing, f"wsfleet-{settings.name}-router", region),
        },
    )


def worker(settings: EnvironmentSettings, resources: Resources, region: str) -> dict[str, str]:
    # WORKER_ID stays unset: on ECS the worker takes its task id from task metadata.
    values = {
        spec.LEASE_SECONDS: settings.lease_seconds,
        spec.HEARTBEAT_SECONDS: settings.heartbeat_seconds,
        spec.RECONCILE_SECONDS: settings.reconcile_seconds,
        spec.CHECKPOINT_SECONDS: settings.checkpoint_seconds,
        spec.FLUSH_INTERVAL_MS: settings.flush_interval_ms,
        spec.MAX_CONNECTIONS: settings.max_connections_per_worker,
        spec.REBALANCE: settings.rebalance,
        spec.REBALANCE_TOLERANCE: settings.rebalance_tolerance,
        spec.MAX_CLOCK_SKEW_MS: settings.max_clock_skew_ms,
        spec.METRICS_NAMESPACE: METRICS_NAMESPACE,
        spec.SERVICE_NAME: settings.service_name,
        spec.STATE_SHARDS: settings.state_shards,
        spec.SHUTDOWN_SECONDS: settings.shutdown_seconds,
        spec.METRICS_SECONDS: settings.metrics_seconds,
        spec.MESSAGE_TTL_DAYS: settings.message_ttl_days,
        spec.MAX_FRAME_BYTES: settings.max_frame_bytes,
        # The worker's own default for frame bytes (half of what its memory, the task's
        # less its tracing sidecar's reservation, leaves beside the frame decoder), set
        # here: the worker's default reads its cgroup limit, and on Fargate the container
        # may see none (then it would take 256 MiB).
        spec.MAX_BUFFERED_BYTES: budget.default_budget_bytes(
            (settings.worker_memory_mib - tracing.worker_sidecar_memory_mib(settings.tracing)) * 1024 * 1024,
            settings.max_frame_bytes,
        ),
        # The router's allow-list: the worker lets only exactly listed hosts resolve
        # to internal addresses (validation.check_resolved).
        spec.ALLOWED_WS_HOSTS: settings.allowed_ws_hosts,
        # The same prefix as the router's: a stored upstream naming another secret is refused.
        spec.UPSTREAM_SECRET_PREFIX: settings.secret_prefix,
        spec.SECRET_HOSTS_REQUIRED: settings.secret_hosts_required,
        spec.UPSTREAM_PROXY: settings.upstream_proxy,
    }
    return spec.environment(
        spec.WORKER,
        {
            spec.TABLE_NAME: resources.connections_table_name,
            spec.SESSIONS_TABLE_NAME: resources.sessions_table_name,
            **_sink(settings, resources),
            **(
                {spec.MESSAGES_DELIVERY_STREAM_NAME: resources.messages_delivery_stream_name}
                if resources.messages_delivery_stream_name is not None
                else {}
            ),
            spec.MESSAGES_BUCKET_NAME: resources.messages_bucket_name,
            spec.QUEUE_URL: resources.queue_url,
            spec.AWS_REGION: region,
            **{name: _text(name, value) for name, value in values.items()},
            **tracing.worker_environment(settings.tracing, settings.service_name),
        },
    )


def consumer(settings: EnvironmentSettings, *, bucket_name: str, table_name: str) -> dict[str, str]:
    assert settings.consumer is not None
    return spec.environment(
        spec.CONSUMER,
        {
            spec.CONSUMER_BUCKET_NAME: bucket_name,
            spec.CONSUMER_TABLE_NAME: table_name,
            spec.CONSUMER_PREFIX: settings.consumer.prefix,
            spec.METRICS_NAMESPACE: METRICS_NAMESPACE,
            spec.SERVICE_NAME: settings.consumer_service_name,
        },
    )
