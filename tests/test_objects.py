"""Large data in the messages bucket, against the emulator's S3: the object holds the
data's compact JSON at its (connection, seq) key, the item points at it with its size
and SHA-256, a replay rewrites the same key, and a read checks what it got."""

from __future__ import annotations

import hashlib
import json

import boto3
import pytest
from botocore.exceptions import ClientError

from tests.conftest import REGION
from wsfleet import schema
from wsfleet.sinks import CorruptObject, MessagesStore, ObjectsStore, needs_object
from wsfleet.store import TransientError, is_transient
from wsfleet.stream import MAX_MESSAGE_BYTES, Frame, Problem, parse_frame


@pytest.fixture
def s3(emulator):
    return boto3.client("s3", endpoint_url=emulator.endpoint_url, region_name=REGION)


@pytest.fixture
def objects(s3, aws_env):
    return ObjectsStore(s3, aws_env["MESSAGES_BUCKET_NAME"])


def keys(s3, bucket: str) -> list[str]:
    return [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]


def large_frame(seq: int, size: int) -> Frame:
    """What the parser makes of a frame whose data is a string of about ``size`` bytes."""
    frame = parse_frame(json.dumps({"seq": seq, "data": {"blob": "é" + "x" * size}}, indent=1), 1_000)
    assert needs_object(frame)
    return frame


def test_data_over_an_item_needs_an_object_and_data_that_fits_does_not():
    at_limit = parse_frame('{"seq": 1, "data": "%s"}' % ("x" * (MAX_MESSAGE_BYTES - 2)), 0)
    assert at_limit.data_bytes == MAX_MESSAGE_BYTES and not needs_object(at_limit)
    assert needs_object(parse_frame('{"seq": 1, "data": "%s"}' % ("x" * (MAX_MESSAGE_BYTES - 1)), 0))
    assert not needs_object(Frame(1, None, 0, Problem.TOO_DEEP, data_bytes=10**9))  # a marker: nothing to store


def test_an_object_holds_the_datas_compact_json_at_its_seq_key(objects, s3, aws_env):
    frame = large_frame(7, 500_000)
    stored = objects.put("c1", 7, frame.data_json)
    bucket = aws_env["MESSAGES_BUCKET_NAME"]
    body = frame.data_json.encode("utf-8")
    assert stored.ref == f"s3://{bucket}/messages/c1/00000000000000000007"
    assert (stored.size, stored.sha256) == (len(body), hashlib.sha256(body).hexdigest())
    got = s3.get_object(Bucket=bucket, Key="messages/c1/00000000000000000007")
    assert got["ContentType"] == "application/json" and got["Body"].read() == body
    assert objects.get(stored.ref) == body


def test_data_encoded_piece_by_piece_is_its_utf8_byte_for_byte(objects):
    data = json.dumps(["€😀ü" * 500_000, "y" * 1_500_000], ensure_ascii=False)  # pieces split it anywhere
    stored = objects.put("c1", 8, data)
    assert objects.get(stored.ref) == data.encode("utf-8") and stored.size == len(data.encode("utf-8"))


def test_a_large_frames_item_points_at_its_object_and_reads_back_byte_for_byte(objects, ddb, aws_env):
    msgs = MessagesStore(ddb, aws_env["MESSAGES_TABLE_NAME"])
    small, large = Frame(1, '{"v":1}', 1_000, data_bytes=7), large_frame(2, 500_000)
    stored = objects.put("c1", 2, large.data_json)
    msgs.put_many([("c1", 3, small), ("c1", 3, large)], worker_id="w", objects={("c1", 2): stored})
    rows = {r["sk"]: r for r in msgs.read_all("c1")}
    assert schema.MESSAGE_DATA not in rows[2] and schema.SKIPPED not in rows[2]
    assert (rows[2][schema.DATA_REF], rows[2][schema.DATA_BYTES], rows[2][schema.DATA_SHA256]) == (
        stored.ref,
        len(large.data_json.encode()),
        stored.sha256,
    )
    assert objects.data_of(rows[2]) == large.data_json and objects.data_of(rows[1]) == '{"v":1}'
    assert msgs.stored_end("c1", 0) == 2


def test_large_data_without_its_object_is_refused_before_anything_is_written(ddb, aws_env):
    msgs = MessagesStore(ddb, aws_env["MESSAGES_TABLE_NAME"])
    with pytest.raises(ValueError, match="before its object"):
        msgs.put_many([("c1", 1, Frame(1, "{}", 1)), ("c1", 1, large_frame(2, 400_000))], worker_id="w")
    assert msgs.read_all("c1") == []


def test_a_replay_rewrites_the_same_object_and_item(objects, s3, ddb, aws_env):
    msgs = MessagesStore(ddb, aws_env["MESSAGES_TABLE_NAME"])
    frame = large_frame(5, 400_000)
    for fence, worker in ((1, "a"), (2, "b")):  # the first owner, then a replay after a takeover
        stored = objects.put("c1", 5, frame.data_json)
        msgs.put_many([("c1", fence, frame)], worker_id=worker, objects={("c1", 5): stored})
    assert keys(s3, aws_env["MESSAGES_BUCKET_NAME"]) == ["messages/c1/00000000000000000005"]
    (row,) = msgs.read_all("c1")
    assert (row["fence_token"], row["worker_id"]) == (2, "b") and objects.data_of(row) == frame.data_json


def test_a_read_refuses_an_object_that_is_not_what_its_item_says(objects, s3, ddb, aws_env):
    msgs = MessagesStore(ddb, aws_env["MESSAGES_TABLE_NAME"])
    frame = large_frame(1, 400_000)
    msgs.put_many([("c1", 1, frame)], worker_id="w", objects={("c1", 1): objects.put("c1", 1, frame.data_json)})
    (row,) = msgs.read_all("c1")
    s3.put_object(Bucket=aws_env["MESSAGES_BUCKET_NAME"], Key="messages/c1/00000000000000000001", Body=frame.data_json.upper().encode())
    with pytest.raises(CorruptObject):
        objects.data_of(row)


def test_an_over_limit_marker_says_so_and_a_parse_marker_says_malformed(ddb, aws_env, objects):
    msgs = MessagesStore(ddb, aws_env["MESSAGES_TABLE_NAME"])
    over = large_frame(1, 400_000).as_marker(Problem.TOO_LARGE)
    msgs.put("c1", [over, Frame(2, None, 1, Problem.TOO_DEEP)], fence_token=1, worker_id="w")
    rows = {r["sk"]: r for r in msgs.read_all("c1")}
    assert rows[1][schema.SKIPPED] == schema.SKIPPED_OVER_FRAME_LIMIT and rows[1][schema.DATA_BYTES] > 400_000
    assert rows[2][schema.SKIPPED] == schema.SKIPPED_MALFORMED
    assert objects.data_of(rows[1]) is None


def test_a_missing_bucket_is_an_error_to_retry_later_not_a_transient_fault(s3):
    objects = ObjectsStore(s3, "no-such-bucket")
    with pytest.raises(ClientError) as refused:
        objects.put("c1", 1, "1")
    assert not isinstance(refused.value, TransientError) and not is_transient(refused.value)


@pytest.mark.parametrize(("code", "status"), [("SlowDown", 503), ("InternalError", 500), ("RequestTimeout", 400)])
def test_s3s_throttling_and_server_faults_are_transient(code, status):
    exc = ClientError({"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject")
    assert is_transient(exc)
