"""The worker against the emulator and a real local WebSocket upstream, in-process
(the fleet tests run it as separate processes)."""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import asynccontextmanager

import pytest
from botocore.awsrequest import AWSResponse

from wsfleet import metrics_names as names
from wsfleet.aws import Aws
from wsfleet.config import WorkerConfig
from wsfleet.local.upstream import ThreadedUpstream
from wsfleet.logs import JsonLogger
from wsfleet.store import Acquired, ConnectionsStore, MessagesStore, TransientError
from wsfleet.worker.lifecycle import Worker
from wsfleet.worker.retry import LeaseExpired, call_until

FAST = {
    "LEASE_SECONDS": "2",
    "HEARTBEAT_SECONDS": "0.4",
    "RECONCILE_SECONDS": "0.5",
    "MAX_CLOCK_SKEW_MS": "200",
    "SHUTDOWN_SECONDS": "5",
    "METRICS_SECONDS": "30",
    "ALLOWED_WS_HOSTS": "127.0.0.1",  # the local upstream's address
}


@pytest.fixture
def upstream():
    with ThreadedUpstream(rate=20.0) as up:
        yield up


@pytest.fixture
def stores(ddb, aws_env):
    return (
        ConnectionsStore(ddb, aws_env["TABLE_NAME"], state_shards=4),
        MessagesStore(ddb, aws_env["MESSAGES_TABLE_NAME"]),
    )


def config(aws_env, **overrides) -> WorkerConfig:
    return WorkerConfig.from_env({**aws_env, **FAST, **overrides})


@asynccontextmanager
async def running(cfg: WorkerConfig, worker_id: str = "w1"):
    aws = Aws(cfg, threads=8)
    worker = Worker(cfg, worker_id, aws=aws, log=JsonLogger())
    task = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        worker.request_shutdown()
        await asyncio.wait_for(task, timeout=15)
        aws.close()


