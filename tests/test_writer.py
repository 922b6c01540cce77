"""The worker's shared writer: batches filled across connections, per-connection order and
gap-free checkpoints, fairness, backpressure, flush, the deadline. Driven with a recording
DynamoDB client (requests really go through MessagesStore), no network."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from wsfleet import clock
from wsfleet import metrics_names as names
from wsfleet.logs import JsonLogger
from wsfleet.metrics import Counters
from wsfleet.sinks import MessagesStore, ObjectsStore
from wsfleet.stream import Frame, Problem, upstream_gap
from wsfleet.worker.latency import Latency, histogram_of, histogram_quantile
from wsfleet.worker.retry import LeaseExpired
from wsfleet.worker.writer import Writer


class RecordingDynamoDB:
    """Answers BatchWriteItem like DynamoDB, records each request and what it stored, and
    can leave items unprocessed, refuse a request holding a given item (as DynamoDB
    refuses a whole batch for one invalid item), or fail requests with given errors."""

    def __init__(self) -> None:
        self.requests: list[list[tuple[str, int]]] = []
        self.items: dict[tuple[str, int], dict] = {}
        self.unprocess_once: set[tuple[str, int]] = set()
        self.refuse_data: set[str] = set()  # items with this message_data
        self.refuse_keys: set[tuple[str, int]] = set()  # any item with this key, markers too
        self.errors: list[Exception] = []  # raised one per request, before anything is stored

    def batch_write_item(self, RequestItems: dict[str, Any]) -> dict[str, Any]:
        (table, reqs), = RequestItems.items()
        items = [r["PutRequest"]["Item"] for r in reqs]
        keys = [(i["pk"]["S"], int(i["sk"]["N"])) for i in items]
        self.requests.append(keys)
        if self.errors:
            raise self.errors.pop(0)
        if any(i.get("message_data", {}).get("S") in self.refuse_data for i in items) or self.refuse_keys & set(keys):
            raise client_error("ValidationException", "Item size has exceeded the maximum allowed size")
        left = [r for r, k in zip(reqs, keys, strict=True) if k in self.unprocess_once]
        self.unprocess_once -= set(keys)
        self.items.update((k, i) for k, i, r in zip(keys, items, reqs, strict=True) if r not in left)
        return {"UnprocessedItems": {table: left} if left else {}}


def client_error(code: str, message: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": message}}, "BatchWriteItem")


async def direct_call(fn, /, *args, **kwargs):
    return fn(*args, **kwargs)


class Harness:
    def __init__(self, *, interval: float = 0.05, deadline_s: float = 60.0, **caps: Any) -> None:
        self.ddb = RecordingDynamoDB()
        self.counters = Counters()
        self.deadline = clock.now() + deadline_s
        self.stored: dict[str, list[tuple[int, int]]] = {}
        self.writer = Writer(
            messages=MessagesStore(self.ddb, "msgs", sleep=lambda _: None),
            # No bucket here (port 9 refuses): these tests have no large data; those
            # that do are in test_large_frames.py, against the emulator.
            objects=ObjectsStore(boto3.client("s3", endpoint_url="http://127.0.0.1:9", region_name="us-east-1"), "none"),
            call=direct_call,
            worker_id="w1",
            counters=self.counters,
            log=JsonLogger(),
            flush_interval_s=interval,
            **caps,
        )

    def open(self, *cids: str) -> None:
        for cid in cids:
            self.stored[cid] = []
            self.writer.open(
                cid, fence_token=1, deadline=lambda: self.deadline, on_stored=lambda s, n, c=cid: self.stored[c].append((s, n.frames))
            )

    async def put(self, cid: str, *seqs: int, data: str = "{}") -> None:
        for seq in seqs:
            await self.writer.put(cid, Frame(seq, data, 1))

    def idle(self) -> bool:
        """No queue left in flight, every batch slot free."""
        in_flight = any(q.in_flight for q in self.writer._queues.values())
        return not in_flight and self.writer._slots._value == self.writer._concurrency


async def until(predicate, timeout: float = 5.0) -> None:
    deadline = clock.now() + timeout
    while not predicate():
        assert clock.now() < deadline, "timed out"
        await asyncio.sleep(0.005)


def run(coro):
    return asyncio.run(coro)



def slow_table(h: Harness, seconds: float) -> None:
    """Every batch write takes ``seconds``, in a thread as the worker's pool runs it."""
    real = h.writer._put

    def slow_put(**kw):
        time.sleep(seconds)
        real(**kw)

    async def threaded(fn, /, **kw):
        return await asyncio.to_thread(fn, **kw)

    h.writer._put = slow_put
    h.writer._call = threaded

