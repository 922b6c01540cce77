"""The Firehose sink (sinks.firehose.DeliverySink) against the emulator's delivery
stream (moto writes each PutRecordBatch to S3 as one object): lines that decode to what
was put, the frames of a call (each connection's together) packed into records within Firehose's limits,
requests within its limits, and under the emulator's Firehose faults (records refused
one by one, lost answers, throttling, an outage) every line delivered, again only with
the same fence, only the refused records sent again."""

from __future__ import annotations

import asyncio
import gzip
import json
import uuid
import zlib
from collections import Counter

import boto3
import pytest

from bench.stream_bill import delivery_bill
from tests.conftest import own_emulator
from wsfleet import clock, records, schema
from wsfleet import metrics_names as names
from wsfleet.logs import JsonLogger
from wsfleet.metrics import Counters
from wsfleet.sinks import DeliverySink, InvalidItem, ManySinks, MessagesStore, ObjectsStore, StoredObject
from wsfleet.sinks.firehose import MAX_PUT_BYTES, MAX_RECORD_BYTES, connection_bucket
from wsfleet.store import TransientError
from wsfleet.stream import MAX_MESSAGE_BYTES, Frame, Problem, upstream_gap
from wsfleet.worker.writer import Writer
from sim.delivery_audit import delivery_objects, read_delivery
from sim.emulator import faults, set_faults

REGION = "us-east-1"


@pytest.fixture(scope="module")
def faulty():
    """An emulator of this module's own (its faults reach no other test): (url, a
    Firehose client that tries each request once, an S3 client, a DynamoDB client)."""
    for url, _, client in own_emulator("firehose"):
        kw = dict(endpoint_url=url, region_name=REGION, aws_access_key_id="testing", aws_secret_access_key="testing")
        yield url, client, boto3.client("s3", **kw), boto3.client("dynamodb", **kw)


@pytest.fixture
def delivery(faulty):
    """(url, firehose, s3, a new delivery stream's name); faults off before and after."""
    url, firehose, s3, _ = faulty
    name = f"fh-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=name)
    firehose.create_delivery_stream(
        DeliveryStreamName=name, DeliveryStreamType="DirectPut",
        ExtendedS3DestinationConfiguration={"RoleARN": "arn:aws:iam::123456789012:role/r", "BucketARN": f"arn:aws:s3:::{name}",
                                            "Prefix": "frames/"},
    )
    set_faults(url)
    yield url, firehose, s3, name
    set_faults(url)


class Requests:
    """PutRecordBatch requests a client sent: records and bytes each."""

    def __init__(self, client) -> None:
        self.sizes: list[tuple[int, int]] = []
        self.datas: list[bytes] = []
        client.meta.events.register("provide-client-params.firehose.PutRecordBatch", self._seen)

    def _seen(self, params, **_):
        recs = params["Records"]
        self.sizes.append((len(recs), sum(len(r["Data"]) for r in recs)))
        self.datas += [r["Data"] for r in recs]


def interleaved(cids, n: int, fence: int = 1, pad: int = 0) -> list[tuple[str, int, Frame]]:
    return [(c, fence, Frame(s, json.dumps({"c": c, "s": s, "p": "x" * pad}), 1_700_000_000_000 + s))
            for s in range(1, n + 1) for c in cids]


def by_connection(firehose, s3, name) -> dict[str, list[records.Record]]:
    out: dict[str, list[records.Record]] = {}
    for d in read_delivery(firehose, s3, name):
        assert d.record is not None, d.error
        out.setdefault(d.record.connection_id, []).append(d.record)
    return out


def counting() -> tuple[Counter, object]:
    counts: Counter = Counter()
    return counts, lambda name, n: counts.update({name: n})


def test_lines_decode_to_what_was_put_with_their_connection_bucket_a_connections_frames_sharing_a_record(delivery):
    _, firehose, s3, name = delivery
    sink = DeliverySink(firehose, name)
    assert (sink.names, sink.max_batch, sink.reads_tail) == (("firehose",), 500, False)
    big = StoredObject("s3://b/k", 400_000, "ab" * 32)
    hostile = 'x"},"seq":0,"fence_token":99,"y":{"'
    entries = [
        *interleaved(["a", "b", hostile, "é-ü:☃"], 10, fence=3),
        ("a", 3, Frame(11, None, 5, Problem.INVALID_UTF8, data_bytes=7)),
        ("a", 3, upstream_gap(12, 30, 6)),
        ("b", 3, Frame(11, '"' + "x" * (MAX_MESSAGE_BYTES + 10) + '"', 7)),
    ]
    sent = Requests(firehose)
    sink.put_many(entries, worker_id="w-1", objects={("b", 11): big})
    # One record for the whole call: every connection's lines, each's together, newline-terminated.
    assert sent.sizes[0][0] == 1 and sent.datas[0].endswith(b"\n") and sent.datas[0].count(b"\n") == len(entries)
    cids = [json.loads(line)["connection_id"] for line in sent.datas[0].splitlines()]
    assert cids == sorted(cids, key=[c for c, _, _ in entries].index)
    got = by_connection(firehose, s3, name)
    assert set(got) == {"a", "b", hostile, "é-ü:☃"}
    for cid, recs in got.items():
        assert [r.seq for r in recs] == list(range(1, {"a": 13, "b": 12}.get(cid, 11)))
        assert all(r.fence_token == 3 and r.worker_id == "w-1" for r in recs)
        assert all(r.data == {"c": cid, "s": r.seq, "p": ""} for r in recs[:10])
    a, gap, b = got["a"][10], got["a"][11], got["b"][10]
    assert (a.skipped, a.data_bytes) == ("malformed", 7) and (gap.skipped, gap.skip_to) == ("upstream_gap", 30)
    assert (b.data_ref, b.data_bytes, b.data_sha256) == ("s3://b/k", 400_000, "ab" * 32)  # large data: its pointer
    line = json.loads(sent.datas[0].splitlines()[0])
    assert line["connection_bucket"] == connection_bucket("a") == zlib.crc32(b"a") % 64


