"""The worker's AWS boundary: requests counted, and writes refused past a deadline."""

import time

import pytest

from wsfleet import clock
from wsfleet.aws import Aws, SendDeadlinePassed, send_deadline
from wsfleet.config import WorkerConfig
from wsfleet.sinks import MessagesStore, ObjectsStore
from wsfleet.store import TransientError
from wsfleet.stream import Frame


@pytest.fixture
def aws(aws_env):
    a = Aws(WorkerConfig.from_env(aws_env), threads=2)
    yield a
    a.close()


def test_a_write_whose_deadline_passed_before_it_left_is_refused_and_never_sent(aws, aws_env):
    msgs = MessagesStore(aws.dynamodb, aws_env["MESSAGES_TABLE_NAME"])
    with send_deadline(clock.now() - 0.001), pytest.raises(SendDeadlinePassed) as refused:
        msgs.put("c1", [Frame(1, "1", 0)], fence_token=1, worker_id="w")
    assert isinstance(refused.value, TransientError)  # never read as a lost lease
    assert msgs.read_all("c1") == []


def test_a_write_whose_deadline_passes_after_botocore_checked_it_is_refused_at_the_socket(aws, aws_env):
    # A freeze after the before-send hook (the connect, a wait for the GIL, a SIGSTOP):
    # a later before-send handler that outlives the deadline stands in for it.
    msgs = MessagesStore(aws.dynamodb_writes, aws_env["MESSAGES_TABLE_NAME"])
    aws.dynamodb_writes.meta.events.register("before-send.dynamodb", lambda **_: time.sleep(0.1))
    with send_deadline(clock.now() + 0.05), pytest.raises(SendDeadlinePassed):
        msgs.put_many([("c1", 1, Frame(1, "1", 0))], worker_id="w")
    assert msgs.read_all("c1") == []
    assert aws.requests["dynamodb.BatchWriteItem"] == 1  # refused once, not retried into a second refusal


def test_a_write_within_its_deadline_goes_through_and_the_deadline_ends_with_the_block(aws, aws_env):
    msgs = MessagesStore(aws.dynamodb, aws_env["MESSAGES_TABLE_NAME"])
    with send_deadline(clock.now() + 30):
        msgs.put("c1", [Frame(1, "1", 0)], fence_token=1, worker_id="w")
    with send_deadline(clock.now() - 1):
        pass
    msgs.put("c1", [Frame(2, "2", 0)], fence_token=1, worker_id="w")  # no deadline outside the block
    assert [r["sk"] for r in msgs.read_all("c1")] == [1, 2]


def test_a_deadline_given_as_a_callable_is_read_afresh_at_each_request(aws, aws_env):
    # A store that retries inside one call (the stream's rounds) follows the renewals:
    # the deadline the call started with has passed, the lease it reads now has not.
    msgs = MessagesStore(aws.dynamodb_writes, aws_env["MESSAGES_TABLE_NAME"])
    started = clock.now()
    deadlines = iter([started + 0.05, started + 30])
    current = [next(deadlines)]
    aws.dynamodb_writes.meta.events.register("before-send.dynamodb", lambda **_: time.sleep(0.1))
    with send_deadline(lambda: current[0]), pytest.raises(SendDeadlinePassed):
        msgs.put_many([("c1", 1, Frame(1, "1", 0))], worker_id="w")  # read after the sleep: passed
    current[0] = next(deadlines)  # a renewal moved it on
    with send_deadline(lambda: current[0]):
        msgs.put_many([("c1", 2, Frame(2, "2", 0))], worker_id="w")
    current[0] = clock.now() - 1  # the lease is lost: refused at once
    with send_deadline(lambda: current[0]), pytest.raises(SendDeadlinePassed):
        msgs.put_many([("c1", 3, Frame(3, "3", 0))], worker_id="w")
    assert [r["sk"] for r in msgs.read_all("c1")] == [2]


