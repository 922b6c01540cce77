"""The reference consumer (``wsfleet.consumer``): records put on the emulator's stream as
the worker encodes them (``records.encode``), read back and handed to the real handler
by the local event source (Lambda's Kinesis event source mapping, partial batch
responses included), its objects and state on the emulator's S3 and DynamoDB."""

from __future__ import annotations

import copy
import hashlib
import io
import json
import logging
import sys
import threading
import types
import uuid
from typing import Any, Iterable

import boto3
import pytest
from botocore.config import Config

from wsfleet import aggregation, config, records, schema, settings_spec
from wsfleet.consumer import Consumer, batch, delivery, object_key
from wsfleet.consumer.delivery import Delivered, decide
from wsfleet.consumer.local import LocalEventSource, kinesis_event
from sim.emulator import set_faults
from wsfleet.logs import JsonLogger
from wsfleet.stream import Frame, upstream_gap

pytestmark = pytest.mark.timeout(120)

REGION = "us-east-1"


def frame_record(cid: str, seq: int, fence: int, data: Any = None, *, worker: str = "w1") -> bytes:
    data_json = json.dumps({"v": seq} if data is None else data, separators=(",", ":"), ensure_ascii=False)
    return records.encode(cid, fence, worker, Frame(seq, data_json, 1_700_000_000_000 + seq))


def expected_line(cid: str, seq: int, fence: int, data: Any = None, *, worker: str = "w1") -> dict:
    return {"connection_id": cid, "seq": seq, "fence_token": fence, "worker_id": worker,
            "received_at_ms": 1_700_000_000_000 + seq, "data": {"v": seq} if data is None else data}


class Rig:
    """A stream, the consumer's bucket and table, the consumer, and the event source."""

    def __init__(self, endpoint_url: str, *, shards: int = 2, batch_size: int = 100, ddb: Any = None, s3: Any = None) -> None:
        suffix = uuid.uuid4().hex[:8]
        self.stream, self.bucket, self.table = f"messages-{suffix}", f"frames-{suffix}", f"consumer-{suffix}"
        client = lambda service: boto3.client(service, endpoint_url=endpoint_url, region_name=REGION)  # noqa: E731
        self.kinesis, self.ddb, self.s3 = client("kinesis"), client("dynamodb"), client("s3")
        self.kinesis.create_stream(StreamName=self.stream, ShardCount=shards)
        self.kinesis.get_waiter("stream_exists").wait(StreamName=self.stream, WaiterConfig={"Delay": 0.1, "MaxAttempts": 300})
        self.ddb.create_table(**schema.consumer_table_spec(self.table))
        self.s3.create_bucket(Bucket=self.bucket)
        self.env = {
            settings_spec.CONSUMER_BUCKET_NAME: self.bucket,
            settings_spec.CONSUMER_TABLE_NAME: self.table,
            settings_spec.AWS_REGION: REGION,
            settings_spec.AWS_ENDPOINT_URL: endpoint_url,
        }
        self.logs = io.StringIO()
        self.consumer = Consumer.from_env(self.env, ddb=ddb, s3=s3, logger=JsonLogger(self.logs, component="consumer"))
        self.source = LocalEventSource(self.kinesis, self.stream, self.consumer.handle, batch_size=batch_size)

    def put(self, *entries: tuple[str, bytes]) -> None:
        """(partition key, data) records, in this order, as PutRecords calls of at most 5 MiB."""
        chunk: list[dict] = []
        size = 0
        for key, data in entries:
            if chunk and (size + len(data) + len(key) > records.MAX_PUT_BYTES or len(chunk) == records.MAX_PUT_RECORDS):
                self._put(chunk)
                chunk, size = [], 0
            chunk.append({"PartitionKey": key, "Data": data})
            size += len(data) + len(key)
        if chunk:
            self._put(chunk)

    def _put(self, chunk: list[dict]) -> None:
        resp = self.kinesis.put_records(StreamName=self.stream, Records=chunk)
        assert resp.get("FailedRecordCount", 0) == 0

    def frames(self, cid: str, seqs: Iterable[int], fence: int) -> None:
        self.put(*((cid, frame_record(cid, s, fence)) for s in seqs))

    def keys(self, cid: str) -> list[str]:
        resp = self.s3.list_objects_v2(Bucket=self.bucket, Prefix=f"frames/{cid}/")
        return [o["Key"] for o in resp.get("Contents", [])]

    def delivered(self, cid: str) -> list[dict]:
        """Every line of every object of the connection, in key order."""
        lines: list[dict] = []
        for key in self.keys(cid):
            body = self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read()
            lines += [json.loads(line) for line in body.decode("utf-8").splitlines()]
        return lines

    def state(self, cid: str) -> dict:
        from wsfleet.store import unmarshal

        item = self.ddb.get_item(TableName=self.table, Key={"connection_id": {"S": cid}}, ConsistentRead=True)
        return unmarshal(item.get("Item", {}))

    def log_lines(self, event: str | None = None) -> list[dict]:
        lines = [json.loads(line) for line in self.logs.getvalue().splitlines()]
        return [line for line in lines if event is None or line["event"] == event]

    def total(self, field: str) -> int:
        return sum(line[field] for line in self.log_lines("batch"))