def test_frames_of_many_connections_share_batches_of_up_to_25():
    async def scenario():
        h = Harness()
        cids = [f"c{i}" for i in range(10)]
        h.open(*cids)
        task = asyncio.create_task(h.writer.run())
        for cid in cids:
            await h.put(cid, 1, 2, 3)
        await until(lambda: h.counters.total(names.MESSAGES_STORED) == 30)
        task.cancel()
        return h

    h = run(scenario())
    assert len(h.ddb.requests) == 2 and sum(len(r) for r in h.ddb.requests) == 30  # 30 frames, 2 requests
    assert all(h.stored[c][-1][0] == 3 and sum(n for _, n in h.stored[c]) == 3 for c in h.stored)
    assert h.counters.total(names.MESSAGES_STORED) == 30


def written_after_queueing(frames: dict[str, list[int]]) -> Harness:
    """Queue every connection's frames first, then run the writer until all are stored."""

    async def scenario():
        h = Harness(interval=0.05)
        h.open(*frames)
        for cid, seqs in frames.items():
            await h.put(cid, *seqs)
        task = asyncio.create_task(h.writer.run())
        await until(lambda: h.counters.total(names.MESSAGES_STORED) == sum(map(len, frames.values())))
        task.cancel()
        return h

    return run(scenario())


def test_many_quiet_connections_fill_whole_batches_not_halves():
    h = written_after_queueing({f"q{i}": [1] for i in range(30)})
    # One frame each from 30 connections: a full batch of 25, then the other 5 (not two
    # concurrent batches of 15, which at 1,000 quiet connections cost 20 % more requests).
    assert [len(r) for r in h.ddb.requests] == [25, 5]
    assert [pk for pk, _ in h.ddb.requests[0]] == [f"CONN#q{i}" for i in range(25)]  # oldest first


def test_a_lone_frame_waits_the_flush_interval_and_a_full_batch_leaves_at_once():
    async def scenario():
        h = Harness(interval=1.5)
        h.open("a", "b")
        task = asyncio.create_task(h.writer.run())
        t0 = clock.now()
        await h.put("a", 1)
        await until(lambda: h.stored["a"])
        lone = clock.now() - t0
        t1 = clock.now()
        await h.put("b", *range(1, 26))
        await until(lambda: h.stored["b"])
        full = clock.now() - t1
        task.cancel()
        return lone, full

    lone, full = run(scenario())
    assert lone >= 1.5 and full < 1.0


def test_a_connections_items_leave_in_seq_order_one_batch_in_flight_at_a_time():
    async def scenario():
        h = Harness(interval=0.01)
        h.open("a")
        gate = asyncio.Event()
        real = h.writer._put

        def slow_put(**kw):
            # The first request is held until released: the next 25 must wait for it.
            if len(h.ddb.requests) == 0:
                while not gate.is_set():
                    time.sleep(0.01)
            real(**kw)

        h.writer._put = slow_put

        async def threaded(fn, /, **kw):
            return await asyncio.to_thread(fn, **kw)

        h.writer._call = threaded
        task = asyncio.create_task(h.writer.run())
        await h.put("a", *range(1, 26))
        await asyncio.sleep(0.05)
        await h.put("a", *range(26, 51))
        await asyncio.sleep(0.1)
        assert len(h.ddb.requests) == 0  # the second batch did not overtake the first
        gate.set()
        await until(lambda: h.stored["a"] and h.stored["a"][-1][0] == 50)
        task.cancel()
        return h

    h = run(scenario())
    assert [k[1] for r in h.ddb.requests for k in r] == list(range(1, 51))
    assert [s for s, _ in h.stored["a"]] == [25, 50]


