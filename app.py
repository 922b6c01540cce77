#!/usr/bin/env python3
"""The CDK app: the stacks of one environment, chosen with ``-c env=<name>``.

    cdk synth -c env=dev
    cdk deploy -c env=prod --all
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

from aws_cdk import App, Tags
from aws_cdk import aws_logs as logs

from stacks import nag
from stacks.service_stack import ServiceStack
from stacks.settings import EnvironmentSettings
from stacks.settings_parts import ConsumerSettings, SettingsError, TracingSettings, WarmThroughput
from stacks.synth import check_plan, with_context
from stacks.stateful_stack import StatefulStack
from wsfleet import stack_outputs

T = TypeVar("T")


def built(kind: Callable[..., T], **values: Any) -> T:
    """``kind(**values)`` (an environment's settings, or a part of them); a bad setting
    stops the app with its sentence, naming the setting, instead of a traceback: ``cdk
    synth`` runs this module, and the settings are checked as it builds them."""
    try:
        return kind(**values)
    except SettingsError as error:
        name = f" {values['name']!r}" if "name" in values else ""
        raise SystemExit(f"app.py, {getattr(kind, '__name__', kind)}{name}: {error}") from None


ENVIRONMENTS = {
    settings.name: settings
    for settings in (
        built(
            EnvironmentSettings,
            name="dev",
            retain_data=False,
            message_ttl_days=3,
            log_retention=logs.RetentionDays.ONE_WEEK,
            lease_seconds=10,
            heartbeat_seconds=2.5,
            reconcile_seconds=10,
            checkpoint_seconds=120,
            state_shards=4,
            worker_cpu=256,
            worker_memory_mib=512,
            min_workers=1,
            max_workers=4,
            use_fargate_spot=True,
            shutdown_seconds=25,
            stop_timeout_seconds=45,
            max_frame_bytes=32 * 1024 * 1024,
            # dev runs both sinks and the reference consumer: the whole Kinesis path
            # deployed where a mistake is cheap (a stream-hour, a key, a function), while
            # the read API still answers from the table. prod stays on the table alone
            # until its operators choose (here, or `cdk deploy -c sink=...`).
            sink="dynamodb,kinesis",
            stream_retention_hours=24,
            stream_kms="customer-managed",
            consumer=built(
                ConsumerSettings,
                batch_size=10_000,
                max_batching_window_seconds=30,
                starting_position="TRIM_HORIZON",
                bisect_on_error=True,
                retry_attempts=None,
                prefix="frames/",
                output_ttl_days=3,
                iterator_age_alarm_seconds=600,
            ),
            allowed_ws_hosts=("*.example.com",),
            upstream_secret_prefix="wsfleet/dev/",
            upstream_secret_kms_key_arns=(),
            api_rate_limit=20,
            api_burst_limit=40,
            nat_gateways=1,
            nat_addresses_per_gateway=1,
            worker_subnet_mask=20,
            connections_warm_throughput=None,
            owner_index_warm_throughput=None,
            quotas={},
            # dev runs OpenTelemetry (the ADOT collector beside each worker, the ADOT
            # Lambda layer beside the router) ahead of prod's switch (README "Tracing").
            tracing=TracingSettings(mode="otel", lambda_otel="layer", sample_ratio=0.05),
        ),
        built(
            EnvironmentSettings,
            name="prod",
            retain_data=True,
            message_ttl_days=30,
            log_retention=logs.RetentionDays.THREE_MONTHS,
            lease_seconds=10,
            heartbeat_seconds=2.5,
            reconcile_seconds=10,
            checkpoint_seconds=120,
            state_shards=16,
            worker_cpu=512,
            worker_memory_mib=1024,
            # 500,000 connections (README, "prod: 500k connections"): 2,000 tasks at 250
            # each, 350 at most (a crash's survivors hold 278); a deploy's 4,000 tasks stay
            # under ECS's 5,000 per service, and a crash's 1,800 survivors rewrite their
            # by_ring entries 720 times a second, under the RING partition's 1,000.
            max_connections_per_worker=350,
            target_connections_per_worker=250,
            min_workers=2,
            max_workers=2000,
            use_fargate_spot=False,
            shutdown_seconds=25,
            stop_timeout_seconds=60,
            max_frame_bytes=32 * 1024 * 1024,
            sink="dynamodb",
            allowed_ws_hosts=("*.example.com",),
            upstream_secret_prefix="wsfleet/prod/",
            upstream_secret_kms_key_arns=(),
            api_rate_limit=200,
            api_burst_limit=400,
            # 10 addresses x 55,000 connections to one upstream IP and port.
            nat_gateways=2,
            nat_addresses_per_gateway=5,
            worker_subnet_mask=20,
            # A crash of 10 % at 500k: 12,500 acquisitions a second, each a transactional
            # write (2 units) after a consistent read, and 2 by_owner writes; a scale-in's
            # handoffs 3 units each: 37,500 a second.
            connections_warm_throughput=WarmThroughput(read_units_per_second=15_000, write_units_per_second=40_000),
            owner_index_warm_throughput=WarmThroughput(read_units_per_second=12_000, write_units_per_second=30_000),
            # Raise before deploying (README, "Quotas to raise before deploying prod").
            quotas={"eips_per_nat_gateway": 5, "eips_per_region": 10},
            # The X-Ray SDK and daemon until dev has run otel for a while; switch before
            # 2027-02-25, when their support ends (README "Tracing").
            tracing=TracingSettings(mode="xray-sdk"),
        ),
    )
}


def create_stacks(app: App) -> tuple[StatefulStack, ServiceStack]:
    """The two stacks of the environment named by the ``env`` context value, with the
    settings that context overrides (stacks.synth.CONTEXT_OVERRIDES)."""
    name = app.node.try_get_context("env")
    if name not in ENVIRONMENTS:
        raise SystemExit(f"choose an environment with -c env=<name>: one of {', '.join(ENVIRONMENTS)}")
    try:
        settings = with_context(ENVIRONMENTS[name], app.node.try_get_context)
        check_plan(settings)
    except SettingsError as error:
        raise SystemExit(f"{name}: {error}") from None
    stateful = StatefulStack(app, f"wsfleet-{name}-stateful", settings=settings)
    stream, consumer = stateful.messages_stream, stateful.consumer_store
    service = ServiceStack(
        app,
        f"wsfleet-{name}-service",
        settings=settings,
        connections_table=stateful.tables.connections,
        sessions_table=stateful.tables.sessions,
        messages_table=stateful.tables.messages,
        messages_bucket_name=stateful.output_value(stack_outputs.MESSAGES_BUCKET_NAME),
        start_queue=stateful.start_queue.queue,
        dead_letter_queue=stateful.start_queue.dead_letter_queue,
        messages_stream=stream.stream if stream else None,
        stream_key=stream.key if stream else None,
        consumer_bucket_name=stateful.output_value(stack_outputs.CONSUMER_BUCKET_NAME) if consumer else None,
        consumer_table=consumer.table if consumer else None,
    )
    Tags.of(app).add("project", "wsfleet")
    Tags.of(app).add("environment", name)
    nag.check_app(app)
    return stateful, service


if __name__ == "__main__":
    app = App()
    create_stacks(app)
    app.synth()