@pytest.fixture
def rig(emulator) -> Rig:
    return Rig(emulator.endpoint_url)


def seqs(lines: list[dict]) -> list[int]:
    return [line["seq"] for line in lines]


# --- deliveries ---------------------------------------------------------------------------------


def test_a_clean_batch_delivers_every_frame_once_in_one_object_per_connection(rig):
    ref = {"data_ref": "s3://msgs/messages/c2/00000000000000000003", "data_bytes": 400_000, "data_sha256": "ab" * 32}
    rig.frames("c1", range(1, 6), fence=1)
    rig.put(
        ("c2", frame_record("c2", 1, 4)),
        ("c2", b'{"connection_id":"c2","seq":2,"fence_token":4,"worker_id":"w1","received_at_ms":5,'
               b'"skipped":"upstream_gap","skip_to":2}'),
        ("c2", json.dumps({"connection_id": "c2", "seq": 3, "fence_token": 4, "worker_id": "w1",
                           "received_at_ms": 6, **ref}).encode()),
        ("c2", b'{"connection_id":"c2","seq":4,"fence_token":4,"worker_id":"w1","received_at_ms":7,'
               b'"skipped":"upstream_gap","skip_to":9}'),
        ("c2", frame_record("c2", 10, 4, data=["é", None, {"deep": [1.5, True]}])),
    )
    rounds = rig.source.drain()
    assert all(not r.failures for r in rounds)

    assert rig.keys("c1") == [object_key("frames/", "c1", 0)] and rig.keys("c1")[0] == "frames/c1/00000000000000000000.jsonl"
    assert rig.delivered("c1") == [expected_line("c1", s, 1) for s in range(1, 6)]
    c2 = rig.delivered("c2")
    assert seqs(c2) == [1, 2, 3, 4, 10]
    assert c2[2] == {"connection_id": "c2", "seq": 3, "fence_token": 4, "worker_id": "w1", "received_at_ms": 6, **ref}
    assert c2[3]["skipped"] == "upstream_gap" and c2[3]["skip_to"] == 9 and "data" not in c2[3]
    assert c2[4]["data"] == ["é", None, {"deep": [1.5, True]}]
    state = rig.state("c2")
    assert (state["delivered_from"], state["delivered_to"], state["fence_token"], state["revision"]) == (1, 10, 4, 1)
    assert "above" not in state
    assert (rig.total("delivered"), rig.total("bad_records"), rig.total("failed_connections")) == (10, 0, 0)


def shard_entries(rig: Rig, shard_id: str = "shardId-000000000000") -> list[dict]:
    iterator = rig.kinesis.get_shard_iterator(StreamName=rig.stream, ShardId=shard_id, ShardIteratorType="TRIM_HORIZON")
    return rig.kinesis.get_records(ShardIterator=iterator["ShardIterator"])["Records"]


def test_lambda_delivering_a_whole_batch_again_writes_nothing_more(emulator):
    rig = Rig(emulator.endpoint_url, shards=1)
    rig.frames("c1", range(1, 4), fence=1)
    rig.source.drain()
    event = kinesis_event("shardId-000000000000", shard_entries(rig), stream_arn="arn", region=REGION)
    assert rig.consumer.handle(event) == {"batchItemFailures": []}
    assert len(rig.keys("c1")) == 1 and seqs(rig.delivered("c1")) == [1, 2, 3]
    assert rig.log_lines("batch")[-1]["resent"] == 3 and rig.state("c1")["revision"] == 1