def test_busy_connections_are_written_in_concurrent_batches():
    h = written_after_queueing({f"b{i}": list(range(1, 26)) for i in range(8)})
    # 200 frames of 8 connections: full batches of 2 connections each, not one batch of 8
    # at a time.
    assert all(len(r) == 25 for r in h.ddb.requests) and len(h.ddb.requests) == 8
    assert max(len({pk for pk, _ in r}) for r in h.ddb.requests) <= 2


def test_a_chatty_connection_cannot_starve_quiet_ones_of_batch_slots():
    async def scenario():
        h = Harness(interval=0.05)
        h.open("chatty", *[f"q{i}" for i in range(5)])
        for seq in range(1, 201):
            await h.put("chatty", seq)
        for i in range(5):
            await h.put(f"q{i}", 1)
        task = asyncio.create_task(h.writer.run())
        await until(lambda: all(h.stored[f"q{i}"] for i in range(5)))
        task.cancel()
        return h

    h = run(scenario())
    # The chatty one's 200 frames fill several concurrent batches; the quiet ones ride in
    # the first round of them, not behind all 200.
    first_round = {pk for request in h.ddb.requests[:4] for pk, _ in request}
    assert {f"CONN#q{i}" for i in range(5)} <= first_round


def test_unprocessed_items_are_retried_and_the_checkpoint_waits_for_all_of_them():
    async def scenario():
        h = Harness(interval=0.01)
        h.open("a")
        h.ddb.unprocess_once = {("CONN#a", 3)}
        task = asyncio.create_task(h.writer.run())
        await h.put("a", 1, 2, 3, 4)
        await until(lambda: h.stored["a"])
        task.cancel()
        return h

    h = run(scenario())
    assert h.ddb.requests[1] == [("CONN#a", 3)]
    assert h.stored["a"] == [(4, 4)]  # reported once, after item 3 got through too


def test_a_range_marker_is_reported_stored_to_its_end_and_each_marker_counted_once_stored():
    async def scenario():
        h = Harness(interval=0.05)
        h.open("a")
        h.ddb.unprocess_once = {("CONN#a", 2)}  # the range's item comes back once: retried, counted once
        task = asyncio.create_task(h.writer.run())
        await h.writer.put("a", Frame(1, "{}", 1), upstream_gap(2, 99, 1))
        await h.writer.flush("a")
        await h.writer.put("a", Frame(100, "{}", 1), Frame(101, None, 1, Problem.OVER_FRAME_LIMIT, data_bytes=5))
        await h.writer.put("a", Frame(102, None, 1, Problem.TOO_DEEP))
        await h.writer.flush("a")
        task.cancel()
        return h

    h = run(scenario())
    assert h.stored["a"][0] == (99, 1)  # a checkpoint past 99 covers seqs stored as one range item; markers count no frame
    assert h.stored["a"][-1][0] == 102
    assert h.ddb.items[("CONN#a", 2)]["skip_to"] == {"N": "99"}
    assert h.ddb.items[("CONN#a", 101)]["skipped"] == {"S": "over_frame_limit"}
    assert h.counters.total(names.SKIPPED_FRAMES) == 3 and h.counters.total(names.MALFORMED_FRAMES) == 0