async def eventually(predicate, timeout: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await asyncio.to_thread(predicate)
        if value:
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def seqs(messages: MessagesStore, cid: str) -> list[int]:
    return [row["sk"] for row in messages.read_all(cid)]


def test_frames_are_stored_gap_free_and_checkpointed_on_release(aws_env, stores, upstream):
    conns, msgs = stores
    for cid in ("a", "b"):
        conns.start(cid, upstream.url_for(cid))

    async def scenario():
        async with running(config(aws_env)) as worker:
            await eventually(lambda: all(len(seqs(msgs, c)) >= 20 for c in ("a", "b")), what="20 stored each")
            assert set(worker.runners) == {"a", "b"}

    asyncio.run(scenario())
    for cid in ("a", "b"):
        stored = seqs(msgs, cid)
        assert stored == list(range(1, len(stored) + 1))
        item = conns.get(cid)
        assert item["last_seq"] == stored[-1]  # final checkpoint = last stored, no gap below
        assert item["lease_owner"] == "" and item["lease_expires_at_ms"] == 0
        assert upstream.max_concurrent(cid) == 1 and not upstream.open_sockets(cid)


def test_a_dropped_socket_reconnects_and_resumes_without_gap_or_duplicate(aws_env, stores, upstream):
    conns, msgs = stores
    conns.start("a", upstream.url_for("a"))

    async def scenario():
        async with running(config(aws_env)) as worker:
            await eventually(lambda: len(seqs(msgs, "a")) >= 10, what="first frames")
            upstream.drop("a")
            await eventually(lambda: len(upstream.sockets("a")) >= 2, what="a second socket")
            head = upstream.produced("a")
            await eventually(lambda: len(seqs(msgs, "a")) >= head + 5, what="frames after the reconnect")
            assert worker.counters.total(names.RECONNECTS) >= 1

    asyncio.run(scenario())
    stored = seqs(msgs, "a")
    assert stored == list(range(1, len(stored) + 1))
    second = upstream.sockets("a")[1]
    assert second.from_seq > 1  # resumed, not replayed from the start
    assert upstream.max_concurrent("a") == 1


def test_malformed_frames_are_counted_and_skipped_and_the_connection_stays_up(aws_env, stores, upstream):
    conns, msgs = stores
    conns.start("a", upstream.url_for("a"))

    async def scenario():
        async with running(config(aws_env)) as worker:
            await eventually(lambda: len(seqs(msgs, "a")) >= 5, what="first frames")
            upstream.inject("a", "not json")
            upstream.inject("a", '{"data": 1}')
            await eventually(lambda: worker.counters.total(names.MALFORMED_FRAMES) == 2, what="two malformed frames")
            n = len(seqs(msgs, "a"))
            await eventually(lambda: len(seqs(msgs, "a")) >= n + 5, what="frames after the malformed ones")
            assert len(upstream.sockets("a")) == 1

    asyncio.run(scenario())
    stored = seqs(msgs, "a")
    assert stored == list(range(1, len(stored) + 1))


def test_stop_closes_the_socket_and_releases_within_one_heartbeat(aws_env, stores, upstream):
    conns, msgs = stores
    conns.start("a", upstream.url_for("a"))
    cfg = config(aws_env)

    async def scenario():
        async with running(cfg) as worker:
            await eventually(lambda: upstream.open_sockets("a"), what="a connected socket")
            stopped_at = time.monotonic()
            conns.stop("a")
            await eventually(
                lambda: not upstream.open_sockets("a") and conns.get("a")["lease_owner"] == "",
                what="socket closed, lease released",
            )
            took = time.monotonic() - stopped_at
            assert took < cfg.heartbeat_ms / 1000 + 1.0, took
            assert "a" not in worker.runners

    asyncio.run(scenario())
    item = conns.get("a")
    stored = seqs(msgs, "a")
    assert item["desired_state"] == "STOPPED" and item["last_seq"] == stored[-1]


def test_a_worker_whose_lease_was_taken_stops_writing_and_closes_its_socket(aws_env, stores, upstream, ddb):
    conns, msgs = stores
    conns.start("a", upstream.url_for("a"))

    async def scenario():
        async with running(config(aws_env)) as worker:
            await eventually(lambda: upstream.open_sockets("a"), what="a connected socket")
            # Another worker takes over (as if ours had stalled past its lease).
            ddb.update_item(
                TableName=aws_env["TABLE_NAME"],
                Key={"pk": {"S": "CONN#a"}},
                UpdateExpression="SET lease_owner = :t, fence_token = fence_token + :one",
                ExpressionAttributeValues={":t": {"S": "thief"}, ":one": {"N": "1"}},
            )
            await eventually(lambda: "a" not in worker.runners and not upstream.open_sockets("a"), what="runner gone")
            assert worker.counters.total(names.LEASES_LOST) == 1
            stored_then = len(seqs(msgs, "a"))
            await asyncio.sleep(0.5)  # frames keep coming upstream; none may be written by us
            assert len(seqs(msgs, "a")) == stored_then
            # It does not try to take it back while the thief's lease is live.
            assert conns.get("a")["lease_owner"] == "thief"

    asyncio.run(scenario())
    assert all(row["fence_token"] == 1 for row in msgs.read_all("a"))


def test_an_expired_lease_of_a_dead_worker_is_taken_over_soon_after_it_expires(aws_env, stores, upstream):
    conns, msgs = stores
    conns.start("a", upstream.url_for("a"))
    cfg = config(aws_env)
    dead = conns.acquire("a", owner="dead", lease_ms=cfg.lease_ms, max_clock_skew_ms=cfg.max_clock_skew_ms)
    assert isinstance(dead, Acquired)
    expires_s = dead.item["lease_expires_at_ms"] / 1000

    async def scenario():
        async with running(cfg) as worker:
            await eventually(lambda: "a" in worker.runners, timeout=cfg.lease_ms / 1000 + 5, what="takeover")
            took = time.time() - expires_s
            # Tried the moment it became acquirable (expiry + skew), plus jitter.
            assert took < cfg.max_clock_skew_ms / 1000 + 1.0, took
            assert worker.counters.total(names.ORPHANS_RECOVERED) == 1
            assert worker.runners["a"].fence_token == 2

    asyncio.run(scenario())


def test_a_start_hint_is_taken_from_the_queue_and_connected_quickly(aws_env, stores, upstream, sqs):
    conns, _ = stores
    cfg = config(aws_env, RECONCILE_SECONDS="60")  # only the hint can bring it in time

    async def scenario():
        async with running(cfg) as worker:
            await asyncio.sleep(0.2)
            conns.start("h", upstream.url_for("h"))
            sent = time.monotonic()
            sqs.send_message(QueueUrl=aws_env["QUEUE_URL"], MessageBody=json.dumps({"connection_id": "h"}))
            await eventually(lambda: upstream.open_sockets("h"), what="hinted connection connected")
            assert time.monotonic() - sent < 3.0
            assert "h" in worker.runners

    asyncio.run(scenario())


def test_a_worker_at_capacity_leaves_hints_for_its_peers(aws_env, stores, upstream, sqs):
    conns, _ = stores
    cfg = config(aws_env, MAX_CONNECTIONS="1", RECONCILE_SECONDS="60")
    conns.start("a", upstream.url_for("a"))
    conns.start("b", upstream.url_for("b"))

    async def scenario():
        aws = Aws(cfg, threads=4)
        worker = Worker(cfg, "w1", aws=aws, log=JsonLogger())
        assert await worker.try_acquire("a", source="test") is not None
        assert worker.free() == 0
        assert await worker.poll_once(wait_seconds=0) == 0  # does not even poll when full
        await worker.shutdown(budget_s=5)
        aws.close()

    asyncio.run(scenario())
    assert conns.get("b")["lease_owner"] == ""


def test_transient_failures_are_retried_until_they_succeed():
    calls = []

    async def call(fn, **kwargs):
        calls.append(kwargs)
        if len(calls) < 3:
            raise TransientError("throttled")
        return "ok"

    result = asyncio.run(call_until(call, lambda: time.monotonic() + 10, len, log=JsonLogger(), x=1))
    assert result == "ok" and len(calls) == 3


def test_transient_failures_past_the_lease_deadline_end_in_lease_expired_not_lost():
    async def call(fn, **kwargs):
        raise TransientError("throttled")

    deadline = time.monotonic() + 0.3
    with pytest.raises(LeaseExpired):
        asyncio.run(call_until(call, lambda: deadline, len, log=JsonLogger()))
    assert time.monotonic() < deadline + 0.5


def test_throttled_renewals_shorter_than_the_lease_do_not_drop_the_connection(aws_env, stores, upstream):
    conns, msgs = stores
    conns.start("a", upstream.url_for("a"))
    cfg = config(aws_env, LEASE_SECONDS="4", HEARTBEAT_SECONDS="0.5")
    throttle = {"on": False, "served": 0}

    class Raw:
        def stream(self, **_):
            yield b'{"__type":"com.amazonaws.dynamodb.v20120810#ThrottlingException","message":"slow down"}'

    def hook(request, **_):
        if throttle["on"]:
            throttle["served"] += 1
            return AWSResponse(request.url, 400, {}, Raw())
        return None

    async def scenario():
        async with running(cfg) as worker:
            await eventually(lambda: upstream.open_sockets("a") and len(seqs(msgs, "a")) >= 5, what="connected")
            worker._aws.dynamodb.meta.events.register("before-send.dynamodb.UpdateItem", hook)
            throttle["on"] = True
            # Throttle every renewal for 1.5 s: three heartbeats fail, well inside the lease.
            await asyncio.sleep(1.5)
            throttle["on"] = False
            fence = worker.runners["a"].fence_token
            renewed = conns.get("a")["updated_at_ms"]
            await eventually(lambda: conns.get("a")["updated_at_ms"] > renewed, what="a renewal after the throttling")
            assert worker.runners["a"].fence_token == fence
            assert worker.counters.total(names.LEASES_LOST) == 0

    asyncio.run(scenario())
    assert throttle["served"] >= 2
    assert len(upstream.sockets("a")) == 1  # the socket was never closed


def test_a_takeover_that_meets_a_late_last_renewal_tries_again_at_the_new_expiry(aws_env, stores, upstream):
    conns, _ = stores
    conns.start("a", upstream.url_for("a"))
    cfg = config(aws_env)
    dead = conns.acquire("a", owner="dead", lease_ms=cfg.lease_ms, max_clock_skew_ms=cfg.max_clock_skew_ms)
    first_expiry = dead.item["lease_expires_at_ms"]

    async def scenario():
        aws = Aws(cfg, threads=4)
        worker = Worker(cfg, "w1", aws=aws, log=JsonLogger())  # stepped by hand: no scans but this one
        try:
            await eventually(lambda: time.time() * 1000 > first_expiry - cfg.lease_ms + 700, what="a missed renewal")
            assert await worker.reconcile_once() == 1
            # The dead holder's last renewal lands after our scan read the index.
            late = conns.renew("a", owner="dead", fence_token=1, lease_ms=cfg.lease_ms, last_seq=0)
            assert late["lease_expires_at_ms"] > first_expiry
            await eventually(
                lambda: "a" in worker.runners, timeout=cfg.lease_ms / 1000 + 3, what="the retried takeover"
            )
            assert time.time() * 1000 >= late["lease_expires_at_ms"] + cfg.max_clock_skew_ms
            assert worker.runners["a"].fence_token == 2
        finally:
            await worker.shutdown(budget_s=3)
            aws.close()

    asyncio.run(scenario())


def test_a_host_name_that_resolves_to_an_internal_address_is_not_connected_to(aws_env, stores, upstream):
    conns, _ = stores
    # Neither "localhost" nor 127.0.0.1 is listed: DNS sends the name to loopback, as a
    # hostile record could send a name to the metadata endpoint.
    conns.start("a", upstream.url_for("a").replace("127.0.0.1", "localhost"))

    async def scenario():
        async with running(config(aws_env, ALLOWED_WS_HOSTS="*.localhost,127.0.0.2")) as worker:
            await eventually(lambda: "a" in worker.runners, what="the lease")
            await asyncio.sleep(0.5)
            assert upstream.sockets("a") == [] and not worker.runners["a"].connected.is_set()

    asyncio.run(scenario())


def test_an_exactly_listed_host_name_may_resolve_to_loopback(aws_env, stores, upstream):
    conns, msgs = stores
    conns.start("a", upstream.url_for("a").replace("127.0.0.1", "localhost"))

    async def scenario():
        async with running(config(aws_env, ALLOWED_WS_HOSTS="localhost")):
            await eventually(lambda: len(seqs(msgs, "a")) >= 3, what="frames stored")

    asyncio.run(scenario())