def test_a_takeover_replay_is_dropped_and_only_the_new_seqs_are_delivered_with_the_new_fence(rig):
    rig.frames("c1", range(1, 6), fence=1)
    rig.frames("c1", range(3, 9), fence=2)  # the new owner resumed from checkpoint 2
    rig.source.drain()
    lines = rig.delivered("c1")
    assert seqs(lines) == list(range(1, 9))
    assert [line["fence_token"] for line in lines] == [1] * 5 + [2] * 3
    assert (rig.total("replayed"), rig.total("resent"), rig.total("delivered")) == (3, 0, 8)
    assert rig.state("c1")["fence_token"] == 2


def test_a_resend_after_a_partial_failure_is_dropped_and_the_refused_seq_still_delivered_out_of_order(emulator):
    rig = Rig(emulator.endpoint_url, batch_size=2)  # state carried from batch to batch
    rig.frames("c1", [1, 2, 4, 5], fence=1)  # 3 refused: it and every later record sent again
    rig.frames("c1", [3, 4, 5], fence=1)
    rig.frames("new", [8, 9, 7, 8, 9], fence=3)  # a connection's first records, the first refused
    rig.source.poll()
    assert (rig.state("c1")["delivered_to"], rig.state("c1").get("above")) == (2, None)
    rig.source.poll()
    assert (rig.state("c1")["delivered_to"], rig.state("c1")["above"]) == (2, [[4, 5]])
    rig.source.drain()

    assert seqs(rig.delivered("c1")) == [1, 2, 4, 5, 3]  # in stream order; 3 was not "delivered already"
    assert seqs(rig.delivered("new")) == [8, 9, 7]
    assert (rig.state("c1")["delivered_to"], rig.state("c1").get("above")) == (5, None)
    assert (rig.state("new")["delivered_from"], rig.state("new")["delivered_to"]) == (7, 9)
    assert (rig.total("resent"), rig.total("replayed"), rig.total("delivered")) == (4, 0, 8)


def test_a_stale_owners_late_record_is_dropped_and_its_successor_delivers_the_seq(rig):
    rig.frames("c1", [1, 2, 3], fence=5)
    rig.frames("c1", [4, 3], fence=4)  # a frozen owner's request landing after its successor's
    rig.frames("c1", [4], fence=5)
    rig.source.drain()
    lines = rig.delivered("c1")
    assert seqs(lines) == [1, 2, 3, 4] and {line["fence_token"] for line in lines} == {5}
    assert (rig.total("stale"), rig.total("delivered")) == (2, 4)


def test_a_marker_is_new_unless_its_whole_range_was_delivered():
    def marker(seq: int, to: int, fence: int = 1) -> records.Record:
        return records.Record("c", seq, fence, "w", 0, False, skipped="upstream_gap", skip_to=to)

    def frame(seq: int, fence: int = 1) -> records.Record:
        return records.Record("c", seq, fence, "w", 0, True, data=seq)

    out = decide(Delivered(), [(r, r.seq) for r in (frame(1), marker(2, 5), marker(3, 4), marker(4, 7), frame(6))])
    assert out.deliver == [1, 2, 4] and out.state.ranges == ((1, 7),)
    assert out.counts == {"delivered": 3, "resent": 2}


def test_a_marker_over_seqs_delivered_already_goes_downstream_only_for_the_seqs_not_delivered(rig):
    """A taker that could not replay writes an upstream_gap marker from its checkpoint on,
    over seqs its predecessor delivered as data: downstream gets those seqs once (the
    data), and the marker only for the seqs no one delivered, in as many parts as the
    holes it spans."""
    def gap(seq: int, to: int, fence: int) -> bytes:
        return records.encode("c1", fence, "w2", upstream_gap(seq, to, 1_700_000_000_000 + seq))

    rig.frames("c1", [1, 2, 3, 4, 5, 7], fence=1)  # 6 is on its way again (a partial failure)
    rig.put(("c1", gap(4, 9, 2)), ("c1", frame_record("c1", 10, 2)))
    rig.source.drain()

    lines = rig.delivered("c1")
    assert [(line["seq"], line.get("skip_to"), line["fence_token"]) for line in lines] == [
        (1, None, 1), (2, None, 1), (3, None, 1), (4, None, 1), (5, None, 1), (7, None, 1),
        (6, None, 2), (8, 9, 2), (10, None, 2),
    ]
    assert all(line["skipped"] == "upstream_gap" for line in lines if line["fence_token"] == 2 and line["seq"] != 10)
    assert rig.state("c1")["delivered_to"] == 10


