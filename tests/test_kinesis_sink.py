"""The Kinesis sink (sinks.kinesis.StreamSink) against the emulator's stream: requests
within Kinesis' limits, records that decode to what was put, one connection's records
in order on one shard, and under the emulator's Kinesis faults (partly refused
PutRecords, lost answers, throttling, an outage) every record acknowledged, the last
delivery of each seq in seq order, duplicates only at the same fence."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import uuid
from collections import Counter

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from tests.conftest import own_emulator
from tests.kinesis_reading import by_connection, check_order, kinesis_env, last_deliveries, read_stream
from wsfleet import aggregation, clock, records
from wsfleet import metrics_names as names
from wsfleet.aws import Aws, SendDeadlinePassed, send_deadline
from wsfleet.config import WorkerConfig
from sim.emulator import faults, set_faults
from wsfleet.logs import JsonLogger
from wsfleet.metrics import Counters
from wsfleet.sinks import ManySinks, InvalidItem, MessagesStore, ObjectsStore, StoredObject, StreamSink
from wsfleet.store import TransientError
from wsfleet.stream import MAX_MESSAGE_BYTES, Frame, Problem, upstream_gap
from wsfleet.worker.writer import Writer

REGION = "us-east-1"


def new_stream(client, shards: int = 2) -> str:
    name = f"ms-{uuid.uuid4().hex[:8]}"
    client.create_stream(StreamName=name, ShardCount=shards)
    client.get_waiter("stream_exists").wait(StreamName=name, WaiterConfig={"Delay": 0.1, "MaxAttempts": 100})
    return name


def frames(cid: str, seqs, fence: int = 1, data: str = '{"v":1}') -> list[tuple[str, int, Frame]]:
    return [(cid, fence, Frame(s, data, 1_700_000_000_000 + s)) for s in seqs]


def interleaved(cids, n: int, fence: int = 1) -> list[tuple[str, int, Frame]]:
    """n frames of each connection, their seqs 1..n, taken in turn (as a batch holds them)."""
    return [(c, fence, Frame(s, json.dumps({"c": c, "s": s}), 1_700_000_000_000)) for s in range(1, n + 1) for c in cids]


class Requests:
    """PutRecords requests a client sent: how many records and bytes each."""

    def __init__(self, client) -> None:
        self.sizes: list[tuple[int, int]] = []
        self.datas: list[bytes] = []  # every record's data, in the order sent
        client.meta.events.register("provide-client-params.kinesis.PutRecords", self._seen)

    def _seen(self, params, **_):
        recs = params["Records"]
        self.sizes.append((len(recs), sum(len(r["Data"]) + len(r["PartitionKey"].encode()) for r in recs)))
        self.datas += [r["Data"] for r in recs]


@pytest.fixture
def kinesis(emulator):
    return boto3.client("kinesis", endpoint_url=emulator.endpoint_url, region_name=REGION)


@pytest.fixture(scope="module")
def faulty():
    """An emulator of this module's own, for the fault tests: (url, a Kinesis client that
    tries each request once, so that every fault reaches the sink)."""
    for url, _, client in own_emulator("kinesis"):
        yield url, client


@pytest.fixture
def faulted(faulty):
    url, client = faulty
    set_faults(url)
    yield url, client, new_stream(client)
    set_faults(url)


# --- what is put, and how ------------------------------------------------------------


def test_records_decode_to_what_was_put_each_connection_in_order_on_one_shard(kinesis):
    stream = new_stream(kinesis)
    sink = StreamSink(kinesis, stream)
    assert (sink.names, sink.max_batch, sink.reads_tail) == (("kinesis",), 500, False)
    big = StoredObject("s3://b/k", 400_000, "ab" * 32)
    hostile = 'x"},"seq":0,"fence_token":99,"y":{"'  # quotes and braces in an id: still one field
    entries = [
        *interleaved(["a", "b", "c", "d", hostile, "é-ü:☃"], 20, fence=3),
        ("a", 3, Frame(21, None, 5, Problem.INVALID_UTF8, data_bytes=7)),
        ("a", 3, upstream_gap(22, 30, 6)),
        ("b", 3, Frame(21, '"' + "x" * (MAX_MESSAGE_BYTES + 10) + '"', 7)),
        ("c", 3, Frame(21, '{"t":"line\\nbreak \\"q\\" \\u2028 ☃","n":null,"l":[1,2.5,-3e10]}', 8)),
        ("d", 3, Frame(21, "null", 9)),
    ]
    sink.put_many(entries, worker_id="w-1", objects={("b", 21): big})
    got = by_connection(kinesis, stream)
    assert set(got) == {"a", "b", "c", "d", hostile, "é-ü:☃"}
    for cid, recs in got.items():
        assert [r.seq for r in recs] == list(range(1, {"a": 23, "b": 22, "c": 22, "d": 22}.get(cid, 21))), cid
        assert all(r.fence_token == 3 and r.worker_id == "w-1" for r in recs)
        assert all(r.data == {"c": cid, "s": r.seq} for r in recs[:20])
    a, gap, b, c, d = got["a"][20], got["a"][21], got["b"][20], got["c"][20], got["d"][20]
    assert (a.skipped, a.data_bytes, a.is_marker, a.has_data) == ("malformed", 7, True, False)
    assert (gap.skipped, gap.skip_to, gap.end) == ("upstream_gap", 30, 30)
    assert (b.data_ref, b.data_bytes, b.data_sha256, b.has_data) == ("s3://b/k", 400_000, "ab" * 32, False)
    assert c.data == {"t": "line\nbreak \"q\" \u2028 ☃", "n": None, "l": [1, 2.5, -3e10]}
    assert d.has_data and d.data is None
    assert (d.received_at_ms, a.received_at_ms) == (9, 5)


def test_a_call_is_split_in_puts_of_at_most_500_records_and_5_mib_in_order(kinesis):
    stream = new_stream(kinesis)
    sent = Requests(kinesis)
    sink = StreamSink(kinesis, stream)
    cids = [f"k{i}" for i in range(1203)]
    sink.put_many(interleaved(cids, 1), worker_id="w")  # one frame each: 1203 plain records
    assert [n for n, _ in sent.sizes] == [500, 500, 203]
    # 340 KB of data each: two share an aggregate (three would pass its bound), and 7
    # aggregates fit in 5 MiB, not 8 (moto refuses a request over it).
    data = '"' + "y" * 340_000 + '"'
    sent.sizes.clear()
    sent.datas.clear()
    sink.put_many(frames("big", range(1, 21), data=data), worker_id="w")
    assert [n for n, _ in sent.sizes] == [7, 3]
    assert all(size <= records.MAX_PUT_BYTES for _, size in sent.sizes)
    assert all(len(d) + 3 <= records.MAX_AGGREGATE_BYTES and len(aggregation.unpack(d)) == 2 for d in sent.datas)
    got = by_connection(kinesis, stream)
    assert [r.seq for r in got["big"]] == list(range(1, 21))
    assert all([r.seq for r in got[cid]] == [1] for cid in cids)


def test_a_connections_frames_of_one_call_share_one_record_within_the_bound_each_keeping_seq_and_fence(kinesis):
    stream = new_stream(kinesis, shards=1)
    sent = Requests(kinesis)
    StreamSink(kinesis, stream).put_many([*interleaved(["a", "b"], 30, fence=7), *frames("c", [5], fence=2)], worker_id="w")
    assert [n for n, _ in sent.sizes] == [3]  # a's 30 frames, b's 30, c's one (plain)
    a, b, c = sent.datas
    assert aggregation.unpack(c) is None and records.decode(c).seq == 5
    assert [records.decode(u.data).seq for u in aggregation.unpack(a)] == list(range(1, 31))
    assert {u.partition_key for u in aggregation.unpack(b)} == {"b"}
    got = by_connection(kinesis, stream)
    assert [(r.seq, r.fence_token) for r in got["a"]] == [(s, 7) for s in range(1, 31)]
    assert [(r.seq, r.fence_token) for r in got["c"]] == [(5, 2)]
    # A smaller bound: more aggregates, each within it, the seqs in order across them.
    sent.datas.clear()
    StreamSink(kinesis, stream, max_aggregate_bytes=1000).put_many(frames("d", range(1, 41)), worker_id="w")
    assert len(sent.datas) > 4 and all(len(d) + 1 <= 1000 for d in sent.datas)
    assert [r.seq for r in by_connection(kinesis, stream)["d"]] == list(range(1, 41))
    sent.datas.clear()
    StreamSink(kinesis, stream, max_aggregate_bytes=None).put_many(frames("e", range(1, 4)), worker_id="w")
    assert [records.decode(d).seq for d in sent.datas] == [1, 2, 3]  # no aggregation: one plain record a frame
    with pytest.raises(ValueError, match="max_aggregate_bytes must be from 1 to 1048576"):
        StreamSink(kinesis, stream, max_aggregate_bytes=2 << 20)


def test_an_entry_that_cannot_be_a_record_raises_invalid_item_before_anything_is_sent(kinesis):
    stream = new_stream(kinesis, shards=1)
    sink = StreamSink(kinesis, stream)
    sent = Requests(kinesis)
    # Inline data is at most MAX_MESSAGE_BYTES; a frame that claims less than it holds
    # would make a record over 1 MiB.
    over = Frame(3, '"' + "z" * (records.MAX_RECORD_BYTES + 1) + '"', 1, data_bytes=10)
    with pytest.raises(InvalidItem, match="a seq 3: a record of .* over Kinesis' 1 MiB"):
        sink.put_many([*frames("a", [1, 2]), ("a", 1, over)], worker_id="w")
    with pytest.raises(InvalidItem, match="a seq 2: UnicodeEncodeError"):
        sink.put_many([*frames("a", [1]), ("a", 1, Frame(2, '"\ud800"', 1, data_bytes=3))], worker_id="w")
    with pytest.raises(InvalidItem, match="partition key"):
        sink.put_many(frames("k" * 257, [1]), worker_id="w")
    assert sent.sizes == [] and not any(read_stream(kinesis, stream).values())
    with pytest.raises(ValueError, match="before its object"):  # large data with no object: the caller's bug
        sink.put_many([("a", 1, Frame(1, '"' + "x" * (MAX_MESSAGE_BYTES + 1) + '"', 1))], worker_id="w")


def test_a_stream_named_by_its_arn_is_written_and_stored_end_is_the_checkpoint_with_no_request(kinesis):
    stream = new_stream(kinesis, shards=1)
    arn = kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamARN"]
    sink = StreamSink(kinesis, arn)
    sent = Requests(kinesis)
    assert sink.stored_end("a", 17) == 17 and sent.sizes == []
    sink.put_many(frames("a", [1, 2]), worker_id="w")
    assert [r.seq for r in by_connection(kinesis, stream)["a"]] == [1, 2]


def test_a_missing_stream_is_raised_as_it_is_not_as_a_transient_fault(kinesis):
    sink = StreamSink(kinesis, f"nope-{uuid.uuid4().hex[:6]}", sleep=lambda _: None)
    with pytest.raises(ClientError) as caught:
        sink.put_many(frames("a", [1]), worker_id="w")
    assert caught.value.response["Error"]["Code"] == "ResourceNotFoundException"
    assert not isinstance(caught.value, TransientError)


def test_past_the_send_deadline_nothing_is_sent(emulator, kinesis):
    stream = new_stream(kinesis, shards=1)
    cfg = WorkerConfig.from_env(env := {
        "AWS_ENDPOINT_URL": emulator.endpoint_url, "AWS_REGION": REGION, "TABLE_NAME": "t", "SESSIONS_TABLE_NAME": "s",
        "QUEUE_URL": "q", "MESSAGES_BUCKET_NAME": "b", "SINK": "kinesis", "MESSAGES_STREAM_NAME": stream,
    })
    aws = Aws(cfg, threads=1)
    try:
        sink = StreamSink(aws.kinesis, stream)
        with send_deadline(clock.now() - 0.001), pytest.raises(SendDeadlinePassed):
            sink.put_many(frames("a", [1, 2]), worker_id="w")
        with send_deadline(clock.now() + 60):
            sink.put_many(frames("a", [3]), worker_id="w")
        assert aws.requests["kinesis.PutRecords"] == 2  # counted per attempt made (the refused one too)
        table_only = Aws(WorkerConfig.from_env({**env, "SINK": "dynamodb", "MESSAGES_TABLE_NAME": "m"}), threads=1)
        table_only.close()
        assert table_only.kinesis is None
    finally:
        aws.close()
    assert [r.seq for r in by_connection(kinesis, stream)["a"]] == [3]


# --- under the emulator's Kinesis faults ------------------------------------------------


def counting() -> tuple[Counter, object]:
    counts: Counter = Counter()
    return counts, lambda name, n: counts.update({name: n})


def test_a_partly_refused_put_resends_each_connections_suffix_so_the_last_deliveries_stay_in_order(faulted):
    url, client, stream = faulted
    counts, count = counting()
    # Aggregates of three frames: each connection's 40 in 14 records, any of them refused.
    sink = StreamSink(client, stream, count=count, sleep=lambda _: None, max_rounds=50, max_aggregate_bytes=450)
    set_faults(url, refuse_records=0.3, seed=11)
    cids = [f"c{i}" for i in range(6)]
    sent = Requests(client)
    sink.put_many(interleaved(cids, 40, fence=4), worker_id="w")  # 240 frames, 84 records, one request a round
    refused = faults(url)["records_refused"]["PutRecords"]
    set_faults(url)
    got = by_connection(client, stream)
    for cid in cids:
        recs = got[cid]
        check_order(recs)
        assert [r.seq for r in last_deliveries(recs)] == list(range(1, 41))
        assert {r.fence_token for r in recs} == {4}  # a resend is the same frame, same fence
    assert sent.sizes[0][0] == 84 and all(len(aggregation.unpack(d) or [d]) in (1, 3) for d in sent.datas)
    assert refused > 0 and counts[names.RECORDS_THROTTLED] == refused
    # Every resend went out again: the refused ones and the later ones of their connections.
    assert sum(n for n, _ in sent.sizes[1:]) == counts[names.RECORDS_RESENT] > refused


def test_a_lost_answer_delivers_the_same_records_again_never_loses_one(faulted):
    url, client, stream = faulted
    sink = StreamSink(client, stream, sleep=lambda _: None, max_rounds=50)
    set_faults(url, ambiguous={"PutRecords": 0.5}, seed=3)
    for n in range(6):
        sink.put_many(interleaved(["a", "b"], 10 * (n + 1))[20 * n :], worker_id="w")
    state = faults(url)
    set_faults(url)
    assert state["ambiguous"].get("PutRecords", 0) > 0
    got = by_connection(client, stream)
    for cid in "ab":
        check_order(got[cid])
        assert sorted({r.seq for r in got[cid]}) == list(range(1, 61))
        assert len(got[cid]) > 60  # an applied request whose answer was lost went again


def test_throttled_puts_are_retried_after_a_backoff_and_counted(faulted):
    url, client, stream = faulted
    counts, count = counting()
    slept: list[float] = []
    sink = StreamSink(client, stream, count=count, sleep=slept.append, max_rounds=50)
    set_faults(url, throttle={"PutRecords": 0.6}, seed=5)
    for n in range(10):
        sink.put_many(interleaved(["a", "b"], 3 * (n + 1))[6 * n :], worker_id="w")
    throttled = faults(url)["throttled"].get("PutRecords", 0)
    set_faults(url)
    got = by_connection(client, stream)
    assert all([r.seq for r in got[c]] == list(range(1, 31)) for c in "ab")  # refused whole: nothing applied twice
    assert throttled > 0 and counts[names.RECORDS_THROTTLED] == 2 * throttled  # a record per connection
    assert len(slept) == throttled and all(0 < s <= 2.0 for s in slept)


def test_an_outage_longer_than_the_rounds_raises_transient_and_a_retry_after_it_delivers(faulted):
    url, client, stream = faulted
    sink = StreamSink(client, stream, sleep=lambda _: None)
    set_faults(url, outage={"kinesis": 60})
    with pytest.raises(TransientError, match="after 8 rounds|InternalFailure"):
        sink.put_many(frames("a", [1, 2]), worker_id="w")
    assert faults(url)["failed"]["PutRecords"] == 8
    set_faults(url)
    sink.put_many(frames("a", [1, 2]), worker_id="w")
    assert [r.seq for r in by_connection(client, stream)["a"]] == [1, 2]


def test_kinesis_faults_are_refused_when_out_of_range_and_dynamodb_settings_leave_kinesis_alone(faulted):
    url, client, stream = faulted
    with pytest.raises(urllib.error.HTTPError) as refused:
        set_faults(url, refuse_records=1.5)
    assert refused.value.code == 400 and "refuse_records must be a number from 0 to 1" in refused.value.read().decode()
    set_faults(url, throttle=1.0, ambiguous=1.0)  # "*": DynamoDB's and SQS', never Kinesis'
    StreamSink(client, stream).put_many(frames("a", [1]), worker_id="w")
    assert faults(url)["passed"] == {"PutRecords": 1}
    set_faults(url)


def test_the_harness_mark_exempts_a_kinesis_client_from_the_faults(faulty):
    url, _ = faulty
    harness = boto3.client(
        "kinesis", endpoint_url=url, region_name=REGION,
        config=Config(user_agent_extra="wsfleet-harness", retries={"mode": "standard", "total_max_attempts": 1}),
    )
    stream = new_stream(harness, shards=1)
    set_faults(url, outage={"kinesis": 60}, refuse_records=1.0)
    try:
        StreamSink(harness, stream).put_many(frames("a", [1, 2]), worker_id="w")
        assert [r.seq for r in by_connection(harness, stream)["a"]] == [1, 2]
    finally:
        set_faults(url)


# --- the writer through the stream, and both sinks ------------------------------------


def stream_writer(sink, counters: Counters, stored: dict, deadline: float, *cids: str) -> Writer:
    writer = Writer(
        messages=sink,
        # No large data in these tests: port 9 refuses, nothing is uploaded.
        objects=ObjectsStore(boto3.client("s3", endpoint_url="http://127.0.0.1:9", region_name=REGION), "none"),
        call=lambda fn, /, **kw: asyncio.to_thread(fn, **kw),
        worker_id="w1",
        counters=counters,
        log=JsonLogger(),
        flush_interval_s=0.02,
    )
    for cid in cids:
        stored[cid] = []
        writer.open(cid, fence_token=2, deadline=lambda: deadline, on_stored=lambda s, n, c=cid: stored[c].append(s))
    return writer


async def until(predicate, timeout: float = 30.0) -> None:
    deadline = clock.now() + timeout
    while not predicate():
        assert clock.now() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_the_writer_reports_a_seq_stored_only_once_the_stream_acknowledged_every_record_up_to_it(faulted):
    url, client, stream = faulted
    counters, stored = Counters(), {}
    # Aggregates of two frames at most: many records to refuse.
    sink = StreamSink(client, stream, count=counters.add, sleep=lambda _: None, max_rounds=50, max_aggregate_bytes=300)
    cids = [f"c{i}" for i in range(4)]
    writer = stream_writer(sink, counters, stored, clock.now() + 600, *cids)
    ahead: list[str] = []

    def check(cid: str, last: int) -> None:
        # What the stream holds of this connection when the writer says "stored to last".
        on_stream = {r.seq for r in by_connection(client, stream).get(cid, [])}
        if not set(range(1, last + 1)) <= on_stream:
            ahead.append(f"{cid}: reported {last}, stream has {sorted(on_stream)}")

    for cid in cids:
        writer._queues[cid].on_stored = lambda s, n, c=cid: (check(c, s), stored[c].append(s))
    set_faults(url, refuse_records=0.1, seed=21)

    async def scenario():
        task = asyncio.create_task(writer.run())
        for seq in range(1, 61):
            for cid in cids:
                await writer.put(cid, Frame(seq, f'{{"s":{seq}}}', 1))
        await until(lambda: all(stored[c] and stored[c][-1] == 60 for c in cids))
        task.cancel()

    asyncio.run(scenario())
    set_faults(url)
    assert ahead == []
    assert writer.items == 240 and writer.batches < 240 / 25  # batches of the stream's size, not the table's
    assert counters.total(names.RECORDS_RESENT) > 0 and counters.total(names.MESSAGES_STORED) == 240
    got = by_connection(client, stream)
    for cid in cids:
        check_order(got[cid])
        assert stored[cid] == sorted(stored[cid])  # the checkpoint never goes back


def test_a_frame_the_stream_cannot_take_becomes_a_skip_marker_and_the_rest_are_delivered(kinesis):
    stream = new_stream(kinesis, shards=1)
    counters, stored = Counters(), {}
    writer = stream_writer(StreamSink(kinesis, stream), counters, stored, clock.now() + 600, "a", "b")

    async def scenario():
        task = asyncio.create_task(writer.run())
        await writer.put("a", Frame(1, "1", 1), Frame(2, '"\ud800"', 1, data_bytes=3), Frame(3, "3", 1))
        await writer.put("b", Frame(1, "1", 1))
        await until(lambda: stored["a"] == [3] and stored["b"] == [1])
        assert not task.done()
        task.cancel()

    asyncio.run(scenario())
    got = by_connection(kinesis, stream)
    assert [(r.seq, r.skipped) for r in got["a"]] == [(1, None), (2, "malformed"), (3, None)]
    assert [r.seq for r in got["b"]] == [1]
    assert counters.total(names.MALFORMED_FRAMES) == 1 and counters.total(names.SKIPPED_FRAMES) == 1


def test_both_sinks_store_each_call_in_the_table_and_on_the_stream_and_resume_from_the_checkpoint(emulator, kinesis):
    env = kinesis_env(emulator.endpoint_url, sink="dynamodb,kinesis", shards=1)
    ddb = boto3.client("dynamodb", endpoint_url=emulator.endpoint_url, region_name=REGION)
    table = MessagesStore(ddb, env["MESSAGES_TABLE_NAME"])
    both = ManySinks(table, StreamSink(kinesis, env["MESSAGES_STREAM_NAME"]))
    assert (both.names, both.max_batch, both.reads_tail) == (("dynamodb", "kinesis"), 25, False)
    both.put_many(frames("a", range(1, 31), fence=5), worker_id="w")
    assert [row["sk"] for row in table.read_all("a")] == list(range(1, 31))
    assert [r.seq for r in by_connection(kinesis, env["MESSAGES_STREAM_NAME"])["a"]] == list(range(1, 31))
    assert table.stored_end("a", 10) == 30 and both.stored_end("a", 10) == 10  # the stream's rule: no tail read


def test_refuse_records_applies_the_others_and_answers_each_refused_record_in_its_place(faulted):
    url, client, stream = faulted
    set_faults(url, refuse_records=0.5, seed=2)
    resp = client.put_records(StreamName=stream, Records=[{"Data": str(i).encode(), "PartitionKey": "k"} for i in range(12)])
    refused_count = faults(url)["records_refused"]["PutRecords"]
    set_faults(url)
    results = resp["Records"]
    refused = [i for i, r in enumerate(results) if "ErrorCode" in r]
    assert len(results) == 12 and resp["FailedRecordCount"] == len(refused) == refused_count and 0 < len(refused) < 12
    assert {results[i]["ErrorCode"] for i in refused} == {"ProvisionedThroughputExceededException"}
    assert all(r["SequenceNumber"] and r["ShardId"] for r in results if "ErrorCode" not in r)
    shards = client.list_shards(StreamName=stream)["Shards"]
    on_stream = []
    for shard in shards:
        it = client.get_shard_iterator(StreamName=stream, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON")
        on_stream += [int(r["Data"]) for r in client.get_records(ShardIterator=it["ShardIterator"])["Records"]]
    assert on_stream == [i for i in range(12) if i not in refused]


def test_a_request_kinesis_refuses_as_invalid_is_invalid_item_for_the_writer_to_split(kinesis):
    from wsfleet.sinks.kinesis import _Rec

    stream = new_stream(kinesis, shards=1)
    sink = StreamSink(kinesis, stream, sleep=lambda _: None)
    # Past our own checks (they would have refused it first): Kinesis' own refusal.
    over = _Rec("a", {"Data": b"x" * (records.MAX_RECORD_BYTES + 1), "PartitionKey": "a"})
    with pytest.raises(InvalidItem, match="ValidationException"):
        sink._put([over])
    assert not any(read_stream(kinesis, stream).values())


def test_the_suffix_rule_holds_across_the_requests_of_one_call_with_markers_and_references_refused(faulted):
    """One connection's records split over two PutRecords of one call (over 500), markers
    and data references among them, a share of every request refused record by record:
    each request is acknowledged whole before the next leaves, so the last delivery of
    every seq stays in seq order across the split, whichever kind of record was refused."""
    url, client, stream = faulted
    requests = Requests(client)
    # One plain record a frame: over 500 of one connection (aggregates: the test above).
    sink = StreamSink(client, stream, sleep=lambda _: None, max_rounds=50, max_aggregate_bytes=None)
    entries, objects, seq = [], {}, 1
    while seq <= 700:
        if seq % 7 == 0:  # a range marker for seq..seq+1
            entries.append(("a", 3, upstream_gap(seq, seq + 1, 1)))
            seq += 2
            continue
        if seq % 5 == 0:  # data in the bucket: the record is a reference
            frame = Frame(seq, json.dumps("x" * (MAX_MESSAGE_BYTES + 1)), 1)
            objects[("a", seq)] = StoredObject(f"a/{seq}", MAX_MESSAGE_BYTES + 3, "0" * 64)
        else:
            frame = Frame(seq, json.dumps({"s": seq}), 1)
        entries.append(("a", 3, frame))
        seq += 1
    set_faults(url, refuse_records=0.2, seed=8)
    sink.put_many(entries, worker_id="w", objects=objects)
    refused = faults(url)["records_refused"]["PutRecords"]
    set_faults(url)
    assert refused > 0 and len(requests.sizes) > 2 and requests.sizes[0][0] == 500
    recs = by_connection(client, stream)["a"]
    check_order(recs)
    last = last_deliveries(recs)
    assert [r.seq for r in last] == [f.seq for _, _, f in entries]
    assert {r.seq for r in last if r.is_marker} == {f.seq for _, _, f in entries if f.is_marker}
    assert {r.seq for r in last if r.data_ref} == {s for _, s in objects}
    sent = Counter(r.seq for r in recs)  # a marker and a reference were among those sent again
    assert any(sent[r.seq] > 1 for r in last if r.is_marker) and any(sent[r.seq] > 1 for r in last if r.data_ref)


def test_a_batch_taken_before_its_connection_was_closed_and_opened_again_is_not_sent_under_the_new_lease(kinesis):
    """The writer took a batch at fence 2; before its pool thread ran, the connection was
    closed (its session lost) and acquired again by this worker at fence 3. The batch's
    send deadline is its own queue's, gone with the close: nothing is sent, not even
    under the new acquisition's live deadline (a fence-2 write after our fence-2 lease
    ended, which the table would store over the new owner's items)."""
    stream = new_stream(kinesis, shards=1)
    aws = Aws(WorkerConfig.from_env({
        "AWS_ENDPOINT_URL": kinesis.meta.endpoint_url, "AWS_REGION": REGION, "TABLE_NAME": "t", "SESSIONS_TABLE_NAME": "s",
        "QUEUE_URL": "q", "MESSAGES_BUCKET_NAME": "b", "SINK": "kinesis", "MESSAGES_STREAM_NAME": stream,
    }), threads=1)  # its client checks the send deadline, as the worker's does
    try:
        counters, stored = Counters(), {}
        writer = stream_writer(StreamSink(aws.kinesis, stream, sleep=lambda _: None), counters, stored, clock.now() + 600, "a")
        batch = [("a", 2, Frame(s, f'{{"s":{s}}}', 1)) for s in (1, 2)]
        writer.close("a")
        writer.open("a", fence_token=3, deadline=lambda: clock.now() + 600, on_stored=lambda s, n: None)

        with pytest.raises(SendDeadlinePassed):
            writer._put(entries=batch, objects={})
        assert not any(read_stream(kinesis, stream).values())
        writer._put(entries=[("a", 3, f) for _, _, f in batch], objects={})  # the new acquisition's own batch goes
    finally:
        aws.close()
    assert [r.fence_token for r in by_connection(kinesis, stream)["a"]] == [3, 3]