def objects_in(aws, aws_env) -> list[str]:
    listed = aws.s3.list_objects_v2(Bucket=aws_env["MESSAGES_BUCKET_NAME"])
    return [o["Key"] for o in listed.get("Contents", [])]


def test_an_upload_whose_deadline_passed_before_it_left_is_refused_and_never_sent(aws, aws_env):
    objects = ObjectsStore(aws.s3, aws_env["MESSAGES_BUCKET_NAME"])
    with send_deadline(clock.now() - 0.001), pytest.raises(SendDeadlinePassed):
        objects.put("c1", 1, '"' + "x" * 400_000 + '"')
    assert objects_in(aws, aws_env) == [] and aws.requests["s3.PutObject"] == 1  # refused once, not retried


def test_an_upload_whose_deadline_passes_after_botocore_checked_it_is_refused_at_the_socket(aws, aws_env):
    objects = ObjectsStore(aws.s3, aws_env["MESSAGES_BUCKET_NAME"])
    aws.s3.meta.events.register("before-send.s3", lambda **_: time.sleep(0.1))
    with send_deadline(clock.now() + 0.05), pytest.raises(SendDeadlinePassed):
        objects.put("c1", 1, '"' + "x" * 400_000 + '"')
    assert objects_in(aws, aws_env) == [] and aws.requests["s3.PutObject"] == 1


def test_an_upload_within_its_deadline_is_stored_and_counted(aws, aws_env):
    objects = ObjectsStore(aws.s3, aws_env["MESSAGES_BUCKET_NAME"])
    with send_deadline(clock.now() + 30):
        stored = objects.put("c1", 1, '"' + "x" * 400_000 + '"')
    assert objects_in(aws, aws_env) == ["messages/c1/00000000000000000001"]
    assert objects.get(stored.ref) == b'"' + b"x" * 400_000 + b'"' and aws.requests["s3.PutObject"] == 1


def test_requests_are_counted_per_operation_as_sent(aws, aws_env):
    aws.dynamodb.describe_table(TableName=aws_env["TABLE_NAME"])
    aws.sqs.get_queue_attributes(QueueUrl=aws_env["QUEUE_URL"])
    assert aws.requests["dynamodb.DescribeTable"] == 1 and aws.requests["sqs.GetQueueAttributes"] == 1


def test_a_poll_result_that_arrives_after_its_awaiter_gave_up_goes_to_on_abandoned(aws):
    import asyncio
    import threading

    release, given_back = threading.Event(), []

    def slow_poll():
        release.wait(10)
        return {"Messages": [{"ReceiptHandle": "h1"}]}

    async def scenario():
        task = asyncio.ensure_future(aws.poll(slow_poll, on_abandoned=given_back.append))
        await asyncio.sleep(0.05)
        task.cancel()  # shutdown cancels the poller while its request is in flight
        release.set()
        for _ in range(100):
            if given_back:
                return
            await asyncio.sleep(0.02)

    asyncio.run(scenario())
    assert given_back == [{"Messages": [{"ReceiptHandle": "h1"}]}]


def test_a_poll_result_that_is_taken_is_not_given_back(aws):
    import asyncio

    given_back = []

    async def scenario():
        return await aws.poll(lambda: {"Messages": []}, on_abandoned=given_back.append)

    assert asyncio.run(scenario()) == {"Messages": []}
    time.sleep(0.1)
    assert given_back == []


def test_a_span_is_named_after_the_clients_operation_or_our_own_function():
    import boto3

    from wsfleet.aws import span_name

    sqs = boto3.client("sqs", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    assert span_name(sqs.send_message_batch) == "sqs.send_message_batch"
    assert span_name(test_a_span_is_named_after_the_clients_operation_or_our_own_function) == (
        "test_a_span_is_named_after_the_clients_operation_or_our_own_function"
    )

    def inner() -> None: ...

    assert span_name(inner) == "inner"