def test_decide_without_trim_delivers_a_partly_delivered_marker_whole():
    marker = records.Record("c", 2, 1, "w", 0, False, skipped="upstream_gap", skip_to=6)
    data = records.Record("c", 4, 1, "w", 0, True, data=4)
    out = decide(Delivered(), [(data, "d4"), (marker, "m2-6")])
    assert out.deliver == ["d4", "m2-6"]
    trimmed = decide(Delivered(), [(data, "d4"), (marker, "m2-6")], trim=lambda r, a, b: f"m{a}-{b}")
    assert trimmed.deliver == ["d4", "m2-3", "m5-6"] and trimmed.state.ranges == ((2, 6),)


def test_holes_past_the_limit_give_up_the_lowest_and_the_state_stays_small():
    state, abandoned = Delivered(), []
    for seq in range(0, 2 * (delivery.MAX_RANGES + 3), 2):  # every other seq: a hole after each
        state, gone = state.with_range(seq, seq)
        abandoned += [gone] if gone else []
    assert len(state.ranges) == delivery.MAX_RANGES
    assert abandoned == [(1, 1), (3, 3), (5, 5)] and state.ranges[0] == (0, 6)


def test_holes_given_up_are_counted_in_a_metric_not_only_logged(rig):
    """Every other seq of one connection: past the range limit the lowest holes are
    given up, seqs lost downstream; the batch line's SeqsAbandoned says how many."""
    rig.frames("gone", range(0, 2 * (delivery.MAX_RANGES + 2) + 1, 2), fence=1)  # 67 ranges: 3 over the limit
    rig.source.drain()

    (line,) = rig.log_lines("batch")
    assert line["seqs_abandoned"] == line["SeqsAbandoned"] == 3
    assert [(g["from_seq"], g["to_seq"]) for g in rig.log_lines("gap_abandoned")] == [(1, 1), (3, 3), (5, 5)]


# --- failures: the shard goes again, nothing is delivered twice -------------------------------------


def fail_puts(s3: Any, *, key_part: str) -> list[str]:
    """Answer this client's PutObject of keys holding ``key_part`` with a 503 (not sent)."""
    failed: list[str] = []

    def refuse(params: dict, **_: Any) -> Any:
        if key_part in params["url_path"]:  # the serialised request: its path holds the key
            failed.append(params["url_path"])
            error = {"Error": {"Code": "ServiceUnavailable", "Message": "injected"}, "ResponseMetadata": {"HTTPStatusCode": 503}}
            return types.SimpleNamespace(status_code=503), error
        return None

    s3.meta.events.register("before-call.s3.PutObject", refuse, unique_id="fail-puts")
    return failed


def test_an_s3_failure_answers_the_first_failed_record_and_the_shard_goes_again_from_there(emulator):
    s3 = boto3.client("s3", endpoint_url=emulator.endpoint_url, region_name=REGION,
                      config=Config(retries={"mode": "standard", "total_max_attempts": 1}))
    rig = Rig(emulator.endpoint_url, shards=1, s3=s3)
    for seq in (1, 2):
        rig.frames("a", [seq], fence=1)
        rig.frames("b", [seq], fence=1)
        rig.frames("c", [seq], fence=1)
    failed = fail_puts(s3, key_part="frames/b/")
    first = rig.source.poll()
    b_first = next(e for e in shard_entries(rig) if e["PartitionKey"] == "b")
    assert first.failures == [b_first["SequenceNumber"]] and failed
    assert rig.keys("b") == [] and seqs(rig.delivered("a")) == [1, 2] and seqs(rig.delivered("c")) == [1, 2]
    assert rig.log_lines("delivery_failed")[0]["connection_id"] == "b"

    s3.meta.events.unregister("before-call.s3.PutObject", unique_id="fail-puts")
    rig.source.drain()
    for cid in "abc":
        assert seqs(rig.delivered(cid)) == [1, 2] and len(rig.keys(cid)) == 1
    assert rig.total("delivered") == 6 and rig.total("resent") == 3  # a's 2 and c's 1, 2 after b's first