def test_frames_put_together_are_queued_together_or_not_at_all():
    async def scenario():
        h = Harness(interval=10.0, max_pending_per_connection=2)
        h.open("a")
        await h.put("a", 1, 2)
        putter = asyncio.create_task(h.writer.put("a", upstream_gap(3, 5, 1), Frame(6, "{}", 1)))
        await until(lambda: h.counters.total(names.BACKPRESSURE_WAITS) == 1)
        putter.cancel()  # the receive loop torn down while it waits
        await asyncio.gather(putter, return_exceptions=True)
        pending_after_cancel = h.writer.stats()["pending"]
        task = asyncio.create_task(h.writer.run())
        await asyncio.wait_for(h.writer.flush("a"), 5)
        await asyncio.wait_for(h.writer.put("a", upstream_gap(3, 5, 1), Frame(6, "{}", 1)), 5)
        await asyncio.wait_for(h.writer.flush("a"), 5)
        task.cancel()
        return h, pending_after_cancel

    h, pending_after_cancel = run(scenario())
    assert pending_after_cancel == 2  # neither of the two
    assert [k[1] for r in h.ddb.requests for k in r] == [1, 2, 3, 6]
    assert h.stored["a"] == [(2, 2), (6, 1)]  # frames counted: the gap marker is none


def test_a_full_connection_makes_its_receive_loop_wait_and_nothing_is_dropped():
    async def scenario():
        h = Harness(interval=10.0, max_pending_per_connection=5)
        h.open("a")
        putter = asyncio.create_task(h.put("a", *range(1, 9)))
        await asyncio.sleep(0.1)
        assert not putter.done() and h.writer.stats()["pending"] == 5
        assert h.counters.total(names.BACKPRESSURE_WAITS) == 1
        task = asyncio.create_task(h.writer.run())
        await h.writer.flush("a")
        await putter
        await h.writer.flush("a")
        task.cancel()
        return h

    h = run(scenario())
    assert [k[1] for r in h.ddb.requests for k in r] == list(range(1, 9))


def test_flush_sends_that_connections_frames_now_instead_of_after_the_interval():
    async def scenario():
        h = Harness(interval=30.0)
        h.open("a", "b")
        task = asyncio.create_task(h.writer.run())
        await h.put("a", 1, 2)
        await h.put("b", 1)
        t0 = clock.now()
        await h.writer.flush("a")
        took = clock.now() - t0
        task.cancel()
        return h, took

    h, took = run(scenario())
    assert took < 1.0 and h.stored["a"] == [(2, 2)]


def test_nothing_is_sent_past_the_deadline_and_flush_says_so():
    async def scenario():
        h = Harness(interval=0.01, deadline_s=-1.0)
        h.open("a")
        task = asyncio.create_task(h.writer.run())
        await h.put("a", 1)
        with pytest.raises(LeaseExpired):
            await h.writer.flush("a")
        await asyncio.sleep(0.05)
        task.cancel()
        return h

    h = run(scenario())
    assert h.ddb.requests == [] and h.stored["a"] == []


def test_closing_a_connection_forgets_its_pending_frames():
    async def scenario():
        h = Harness(interval=30.0)
        h.open("a")
        await h.put("a", 1, 2, 3)
        dropped = h.writer.close("a")
        return h, dropped

    h, dropped = run(scenario())
    assert dropped == 3 and h.writer.stats()["pending"] == 0


def test_a_batch_slower_than_the_deadline_it_started_with_is_kept_while_renewals_extend_it():
    """Regression (faults benchmark, 50 % throttling): a batch whose retries outlasted the
    deadline read when it was sent was dropped while the session lived on, and the
    checkpoint moved past the hole."""

    async def scenario():
        # The renewal lands 0.2 s in, well before the 1 s deadline (a busy machine can
        # stretch that sleep by most of a second and the test still means what it says),
        # and the batch takes 1.5 s, past the deadline it was sent with.
        h = Harness(interval=0.01, deadline_s=1.0)
        h.open("a")
        slow_table(h, 1.5)  # throttled and retried inside the store
        task = asyncio.create_task(h.writer.run())
        await h.put("a", 1, 2, 3)
        await asyncio.sleep(0.2)
        h.deadline = clock.now() + 10  # a renewal landed meanwhile
        await h.put("a", 4)
        await h.writer.flush("a")
        task.cancel()
        return h

    h = run(scenario())
    assert [k[1] for r in h.ddb.requests for k in r] == [1, 2, 3, 4]
    assert h.stored["a"][-1][0] == 4


