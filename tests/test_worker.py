"""The worker against the emulator and a real local WebSocket upstream, in-process
(the fleet tests run it as separate processes): its session, what it holds, takeover of
dead sessions, STOP through the session inbox, self-fencing at its deadline."""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import asynccontextmanager
from dataclasses import replace

import pytest
from botocore.awsrequest import AWSResponse

from wsfleet import clock
from wsfleet import metrics_names as names
from wsfleet.aws import Aws
from wsfleet.config import WorkerConfig
from sim.upstream import ThreadedUpstream
from wsfleet.logs import JsonLogger
from wsfleet import schema
from wsfleet.router import Router
from wsfleet.sinks import MessagesStore
from wsfleet.store import Acquired, ConnectionsStore, SessionsStore, TransientError
from wsfleet.stream import Frame
from wsfleet.worker.lifecycle import Worker
from wsfleet.worker.retry import LeaseExpired, call_until

pytestmark = pytest.mark.slow

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
def router(aws_env, ddb, sqs):
    return Router.from_env({**aws_env, "ALLOWED_WS_HOSTS": "127.0.0.1"}, ddb=ddb, sqs=sqs)


def post(router: Router, body: dict) -> int:
    return router.handle({"httpMethod": "POST", "resource": "/events", "path": "/events", "body": json.dumps(body)})[
        "statusCode"
    ]


def dead_session(sessions: SessionsStore, conns: ConnectionsStore, name: str, *cids: str, lease_ms: int) -> dict:
    """A session whose worker died right after opening it and taking ``cids``."""
    item = sessions.open(name, worker_id=name.split("#")[0], lease_ms=lease_ms, max_connections=10)
    for cid in cids:
        assert isinstance(conns.acquire(cid, session_id=name, worker_id=item["worker_id"]), Acquired)
    return item


def config(aws_env, **overrides) -> WorkerConfig:
    return WorkerConfig.from_env({**aws_env, **FAST, **overrides})


@asynccontextmanager
async def running(
    cfg: WorkerConfig,
    worker_id: str = "w1",
    *,
    log: JsonLogger | None = None,
    refused_retry_s: float | None = None,
    **kwargs,
):
    """A worker running in this loop; ``refused_retry_s``: its connections' wait after a
    refused handshake (set before any connection is taken, so every runner gets it)."""
    aws = Aws(cfg, threads=8)
    worker = Worker(cfg, worker_id, aws=aws, log=log or JsonLogger(), **kwargs)
    if refused_retry_s is not None:
        worker.acquisition.settings = replace(worker.acquisition.settings, refused_retry_s=refused_retry_s)
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


def test_frames_are_stored_gap_free_and_checkpointed_on_release(aws_env, stores, sessions, upstream):
    conns, msgs = stores
    for cid in ("a", "b"):
        conns.start(cid, upstream.url_for(cid))

    async def scenario():
        async with running(config(aws_env)) as worker:
            await eventually(lambda: all(len(seqs(msgs, c)) >= 20 for c in ("a", "b")), what="20 stored each")
            assert set(worker.holdings.runners) == {"a", "b"}
            return worker.keeper.session_id

    session_id = asyncio.run(scenario())
    for cid in ("a", "b"):
        stored = seqs(msgs, cid)
        assert stored == list(range(1, len(stored) + 1))
        item = conns.get(cid)
        assert item["last_seq"] == stored[-1]  # final checkpoint = last stored, no gap below
        # Handed off: still attached to the session (no FREE# write), released at its fence
        assert item["lease_session"] == session_id and item["released_fence"] == item["fence_token"]
        assert item["owner_key"] == schema.owner_key_session(session_id)
        assert upstream.max_concurrent(cid) == 1 and not upstream.open_sockets(cid)
    # A clean exit ends the session; nobody took its handoffs, so it stays in the ring for
    # its watchers to drain.
    ended = sessions.get(session_id)
    assert ended["state"] == schema.ENDED and ended["ring"] == schema.RING_VALUE


def test_shutdown_hands_connections_over_a_few_at_a_time_each_socket_open_until_its_own_turn(
    aws_env, stores, upstream, monkeypatch
):
    import wsfleet.worker.shutdown as shutdown

    monkeypatch.setattr(shutdown, "HANDOFF_CONCURRENCY", 2)
    conns, msgs = stores
    cids = [f"h{i}" for i in range(8)]
    for cid in cids:
        conns.start(cid, upstream.url_for(cid))

    async def scenario():
        async with running(config(aws_env, SHUTDOWN_SECONDS="30")):
            await eventually(lambda: all(len(seqs(msgs, c)) >= 3 for c in cids), what="3 stored each")

    asyncio.run(scenario())
    # Each connection is without a socket from the upstream's close to its release (the
    # item's updated_at_ms): at most HANDOFF_CONCURRENCY of those windows overlap.
    windows = []
    for cid in cids:
        (sock,) = upstream.sockets(cid)
        item = conns.get(cid)
        assert item["released_fence"] == item["fence_token"] and item["last_seq"] == seqs(msgs, cid)[-1]
        windows.append((sock.closed_at, item["updated_at_ms"] / 1000))
    assert all(closed <= released + 0.05 for closed, released in windows)
    most = max(sum(1 for c, r in windows if c <= at < r) for at, _ in windows)
    assert most <= 2, sorted(windows)
    # and the handoff was paced: the last socket closed after the first release
    assert max(c for c, _ in windows) > min(r for _, r in windows)