@pytest.mark.parametrize("attempts", [1, 3])
def test_a_state_write_whose_answer_was_lost_delivers_nothing_twice(emulator, attempts):
    """One attempt: the delivery fails, and Lambda's retry finds the seqs delivered. Three:
    botocore's retry fails its condition, and the write is found to be this one."""
    ddb = boto3.client("dynamodb", endpoint_url=emulator.endpoint_url, region_name=REGION,
                       config=Config(retries={"mode": "standard", "total_max_attempts": attempts}))
    rig = Rig(emulator.endpoint_url, ddb=ddb)
    rig.frames("c1", [1, 2, 3], fence=1)
    lost: list[str] = []

    def switch_off(operation: Any, response: Any = None, **_: Any) -> None:
        if not lost and response is not None and response[0].status_code == 500:
            lost.append(operation.name)
            set_faults(emulator.endpoint_url)

    ddb.meta.events.register("needs-retry.dynamodb.PutItem", switch_off)
    set_faults(emulator.endpoint_url, ambiguous={"PutItem": 1.0})
    try:
        rounds = rig.source.drain()
    finally:
        set_faults(emulator.endpoint_url)
    assert lost == ["PutItem"]
    assert bool(rounds[0].failures) == (attempts == 1)
    assert seqs(rig.delivered("c1")) == [1, 2, 3] and len(rig.keys("c1")) == 1
    assert rig.state("c1")["revision"] == 1
    # Unanswered, the write was not counted as delivering: the retry counts them as sent again.
    assert (rig.total("delivered"), rig.total("resent")) == ((0, 3) if attempts == 1 else (3, 0))


class Crash(BaseException):
    """The process dying: nothing in the handler catches it."""


def test_a_crash_between_the_object_and_the_state_write_rewrites_the_same_object_on_the_retry(emulator):
    ddb = boto3.client("dynamodb", endpoint_url=emulator.endpoint_url, region_name=REGION)
    rig = Rig(emulator.endpoint_url, ddb=ddb)
    rig.frames("c1", [1, 2, 3], fence=1)

    def crash(**_: Any) -> None:
        raise Crash()

    ddb.meta.events.register("before-call.dynamodb.PutItem", crash, unique_id="crash")
    with pytest.raises(Crash):
        rig.source.poll()
    assert rig.keys("c1") == ["frames/c1/00000000000000000000.jsonl"] and rig.state("c1") == {}
    ddb.meta.events.unregister("before-call.dynamodb.PutItem", unique_id="crash")

    rig.source.drain()  # Lambda sends the same batch again
    assert rig.keys("c1") == ["frames/c1/00000000000000000000.jsonl"]
    assert seqs(rig.delivered("c1")) == [1, 2, 3] and rig.state("c1")["revision"] == 1


def test_a_second_writer_of_a_connections_state_is_caught_and_the_batch_goes_again(emulator):
    ddb = boto3.client("dynamodb", endpoint_url=emulator.endpoint_url, region_name=REGION)
    rig = Rig(emulator.endpoint_url, ddb=ddb)
    rig.frames("c1", [1, 2], fence=1)
    other = batch.DeliveryStates(rig.ddb, rig.table)

    def meanwhile(**_: Any) -> None:  # another consumer stores its state first, once
        ddb.meta.events.unregister("before-call.dynamodb.PutItem", unique_id="meanwhile")
        assert other.put("c1", Delivered(), Delivered(ranges=((1, 1),), fence_token=1))

    ddb.meta.events.register("before-call.dynamodb.PutItem", meanwhile, unique_id="meanwhile")
    first = rig.source.poll()
    assert first.failures and rig.log_lines("state_conflict")[0]["connection_id"] == "c1"
    assert rig.state("c1")["revision"] == 1  # the other's
    rig.source.drain()
    assert rig.state("c1")["revision"] == 2 and rig.state("c1")["delivered_to"] == 2
    # Nothing lost. Once per seq is what one writer per shard gives: here the object of
    # revision 0 (written before the conflict showed) still holds seq 2 beside revision 1.
    assert rig.keys("c1") == [object_key("frames/", "c1", 0), object_key("frames/", "c1", 1)]
    assert seqs(rig.delivered("c1")) == [1, 2, 2]


def test_with_the_invocation_nearly_out_of_time_no_delivery_starts_and_the_next_invocation_delivers(emulator):
    rig = Rig(emulator.endpoint_url, shards=1)
    rig.frames("c1", [1, 2], fence=1)
    rig.frames("c2", [1], fence=1)
    event = kinesis_event("shardId-000000000000", shard_entries(rig), stream_arn="a", region=REGION)
    late = types.SimpleNamespace(aws_request_id="r1", get_remaining_time_in_millis=lambda: batch.MIN_REMAINING_MS - 1)
    answer = rig.consumer.handle(event, late)
    assert answer == {"batchItemFailures": [{"itemIdentifier": event["Records"][0]["kinesis"]["sequenceNumber"]}]}
    assert rig.keys("c1") == rig.keys("c2") == [] and rig.state("c1") == {}
    in_time = types.SimpleNamespace(aws_request_id="r2", get_remaining_time_in_millis=lambda: 60_000)
    assert rig.consumer.handle(event, in_time) == {"batchItemFailures": []}
    assert seqs(rig.delivered("c1")) == [1, 2] and seqs(rig.delivered("c2")) == [1]