def test_a_call_is_split_in_requests_of_at_most_500_records_and_4_mib_records_at_most_1000_kib(delivery):
    _, firehose, s3, name = delivery
    sent = Requests(firehose)
    # A record of 200 bytes holds one of these lines (~155 bytes): 600 lines, 600 records.
    DeliverySink(firehose, name, max_record_bytes=200).put_many(interleaved([f"c{i}" for i in range(600)], 1), worker_id="w")
    assert [n for n, _ in sent.sizes] == [500, 100]
    sent.sizes.clear()
    sink = DeliverySink(firehose, name)
    sink.put_many(interleaved(["a", "b"], 30, pad=300_000), worker_id="w")  # 18 MB of lines
    assert all(n <= 500 and size <= MAX_PUT_BYTES for n, size in sent.sizes) and len(sent.sizes) >= 5
    assert all(len(d) <= MAX_RECORD_BYTES for d in sent.datas)
    got = by_connection(firehose, s3, name)
    assert [r.seq for r in got["a"]] == list(range(1, 31)) and [r.seq for r in got["b"]] == list(range(1, 31))


def test_a_line_over_the_record_limit_is_invalid_before_anything_is_sent_and_a_missing_stream_is_raised(delivery):
    _, firehose, _, name = delivery
    sent = Requests(firehose)
    with pytest.raises(InvalidItem, match="a seq 2: a line of"):
        DeliverySink(firehose, name, max_record_bytes=200).put_many(
            [("a", 1, Frame(1, "1", 1)), ("a", 1, Frame(2, json.dumps("x" * 200), 1))], worker_id="w"
        )
    with pytest.raises(InvalidItem, match="UnicodeEncodeError"):
        DeliverySink(firehose, name).put_many([("a", 1, Frame(1, '"\ud800"', 1, data_bytes=3))], worker_id="w")
    assert sent.sizes == []
    with pytest.raises(Exception, match="ResourceNotFound") as missing:
        DeliverySink(firehose, "no-such-stream").put_many(interleaved(["a"], 1), worker_id="w")
    assert not isinstance(missing.value, TransientError)  # the writer's supervisor backs off, as for a table


def test_refused_records_alone_are_sent_again_until_every_line_is_delivered_and_counted(delivery):
    url, firehose, s3, name = delivery
    counts, count = counting()
    sink = DeliverySink(firehose, name, count=count, sleep=lambda _: None, max_rounds=50, max_record_bytes=400)
    set_faults(url, refuse_records=0.3, seed=11)
    sent = Requests(firehose)
    sink.put_many(interleaved([f"c{i}" for i in range(6)], 20, fence=4), worker_id="w")  # 120 frames, 60 records
    refused = faults(url)["records_refused"]["PutRecordBatch"]
    set_faults(url)
    got = by_connection(firehose, s3, name)
    for i in range(6):
        assert [r.seq for r in got[f"c{i}"]] == list(range(1, 21))  # each exactly once: only the refused went again
    assert sent.sizes[0][0] == 60 and refused > 0
    assert sum(n for n, _ in sent.sizes[1:]) == counts[names.RECORDS_RESENT] == counts[names.RECORDS_THROTTLED] == refused


def test_a_lost_answer_delivers_the_same_lines_again_with_the_same_fence_never_loses_one(delivery):
    url, firehose, s3, name = delivery
    sink = DeliverySink(firehose, name, sleep=lambda _: None, max_rounds=50)
    set_faults(url, ambiguous={"PutRecordBatch": 0.5}, seed=3)
    for n in range(6):
        sink.put_many(interleaved(["a", "b"], 10 * (n + 1))[20 * n :], worker_id="w")
    lost = faults(url)["ambiguous"].get("PutRecordBatch", 0)
    set_faults(url)
    got = by_connection(firehose, s3, name)
    assert lost > 0
    for cid in "ab":
        assert sorted({r.seq for r in got[cid]}) == list(range(1, 61)) and len(got[cid]) > 60
        assert {r.fence_token for r in got[cid]} == {1}