def test_holding_connections_costs_one_session_renewal_per_heartbeat_and_no_connection_write(
    aws_env, stores, sessions, upstream
):
    conns, msgs = stores
    quiet = ThreadedUpstream(rate=None)  # publishes nothing by itself
    with quiet:
        for i in range(5):
            conns.start(f"q{i}", quiet.url_for(f"q{i}"))
        cfg = config(aws_env, RECONCILE_SECONDS="60")

        async def scenario():
            async with running(cfg) as worker:
                await eventually(lambda: len(worker.holdings.runners) == 5 and all(quiet.open_sockets(f"q{i}") for i in range(5)))
                before = dict(worker.aws.requests)
                renewals = worker.keeper.renewals
                await asyncio.sleep(2.0)
                sent = {k: v - before.get(k, 0) for k, v in worker.aws.requests.items() if v - before.get(k, 0)}
                return sent, worker.keeper.renewals - renewals

        sent, renewals = asyncio.run(scenario())
    # 2 s at a 0.4 s heartbeat: about five renewals, the only UpdateItems; no checkpoint
    # for quiet connections, and nothing read per connection.
    assert 3 <= renewals <= 7, renewals
    assert sent.get("dynamodb.UpdateItem", 0) <= renewals + 1, sent
    assert "dynamodb.GetItem" not in sent, sent


def test_checkpoints_are_written_while_frames_arrive_at_most_every_checkpoint_seconds(aws_env, stores, upstream):
    conns, msgs = stores
    conns.start("a", upstream.url_for("a"))

    async def scenario():
        async with running(config(aws_env, CHECKPOINT_SECONDS="0.5")):
            await eventually(lambda: conns.get("a")["last_seq"] >= 10, what="a checkpoint while holding")
            first = conns.get("a")["last_seq"]
            await eventually(lambda: conns.get("a")["last_seq"] > first, what="a later checkpoint")
            assert conns.get("a")["lease_session"]  # still held: these were checkpoints, not a release

    asyncio.run(scenario())


def test_checkpoints_of_many_connections_share_transactions(aws_env, stores, upstream):
    conns, msgs = stores
    ids = [f"k{i}" for i in range(6)]
    for cid in ids:
        conns.start(cid, upstream.url_for(cid))

    async def scenario():
        async with running(config(aws_env, CHECKPOINT_SECONDS="1")) as worker:
            await eventually(lambda: worker.checkpoints.written >= 24, timeout=30, what="four rounds of checkpoints")
            held = [conns.get(c) for c in ids]
            return worker.checkpoints.stats(), dict(worker.aws.requests), held

    stats, requests, held = asyncio.run(scenario())
    # Six connections ask for their checkpoints within a tenth of a second of each other
    # (acquired together, or written together last time): they leave together, far fewer
    # requests than checkpoints even if the first round went one by one.
    assert stats["transactions"] <= stats["written"] / 2, stats
    assert requests.get("dynamodb.TransactWriteItems", 0) >= stats["transactions"], requests
    assert all(item["last_seq"] > 0 and item["lease_session"] for item in held)  # checkpoints while held


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




def test_frames_that_once_bounced_a_connection_are_skipped_and_the_stream_goes_on_with_one_socket_and_fence(
    aws_env, stores
):
    """Regression (issue 17): a lone surrogate (a JavaScript producer cutting an emoji in
    half) and 3,000-deep nesting made the parser raise; the runner ended FAILED and the
    connection bounced from owner to owner, nothing past the bad seq ever stored. A seq of
    10^40 wedged the writer; invalid UTF-8 failed the socket (1007) at every reconnect."""
    conns, msgs = stores
    with ThreadedUpstream(rate=None) as up:
        frames = [
            *('{"seq": %d, "data": {"v": %d}}' % (n, n) for n in range(1, 5)),
            '{"seq": 5, "data": "\\ud83d"}',  # stored escaped
            '{"seq": 6, "data": %s}' % ("[" * 3000 + "]" * 3000),  # a skip marker at 6
            '{"seq": %d, "data": 1}' % 10**40,  # no usable seq: only counted
            b'{"seq": 7, "data": "\xff"}',  # invalid UTF-8: a skip marker at 7
            *('{"seq": %d, "data": {"v": %d}}' % (n, n) for n in range(8, 11)),
        ]
        for frame in frames:
            up.inject("a", frame)
        for _ in range(10):
            up.publish("b")  # a healthy stream, its frames in the same batches
        conns.start("a", up.url_for("a"))
        conns.start("b", up.url_for("b"))

        async def scenario():
            async with running(config(aws_env, FLUSH_INTERVAL_MS="200")) as worker:
                await eventually(lambda: seqs(msgs, "a") == list(range(1, 11)), what="every seq of a stored")
                await eventually(lambda: len(seqs(msgs, "b")) == 10, what="b's first frames")
                for _ in range(10):
                    up.publish("b")
                await eventually(lambda: len(seqs(msgs, "b")) == 20, what="b's later frames")
                return worker.counters.totals()

        totals = asyncio.run(scenario())
        assert len(up.sockets("a")) == 1 and len(up.sockets("b")) == 1  # never reconnected
    rows = {r["sk"]: r for r in msgs.read_all("a")}
    assert {r["fence_token"] for r in rows.values()} == {1} and conns.get("a")["fence_token"] == 1
    assert rows[5]["message_data"] == '"\\ud83d"'
    assert rows[6]["skipped"] == rows[7]["skipped"] == "malformed" and "message_data" not in rows[6]
    assert rows[8]["message_data"] == '{"v":8}'
    assert totals[names.MALFORMED_FRAMES] == 4 and totals[names.LOOP_ERRORS] == 0
    assert conns.get("a")["last_seq"] == 10  # released past the markers: no owner ever stops at them


