"""The emulator's Kinesis is atomic: moto's PutRecords, called concurrently, can give two
records one sequence number and lose one of them; the emulator serialises Kinesis
requests, so that every record put is read back once, each with a sequence number of
its own."""

from __future__ import annotations

import sys
import threading
import uuid

import boto3

from tests.conftest import REGION

THREADS, CALLS, RECORDS = 8, 6, 50


def test_concurrent_put_records_lose_nothing_and_never_share_a_sequence_number(emulator):
    kinesis = boto3.client("kinesis", endpoint_url=emulator.endpoint_url, region_name=REGION)
    stream = f"race-{uuid.uuid4().hex[:8]}"
    kinesis.create_stream(StreamName=stream, ShardCount=1)
    kinesis.get_waiter("stream_exists").wait(StreamName=stream, WaiterConfig={"Delay": 0.1, "MaxAttempts": 100})
    start = threading.Barrier(THREADS)
    failures: list[BaseException] = []

    def put(t: int) -> None:
        try:
            client = boto3.client("kinesis", endpoint_url=emulator.endpoint_url, region_name=REGION)
            start.wait(timeout=30)
            for c in range(CALLS):
                records = [{"Data": f"{t}-{c}-{r}".encode(), "PartitionKey": f"p{t}"} for r in range(RECORDS)]
                resp = client.put_records(StreamName=stream, Records=records)
                assert resp["FailedRecordCount"] == 0
        except BaseException as exc:  # noqa: BLE001 - reported by the test's thread
            failures.append(exc)

    threads = [threading.Thread(target=put, args=(t,)) for t in range(THREADS)]
    # Switch threads as often as the interpreter can: moto's window between reading the
    # last sequence number and storing the next is a few bytecodes wide, and the test's
    # emulator answers from threads of this process.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=120)
    finally:
        sys.setswitchinterval(interval)
    assert not failures, failures

    shard = kinesis.list_shards(StreamName=stream)["Shards"][0]["ShardId"]
    iterator = kinesis.get_shard_iterator(StreamName=stream, ShardId=shard, ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
    data, numbers = [], []
    while iterator:
        page = kinesis.get_records(ShardIterator=iterator, Limit=10_000)
        data += [r["Data"].decode() for r in page["Records"]]
        numbers += [r["SequenceNumber"] for r in page["Records"]]
        if not page["Records"]:
            break
        iterator = page.get("NextShardIterator")

    expected = {f"{t}-{c}-{r}" for t in range(THREADS) for c in range(CALLS) for r in range(RECORDS)}
    assert len(data) == len(expected) and set(data) == expected
    assert len(set(numbers)) == len(numbers)
    # Each thread's records are in the shard in the order it put them.
    for t in range(THREADS):
        mine = [d for d in data if d.startswith(f"{t}-")]
        assert mine == [f"{t}-{c}-{r}" for c in range(CALLS) for r in range(RECORDS)]


def test_a_shards_first_and_last_sequence_numbers_are_read_without_copying_its_keys():
    """moto copies every key of a shard per record put (quadratic in the shard); the
    emulator's patch reads the two ends of the ordered dict instead, with the same answers."""
    from collections import OrderedDict
    from types import SimpleNamespace

    from moto.kinesis.models import Shard

    from sim.moto_patches import _kinesis_sequence_ends_in_constant_time

    class NoCopies(OrderedDict):
        def keys(self):  # what moto's own version copies
            raise AssertionError("the shard's keys were copied")

    _kinesis_sequence_ends_in_constant_time()
    shard = SimpleNamespace(records=NoCopies((n, None) for n in range(1, 30_001)))
    assert (Shard.get_min_sequence_number(shard), Shard.get_max_sequence_number(shard)) == (1, 30_000)
    empty = SimpleNamespace(records=NoCopies())
    assert (Shard.get_min_sequence_number(empty), Shard.get_max_sequence_number(empty)) == (0, 0)