def test_throttled_calls_back_off_and_an_outage_past_the_rounds_raises_transient_then_a_retry_delivers(delivery):
    url, firehose, s3, name = delivery
    counts, count = counting()
    slept: list[float] = []
    sink = DeliverySink(firehose, name, count=count, sleep=slept.append, max_rounds=50)
    set_faults(url, throttle={"PutRecordBatch": 0.6}, seed=1)
    for n in range(5):
        sink.put_many(interleaved(["a", "b"], 3 * (n + 1))[6 * n :], worker_id="w")
    throttled = faults(url)["throttled"].get("PutRecordBatch", 0)
    # each call is one record (both connections' lines): a throttled call counts its one record
    assert throttled > 0 and counts[names.RECORDS_THROTTLED] == throttled and len(slept) == throttled
    assert all(0 < s <= 2.0 for s in slept)
    set_faults(url, outage={"firehose": 60})
    with pytest.raises(TransientError, match="after 8 rounds"):
        DeliverySink(firehose, name, sleep=lambda _: None).put_many(interleaved(["a"], 16)[15:], worker_id="w")
    assert faults(url)["failed"]["PutRecordBatch"] == 8
    set_faults(url)
    sink.put_many(interleaved(["a"], 16)[15:], worker_id="w")
    got = by_connection(firehose, s3, name)
    assert [r.seq for r in got["a"]] == list(range(1, 17)) and [r.seq for r in got["b"]] == list(range(1, 16))


def test_the_writer_reports_a_seq_stored_only_once_the_delivery_stream_acknowledged_it(delivery):
    url, firehose, s3, name = delivery
    counters, stored, ahead = Counters(), {}, []
    sink = DeliverySink(firehose, name, count=counters.add, sleep=lambda _: None, max_rounds=50, max_record_bytes=300)
    writer = Writer(
        messages=sink,
        objects=ObjectsStore(boto3.client("s3", endpoint_url="http://127.0.0.1:9", region_name=REGION), "none"),
        call=lambda fn, /, **kw: asyncio.to_thread(fn, **kw), worker_id="w1", counters=counters, log=JsonLogger(),
        flush_interval_s=0.02,
    )

    def on_stored(cid: str, last: int) -> None:
        delivered = {r.seq for r in by_connection(firehose, s3, name).get(cid, [])}
        if not set(range(1, last + 1)) <= delivered:
            ahead.append(f"{cid}: reported {last}, S3 has {sorted(delivered)}")
        stored[cid].append(last)

    cids = [f"c{i}" for i in range(3)]
    for cid in cids:
        stored[cid] = []
        writer.open(cid, fence_token=2, deadline=lambda: clock.now() + 600, on_stored=lambda s, n, c=cid: on_stored(c, s))
    set_faults(url, refuse_records=0.2, seed=21)

    async def scenario():
        task = asyncio.create_task(writer.run())
        for seq in range(1, 31):
            for cid in cids:
                await writer.put(cid, Frame(seq, f'{{"s":{seq}}}', 1))
        deadline = clock.now() + 60
        while not all(stored[c] and stored[c][-1] == 30 for c in cids):
            assert clock.now() < deadline, "timed out"
            await asyncio.sleep(0.01)
        task.cancel()

    asyncio.run(scenario())
    set_faults(url)
    assert ahead == [] and all(stored[c] == sorted(stored[c]) for c in cids)
    assert counters.total(names.RECORDS_RESENT) > 0 and counters.total(names.MESSAGES_STORED) == 90


def test_with_the_table_too_each_call_is_in_both_and_a_new_owner_resumes_from_the_checkpoint(faulty, delivery):
    _, firehose, s3, name = delivery
    ddb = faulty[3]
    table_name = f"m-{uuid.uuid4().hex[:8]}"
    ddb.create_table(**schema.messages_table_spec(table_name))
    table = MessagesStore(ddb, table_name)
    both = ManySinks(table, DeliverySink(firehose, name))
    assert (both.names, both.max_batch, both.reads_tail) == (("dynamodb", "firehose"), 25, False)
    both.put_many([("a", 5, Frame(s, "1", 1)) for s in range(1, 31)], worker_id="w")
    assert [row["sk"] for row in table.read_all("a")] == list(range(1, 31))
    assert [r.seq for r in by_connection(firehose, s3, name)["a"]] == list(range(1, 31))
    assert both.stored_end("a", 10) == 10


def test_the_benchmarks_bill_counts_the_delivered_lines_and_how_much_smaller_gzip_makes_them(delivery):
    _, firehose, s3, name = delivery
    sink = DeliverySink(firehose, name)
    for n in (5, 7):  # two calls: two objects in the emulator, one record each
        sink.put_many(interleaved(["a", "b", "c"], n, pad=150), worker_id="w-1")
    bill = delivery_bill(firehose, s3, name)
    lines = b"".join(body for _, body in delivery_objects(firehose, s3, name))
    assert (bill["frames"], bill["firehose_records"]) == (36, 2)
    assert bill["bytes_per_message"] == pytest.approx(len(lines) / 36)
    assert bill["gzip_ratio"] == pytest.approx(len(lines) / len(gzip.compress(lines, 6)))
    assert bill["gzip_ratio"] > 3  # "x" * 150 and the repeated fields