def test_an_unexpected_error_in_the_stream_loop_costs_a_reconnect_not_the_connection(
    aws_env, stores, upstream, monkeypatch
):
    from wsfleet.worker import upstream_socket

    real, calls = upstream_socket.resolve, []

    async def failing_once(ws_url, allowlist):
        calls.append(ws_url.rsplit("/", 1)[-1])
        if len(calls) == 1:
            raise UnicodeError("label too long")  # what getaddrinfo raises for some host names
        return await real(ws_url, allowlist)

    monkeypatch.setattr(upstream_socket, "resolve", failing_once)
    conns, msgs = stores
    conns.start("a", upstream.url_for("a"))

    async def scenario():
        async with running(config(aws_env)) as worker:
            await eventually(lambda: len(seqs(msgs, "a")) >= 5, what="frames after the error")
            return worker.counters.totals()

    totals = asyncio.run(scenario())
    assert totals[names.LOOP_ERRORS] == 1 and totals[names.LEASES_ACQUIRED] == 1
    assert calls == ["a", "a"] and len(upstream.sockets("a")) == 1
    assert conns.get("a")["fence_token"] == 1


def test_a_loop_step_that_raises_is_logged_with_its_traceback_counted_and_run_again(aws_env, upstream, capsys):
    async def scenario():
        async with running(config(aws_env)) as worker:
            real, calls = worker.takeover.reconcile_once, []

            async def failing_once():
                calls.append(time.monotonic())
                if len(calls) == 1:
                    raise RuntimeError("a bug in a scan")
                return await real()

            worker.takeover.reconcile_once = failing_once
            await eventually(lambda: len(calls) >= 3, what="the step run again")
            return worker.counters.total(names.LOOP_ERRORS)

    assert asyncio.run(scenario()) == 1
    errors = [json.loads(line) for line in capsys.readouterr().out.splitlines() if '"loop_error"' in line]
    assert [(e["level"], e["loop"], e["error"]) for e in errors] == [("error", "reconcile", "RuntimeError: a bug in a scan")]
    assert "Traceback (most recent call last)" in errors[0]["traceback"] and "failing_once" in errors[0]["traceback"]


def test_stop_reaches_the_owner_through_its_session_inbox_with_no_per_connection_read(
    aws_env, stores, upstream, router
):
    conns, msgs = stores
    cfg = config(aws_env, RECONCILE_SECONDS="60")  # no scan or audit can be what finds the STOP
    assert post(router, {"event_type": "START", "connection_id": "a", "ws_url": upstream.url_for("a")}) == 202

    async def scenario():
        async with running(cfg) as worker:
            await eventually(lambda: upstream.open_sockets("a"), what="a connected socket")
            reads: list[tuple[str, str]] = []

            def record(params, model, **_):
                # What reads this connection or our holdings: a GetItem or Scan of the
                # connections table, or a query of our session's owner_key (the free
                # scan of FREE# partitions is neither).
                if params.get("TableName") != aws_env["TABLE_NAME"] or model.name not in ("GetItem", "Query", "Scan"):
                    return
                key = params.get("ExpressionAttributeValues", {}).get(":k", {}).get("S", "")
                if model.name != "Query" or not key.startswith(schema.OWNER_KEY_FREE_PREFIX):
                    reads.append((model.name, key))

            worker.aws.dynamodb.meta.events.register("provide-client-params.dynamodb", record)
            stopped_at = time.monotonic()
            assert post(router, {"event_type": "STOP", "connection_id": "a"}) == 202
            await eventually(
                lambda: not upstream.open_sockets("a") and conns.get("a")["lease_session"] == "" and "a" not in worker.holdings.runners,
                what="socket closed, connection released",
            )
            took = time.monotonic() - stopped_at
            assert took < cfg.heartbeat_ms / 1000 + 1.0, took
            assert not reads, reads

    asyncio.run(scenario())
    item = conns.get("a")
    stored = seqs(msgs, "a")
    assert item["desired_state"] == "STOPPED" and item["last_seq"] == stored[-1] and "owner_key" not in item