# --- what the stream may hold -----------------------------------------------------------------------


SECRET = "SECRET-FRAME-DATA"


def hostile_records() -> list[tuple[str, bytes]]:
    good = json.loads(frame_record("c1", 9, 1, data=SECRET))
    deep = b'{"connection_id":"c1","seq":9,"fence_token":1,"worker_id":"w","received_at_ms":1,"data":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    variants = [
        b"not json " + SECRET.encode(),
        b"[1, 2]",
        json.dumps({**good, "seq": True}).encode(),
        json.dumps({**good, "seq": -1}).encode(),
        json.dumps({**good, "seq": 2**63}).encode(),
        json.dumps({**good, "fence_token": "1"}).encode(),
        json.dumps({**good, "fence_token": -3}).encode(),
        json.dumps({k: v for k, v in good.items() if k != "worker_id"}).encode(),
        json.dumps({**good, "data_ref": "s3://x/y", "data_sha256": "0"}).encode(),
        json.dumps({k: v for k, v in good.items() if k != "data"} | {"skipped": "bored"}).encode(),
        json.dumps({k: v for k, v in good.items() if k != "data"} | {"skipped": "upstream_gap", "skip_to": 3}).encode(),
        json.dumps({**good, "connection_id": "not an id"}).encode(),
        json.dumps({**good, "connection_id": "c2"}).encode(),  # not its partition key
        b'{"connection_id":"c1","seq":9,"fence_token":1,"worker_id":"w","received_at_ms":1,"data":NaN}',
        b'{"connection_id":"c1","seq":9,"fence_token":1,"worker_id":"w","received_at_ms":1,"data":"\\ud800"}',
        deep,
        b"\xff\xfe" + SECRET.encode(),
    ]
    return [("c1", v) for v in variants]


def test_hostile_records_are_logged_and_counted_never_a_batch_failure_and_never_their_data(rig):
    rig.frames("c1", [1], fence=1)
    rig.put(*hostile_records())
    rig.frames("c1", [2], fence=1)
    rounds = rig.source.drain()
    assert all(not r.failures for r in rounds)
    assert seqs(rig.delivered("c1")) == [1, 2]
    bad = rig.log_lines("bad_record")
    assert len(bad) == len(hostile_records()) == rig.total("bad_records")
    assert all(line["partition_key"] == "c1" and line["sequence_number"] and line["detail"] for line in bad)
    assert SECRET not in rig.logs.getvalue()
    assert rig.log_lines("batch")[0]["BadRecords"] == len(bad)  # the embedded metric


def test_an_aggregates_records_are_each_delivered_and_a_bad_one_among_them_is_counted_alone(rig):
    good = [frame_record("c1", s, 1) for s in (1, 2, 3)]
    rig.put(("c1", aggregation.pack("c1", [good[0], b"not json", good[1]])), ("c1", good[2]))
    wrong_key = aggregation.pack("c1", [frame_record("c1", 4, 1)])
    damaged = aggregation.MAGIC + b"\x1a\x05\x08" + hashlib.md5(b"\x1a\x05\x08").digest()
    rig.put(("c2", wrong_key), ("c1", damaged), ("c1", aggregation.pack("c1", [frame_record("c1", 4, 1)])))
    assert all(not r.failures for r in rig.source.drain())
    assert seqs(rig.delivered("c1")) == [1, 2, 3, 4]
    assert [line["detail"] for line in rig.log_lines("bad_record")] == [
        "not JSON: Expecting value: line 1 column 1 (char 0)",
        "an aggregate's record under another partition key than the aggregate's",
        "an aggregate that does not parse: AggregatedRecord: field 3 runs past the end",
    ]
    assert (rig.total("records"), rig.total("user_records"), rig.total("bad_records")) == (5, 7, 3)


