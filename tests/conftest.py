"""Shared fixtures: one local AWS emulator (moto server, DynamoDB serialised) per test
session, and fresh tables and queue per test so tests never see each other's items."""

from __future__ import annotations

import itertools
import os
import uuid

import boto3
import pytest

from wsfleet.local.emulator import CREDENTIALS, Emulator, create_resources, set_faults

REGION = "us-east-1"
_names = itertools.count()

# boto3 clients in the test process must never reach real AWS.
os.environ.update(CREDENTIALS)
os.environ.setdefault("AWS_DEFAULT_REGION", REGION)


@pytest.fixture(scope="session")
def emulator():
    with Emulator() as emu:
        yield emu


@pytest.fixture
def aws_env(emulator) -> dict[str, str]:
    """Environment variables (as the worker and router read them) for fresh resources."""
    suffix = f"{next(_names)}-{uuid.uuid4().hex[:6]}"
    return create_resources(
        emulator.endpoint_url,
        region=REGION,
        table_name=f"conn-{suffix}",
        sessions_table_name=f"sess-{suffix}",
        messages_table_name=f"msg-{suffix}",
        queue_name=f"start-{suffix}",
    )


@pytest.fixture
def ddb(emulator):
    return boto3.client("dynamodb", endpoint_url=emulator.endpoint_url, region_name=REGION)


@pytest.fixture
def sqs(emulator):
    return boto3.client("sqs", endpoint_url=emulator.endpoint_url, region_name=REGION)


@pytest.fixture
def python_env() -> dict[str, str]:
    """Environment for a child ``python -m wsfleet...`` process."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "PYTEST_"))}
    env["PYTHONPATH"] = os.path.join(root, "runtime")
    env["PYTHONUNBUFFERED"] = "1"
    env["AWS_XRAY_SDK_ENABLED"] = "false"
    env["ALLOWED_WS_HOSTS"] = "127.0.0.1"  # the local upstream's address
    return env


@pytest.fixture
def lose_first_answer(emulator):
    """``arm(client, ambiguous)``: make requests of the operations in ``ambiguous`` (shares,
    as the emulator's fault switch takes them) applied and then answered 500, until
    ``client`` has had its first such answer: its SDK retries, and everyone else, are
    answered again. Returns the list that operation's name goes in. Off at teardown."""
    url = emulator.endpoint_url

    def arm(client, ambiguous: dict[str, float]) -> list[str]:
        lost: list[str] = []

        def switch_off(operation, response=None, **_):
            if not lost and response is not None and response[0].status_code == 500:
                lost.append(operation.name)
                set_faults(url)

        client.meta.events.register("needs-retry.dynamodb", switch_off)
        set_faults(url, ambiguous=ambiguous)
        return lost

    yield arm
    set_faults(url)