def test_a_renewal_that_finds_the_session_ended_drops_everything_and_comes_back_with_a_new_session(
    aws_env, stores, sessions, upstream, ddb
):
    conns, msgs = stores
    conns.start("a", upstream.url_for("a"))

    async def scenario():
        async with running(config(aws_env)) as worker:
            await eventually(lambda: upstream.open_sockets("a") and len(seqs(msgs, "a")) >= 3, what="connected")
            first = worker.keeper.session_id
            # Another worker ended it (as if ours had stalled past its lease).
            ddb.update_item(
                TableName=aws_env["SESSIONS_TABLE_NAME"],
                Key={"session_id": {"S": first}},
                UpdateExpression="SET #s = :ended",
                ExpressionAttributeNames={"#s": "state"},
                ExpressionAttributeValues={":ended": {"S": "ENDED"}},
            )
            await eventually(lambda: worker.counters.total(names.LEASES_LOST) == 1, what="the connection dropped")
            await eventually(
                lambda: worker.keeper.session_id != first and "a" in worker.holdings.runners, what="a new session takes it back"
            )
            assert worker.holdings.runners["a"].fence_token == 2
            await eventually(lambda: len(seqs(msgs, "a")) >= upstream.produced("a") - 30, what="storing again")
            return first

    first = asyncio.run(scenario())
    stored = seqs(msgs, "a")
    assert stored == list(range(1, len(stored) + 1))
    assert upstream.max_concurrent("a") == 1  # the old socket was closed before the new one
    assert sessions.get(first)["state"] == schema.ENDED


def test_a_dead_sessions_connections_are_taken_over_soon_after_it_expires(aws_env, stores, sessions, upstream):
    conns, msgs = stores
    cfg = config(aws_env)
    for cid in ("a", "b"):
        conns.start(cid, upstream.url_for(cid))
    dead = dead_session(sessions, conns, "dead#1", "a", "b", lease_ms=cfg.lease_ms)
    expires_s = dead["expires_at_ms"] / 1000

    async def scenario():
        async with running(cfg) as worker:
            await eventually(lambda: {"a", "b"} <= set(worker.holdings.runners), timeout=cfg.lease_ms / 1000 + 5, what="takeover")
            took = time.time() - expires_s
            # Ended the moment it became endable (expiry + skew), plus jitter and a few
            # requests on a busy machine: not a watch or scan interval later.
            assert took < cfg.max_clock_skew_ms / 1000 + 2.0, took
            assert worker.counters.total(names.ORPHANS_RECOVERED) == 2
            assert {worker.holdings.runners[c].fence_token for c in ("a", "b")} == {2}

    asyncio.run(scenario())
    ended = sessions.get("dead#1")
    assert ended["state"] == schema.ENDED and ended["ended_by"]


def test_a_drain_takes_its_share_in_one_read_and_one_transaction_per_25_connections(aws_env, stores, sessions):
    # Each acquisition is a read and a transaction with the session's LIVE check; one by
    # one, a drain of 30 would be 60 requests queued at the table while the crash bound runs.
    conns, _ = stores
    cfg = config(aws_env, MAX_CONNECTIONS="60")  # the drainer takes min(30, half its room): all 30
    cids = [f"d{i}" for i in range(30)]
    for cid in cids:
        conns.start(cid, "ws://127.0.0.1:9/quiet")  # nothing listens: only the acquisitions matter here
    dead_session(sessions, conns, "dead#1", *cids, lease_ms=cfg.lease_ms)

    async def scenario():
        async with running(cfg) as worker:
            await eventually(lambda: set(cids) <= set(worker.holdings.runners), timeout=cfg.lease_ms / 1000 + 5, what="takeover")
            return worker.acquirer.batches, dict(worker.aws.requests)

    batches, requests = asyncio.run(scenario())
    assert batches <= 3  # 25 and 5, and room for one more on a busy machine
    assert requests.get("dynamodb.TransactWriteItems", 0) <= batches + 2  # + checkpoints, if any


def test_a_clean_handoffs_hint_carries_the_state_its_release_wrote_so_the_taker_needs_no_read(
    aws_env, stores, sqs, upstream
):
    conns, msgs = stores
    for cid in ("a", "b"):
        conns.start(cid, upstream.url_for(cid))

    async def scenario():
        async with running(config(aws_env, RECONCILE_SECONDS="60")) as worker:
            await worker.takeover.reconcile_once()
            await eventually(lambda: all(len(seqs(msgs, c)) >= 5 for c in ("a", "b")), what="storing")

    asyncio.run(scenario())  # a clean exit: each connection released, then hinted
    bodies = {}
    while len(bodies) < 2:
        resp = sqs.receive_message(QueueUrl=aws_env["QUEUE_URL"], MaxNumberOfMessages=10, WaitTimeSeconds=2)
        assert resp.get("Messages"), bodies
        bodies.update((b["connection_id"], b) for b in (json.loads(m["Body"]) for m in resp["Messages"]))
    for cid in ("a", "b"):
        item = conns.get(cid)
        released = bodies[cid][schema.HINT_RELEASED]
        session_id = item["lease_session"]  # handed off: still attached to the releasing session
        assert released == schema.released_state(
            item["fence_token"], item["ws_url"], item["last_seq"], session_id=session_id
        )
        assert session_id and item["checkpoint_is_end"] == item["fence_token"] == item["released_fence"]


def test_a_worker_that_joins_is_watched_by_its_predecessor_within_a_few_seconds(aws_env, stores):
    cfg = config(aws_env)

    async def scenario():
        async with running(cfg, "w1") as w1:
            await eventually(lambda: w1.keeper.renewals >= 2, what="w1 renewing")
            await w1.takeover.watch_once()  # w1 has read the ring: alone, it watches nobody
            assert w1.takeover.successors() == []
            async with running(cfg, "w2") as w2:
                joined = time.monotonic()
                await eventually(lambda: w2.keeper.session_id in w1.takeover.successors(), what="w1 watching w2")
                # Its next renewal told w1, not its 15 s periodic ring read.
                assert time.monotonic() - joined < 5.0

    asyncio.run(scenario())


