#!/usr/bin/env python3
"""The CDK app: the stacks of one environment, chosen with ``-c env=<name>``.

    cdk synth -c env=dev
    cdk deploy -c env=prod --all
"""

from __future__ import annotations

from pathlib import Path

from aws_cdk import App, Tags

from stacks import nag
from stacks.service_stack import ServiceStack
from stacks.settings import EnvironmentSettings
from stacks.environment_files import load_environments
from stacks.settings_parts import SettingsError
from stacks.synth import check_plan, with_context
from stacks.stateful_stack import StatefulStack
from wsfleet import stack_outputs

# One file per environment (environments/<name>.toml): a new file is a new environment.
ENVIRONMENTS_DIR = Path(__file__).parent / "environments"


def load_all(where: Path = ENVIRONMENTS_DIR) -> dict[str, EnvironmentSettings]:
    """Every environment's settings, checked; a bad file stops the app with its sentence
    (naming the file and the setting) instead of a traceback: ``cdk synth`` runs this
    module."""
    try:
        return load_environments(where)
    except SettingsError as error:
        raise SystemExit(str(error)) from None


ENVIRONMENTS = load_all()


def create_stacks(app: App) -> tuple[StatefulStack, ServiceStack]:
    """The two stacks of the environment named by the ``env`` context value, with the
    settings that context overrides (stacks.synth.CONTEXT_OVERRIDES)."""
    name = app.node.try_get_context("env")
    if name not in ENVIRONMENTS:
        raise SystemExit(
            f"choose an environment with -c env=<name>: one of {', '.join(ENVIRONMENTS)} "
            f"(each a file {ENVIRONMENTS_DIR.name}/<name>.toml; got {name!r})"
        )
    try:
        settings = with_context(ENVIRONMENTS[name], app.node.try_get_context)
        check_plan(settings)
    except SettingsError as error:
        raise SystemExit(f"{name}: {error}") from None
    stateful = StatefulStack(app, f"wsfleet-{name}-stateful", settings=settings)
    stream, consumer, delivery = stateful.messages_stream, stateful.consumer_store, stateful.messages_delivery
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
        delivery_stream=(delivery.stream_name, delivery.stream_arn) if delivery else None,
    )
    Tags.of(app).add("project", "wsfleet")
    Tags.of(app).add("environment", name)
    nag.check_app(app)
    return stateful, service


if __name__ == "__main__":
    app = App()
    create_stacks(app)
    app.synth()