def test_received_to_stored_latency_reflects_a_slow_table():
    """Each frame's time from hand-over to stored batch is measured: with a table that
    takes 0.4 s per request, every frame took at least that long, and the stats line
    says so (lower bounds only: a busy machine can only make it slower)."""

    async def scenario():
        h = Harness(interval=0.01)
        h.open("a", "b")
        slow_table(h, 0.4)
        task = asyncio.create_task(h.writer.run())
        await h.put("a", *range(1, 31))
        await h.put("b", *range(1, 11))
        await until(lambda: h.counters.total(names.MESSAGES_STORED) == 40)
        task.cancel()
        return h

    h = run(scenario())
    lat = h.writer.stats()["received_to_stored_ms"]
    assert lat["n"] == 40
    assert lat["max"] >= 400 and lat["p99"] >= 400 / 1.1 and lat["p50"] >= 400 / 1.1  # 9 % wide buckets
    assert lat["p50"] <= lat["p99"] <= lat["max"]
    assert sum(h.writer.stats()["received_to_stored_hist"].values()) == 40


def test_latency_histogram_percentiles_window_and_cumulative_counts():
    now = [1000.0]
    lat = Latency(window_s=60, slots=6, clock=lambda: now[0])
    # 99 frames stored 50 ms after hand-over and one 2 s after, in one batch.
    lat.record(now[0], [now[0] - 0.05] * 99 + [now[0] - 2.0])
    s = lat.summary()
    assert s["n"] == 100 and s["max"] == 2000.0
    assert 50 / 1.1 <= s["p50"] <= 50 * 1.1 and 50 / 1.1 <= s["p99"] <= 50 * 1.1
    assert lat.summary() == s  # reading is not consuming
    first = lat.cumulative()

    now[0] += 30  # a second batch, later in the window
    lat.record(now[0], [now[0] - 0.5] * 100)
    s = lat.summary()
    assert s["n"] == 200 and 500 / 1.1 <= s["p99"] <= 500 * 1.1 and s["max"] == 2000.0

    now[0] += 45  # the first batch's slot has left the window, the second's has not
    s = lat.summary()
    assert s["n"] == 100 and s["max"] == 500.0

    now[0] += 60
    assert lat.summary() == {"window_s": 60, "n": 0, "p50": None, "p99": None, "max": None}

    # The cumulative histogram keeps everything; two readings subtract to a window.
    both = histogram_of(lat.cumulative())
    assert sum(both) == 200 and sum(histogram_of(first)) == 100
    between = [b - a for a, b in zip(histogram_of(first), both, strict=True)]
    assert 500 / 1.1 <= histogram_quantile(between, 99) <= 500 * 1.1
    assert histogram_quantile([0] * len(between), 50) is None


# --- whatever the store answers ------------------------------------------------------------


def test_an_item_the_store_refuses_becomes_a_skip_marker_and_the_rest_of_its_batch_is_stored():
    async def scenario():
        h = Harness(interval=0.05)
        h.open("a", "b")
        h.ddb.refuse_data = {'"too big"'}
        task = asyncio.create_task(h.writer.run())
        await h.put("a", 1, 2)
        await h.put("a", 3, data='"too big"')
        await h.put("a", 4)
        await h.put("b", 1, 2, 3)  # a healthy connection sharing the batch
        await until(lambda: h.stored["a"] and h.stored["b"])
        alive = not task.done()
        task.cancel()
        return h, alive

    h, alive = run(scenario())
    assert alive and h.idle()
    assert h.stored == {"a": [(4, 4)], "b": [(3, 3)]}  # every seq accounted for, the checkpoint goes on
    assert sorted(h.ddb.items) == [("CONN#a", s) for s in (1, 2, 3, 4)] + [("CONN#b", s) for s in (1, 2, 3)]
    marker = h.ddb.items[("CONN#a", 3)]
    assert marker["skipped"] == {"S": "malformed"} and "message_data" not in marker
    assert marker["data_bytes"] == {"N": str(len('"too big"'))}
    assert h.counters.total(names.MALFORMED_FRAMES) == 1 and h.counters.total(names.FRAMES_DROPPED) == 0
    assert h.counters.total(names.SKIPPED_FRAMES) == 1  # the marker the split found, once stored