def test_a_takeover_that_meets_a_late_last_renewal_ends_the_session_at_its_new_expiry(
    aws_env, stores, sessions, upstream
):
    conns, _ = stores
    conns.start("a", upstream.url_for("a"))
    cfg = config(aws_env)
    dead = dead_session(sessions, conns, "dead#1", "a", lease_ms=cfg.lease_ms)

    async def scenario():
        aws = Aws(cfg, threads=4)
        worker = Worker(cfg, "w1", aws=aws, log=JsonLogger())  # stepped by hand: no watching but these
        assert await worker.keeper.open(asyncio.Event())
        renewing = asyncio.create_task(worker.keeper.run())
        writing = asyncio.create_task(worker.writer.run())
        try:
            await eventually(lambda: time.time() * 1000 > dead["expires_at_ms"] - cfg.lease_ms + 700, what="a missed renewal")
            assert await worker.takeover.watch_once() == 1
            # The dead worker's last renewal lands after our read.
            late = sessions.renew("dead#1", lease_ms=cfg.lease_ms, active=1, max_connections=10)
            await asyncio.sleep(dead["expires_at_ms"] / 1000 + cfg.max_clock_skew_ms / 1000 + 0.5 - time.time())
            assert "a" not in worker.holdings.runners and sessions.get("dead#1")["state"] == schema.LIVE
            while "a" not in worker.holdings.runners and time.time() * 1000 < late["expires_at_ms"] + cfg.max_clock_skew_ms + 2000:
                await worker.takeover.watch_once()
                await asyncio.sleep(0.2)
            assert "a" in worker.holdings.runners
            assert time.time() * 1000 >= late["expires_at_ms"] + cfg.max_clock_skew_ms
            assert worker.holdings.runners["a"].fence_token == 2
        finally:
            await worker.shutdown(budget_s=3)
            renewing.cancel()
            writing.cancel()
            aws.close()

    asyncio.run(scenario())


def test_a_taker_that_died_halfway_leaves_nothing_stuck(aws_env, stores, sessions, upstream):
    conns, _ = stores
    cfg = config(aws_env)
    cids = [f"c{i}" for i in range(6)]
    for cid in cids:
        conns.start(cid, upstream.url_for(cid))
    dead_session(sessions, conns, "dead#1", *cids, lease_ms=cfg.lease_ms)
    # A taker ended dead#1, took two of its six connections, and died itself.
    sessions.end_own("dead#1", worker_id="dead")
    taker = dead_session(sessions, conns, "taker#1", lease_ms=cfg.lease_ms)
    for cid in cids[:2]:
        assert isinstance(conns.acquire(cid, session_id="taker#1", worker_id="taker", expected_session="dead#1"), Acquired)
    bound = (taker["expires_at_ms"] + cfg.max_clock_skew_ms) / 1000 + 2.0

    async def scenario():
        async with running(cfg) as worker:
            await eventually(lambda: set(cids) <= set(worker.holdings.runners), timeout=cfg.lease_ms / 1000 + 6, what="all six")
            assert time.time() < bound
            await eventually(lambda: all(upstream.open_sockets(c) for c in cids), what="all six connected")

    asyncio.run(scenario())


def test_after_a_crash_with_a_partly_written_last_batch_the_new_owner_resumes_with_no_gap_and_no_double(
    aws_env, stores, sessions, upstream
):
    conns, msgs = stores
    cfg = config(aws_env)
    conns.start("a", upstream.url_for("a"))
    dead_session(sessions, conns, "dead#1", "a", lease_ms=cfg.lease_ms)
    head = 40
    for _ in range(head):
        upstream.publish("a", {"v": 1})
    # The dead owner checkpointed 10, then stored 11..30 and 32..33: 31 came back unprocessed.
    conns.checkpoint("a", session_id="dead#1", fence_token=1, last_seq=10)
    msgs.put("a", [Frame(s, '{"v":1}', 1) for s in [*range(1, 31), 32, 33]], fence_token=1, worker_id="dead")

    async def scenario():
        async with running(cfg) as worker:
            await eventually(lambda: "a" in worker.holdings.runners, timeout=cfg.lease_ms / 1000 + 5, what="takeover")
            await eventually(lambda: len(seqs(msgs, "a")) >= head + 5, what="frames past the crash")

    asyncio.run(scenario())
    stored = seqs(msgs, "a")
    assert stored == list(range(1, len(stored) + 1))
    assert upstream.sockets("a")[0].from_seq == 31  # little replayed: from the first hole
    # Counted once each past the bare checkpoint at 10: 11..30 by the taker from the dead
    # owner's items, 31 onwards as it stored them (its release at shutdown counts the last).
    item = conns.get("a")
    data = [len(r["message_data"].encode()) for r in msgs.read_all("a") if r["sk"] > 10]
    assert item["last_seq"] == len(stored) and (item["frames"], item["bytes"]) == (len(data), sum(data))


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
            assert "h" in worker.holdings.runners

    asyncio.run(scenario())




