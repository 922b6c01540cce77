"""What chaos runs found, each kept as a test of its own (``make chaos``; the seed and
what happened are in each docstring)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from contextlib import asynccontextmanager

import pytest

from wsfleet.aws import Aws
from wsfleet.config import WorkerConfig
from sim.chaos.workers import FAKETIME_LIB, clock_off_by
from sim.upstream import ThreadedUpstream
from wsfleet.logs import JsonLogger
from wsfleet.router import Router
from wsfleet.store import ConnectionsStore
from wsfleet.worker.lifecycle import Worker

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

FAST = {
    "LEASE_SECONDS": "2",
    "HEARTBEAT_SECONDS": "0.4",
    "RECONCILE_SECONDS": "0.5",
    "MAX_CLOCK_SKEW_MS": "200",
    "SHUTDOWN_SECONDS": "5",
    "METRICS_SECONDS": "30",
    "ALLOWED_WS_HOSTS": "127.0.0.1",
}


@pytest.mark.skipif(FAKETIME_LIB is None, reason="needs libfaketime (Debian: apt-get install faketime)")
@pytest.mark.parametrize("offset_ms", [-450, 800])
def test_a_worker_with_its_clock_off_can_still_sleep(python_env, offset_ms):
    """Seed 3 (``--minutes 1.25 --workers 3 --connections 9``, fast timings): the worker
    started with its clock 181 ms off (``clock``) logged ``OSError: [Errno 22] Invalid
    argument`` from ``time.sleep`` in botocore's retry under the next fault (DynamoDB
    throttling). libfaketime 0.9.10 with ``FAKETIME_DONT_FAKE_MONOTONIC=1`` fails every
    ``time.sleep``: a fault of the injection, not of a clock. Its clock is off as asked,
    and it sleeps."""
    code = "import time; t = time.time(); m = time.monotonic(); time.sleep(0.2); print(t, time.monotonic() - m)"
    before = time.time()
    out = subprocess.run(
        [sys.executable, "-c", code], env={**python_env, **clock_off_by(offset_ms)}, capture_output=True, text=True, timeout=20
    )
    after = time.time()

    assert out.returncode == 0, out.stderr
    wall, slept = map(float, out.stdout.split())
    assert before + offset_ms / 1000 - 0.1 <= wall <= after + offset_ms / 1000 + 0.1
    assert 0.19 <= slept < 1.0


def test_a_renewal_that_fails_with_an_unexpected_error_still_closes_every_socket_by_the_deadline(aws_env, ddb):
    """Seed 3 (``--minutes 1.25 --workers 3 --connections 9``, fast timings). Worker w1.1
    (under the libfaketime setting above) hit ``OSError: [Errno 22]`` inside its session
    renewal at 41.0 s; the ``session`` task died with it, unlogged. Its session expired and
    was ended by a watcher (``session_end_lost ... already_ended`` in w2.log at 45.99 s), w3.1
    took c005 at 45.02 s (fence 4), but w1.1 never dropped its runners: its deadline held
    its writes back (``deadline_passed_while_writing`` every 0.6 s) while its socket on c005
    (and on c001, c004, c006, c008) stayed open to the end of the run: five
    ``overlap`` and five ``stop_not_closed`` violations.

    Any exception other than TransientError can do this (an OSError such as EMFILE, a
    botocore parsing error). Here the sessions table's UpdateItem raises OSError as it
    leaves, and the worker must still close its socket by its deadline."""
    up = ThreadedUpstream(rate=20.0).start()
    try:
        cfg = WorkerConfig.from_env({**aws_env, **FAST})
        ConnectionsStore(ddb, aws_env["TABLE_NAME"], state_shards=4).start("a", up.url_for("a"))

        def broken(request, **_):
            if json.loads(request.body or b"{}").get("TableName") == aws_env["SESSIONS_TABLE_NAME"]:
                raise OSError(22, "Invalid argument")

        async def scenario() -> None:
            async with _running(cfg) as on_update_item:
                await _until(lambda: len(up.open_sockets("a")) == 1, 10)
                on_update_item(broken)
                broke_at = time.monotonic()
                # Past the deadline (lease - skew after the last renewal), plus room.
                await _until(lambda: not up.open_sockets("a"), 2.0 + 3.0)
                assert time.monotonic() - broke_at < 2.0 + 3.0

        asyncio.run(scenario())
    finally:
        up.stop()


@asynccontextmanager
async def _running(cfg: WorkerConfig, *, log: JsonLogger | None = None):
    """A worker ``w1`` running in this loop; yields a function that adds a before-send
    hook to its DynamoDB UpdateItems. On exit the hooks go first, so that shutting down
    (releases, the session's end) is not held up by them."""
    aws = Aws(cfg, threads=8)
    hooks = []

    def on_update_item(hook) -> None:
        aws.dynamodb.meta.events.register("before-send.dynamodb.UpdateItem", hook)
        hooks.append(hook)

    worker = Worker(cfg, "w1", aws=aws, log=log or JsonLogger())
    task = asyncio.create_task(worker.run())
    try:
        yield on_update_item
    finally:
        for hook in hooks:
            aws.dynamodb.meta.events.unregister("before-send.dynamodb.UpdateItem", hook)
        worker.request_shutdown()
        await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 15)
        aws.close()


async def _until(predicate, timeout: float, what: str = "the condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout}s")
        await asyncio.sleep(0.05)


