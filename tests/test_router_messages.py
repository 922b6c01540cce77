"""The read API, ``GET /connections/{connection_id}/messages``, and the ``skipped`` count of
``GET /connections/{connection_id}``: the real router handler on the emulator's tables
and bucket, driven by hand-built API Gateway REST proxy events. Items are written in the
shape CONTRACT.md section 4 gives them (inline data, S3 data, skip markers)."""

from __future__ import annotations

import base64
import hashlib
import json
import urllib.request
from typing import Any

import boto3
import pytest

from tests.test_router import ALLOWED, URL, Api, assert_error, get_event, inject_dynamodb_error
from wsfleet import message_pages, schema
from wsfleet.config import RouterConfig
from wsfleet.router import make_client, make_presigner
from wsfleet.sinks import MessagesStore, ObjectsStore
from wsfleet.store import marshal
from wsfleet.stream import MAX_SEQ, Frame

pytestmark = pytest.mark.timeout(120)


def messages_event(connection_id: str, query: dict[str, str] | None = None, **overrides: Any) -> dict:
    event = get_event(
        connection_id,
        resource="/connections/{connection_id}/messages",
        path=f"/connections/{connection_id}/messages",
        queryStringParameters=query,
        multiValueQueryStringParameters={k: [v] for k, v in query.items()} if query else None,
    )
    event.update(overrides)
    return event


class Stored:
    """Writes a connection's messages as the worker stores them: inline through the
    store, S3 data and markers item by item in the contract's shape."""

    def __init__(self, ddb: Any, env: dict[str, str], emulator: Any) -> None:
        self.ddb = ddb
        self.table = env["MESSAGES_TABLE_NAME"]
        self.bucket = env["MESSAGES_BUCKET_NAME"]
        self.store = MessagesStore(ddb, self.table)
        self.s3 = boto3.client("s3", endpoint_url=emulator.endpoint_url, region_name=env["AWS_REGION"])

    def inline(self, connection_id: str, seqs: Any, data: Any = None) -> None:
        frames = [
            Frame(s, json.dumps({"v": s} if data is None else data, separators=(",", ":"), ensure_ascii=False), 1_700_000_000_000 + s)
            for s in seqs
        ]
        self.store.put(connection_id, frames, fence_token=1, worker_id="w1")

    def item(self, connection_id: str, seq: int, **attributes: Any) -> None:
        item = {schema.MSG_PK: schema.connection_pk(connection_id), schema.MSG_SK: seq, schema.MSG_FENCE_TOKEN: 1}
        self.ddb.put_item(TableName=self.table, Item=marshal({**item, **attributes}))

    def large(self, connection_id: str, seq: int, data: bytes, **attributes: Any) -> str:
        """The object first, then the item (with ``attributes`` more), as the worker writes
        them; returns the hash."""
        key = schema.message_object_key(connection_id, seq)
        self.s3.put_object(Bucket=self.bucket, Key=key, Body=data, ContentType="application/json")
        digest = hashlib.sha256(data).hexdigest()
        self.item(
            connection_id,
            seq,
            **{
                schema.DATA_REF: schema.data_ref(self.bucket, key),
                schema.DATA_BYTES: len(data),
                schema.DATA_SHA256: digest,
                **attributes,
            },
        )
        return digest

    def marker(self, connection_id: str, seq: int, reason: str, **attributes: Any) -> None:
        self.item(connection_id, seq, **{schema.SKIPPED: reason, **attributes})


@pytest.fixture
def api(aws_env, ddb, sqs) -> Api:
    return Api(aws_env, ddb, sqs)


@pytest.fixture
def stored(api, aws_env, emulator) -> Stored:
    return Stored(api.ddb, aws_env, emulator)


def read(api: Api, connection_id: str, **query: Any) -> tuple[int, dict]:
    return api.call(messages_event(connection_id, {k: str(v) for k, v in query.items()} or None))


def read_all(api: Api, connection_id: str, **query: Any) -> tuple[list[dict], list[int]]:
    """Every entry by following next_after_seq; and the size of each page."""
    entries, sizes, after = [], [], query.pop("after_seq", None)
    while True:
        status, body = read(api, connection_id, **query, **({} if after is None else {"after_seq": after}))
        assert status == 200, body
        entries += body["messages"]
        sizes.append(len(body["messages"]))
        after = body["next_after_seq"]
        if after is None:
            return entries, sizes
        assert after == body["messages"][-1]["seq"]


# --- pages ---------------------------------------------------------------------------------------