def test_a_seq_no_dynamodb_number_holds_is_dropped_and_counted_and_its_batch_is_stored():
    """Regression (issue 17): a seq of 10^40 made the client refuse the whole batch and
    the writer kept its queues in flight for good, a healthy stream sharing the batch
    with them. Not even its marker can be stored (the key is the seq)."""

    async def scenario():
        h = Harness(interval=0.05)
        h.open("a", "b")
        task = asyncio.create_task(h.writer.run())
        await h.put("a", 4, 10**40)
        await h.put("b", 1, 2)
        await until(lambda: h.stored["a"] and h.stored["b"])
        await h.put("a", 10**40 + 1)  # (the parser never lets such a seq through: this is the last line)
        await h.put("b", 3)
        await until(lambda: len(h.stored["b"]) == 2)
        task.cancel()
        return h

    h = run(scenario())
    assert h.idle()
    assert h.stored["b"] == [(2, 2), (3, 1)]
    assert ("CONN#a", 4) in h.ddb.items
    assert h.counters.total(names.FRAMES_DROPPED) == 2 and h.counters.total(names.MALFORMED_FRAMES) == 2
    assert h.counters.total(names.SKIPPED_FRAMES) == 0  # a marker never stored is not counted


def test_access_denied_for_a_while_is_retried_nothing_is_dropped_and_the_loop_lives():
    async def scenario():
        h = Harness(interval=0.05)
        h.open("a")
        h.ddb.errors = [client_error("AccessDeniedException", "not yet")] * 3  # a deploy replacing the role
        task = asyncio.create_task(h.writer.run())
        await h.put("a", 1, 2, 3)
        await until(lambda: h.stored["a"])
        await h.put("a", 4)
        await h.writer.flush("a")
        alive = not task.done()
        task.cancel()
        return h, alive

    h, alive = run(scenario())
    assert alive and h.idle()
    assert h.ddb.requests == [[("CONN#a", s) for s in (1, 2, 3)]] * 4 + [[("CONN#a", 4)]]
    assert sorted(h.ddb.items) == [("CONN#a", s) for s in (1, 2, 3, 4)] and h.stored["a"] == [(3, 3), (4, 1)]
    assert h.counters.total(names.LOOP_ERRORS) == 3 and h.counters.total(names.MALFORMED_FRAMES) == 0


def test_an_arbitrary_exception_from_a_put_is_counted_and_the_writer_goes_on():
    async def scenario():
        h = Harness(interval=0.05)
        h.open("a")
        real, calls = h.writer._put, []

        def failing_once(**kw):
            calls.append(len(kw["entries"]))
            if len(calls) == 1:
                raise KeyError("a bug")
            real(**kw)

        h.writer._put = failing_once
        task = asyncio.create_task(h.writer.run())
        await h.put("a", 1, 2)
        await until(lambda: h.stored["a"])
        await h.put("a", 3)
        await h.writer.flush("a")
        alive = not task.done()
        task.cancel()
        return h, alive, calls

    h, alive, calls = run(scenario())
    assert alive and h.idle() and calls == [2, 2, 1]
    assert h.stored["a"] == [(2, 2), (3, 1)]
    assert h.counters.total(names.LOOP_ERRORS) == 1