def test_a_stop_posted_again_before_the_owner_acknowledged_the_last_one_still_closes_the_socket(aws_env, ddb, sqs):
    """Seed 300750 (``make chaos SEED=300750 MINUTES=30``), #33 storm at 1796063424.09:
    c002 STOP (-7.33 s), handled by w1.3 (-6.77 s), START (-6.42 s), re-acquired by w1.3
    with fence 9 (-6.0 s), STOP again (-5.62 s, ``owner_told``): w1.3 never logged a
    ``stop_received`` for it and kept its socket open until the START at -1.16 s put the
    connection back to STARTED (``stop_not_closed``: 4.39 s against the 3.5 s bound). The
    same in #27 (c005, 4.74 s) and #33 (c016, 4.77 s), both closed by
    ``stop_found_by_audit``. Here the renewal that acknowledges the first STOP is held
    back until the second one is posted."""
    up = ThreadedUpstream(rate=20.0).start()
    gate = threading.Event()
    try:
        cfg = WorkerConfig.from_env({**aws_env, **FAST, "LEASE_SECONDS": "6", "HEARTBEAT_SECONDS": "1", "RECONCILE_SECONDS": "30"})
        router = Router.from_env({**aws_env, "ALLOWED_WS_HOSTS": "127.0.0.1"}, ddb=ddb, sqs=sqs)

        def post(event_type: str) -> None:
            body = {"event_type": event_type, "connection_id": "a"}
            if event_type == "START":
                body["ws_url"] = up.url_for("a")
            status = router.handle({"httpMethod": "POST", "resource": "/events", "path": "/events", "body": json.dumps(body)})
            assert status["statusCode"] == 202, status

        def hold_acknowledgements(request, **_):
            body = json.loads(request.body or b"{}")
            if body.get("TableName") == aws_env["SESSIONS_TABLE_NAME"] and "DELETE" in body.get("UpdateExpression", ""):
                gate.wait(10)

        async def scenario() -> None:
            async with _running(cfg) as on_update_item:
                on_update_item(hold_acknowledgements)
                try:
                    await second_stop()
                finally:
                    gate.set()

        async def second_stop() -> None:
            post("START")
            await _until(lambda: len(up.open_sockets("a")) == 1, 10, "connected")
            post("STOP")
            await _until(lambda: not up.open_sockets("a"), 5, "closed at the first STOP")
            post("START")
            await _until(lambda: len(up.open_sockets("a")) == 1, 5, "connected again")
            post("STOP")
            stopped_at = time.monotonic()
            gate.set()
            await _until(lambda: not up.open_sockets("a"), 1 + 1 + 2, "closed at the second STOP")  # heartbeat + 1 s, room
            assert time.monotonic() - stopped_at < 4

        asyncio.run(scenario())
    finally:
        gate.set()
        up.stop()



def test_a_session_survives_renewals_that_are_answered_slowly_but_inside_the_lease(aws_env, ddb):
    """Seed 208702 (``make chaos SEED=208702 MINUTES=30``, at 5a74c5e, on a machine where
    other processes used 1.7 of the 2 cores), #59 oversize at 1796073461.18 (c003,
    slow_recovery 8.26 s against 2.75 s): no DynamoDB fault was on (#57's SQS outage had
    healed 15 s before, #60's latency began 4.9 s after), but from -4.5 s every renewal of
    all four workers ended in ``renew_retry TimeoutError`` one second after it was sent,
    five or six times each, until each worker's deadline: sessions lost at +0.98 (w2.4), +1.28
    (w4.3), +1.74 (w1.4) and +2.18 s (w3.1), every socket closed (40 -> 24 open, 16
    orphans), new sessions at +3.8-5.8 s. In the same seconds the emulator answered the
    other requests, slowly: w4.3 released the 10 connections it shed at -4.6 s between
    -2.09 and -0.43 s (c003 at -0.77), w2.4 acquired c012 at -1.83 s and w3.1 four
    connections at +0.68-1.96 s. c003, shed and hinted just before the oversized frame
    was aimed at it, was taken by w2.4 as an orphan of its own lost session, at +8.25 s.

    Here every sessions-table UpdateItem takes 1.3 s (lease 4 s, heartbeat 0.5 s, skew
    0.2 s: 3.8 s from a renewal to its deadline): each renewal would be answered in time,
    and the session should hold with its one socket. Fixed: a slow try is no longer given
    up, a second one is sent beside it (SessionKeeper.renew_once). Before the fix no try
    was ever answered in time, whatever the lease; a 3 s lease left too little room for a
    busy machine (the deadline 1.5 s after the answer)."""
    from io import StringIO

    up = ThreadedUpstream(rate=20.0).start()
    out = StringIO()
    try:
        cfg = WorkerConfig.from_env({**aws_env, **FAST, "LEASE_SECONDS": "4", "HEARTBEAT_SECONDS": "0.5"})
        ConnectionsStore(ddb, aws_env["TABLE_NAME"], state_shards=4).start("a", up.url_for("a"))

        def slow(request, **_):
            if json.loads(request.body or b"{}").get("TableName") == aws_env["SESSIONS_TABLE_NAME"]:
                time.sleep(1.3)

        async def scenario() -> None:
            async with _running(cfg, log=JsonLogger(out)) as on_update_item:
                await _until(lambda: len(up.open_sockets("a")) == 1, 10, "connected")
                on_update_item(slow)
                await asyncio.sleep(2 * 3.8)  # two deadlines
                assert "session_lost" not in out.getvalue()
                assert len(up.open_sockets("a")) == 1 and len(up.sockets("a")) == 1

        asyncio.run(scenario())
    finally:
        up.stop()
