"""Shared fixtures: a local AWS emulator (moto server, DynamoDB serialised), and fresh
tables and queue per test so tests never see each other's items."""

from __future__ import annotations

import functools
import itertools
import os
import uuid

import boto3
import botocore.loaders
import botocore.session
import pytest

from wsfleet.local.emulator import CREDENTIALS, Emulator, create_resources
from wsfleet.local.fleet import EmulatorProcess

pytest_plugins = ("tests.markers", "tests.scheduling", "pytester")  # pytester: the markers tests run pytest

REGION = "us-east-1"
_names = itertools.count()

# boto3 clients in the test process must never reach real AWS.
os.environ.update(CREDENTIALS)
os.environ.setdefault("AWS_DEFAULT_REGION", REGION)


# botocore parses its JSON models once per Session (its loader caches them), and the
# runtime makes a Session per owner of clients: the router, each worker, each call of
# create_resources. The tests make hundreds of those; parsing the same files again was
# half of the router tests' time. In this process one loader serves every Session, as
# one Session's loader serves all its clients in production.
class _PathsOnce(list):
    """A loader's search paths; boto3 appends its own to the loader of every Session it
    makes, which with one shared loader would grow the list by one per Session."""

    def append(self, path: str) -> None:
        if path not in self:
            super().append(path)


@functools.cache
def _shared_loader(search_path_string: str | None = None) -> botocore.loaders.Loader:
    loader = botocore.loaders.create_loader(search_path_string)
    loader._search_paths = _PathsOnce(loader.search_paths)
    return loader


botocore.session.create_loader = _shared_loader


@pytest.fixture(scope="session")
def emulator_thread():
    with Emulator() as emu:
        yield emu


@pytest.fixture(scope="module")
def emulator(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """The emulator a module's tests reach: a thread of this process (one per session),
    except for a module of slow tests, which gets a process of its own. Those run
    workers' loops in this process, and moto holds the GIL while it answers: sharing it,
    a worker missed renewals of its 2 s lease whenever the machine was busy."""
    if request.node.get_closest_marker("slow") is None:
        yield request.getfixturevalue("emulator_thread")
        return
    with EmulatorProcess(tmp_path_factory.mktemp("emulator") / "emulator.log") as emu:
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