def test_a_failed_delivery_in_an_aggregate_names_its_sequence_number_and_the_retry_delivers_the_rest(emulator):
    s3 = boto3.client("s3", endpoint_url=emulator.endpoint_url, region_name=REGION,
                      config=Config(retries={"mode": "standard", "total_max_attempts": 1}))
    rig = Rig(emulator.endpoint_url, shards=1, s3=s3)
    rig.put(*((cid, aggregation.pack(cid, [frame_record(cid, s, 1) for s in (1, 2, 3)])) for cid in "ab"))
    failed = fail_puts(s3, key_part="frames/b/")
    first = rig.source.poll()
    assert first.failures == [shard_entries(rig)[1]["SequenceNumber"]] and failed
    s3.meta.events.unregister("before-call.s3.PutObject", unique_id="fail-puts")
    rig.source.drain()
    assert seqs(rig.delivered("a")) == seqs(rig.delivered("b")) == [1, 2, 3]
    assert rig.total("delivered") == 6


@pytest.mark.parametrize(
    "event",
    [None, [], {}, {"Records": "x"}, {"Records": [None, {"kinesis": None}, {"kinesis": {"sequenceNumber": "1", "data": "%%%"}}]}],
)
def test_a_malformed_event_is_answered_without_a_failure_or_a_traceback(rig, event):
    assert rig.consumer.handle(event) == {"batchItemFailures": []}
    assert "traceback" not in rig.logs.getvalue()


def test_a_batch_of_5_mib_is_one_object_per_connection(emulator):
    rig = Rig(emulator.endpoint_url, shards=1, batch_size=10_000)
    text = "ü" * 60_000  # 120 KB of UTF-8 per frame
    rig.put(*(((cid, frame_record(cid, s, 1, data={"t": text, "s": s})) for s in range(1, 23) for cid in ("big", "big2"))))
    rounds = rig.source.drain()
    assert rounds[0].batches == 1 and rounds[0].records == 44 and not rounds[0].failures
    for cid in ("big", "big2"):
        (key,) = rig.keys(cid)
        assert rig.s3.head_object(Bucket=rig.bucket, Key=key)["ContentLength"] > 2.5 * 1024 * 1024
        assert [line["data"] for line in rig.delivered(cid)] == [{"t": text, "s": s} for s in range(1, 23)]


# --- configuration ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "env, named",
    [
        ({settings_spec.CONSUMER_TABLE_NAME: "t", settings_spec.AWS_REGION: REGION}, settings_spec.CONSUMER_BUCKET_NAME),
        ({settings_spec.CONSUMER_BUCKET_NAME: "b", settings_spec.AWS_REGION: REGION}, settings_spec.CONSUMER_TABLE_NAME),
        ({settings_spec.CONSUMER_BUCKET_NAME: "b", settings_spec.CONSUMER_TABLE_NAME: "t"}, settings_spec.AWS_REGION),
        ({settings_spec.CONSUMER_BUCKET_NAME: "b", settings_spec.CONSUMER_TABLE_NAME: "t", settings_spec.AWS_REGION: REGION,
          settings_spec.CONSUMER_PREFIX: "/abs/"}, settings_spec.CONSUMER_PREFIX),
        ({settings_spec.CONSUMER_BUCKET_NAME: "b", settings_spec.CONSUMER_TABLE_NAME: "t", settings_spec.AWS_REGION: REGION,
          settings_spec.CONSUMER_PREFIX: "a\nb"}, settings_spec.CONSUMER_PREFIX),
    ],
)
def test_a_bad_setting_is_an_error_naming_the_variable(env, named):
    with pytest.raises(settings_spec.ConfigError, match=named):
        config.ConsumerConfig.from_env(env)


def test_the_prefix_defaults_to_frames_and_is_taken_as_given():
    env = {settings_spec.CONSUMER_BUCKET_NAME: "b", settings_spec.CONSUMER_TABLE_NAME: "t", settings_spec.AWS_REGION: REGION}
    assert config.ConsumerConfig.from_env(env).prefix == "frames/"
    assert config.ConsumerConfig.from_env({**env, settings_spec.CONSUMER_PREFIX: "out/v1/"}).prefix == "out/v1/"


