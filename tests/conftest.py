"""Shared fixtures: a local AWS emulator (moto server, DynamoDB serialised), and fresh
tables and queue per test so tests never see each other's items."""

from __future__ import annotations

import functools
import gc
import io
import itertools
import json
import logging
import os
import uuid
from typing import Any, Iterator

import boto3
import botocore.loaders
import botocore.session
import pytest
from botocore.config import Config

from sim.emulator import Emulator, create_resources, set_faults
from sim.emulator_client import CREDENTIALS, emulator_session
from sim.children import EmulatorProcess
from sim.upstream import ThreadedUpstream
from wsfleet.sinks import MessagesStore
from wsfleet.store import ConnectionsStore, SessionsStore

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


# A pytest process keeps what every test module leaves alive: imports (boto3's models,
# moto, aws-cdk), the in-process emulator's tables, session fixtures. Python's full
# collection walks all of it each time the heap grows by a quarter: a tenth of the CPU
# of the quick tests went there. Between modules, once a full collection has freed
# the module's garbage, what is left is frozen (gc.freeze: never walked again), as the
# emulator process does with what it stores (sim.emulator.freeze_survivors).
# What that gives up: a cycle among objects alive at a freeze that dies later is not
# freed (a module-scoped fixture's, say) - a small leak for a test process.
def pytest_collection_finish(session: pytest.Session) -> None:
    gc.collect()
    gc.freeze()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    try:
        return (yield)
    finally:
        if nextitem is None or nextitem.module is not item.module:  # the module's teardown ran
            gc.collect()
            gc.freeze()


@pytest.fixture(scope="session")
def emulator_thread():
    with Emulator() as emu:
        yield emu


@pytest.fixture(scope="session")
def emulator_process(tmp_path_factory: pytest.TempPathFactory):
    """One emulator process per pytest process (each xdist worker), for every module of
    slow tests it runs. A process per module was started again each time the worker
    went on to a test of another module, dozens of times a run; the modules shared
    nothing but the endpoint, as the tests of one module always did (every test makes
    tables and a queue of its own)."""
    with EmulatorProcess(tmp_path_factory.mktemp("emulator") / "emulator.log") as emu:
        yield emu


@pytest.fixture(scope="module")
def emulator(request: pytest.FixtureRequest):
    """The emulator a module's tests reach: a thread of this process (one per session),
    except for a module of slow tests, which reaches a process. Those run workers'
    loops in this process, and moto holds the GIL while it answers: sharing it, a
    worker missed renewals of its 2 s lease whenever the machine was busy."""
    if request.node.get_closest_marker("slow") is None:
        yield request.getfixturevalue("emulator_thread")
        return
    emu = request.getfixturevalue("emulator_process")
    if not emu.proc.alive():
        pytest.fail(f"the emulator process of this pytest process has exited; see {emu.proc.log_path}")
    set_faults(emu.endpoint_url)  # none left on by a module before this one (a test that failed mid-fault)
    yield emu
    set_faults(emu.endpoint_url)


@functools.cache
def _creator(endpoint_url: str, service: str) -> Any:
    """A client that creates the tests' resources, one per emulator and service: a
    session and a client made for every test's resources were half of their cost (some
    350 tests make fresh ones). Fixtures run in the main thread: no two threads share one."""
    return emulator_session(REGION).client(service, endpoint_url=endpoint_url)


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
        messages_bucket_name=f"msg-{suffix}",
        queue_name=f"start-{suffix}",
        client=functools.partial(_creator, emulator.endpoint_url),
    )


@pytest.fixture
def ddb(emulator):
    return boto3.client("dynamodb", endpoint_url=emulator.endpoint_url, region_name=REGION)


@pytest.fixture
def sqs(emulator):
    return boto3.client("sqs", endpoint_url=emulator.endpoint_url, region_name=REGION)


@pytest.fixture
def upstream():
    """A local upstream producing 20 frames a second on every stream asked for."""
    with ThreadedUpstream(rate=20.0) as up:
        yield up