def test_a_drained_sessions_connection_is_hinted_naming_it_and_the_taker_acquires_it_from_that_session(
    aws_env, stores, sessions, upstream, sqs
):
    conns, _ = stores
    for cid in ("d1", "d2"):
        conns.start(cid, upstream.url_for(cid))
    dead_session(sessions, conns, "dead#1", "d1", "d2", lease_ms=200)
    time.sleep(0.5)
    assert sessions.end_expired("dead#1", ended_by="test", max_clock_skew_ms=200)
    assert sessions.leave_ring("dead#1")  # nobody watches it: only the hints can bring them
    cfg = config(aws_env, RECONCILE_SECONDS="60")

    async def scenario():
        async with running(cfg) as worker:
            await asyncio.sleep(0.2)
            # What a drainer sends for the connections it leaves to peers: no free first.
            await asyncio.gather(*(worker.hints.hint(c, from_session="dead#1") for c in ("d1", "d2")))
            await eventually(lambda: all(upstream.open_sockets(c) for c in ("d1", "d2")), what="both connected")
            for cid in ("d1", "d2"):
                item = await asyncio.to_thread(conns.get, cid)
                # taken once, straight from the dead session (the fence bumped once)
                assert (item["lease_session"], item["fence_token"]) == (worker.keeper.session_id, 2)
            return dict(worker.aws.requests)

    requests = asyncio.run(scenario())
    assert requests.get("sqs.SendMessageBatch") == 1 and not requests.get("sqs.SendMessage")  # sent together


def test_a_worker_at_capacity_leaves_hints_for_its_peers(aws_env, stores, upstream):
    conns, _ = stores
    cfg = config(aws_env, MAX_CONNECTIONS="1", RECONCILE_SECONDS="60")
    conns.start("a", upstream.url_for("a"))
    conns.start("b", upstream.url_for("b"))

    async def scenario():
        aws = Aws(cfg, threads=4)
        worker = Worker(cfg, "w1", aws=aws, log=JsonLogger())
        assert await worker.keeper.open(asyncio.Event())
        writing = asyncio.create_task(worker.writer.run())
        assert await worker.acquisition.try_acquire("a", source="test") is not None
        assert worker.holdings.free() == 0
        assert await worker.intake.poll_once(wait_seconds=0) == 0  # does not even poll when full
        await worker.shutdown(budget_s=5)
        writing.cancel()
        aws.close()

    asyncio.run(scenario())
    assert conns.get("b")["lease_session"] == ""


def test_a_full_workers_hint_pollers_wait_instead_of_spinning(aws_env):
    cfg = config(aws_env, MAX_CONNECTIONS="2")

    async def scenario():
        aws = Aws(cfg, threads=2)
        worker = Worker(cfg, "w1", aws=aws, log=JsonLogger())
        room, looks, polls = [0], [], []

        def free() -> int:
            looks.append(time.monotonic())
            return room[0]

        async def poll_once(*_, **__) -> int:
            polls.append(time.monotonic())
            await asyncio.sleep(0.05)
            return 0

        worker.holdings.free = free
        worker.intake.poll_once = poll_once
        worker.session_ready.set()
        poller = asyncio.create_task(worker.poll_loop())
        await asyncio.sleep(2.0)  # full, with a live session
        full = (len(looks), len(polls))
        room[0] = 1
        worker.holdings.capacity_freed.set()  # a connection ended
        await eventually(lambda: polls, timeout=5, what="polling again once there is room")
        worker.stopping.set()
        poller.cancel()
        await asyncio.gather(poller, return_exceptions=True)
        aws.close()
        return full

    looks, polls = asyncio.run(scenario())
    # Full for 2 s: a look at the room per FULL_RECHECK_S (and one per wake-up), no poll;
    # about 80 looks when the poller woke on the session being ready every 50 ms.
    assert polls == 0
    assert looks <= 8, looks


def test_transient_failures_are_retried_until_they_succeed():
    calls = []

    async def call(fn, **kwargs):
        calls.append(kwargs)
        if len(calls) < 3:
            raise TransientError("throttled")
        return "ok"

    result = asyncio.run(call_until(call, lambda: clock.now() + 10, len, log=JsonLogger(), x=1))
    assert result == "ok" and len(calls) == 3



def test_transient_failures_past_the_lease_deadline_end_in_lease_expired_not_lost():
    async def call(fn, **kwargs):
        raise TransientError("throttled")

    deadline = clock.now() + 0.3
    with pytest.raises(LeaseExpired):
        asyncio.run(call_until(call, lambda: deadline, len, log=JsonLogger()))
    assert clock.now() < deadline + 0.5




class Throttle:
    """A before-send hook answering a share of DynamoDB requests with a throttle."""

    class Raw:
        def stream(self, **_):
            yield b'{"__type":"com.amazonaws.dynamodb.v20120810#ThrottlingException","message":"slow down"}'

    def __init__(self) -> None:
        self.on = False
        self.served = 0

    def __call__(self, request, **_):
        if self.on:
            self.served += 1
            return AWSResponse(request.url, 400, {}, self.Raw())
        return None


