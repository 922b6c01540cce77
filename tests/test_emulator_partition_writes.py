"""Each partition's write limit in the emulator (sim.emulator_partitions): the items of a
BatchWriteItem over their partition's rate come back unprocessed, a request none of whose
items fits is refused as DynamoDB refuses it, other partitions and operations go by, and
the worker's store writes everything through it in the end."""

from __future__ import annotations

import io
import json
import uuid

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from sim.emulator import Emulator, create_resources
from sim.emulator_partitions import THROUGHPUT_EXCEEDED, PartitionWrites
from wsfleet import schema
from wsfleet.sinks.messages import MessagesStore
from wsfleet.store.base import TransientError
from wsfleet.stream import Frame

TARGET = "DynamoDB_20120810."


class Inner:
    """The application behind the limit: what it was asked, answering nothing unprocessed."""

    def __init__(self) -> None:
        self.seen: list[dict] = []

    def __call__(self, environ, start_response):
        self.seen.append(json.loads(environ["wsgi.input"].read(int(environ["CONTENT_LENGTH"]))))
        start_response("200 OK", [("Content-Type", "application/json")])
        return [b'{"UnprocessedItems": {}}']


def put(pk: str, sk: int) -> dict:
    return {"PutRequest": {"Item": {"pk": {"S": pk}, "sk": {"N": str(sk)}}}}


def call(app, op: str, body: dict) -> tuple[str, dict]:
    raw = json.dumps(body).encode()
    environ = {"HTTP_X_AMZ_TARGET": TARGET + op, "CONTENT_LENGTH": str(len(raw)), "wsgi.input": io.BytesIO(raw)}
    status: list[str] = []
    out = b"".join(app(environ, lambda s, h, *e: status.append(s)))
    return status[0], json.loads(out)


def batch(*requests: dict) -> dict:
    return {"RequestItems": {"t": list(requests)}}


def test_a_partition_over_its_rate_gets_the_rest_back_unprocessed_and_others_go_by():
    now = [100.0]
    inner = Inner()
    app = PartitionWrites(inner, 5, clock=lambda: now[0])
    status, answer = call(app, "BatchWriteItem", batch(*[put("a", i) for i in range(10)], put("b", 1), put("b", 2)))
    assert status.startswith("200")
    assert inner.seen[-1]["RequestItems"]["t"] == [put("a", i) for i in range(5)] + [put("b", 1), put("b", 2)]
    assert answer["UnprocessedItems"] == {"t": [put("a", i) for i in range(5, 10)]}
    assert app.throttled == 5

    # Nothing of "a" fits now: refused whole, as DynamoDB does, and nothing reaches the table.
    status, answer = call(app, "BatchWriteItem", batch(put("a", 5)))
    assert status.startswith("400") and answer["__type"] == THROUGHPUT_EXCEEDED
    assert len(inner.seen) == 1

    now[0] += 0.4  # two items' worth of the rate back
    status, answer = call(app, "BatchWriteItem", batch(put("a", 5), put("a", 6), put("a", 7)))
    assert inner.seen[-1]["RequestItems"]["t"] == [put("a", 5), put("a", 6)]
    assert answer["UnprocessedItems"] == {"t": [put("a", 7)]}

    now[0] += 60  # a bucket holds one second of the rate, however long it waited
    call(app, "BatchWriteItem", batch(*[put("a", i) for i in range(8, 20)]))
    assert len(inner.seen[-1]["RequestItems"]["t"]) == 5


def test_other_operations_and_a_limit_of_zero_pass_untouched():
    inner = Inner()
    call(PartitionWrites(inner, 1), "PutItem", {"TableName": "t", "Item": {"pk": {"S": "a"}}})
    call(PartitionWrites(inner, 0), "BatchWriteItem", batch(*[put("a", i) for i in range(30)]))
    assert len(inner.seen[-1]["RequestItems"]["t"]) == 30


@pytest.fixture(scope="module")
def limited():
    """An emulator whose partitions take 10 items a second, the clock that refills them
    (a list the test moves: a loaded machine's pause between two requests refills
    nothing), and its resources' env."""
    now = [100.0]
    with Emulator(partition_writes_per_s=10, partition_clock=lambda: now[0]) as emu:
        # moto's tables live in the process: names of their own, beside other tests' emulators.
        suffix = uuid.uuid4().hex[:8]
        yield emu.endpoint_url, now, create_resources(
            emu.endpoint_url, table_name=f"c-{suffix}", sessions_table_name=f"s-{suffix}",
            messages_table_name=f"m-{suffix}", queue_name=f"q-{suffix}", messages_bucket_name=f"b-{suffix}",
        )


def test_botocore_reads_the_limits_answers_as_dynamodbs(limited):
    url, _now, env = limited
    ddb = boto3.client("dynamodb", endpoint_url=url, region_name="us-east-1", aws_access_key_id="x",
                       aws_secret_access_key="x", config=Config(retries={"max_attempts": 1}))
    table = env["MESSAGES_TABLE_NAME"]
    items = [put("fast", i) for i in range(25)]
    answer = ddb.batch_write_item(RequestItems={table: items})
    assert len(answer["UnprocessedItems"][table]) == 15
    with pytest.raises(ClientError) as refused:
        ddb.batch_write_item(RequestItems={table: answer["UnprocessedItems"][table]})
    assert refused.value.response["Error"]["Code"] == "ProvisionedThroughputExceededException"
    stored = ddb.query(TableName=table, KeyConditionExpression="pk = :p", ExpressionAttributeValues={":p": {"S": "fast"}})
    assert [int(i["sk"]["N"]) for i in stored["Items"]] == list(range(10))


def test_the_workers_store_writes_a_partition_faster_than_its_rate_whole(limited):
    # What the writer does with a batch the store could not finish (TransientError): sends it
    # again. The store's pauses between its own retries pass on the partition's clock.
    url, now, env = limited
    ddb = boto3.client("dynamodb", endpoint_url=url, region_name="us-east-1", aws_access_key_id="x",
                       aws_secret_access_key="x", config=Config(retries={"max_attempts": 1}))

    def pause(seconds: float) -> None:
        now[0] += seconds

    store = MessagesStore(ddb, env["MESSAGES_TABLE_NAME"], sleep=pause)
    frames = [Frame(seq, json.dumps({"n": seq}), 0) for seq in range(1, 26)]
    for _ in range(10):
        try:
            store.put("steady", frames, fence_token=1, worker_id="w1")
            break
        except TransientError:
            now[0] += 1.0
    stored = ddb.query(TableName=env["MESSAGES_TABLE_NAME"], KeyConditionExpression="pk = :p",
                       ExpressionAttributeValues={":p": {"S": schema.connection_pk("steady")}})
    assert [int(i["sk"]["N"]) for i in stored["Items"]] == list(range(1, 26))