def test_a_page_returns_entries_in_seq_order_with_their_data_and_the_end_as_null(api, stored):
    api.start("c1")
    stored.inline("c1", [3, 1, 2])
    status, body = read(api, "c1")
    assert status == 200
    assert body == {"messages": [{"seq": s, "data": {"v": s}} for s in (1, 2, 3)], "next_after_seq": None}


def test_the_default_page_starts_before_seq_0_and_after_seq_reads_from_the_middle(api, stored):
    api.start("c1")
    stored.inline("c1", range(0, 10))
    assert [e["seq"] for e in read(api, "c1")[1]["messages"]] == list(range(10))
    assert [e["seq"] for e in read(api, "c1", after_seq=4)[1]["messages"]] == [5, 6, 7, 8, 9]
    assert read(api, "c1", after_seq=-1)[1]["messages"][0]["seq"] == 0
    assert read(api, "c1", after_seq=9)[1] == {"messages": [], "next_after_seq": None}
    assert read(api, "c1", after_seq=MAX_SEQ)[1] == {"messages": [], "next_after_seq": None}


def test_pages_bounded_by_count_follow_next_after_seq_to_the_end_without_loss_or_repeat(api, stored):
    api.start("c1")
    stored.inline("c1", range(1, 251))
    status, first = read(api, "c1", limit=100)
    assert status == 200 and len(first["messages"]) == 100 and first["next_after_seq"] == 100

    entries, sizes = read_all(api, "c1", limit=100)
    assert [e["seq"] for e in entries] == list(range(1, 251))
    assert sizes == [100, 100, 50]
    # A page that ends exactly at the last stored seq says so: no empty page after it.
    assert read_all(api, "c1", limit=125)[1] == [125, 125]
    assert read(api, "c1")[1]["next_after_seq"] == 100  # the default limit


def test_pages_are_bounded_by_the_bytes_of_the_lambda_response(api, stored):
    # 30 items of ~300 KB: 9 MB in all, more than one Lambda response may carry.
    api.start("c1")
    stored.inline("c1", range(1, 31), data={"text": "x" * 300_000})
    entries, sizes = read_all(api, "c1", limit=1000)

    assert [e["seq"] for e in entries] == list(range(1, 31))
    assert len(sizes) >= 3 and all(size >= 1 for size in sizes)
    for after in (None, 10):
        resp = api.router.handle(messages_event("c1", {"limit": "1000", **({"after_seq": str(after)} if after else {})}))
        # The size Lambda counts: the whole proxy response as JSON.
        assert len(json.dumps(resp)) < 6 * 1024 * 1024
        assert len(resp["body"]) <= message_pages.MAX_PAGE_BYTES


def test_a_page_measures_escaped_text_as_lambda_carries_it(api, stored):
    # Quotes and non-ASCII text grow when escaped: 'é' is 6 bytes as \\u00e9, 7 in the payload.
    api.start("c1")
    stored.inline("c1", range(1, 31), data=['"é"' * 50_000])
    entries, sizes = read_all(api, "c1", limit=1000)
    assert [e["data"] for e in entries] == [['"é"' * 50_000]] * 30
    resp = api.router.handle(messages_event("c1", {"limit": "1000"}))
    assert len(json.dumps(resp)) < 6 * 1024 * 1024 and len(sizes) > 3


def test_markers_and_a_gap_range_are_in_the_page_and_in_the_skipped_count(api, stored):
    api.start("c1")
    stored.inline("c1", [1, 2, 9])
    stored.marker("c1", 3, schema.SKIPPED_OVER_FRAME_LIMIT, **{schema.DATA_BYTES: 40_000_000})
    stored.marker("c1", 4, schema.SKIPPED_UPSTREAM_GAP, **{schema.SKIP_TO: 7})
    stored.marker("c1", 8, schema.SKIPPED_MALFORMED)

    assert read(api, "c1")[1]["messages"] == [
        {"seq": 1, "data": {"v": 1}},
        {"seq": 2, "data": {"v": 2}},
        {"seq": 3, "skipped": "over_frame_limit", "data_bytes": 40_000_000},
        {"seq": 4, "skipped": "upstream_gap", "to_seq": 7},
        {"seq": 8, "skipped": "malformed"},
        {"seq": 9, "data": {"v": 9}},
    ]
    status, state = api.get("c1")
    assert status == 200 and state["skipped"] == 3