def test_throttled_renewals_shorter_than_the_lease_do_not_drop_the_connection(aws_env, stores, sessions, upstream):
    conns, msgs = stores
    conns.start("a", upstream.url_for("a"))
    cfg = config(aws_env, LEASE_SECONDS="4", HEARTBEAT_SECONDS="0.5")
    throttle = Throttle()

    async def scenario():
        async with running(cfg) as worker:
            await eventually(lambda: upstream.open_sockets("a") and len(seqs(msgs, "a")) >= 5, what="connected")
            worker.aws.dynamodb.meta.events.register("before-send.dynamodb.UpdateItem", throttle)
            throttle.on = True
            # Throttle every renewal for 1.5 s: three heartbeats fail, well inside the lease.
            await asyncio.sleep(1.5)
            throttle.on = False
            fence = worker.holdings.runners["a"].fence_token
            beat = sessions.get(worker.keeper.session_id)["heartbeat_at_ms"]
            await eventually(
                lambda: sessions.get(worker.keeper.session_id)["heartbeat_at_ms"] > beat, what="a renewal after it"
            )
            assert worker.holdings.runners["a"].fence_token == fence
            assert worker.counters.total(names.LEASES_LOST) == 0

    asyncio.run(scenario())
    assert throttle.served >= 2
    assert len(upstream.sockets("a")) == 1  # the socket was never closed


def test_renewals_failing_past_the_deadline_stop_all_writes_then_a_new_session_takes_them_back(
    aws_env, stores, sessions, upstream
):
    conns, msgs = stores
    conns.start("a", upstream.url_for("a"))
    cfg = config(aws_env, LEASE_SECONDS="2", HEARTBEAT_SECONDS="0.4")
    throttle = Throttle()

    async def scenario():
        async with running(cfg) as worker:
            await eventually(lambda: upstream.open_sockets("a") and len(seqs(msgs, "a")) >= 5, what="connected")
            first = worker.keeper.session_id
            for client in worker.aws.dynamodb_clients:
                client.meta.events.register("before-send.dynamodb", throttle)
            throttle.on = True  # every DynamoDB request, message writes included
            await eventually(lambda: worker.keeper.lost_reason is not None, timeout=5, what="the deadline to pass")
            await eventually(lambda: not upstream.open_sockets("a"), what="the socket closed")
            stored_then = seqs(msgs, "a")
            throttle.on = False
            await eventually(lambda: worker.keeper.session_id != first and "a" in worker.holdings.runners, what="taken back")
            await eventually(lambda: len(seqs(msgs, "a")) > len(stored_then) + 5, what="storing again")
            return first

    first = asyncio.run(scenario())
    stored = seqs(msgs, "a")
    assert stored == list(range(1, len(stored) + 1))
    assert upstream.max_concurrent("a") == 1
    assert sessions.get(first)["state"] == schema.ENDED  # ended by itself, then drained


def test_a_worker_whose_clock_is_off_by_less_than_the_skew_margin_never_overlaps_or_loses_data(
    aws_env, stores, sessions, upstream
):
    """The holder's clock runs behind and the taker's ahead, both by 90 % of the margin:
    the taker ends the holder's session as early as it ever could, and still after the
    holder's own deadline."""
    conns, msgs = stores
    cfg = config(aws_env, LEASE_SECONDS="2", HEARTBEAT_SECONDS="0.4")
    off = int(cfg.max_clock_skew_ms * 0.9)
    for cid in ("a", "b"):
        conns.start(cid, upstream.url_for(cid))
    throttle = Throttle()

    async def scenario():
        async with running(cfg, "slow", clock_ms=lambda: int(time.time() * 1000) - off) as holder:
            await eventually(lambda: len(holder.holdings.runners) == 2 and len(seqs(msgs, "a")) >= 5, what="held")
            async with running(cfg, "fast", clock_ms=lambda: int(time.time() * 1000) + off) as taker:
                for client in holder.aws.dynamodb_clients:
                    client.meta.events.register("before-send.dynamodb", throttle)
                throttle.on = True  # the holder stalls: no renewal and no write gets through
                await eventually(lambda: len(taker.holdings.runners) == 2, timeout=8, what="the takeover")
                await eventually(lambda: all(len(seqs(msgs, c)) >= upstream.produced(c) - 30 for c in ("a", "b")))
                throttle.on = False

    asyncio.run(scenario())
    for cid in ("a", "b"):
        stored = seqs(msgs, cid)
        assert stored == list(range(1, len(stored) + 1))
        assert upstream.max_concurrent(cid) == 1, upstream.overlaps(cid)
        rows = msgs.read_all(cid)
        taken_at = min(r["received_at_ms"] for r in rows if r["fence_token"] == 2)
        assert all(r["received_at_ms"] < taken_at for r in rows if r["fence_token"] == 1)


def test_a_host_name_that_resolves_to_an_internal_address_is_not_connected_to(aws_env, stores, upstream):
    conns, _ = stores
    # Neither "localhost" nor 127.0.0.1 is listed: DNS sends the name to loopback, as a
    # hostile record could send a name to the metadata endpoint.
    conns.start("a", upstream.url_for("a").replace("127.0.0.1", "localhost"))

    async def scenario():
        async with running(config(aws_env, ALLOWED_WS_HOSTS="*.localhost,127.0.0.2")) as worker:
            await eventually(lambda: "a" in worker.holdings.runners, what="the lease")
            await asyncio.sleep(0.5)
            assert upstream.sockets("a") == [] and not worker.holdings.runners["a"].connected.is_set()

    asyncio.run(scenario())



def test_an_exactly_listed_host_name_may_resolve_to_loopback(aws_env, stores, upstream):
    conns, msgs = stores
    conns.start("a", upstream.url_for("a").replace("127.0.0.1", "localhost"))

    async def scenario():
        async with running(config(aws_env, ALLOWED_WS_HOSTS="localhost")):
            await eventually(lambda: len(seqs(msgs, "a")) >= 3, what="frames stored")

    asyncio.run(scenario())