@pytest.fixture
def stores(ddb, aws_env):
    """(connections, messages) stores on this test's tables."""
    return (
        ConnectionsStore(ddb, aws_env["TABLE_NAME"], state_shards=4, sessions_table_name=aws_env["SESSIONS_TABLE_NAME"]),
        MessagesStore(ddb, aws_env["MESSAGES_TABLE_NAME"]),
    )


@pytest.fixture
def sessions(ddb, aws_env):
    return SessionsStore(ddb, aws_env["SESSIONS_TABLE_NAME"])


@pytest.fixture
def python_env() -> dict[str, str]:
    """Environment for a child ``python -m wsfleet...`` or ``python -m sim...`` process."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "PYTEST_"))}
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(root, "runtime"), root])
    env["PYTHONUNBUFFERED"] = "1"
    env["AWS_XRAY_SDK_ENABLED"] = "false"
    env["ALLOWED_WS_HOSTS"] = "127.0.0.1"  # the local upstream's address
    return env


def own_emulator(service: str) -> Iterator[tuple[str, dict[str, str], Any]]:
    """An emulator of a test's own (faults set there reach no other test), with fresh
    resources: (endpoint url, their environment, a ``service`` client that tries each
    request once, so that a fault shows as it is)."""
    with Emulator() as emu:
        suffix = uuid.uuid4().hex[:8]
        env = create_resources(
            emu.endpoint_url, table_name=f"c-{suffix}", sessions_table_name=f"s-{suffix}",
            messages_table_name=f"m-{suffix}", queue_name=f"q-{suffix}", messages_bucket_name=f"b-{suffix}",
        )
        client = boto3.client(
            service, endpoint_url=emu.endpoint_url, region_name=env["AWS_REGION"],
            aws_access_key_id="testing", aws_secret_access_key="testing",
            config=Config(retries={"mode": "standard", "total_max_attempts": 1}),
        )
        yield emu.endpoint_url, env, client


def open_sessions(ddb, aws_env: dict[str, str], *session_ids: str, lease_ms: int = 600_000) -> None:
    """LIVE sessions for tests that attach connections to hand-made session ids (an
    acquire is conditional on the acquirer's session being LIVE). The worker id is the
    part before ``#``; an id already open is left as it is."""
    sessions = SessionsStore(ddb, aws_env["SESSIONS_TABLE_NAME"])
    for session_id in session_ids:
        if sessions.get(session_id) is None:
            sessions.open(session_id, worker_id=session_id.split("#")[0], lease_ms=lease_ms, max_connections=100)


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


@pytest.fixture
def otel_spans():
    """TRACING=otel in this process with an in-memory exporter (wsfleet.tracing): call it
    for the spans finished so far, flushed. Tracing is off again afterwards."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from wsfleet import tracing

    memory = InMemorySpanExporter()
    tracing.reset()
    tracing.configure_worker("otel", "wsfleet-test", exporters=[memory])

    def finished():
        assert tracing.flush()
        return memory.get_finished_spans()

    yield finished
    tracing.reset()


class Captured:
    """Every line the worker logs (its JSON logger) and every record of websockets'
    client logger, enabled for DEBUG: what a secret value must never be in."""

    def __init__(self) -> None:
        self.stream = io.StringIO()
        self.records: list[str] = []

    def lines(self) -> str:
        return self.stream.getvalue() + "\n".join(self.records)

    def events(self, name: str) -> list[dict]:
        return [e for e in map(json.loads, self.stream.getvalue().splitlines()) if e.get("event") == name]


@pytest.fixture
def captured():
    cap = Captured()
    handler = logging.Handler(logging.DEBUG)
    handler.emit = lambda record: cap.records.append(record.getMessage())  # type: ignore[method-assign]
    ws_logger = logging.getLogger("websockets.client")  # the worker's side (the upstream's server logs its own)
    level = ws_logger.level
    ws_logger.addHandler(handler)
    ws_logger.setLevel(logging.DEBUG)
    try:
        yield cap
    finally:
        ws_logger.removeHandler(handler)
        ws_logger.setLevel(level)