def test_skipped_counts_every_marker_of_the_connection_and_no_other(api, stored):
    api.start("c1")
    api.start("c2")
    stored.inline("c1", range(1, 50))
    for seq in range(50, 110):
        stored.marker("c1", seq, schema.SKIPPED_MALFORMED)
    stored.marker("c2", 1, schema.SKIPPED_MALFORMED)
    assert api.get("c1")[1]["skipped"] == 60
    assert api.get("c2")[1]["skipped"] == 1
    api.start("c3")
    assert api.get("c3")[1]["skipped"] == 0


def test_counting_markers_is_a_bounded_read_that_stops_at_its_cap(api, stored):
    api.start("c1")
    for seq in range(1, 31):
        stored.marker("c1", seq, schema.SKIPPED_MALFORMED)
    queries: list[dict] = []
    api.ddb.meta.events.register("provide-client-params.dynamodb.Query", lambda params, **_: queries.append(params))
    messages = MessagesStore(api.ddb, api.config.messages_table_name)

    assert messages.count_markers("c1", most=12) == 12
    assert len(queries) == 1 and queries[0]["Limit"] == 12  # one page, bounded, not every marker
    assert messages.count_markers("c1") == 30


@pytest.mark.parametrize("size", [500_000, 20_000_000])
def test_large_data_is_a_presigned_url_that_returns_it_byte_for_byte(api, stored, size):
    api.start("c1")
    data = json.dumps({"blob": "ü" * (size // 2), "n": list(range(1000))}, ensure_ascii=False).encode()
    assert len(data) > size
    stored.inline("c1", [1])
    digest = stored.large("c1", 2, data)
    stored.inline("c1", [3])

    messages = read(api, "c1")[1]["messages"]
    assert [e["seq"] for e in messages] == [1, 2, 3]
    big = messages[1]
    assert set(big) == {"seq", "data_url", "data_bytes", "data_sha256"}
    assert (big["data_bytes"], big["data_sha256"]) == (len(data), digest)
    assert "X-Amz-Signature=" in big["data_url"] and "X-Amz-Expires=900" in big["data_url"]
    with urllib.request.urlopen(big["data_url"], timeout=30) as reply:
        fetched = reply.read()
    assert fetched == data and hashlib.sha256(fetched).hexdigest() == digest


def test_a_binary_feeds_frames_read_back_byte_for_byte_as_data_base64(api, stored):
    api.start("c1")
    payloads = [b"", b"\x00\x01\xff", bytes(range(256))]
    frames = [
        Frame(s, json.dumps(base64.b64encode(p).decode()), 1_700_000_000_000, binary=True) for s, p in enumerate(payloads, 1)
    ]
    stored.store.put("c1", frames, fence_token=1, worker_id="w1")
    messages = read(api, "c1")[1]["messages"]
    assert [set(e) for e in messages] == [{"seq", "data_base64"}] * 3
    assert [base64.b64decode(e["data_base64"]) for e in messages] == payloads


def test_a_large_binary_frame_is_a_data_url_of_its_base64_and_says_its_format(api, stored):
    api.start("c1")
    payload = bytes(range(256)) * 1200  # 307,200 bytes: 409,602 characters of base64 as a JSON string
    frame = Frame(1, json.dumps(base64.b64encode(payload).decode()), 1_700_000_000_000, binary=True)
    obj = ObjectsStore(stored.s3, stored.bucket).put("c1", 1, frame.data_json)
    stored.store.put_many([("c1", 1, frame)], worker_id="w1", objects={("c1", 1): obj})
    (entry,) = read(api, "c1")[1]["messages"]
    assert entry[schema.DATA_FORMAT] == schema.DATA_FORMAT_BINARY and "data_base64" not in entry
    with urllib.request.urlopen(entry["data_url"], timeout=30) as reply:
        assert base64.b64decode(json.loads(reply.read())) == payload


def test_reading_large_data_sends_no_s3_request(aws_env, ddb, sqs, emulator):
    presigner = make_presigner(Api(aws_env, ddb, sqs).config)
    sent: list[str] = []
    presigner.meta.events.register("before-send.s3", lambda request, **_: sent.append(request.url))
    api = Api(aws_env, ddb, sqs)
    api.router = type(api.router)(api.config, ddb, sqs, s3=presigner)
    api.start("c1")
    Stored(api.ddb, aws_env, emulator).large("c1", 1, b'{"a":1}')
    assert read(api, "c1")[1]["messages"][0]["data_bytes"] == 7
    assert sent == []


def test_presigned_urls_use_sigv4_on_the_buckets_regional_host():
    from wsfleet.config import RouterConfig

    env = {
        "TABLE_NAME": "t",
        "SESSIONS_TABLE_NAME": "s",
        "MESSAGES_TABLE_NAME": "m",
        "MESSAGES_BUCKET_NAME": "b",
        "QUEUE_URL": "https://sqs.eu-west-1.amazonaws.com/1/q",
        "AWS_REGION": "eu-west-1",
    }
    url = make_presigner(RouterConfig.from_env(env)).generate_presigned_url(
        "get_object", Params={"Bucket": "wsfleet-msgs", "Key": "messages/c1/00000000000000000002"}, ExpiresIn=900
    )
    assert url.startswith("https://wsfleet-msgs.s3.eu-west-1.amazonaws.com/messages/c1/00000000000000000002?")
    assert "X-Amz-Algorithm=AWS4-HMAC-SHA256" in url and "%2Feu-west-1%2Fs3%2Faws4_request" in url


# --- errors --------------------------------------------------------------------------------------


def test_messages_of_an_unknown_connection_is_404_and_writes_nothing(api, stored):
    stored.inline("ghost", [1])  # messages without a connection item: still unknown
    status, body = read(api, "ghost")
    assert_error(status, body, 404, "connection_not_found")
    assert api.items() == []


@pytest.mark.parametrize(
    "query, code",
    [
        ({"after_seq": "x"}, "invalid_after_seq"),
        ({"after_seq": ""}, "invalid_after_seq"),
        ({"after_seq": "-2"}, "invalid_after_seq"),
        ({"after_seq": str(MAX_SEQ + 1)}, "invalid_after_seq"),
        ({"after_seq": "1.5"}, "invalid_after_seq"),
        ({"after_seq": "+1"}, "invalid_after_seq"),
        ({"after_seq": " 1"}, "invalid_after_seq"),
        ({"after_seq": "1_000"}, "invalid_after_seq"),
        ({"after_seq": "١"}, "invalid_after_seq"),  # an Arabic-Indic digit: int() would take it
        ({"after_seq": "9" * 5000}, "invalid_after_seq"),
        ({"limit": "0"}, "invalid_limit"),
        ({"limit": "1001"}, "invalid_limit"),
        ({"limit": "-1"}, "invalid_limit"),
        ({"limit": "ten"}, "invalid_limit"),
        ({"limit": ""}, "invalid_limit"),
        ({"from_seq": "1"}, "unknown_parameter"),
        ({"after_seq": "1", "Limit": "5"}, "unknown_parameter"),
    ],
)
def test_bad_query_parameters_are_400_with_a_sentence_and_read_nothing(api, stored, query, code):
    api.start("c1")
    stored.inline("c1", [1])
    status, body = read(api, "c1", **query)
    assert_error(status, body, 400, code)
    name = next(iter(query))
    assert name in body["message"]


def test_a_parameter_given_twice_is_400(api):
    api.start("c1")
    event = messages_event(
        "c1",
        {"after_seq": "5"},
        multiValueQueryStringParameters={"after_seq": ["1", "5"]},
    )
    status, body = api.call(event)
    assert_error(status, body, 400, "repeated_parameter")


def test_a_bad_connection_id_is_400_before_anything_is_read(api):
    status, body = api.call(messages_event("bad id!"))
    assert_error(status, body, 400, "invalid_connection_id")


def test_bad_query_parameters_are_400_even_for_an_unknown_connection(api):
    status, body = read(api, "ghost", limit=0)
    assert_error(status, body, 400, "invalid_limit")


def test_only_get_is_allowed_on_messages(api):
    status, body = api.call(messages_event("c1", httpMethod="POST"))
    assert_error(status, body, 405, "method_not_allowed")


def test_a_greedy_proxy_resource_routes_the_messages_path(api, stored):
    api.start("c:1")
    stored.inline("c:1", [1, 2])
    event = messages_event("c%3A1", {"after_seq": "1"}, resource="/{proxy+}", pathParameters={"proxy": "x"})
    status, body = api.call(event)
    assert status == 200 and [e["seq"] for e in body["messages"]] == [2]


def test_a_read_logs_one_line_with_the_connection_and_how_many_entries(api, stored):
    api.start("c1")
    stored.inline("c1", [1, 2, 3])
    read(api, "c1", limit=2)
    line = api.log_lines()[-1]
    assert (line["event"], line["connection_id"], line["status"], line["messages"]) == ("request", "c1", 200, 2)
    assert line["route"] == "/connections/{connection_id}/messages"


def test_a_throttled_read_is_retried_then_answered_503_and_the_skipped_count_too(aws_env, ddb, sqs, emulator):
    config = RouterConfig.from_env({**aws_env, "ALLOWED_WS_HOSTS": ALLOWED})
    router_ddb = make_client("dynamodb", config)  # the production retry policy
    attempts = inject_dynamodb_error(router_ddb, "Query", status=400, code="ThrottlingException")
    api = Api(aws_env, ddb, sqs, ddb_for_router=router_ddb)
    api.start("c1")
    Stored(api.ddb, aws_env, emulator).inline("c1", [1])

    for event in (messages_event("c1"), get_event("c1")):
        resp = api.router.handle(event)
        assert resp["headers"]["Retry-After"] == "1"
        assert_error(resp["statusCode"], json.loads(resp["body"]), 503, "service_unavailable")
    assert len(attempts) == 6


def test_a_read_writes_nothing(api, stored):
    api.start("c1", URL)
    stored.inline("c1", [1])
    before = api.items()
    read(api, "c1")
    assert api.items() == before


def test_items_past_their_message_ttl_that_dynamodb_has_not_deleted_yet_are_not_shown(api, stored):
    # DynamoDB deletes an expired item up to days later; its S3 object may be gone by then.
    import time

    api.start("c1")
    with_ttl = MessagesStore(api.ddb, stored.table, ttl_days=1)
    now_ms = int(time.time() * 1000)
    old = [Frame(s, json.dumps({"v": s}), now_ms - 3 * 86_400_000) for s in (1, 2)]  # expired two days ago
    new = [Frame(s, json.dumps({"v": s}), now_ms) for s in (3, 4)]
    with_ttl.put("c1", old + new, fence_token=1, worker_id="w1")
    status, body = read(api, "c1")
    assert status == 200 and body == {"messages": [{"seq": 3, "data": {"v": 3}}, {"seq": 4, "data": {"v": 4}}], "next_after_seq": None}


# --- where the table is no sink (SINK=kinesis) -----------------------------------------------------

STREAM = {"SINK": "kinesis", "MESSAGES_STREAM_NAME": "wsfleet-dev-messages"}


def sent_requests(client: Any) -> list[str]:
    """The operations ``client`` sends from now on, as they leave."""
    sent: list[str] = []
    client.meta.events.register("before-send.dynamodb", lambda request, **_: sent.append(request.headers["X-Amz-Target"].decode()))
    return sent


def test_the_read_api_of_a_fleet_without_the_table_is_409_naming_the_stream_and_reads_nothing(aws_env, ddb, sqs, emulator):
    router_ddb = boto3.client("dynamodb", endpoint_url=emulator.endpoint_url, region_name=aws_env["AWS_REGION"])
    api = Api(aws_env, ddb, sqs, ddb_for_router=router_ddb, **STREAM)
    api.start("c1")
    Stored(ddb, aws_env, emulator).inline("c1", [1, 2])  # what another environment stored: not read here
    sent = sent_requests(router_ddb)

    for connection_id in ("c1", "ghost"):  # known or not: nothing is read to tell
        status, body = read(api, connection_id, after_seq=0)
        assert_error(status, body, 409, "messages_not_stored")
        assert "Kinesis stream wsfleet-dev-messages" in body["message"] and "SINK to include dynamodb" in body["message"]
    assert sent == []
    assert api.log_lines()[-1]["outcome"] == "messages_not_stored"
    # A bad request is still told as such first.
    assert_error(*read(api, "c1", limit=0), 400, "invalid_limit")


def test_get_of_a_connection_without_the_table_has_no_skipped_count_and_reads_no_marker(aws_env, ddb, sqs, emulator):
    router_ddb = boto3.client("dynamodb", endpoint_url=emulator.endpoint_url, region_name=aws_env["AWS_REGION"])
    env = {k: v for k, v in aws_env.items() if k != "MESSAGES_TABLE_NAME"}  # not required without the table
    api = Api(env, ddb, sqs, ddb_for_router=router_ddb, **STREAM)
    api.start("c1")
    sent = sent_requests(router_ddb)
    status, state = api.get("c1")
    assert status == 200 and state["skipped"] is None and state["desired_state"] == "STARTED"
    assert all("Query" not in op for op in sent)


def test_with_both_sinks_the_read_api_reads_the_table(aws_env, ddb, sqs, emulator):
    api = Api(aws_env, ddb, sqs, SINK="dynamodb,kinesis", MESSAGES_STREAM_NAME="s")
    api.start("c1")
    Stored(ddb, aws_env, emulator).inline("c1", [1, 2])
    status, body = read(api, "c1")
    assert status == 200 and [e["seq"] for e in body["messages"]] == [1, 2]
    assert api.get("c1")[1]["skipped"] == 0