def test_the_lambda_entry_point_with_a_bad_setting_fails_the_whole_batch_and_logs_one_line(monkeypatch, capsys):
    # The entry point routes this process's logging as a Lambda's: put it all back after.
    root = logging.getLogger()
    for owner, name in ((root, "handlers"), (root, "level"), (sys, "excepthook"), (sys, "unraisablehook"),
                        (threading, "excepthook")):
        monkeypatch.setattr(owner, name, copy.copy(getattr(owner, name)))
    monkeypatch.setattr(batch, "_consumer", None)
    monkeypatch.delenv(settings_spec.CONSUMER_BUCKET_NAME, raising=False)
    monkeypatch.setenv(settings_spec.CONSUMER_TABLE_NAME, "t")
    event = {"Records": [{"kinesis": {"sequenceNumber": "49", "partitionKey": "c1", "data": "e30="}}]}
    assert batch.handler(event, None) == {"batchItemFailures": [{"itemIdentifier": "49"}]}
    (line,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert line["event"] == "config_invalid" and settings_spec.CONSUMER_BUCKET_NAME in line["detail"]


# --- with the worker's own sink ---------------------------------------------------------------------


def test_what_the_workers_sink_puts_through_partial_failures_lost_answers_and_a_takeover_is_delivered_once(emulator):
    """The worker's StreamSink writes through refused records (resent with their
    connection's later ones), PutRecords answers lost (sent again whole), a takeover
    from a checkpoint (a higher fence) and the old owner's late request (a lower one):
    downstream, every seq of every connection once, with the data it was sent with."""
    from wsfleet.store.base import TransientError
    from wsfleet.sinks.kinesis import StreamSink

    rig = Rig(emulator.endpoint_url)
    # One attempt per request: a lost answer comes back to the writer, which sends the call
    # again (botocore's own retries would only add their backoff's sleeps).
    once = boto3.client("kinesis", endpoint_url=emulator.endpoint_url, region_name=REGION,
                        config=Config(retries={"mode": "standard", "total_max_attempts": 1}))
    sink = StreamSink(once, rig.stream, sleep=lambda _: None)
    cids = [f"feed-{n}" for n in range(3)]

    def put(fence: int, seqs: Iterable[int], worker: str) -> None:
        frames = [(cid, fence, Frame(s, json.dumps({"v": s}), 1_700_000_000_000 + s)) for s in seqs for cid in cids]
        for start in range(0, len(frames), 40):  # the writer's batches
            while True:  # the writer sends a whole call again after TransientError
                try:
                    sink.put_many(frames[start : start + 40], worker_id=worker)
                    break
                except TransientError:
                    pass

    set_faults(emulator.endpoint_url, refuse_records=0.3, ambiguous={"PutRecords": 0.2}, seed=21)
    try:
        put(1, range(1, 31), "w-old")
        put(2, range(16, 41), "w-new")  # resumed from the old owner's checkpoint, 15
        put(1, range(31, 34), "w-old")  # the old owner's request, frozen past its lease, lands late
    finally:
        set_faults(emulator.endpoint_url)
    entries = [e for s in rig.kinesis.list_shards(StreamName=rig.stream)["Shards"] for e in shard_entries(rig, s["ShardId"])]
    on_stream = sum(len(aggregation.user_records(e["Data"], e["PartitionKey"])) for e in entries)
    assert len(entries) < on_stream / 5  # a connection's frames of a call share one Kinesis record
    rig.source.drain()

    for cid in cids:
        lines = rig.delivered(cid)
        assert sorted(seqs(lines)) == list(range(1, 41)), cid
        assert all(line["data"] == {"v": line["seq"]} for line in lines)
        assert all(line["fence_token"] == 2 for line in lines if line["seq"] > 30)
    assert rig.total("delivered") == 3 * 40
    assert rig.total("replayed") >= 3 * 15 and rig.total("stale") >= 3 * 3
    assert rig.total("delivered") + rig.total("replayed") + rig.total("resent") + rig.total("stale") == on_stream
    assert on_stream > 3 * (30 + 25 + 3)  # the faults did send some records more than once


def test_the_consumers_metrics_carry_the_namespace_and_service_name_it_is_given():
    from wsfleet.config import ConsumerConfig
    from wsfleet.consumer.batch import embedded_metrics

    env = {"CONSUMER_BUCKET_NAME": "b", "CONSUMER_TABLE_NAME": "t", "AWS_REGION": "eu-west-1"}
    assert ConsumerConfig.from_env(env).service_name == "wsfleet-consumer"
    config = ConsumerConfig.from_env({**env, "SERVICE_NAME": "wsfleet-dev-consumer", "METRICS_NAMESPACE": "Ours"})
    line = embedded_metrics({}, failed=0, namespace=config.metrics_namespace, service_name=config.service_name)
    assert line["ServiceName"] == "wsfleet-dev-consumer"
    assert line["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "Ours"