def test_with_both_sinks_a_batch_the_table_took_and_the_stream_did_not_is_not_reported_stored(faulted):
    """SINK=dynamodb,kinesis with the stream out: the table has the batch, but the
    writer reports nothing stored (the checkpoint waits for the stream); once the
    stream is back, the batch is sent again to both and only then reported."""
    url, client, _ = faulted
    env = kinesis_env(url, sink="dynamodb,kinesis", shards=1)
    table = MessagesStore(boto3.client("dynamodb", endpoint_url=url, region_name=REGION), env["MESSAGES_TABLE_NAME"])
    both = ManySinks(table, StreamSink(client, env["MESSAGES_STREAM_NAME"], sleep=lambda _: None, max_rounds=2))
    counters, stored = Counters(), {}
    writer = stream_writer(both, counters, stored, clock.now() + 600, "a")
    set_faults(url, outage={"kinesis": 600})

    async def scenario():
        task = asyncio.create_task(writer.run())
        await writer.put("a", *(Frame(s, f'{{"s":{s}}}', 1) for s in range(1, 11)))
        await until(lambda: len(table.read_all("a")) == 10)  # the table took it...
        await until(lambda: faults(url)["failed"].get("PutRecords", 0) >= 4)  # ...the stream refused it, more than once
        assert stored["a"] == []
        set_faults(url)
        await until(lambda: stored["a"] == [10])
        task.cancel()

    asyncio.run(scenario())
    assert [r.seq for r in by_connection(client, env["MESSAGES_STREAM_NAME"])["a"]] == list(range(1, 11))