def test_a_flush_waits_as_long_as_renewals_keep_moving_the_deadline():
    """Regression (issue 17): the flush computed its headroom once, from the deadline at
    its start, and gave up with LeaseExpired while renewals kept moving the deadline: the
    release then failed and the connection sat attached to the session."""

    async def scenario():
        h = Harness(interval=30.0, deadline_s=0.3)
        h.open("a")
        slow_table(h, 1.0)
        task = asyncio.create_task(h.writer.run())

        async def renewals():
            while True:
                h.deadline = clock.now() + 0.3
                await asyncio.sleep(0.05)

        renewing = asyncio.create_task(renewals())
        await h.put("a", 1)
        await h.writer.flush("a")  # a batch of 1 s, under a deadline never more than 0.3 s away
        renewing.cancel()
        task.cancel()
        return h

    h = run(scenario())
    assert h.stored["a"] == [(1, 1)]


def test_the_byte_cap_makes_receive_loops_wait_until_data_is_stored_and_nothing_is_dropped():
    async def scenario():
        h = Harness(interval=0.05, max_pending_bytes=3000)
        h.open("a", "b")
        data = '"' + "x" * 998 + '"'  # 1000 characters
        putter_a = asyncio.create_task(h.put("a", 1, 2, 3, 4, data=data))
        putter_b = asyncio.create_task(h.put("b", 1, 2, data=data))
        await until(lambda: h.writer.stats()["pending_bytes"] == 3000 and h.counters.total(names.BACKPRESSURE_WAITS) >= 1)
        assert not (putter_a.done() and putter_b.done())
        task = asyncio.create_task(h.writer.run())
        await asyncio.wait_for(asyncio.gather(putter_a, putter_b), 30)
        await h.writer.flush("a")
        await h.writer.flush("b")
        task.cancel()
        return h

    h = run(scenario())
    stored = sorted(k for r in h.ddb.requests for k in r)
    assert stored == [("CONN#a", s) for s in (1, 2, 3, 4)] + [("CONN#b", s) for s in (1, 2)]
    assert h.writer.stats()["pending_bytes"] == 0 and h.writer.stats()["pending_bytes_max"] <= 3000


def test_a_frame_larger_than_the_byte_cap_is_taken_when_the_writer_holds_nothing():
    async def scenario():
        h = Harness(interval=0.01, max_pending_bytes=100)
        h.open("a")
        task = asyncio.create_task(h.writer.run())
        await asyncio.wait_for(h.put("a", 1, 2, data='"' + "y" * 500 + '"'), 30)
        await h.writer.flush("a")
        task.cancel()
        return h

    h = run(scenario())
    assert h.stored["a"] and h.stored["a"][-1][0] == 2 and h.writer.stats()["pending_bytes_max"] == 502


def test_data_in_flight_counts_against_the_byte_cap_until_it_is_stored():
    async def scenario():
        h = Harness(interval=0.01, max_pending_bytes=1500)
        slow_table(h, 0.3)
        h.open("a", "b")
        task = asyncio.create_task(h.writer.run())
        await h.put("a", 1, data='"' + "z" * 998 + '"')
        await until(lambda: any(q.in_flight for q in h.writer._queues.values()))
        putter = asyncio.create_task(h.put("b", 1, data='"' + "z" * 998 + '"'))
        await asyncio.sleep(0)
        in_flight_blocked = not putter.done()
        await asyncio.wait_for(putter, 30)
        await h.writer.flush("b")
        task.cancel()
        return h, in_flight_blocked

    h, blocked = run(scenario())
    assert blocked and h.stored["b"] == [(1, 1)] and h.writer.stats()["pending_bytes_max"] <= 1500


def test_closing_a_connection_gives_back_the_bytes_of_its_pending_and_in_flight_frames():
    async def scenario():
        h = Harness(interval=0.01, max_pending_bytes=10_000)
        slow_table(h, 0.2)
        h.open("a")
        task = asyncio.create_task(h.writer.run())
        await h.put("a", 1, data='"' + "q" * 98 + '"')
        await until(lambda: any(q.in_flight for q in h.writer._queues.values()))
        await h.put("a", 2, data='"' + "q" * 98 + '"')
        h.writer.close("a")
        await until(h.idle)
        task.cancel()
        return h

    h = run(scenario())
    assert h.writer.stats()["pending_bytes"] == 0