def test_a_lost_session_aborts_its_sockets_at_once_even_when_the_upstream_stalls_the_close_handshake(
    aws_env, stores, sessions, upstream
):
    # The next owner may connect as soon as the session is ended: waiting for a close
    # handshake (up to seconds, or for ever from a stalled upstream) would leave two
    # sockets on the stream meanwhile.
    conns, _ = stores
    conns.start("a", upstream.url_for("a"))
    cfg = config(aws_env)

    async def scenario():
        async with running(cfg) as worker:
            await eventually(lambda: upstream.open_sockets("a"), what="connected")
            upstream.stall("a")  # from now on it answers nothing, not even a close frame
            ended_at = time.time()
            assert await asyncio.to_thread(sessions.end_own, worker.keeper.session_id, worker_id="someone")
            # The first socket's close, not "no socket open": the worker starts a new
            # session at once and may take the connection back and open a second socket
            # before a poll sees the moment with none (it did, on loaded full runs).
            await eventually(lambda: upstream.sockets("a")[0].closed_at is not None, timeout=10, what="the socket closed")
            upstream.stall("a", False)
            return ended_at

    ended_at = asyncio.run(scenario())
    first = upstream.sockets("a")[0]
    # The worker learns it at its next renewal (one heartbeat), then aborts: no 1 s
    # handshake wait, let alone the 3 s it used to allow.
    assert first.closed_at - ended_at < cfg.heartbeat_ms / 1000 + 0.9


def test_hints_a_leaving_workers_own_polls_receive_after_it_stopped_waiting_are_visible_again_at_once(
    aws_env, stores, sqs, upstream, monkeypatch
):
    # Its four long polls are in flight when it hands its connections over: SQS gives
    # them its own handover hints, which nobody takes any more. They must go back to the
    # queue at once, not stay invisible for the 30 s visibility timeout. (The worker
    # waits a moment for its polls to return before cancelling them; on a busy machine
    # they return later than that. No wait at all makes every such hint late.)
    import wsfleet.worker.lifecycle as lifecycle

    monkeypatch.setattr(lifecycle, "HINT_GRACE_S", 0.0)
    conns, _ = stores
    cids = [f"h{i}" for i in range(6)]
    for cid in cids:
        conns.start(cid, upstream.url_for(cid))
    queue = aws_env["QUEUE_URL"]

    async def scenario():
        async with running(config(aws_env)) as worker:
            receive = worker.aws.sqs.receive_message

            def slow_answer(**kwargs):  # what a poll received reaches the worker 0.5 s later
                resp = receive(**kwargs)
                time.sleep(0.5)
                return resp

            worker.aws.sqs.receive_message = slow_answer  # before its first poll
            await eventually(lambda: worker.keeper.live(), what="a session")
            await worker.takeover.reconcile_once()
            await eventually(lambda: set(worker.holdings.runners) == set(cids), what="all held")

    asyncio.run(scenario())

    def counts() -> tuple[int, int]:
        attrs = sqs.get_queue_attributes(
            QueueUrl=queue, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
        )["Attributes"]
        return int(attrs["ApproximateNumberOfMessages"]), int(attrs["ApproximateNumberOfMessagesNotVisible"])

    # Every handover hint visible, for a peer; and, nobody having taken them, each hinted
    # again before the worker left (worker.handoffs.Handoffs.hint_again).
    deadline = time.monotonic() + 5
    while counts() != (2 * len(cids), 0) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert counts() == (2 * len(cids), 0)



def test_frames_over_the_socket_allowance_on_every_connection_share_the_receive_slots_and_are_all_stored(aws_env, stores):
    """MAX_BUFFERED_BYTES 1 MiB with 256 KiB frames: one receive slot (wsfleet.budget).
    Four streams each have five 150 KB frames waiting when their sockets open: every
    frame is stored whole and in order, never more than one socket holds a large frame,
    and the writer never holds more than its share (or one frame)."""
    conns, msgs = stores
    streams = ("a", "b", "c", "d")
    with ThreadedUpstream(rate=None) as up:
        payload = {s: [f"{s}{seq}-" + "p" * 150_000 for seq in range(1, 6)] for s in streams}
        for s in streams:
            up.create_stream(s)
            for data in payload[s]:
                up.publish(s, data)
            conns.start(s, up.url_for(s))

        async def scenario():
            cfg = config(aws_env, MAX_FRAME_BYTES=str(256 * 1024), MAX_BUFFERED_BYTES=str(1 << 20))
            async with running(cfg) as worker:
                assert worker.gate is not None and worker.gate.slots == 1
                await eventually(lambda: all(len(seqs(msgs, s)) == 5 for s in streams), 60, "every frame stored")
                return worker.gate.stats(), worker.writer.stats()

        gate, writer = asyncio.run(scenario())
    for s in streams:
        rows = msgs.read_all(s)
        assert [r["sk"] for r in rows] == [1, 2, 3, 4, 5]
        assert [json.loads(r["message_data"]) for r in rows] == payload[s]
    assert gate["high_water"] == 1 and gate["granted"] >= len(streams)  # each socket held it, one at a time
    assert writer["pending_bytes_max"] <= max(512 * 1024, 150_010)
