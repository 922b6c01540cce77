"""The START ``upstream`` object through the event router, against the emulator, with
hand-built API Gateway events (CONTRACT sections 2 and 3): validated before any write,
stored in its stored form (ARNs, never values), compared like ws_url, returned by GET."""

from __future__ import annotations

import json
import threading

import pytest

from tests.test_router import ALLOWED, URL, Api, assert_error
from wsfleet import schema
from wsfleet.config import RouterConfig
from wsfleet.router import MAX_BODY_BYTES, make_client
from wsfleet.store import marshal

PREFIX = "wsfleet/test/"
ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:wsfleet/test/feed-key-AbCdEf"
OTHER_ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:wsfleet/test/other-key-GhIjKl"
SUBSCRIBE = '{"op":"subscribe","stream":"{connection_id}","from_seq":{from_seq}}'

UPSTREAM = {
    "headers": {"X-Client": "wsfleet"},
    "secret_headers": {"Authorization": ARN + "#token"},
    "subprotocols": ["v2.feed"],
    "open_message": SUBSCRIBE,
    "seq_pointer": "/meta/sequence",
    "data_pointer": "/payload",
    "resume": "open_message",
}


@pytest.fixture
def api(aws_env, ddb, sqs) -> Api:
    return Api(aws_env, ddb, sqs, UPSTREAM_SECRET_PREFIX=PREFIX)


def start(api: Api, connection_id: str, upstream: object = None, *, ws_url: str = URL) -> tuple[int, dict]:
    body = {"event_type": "START", "connection_id": connection_id, "ws_url": ws_url}
    if upstream is not None:
        body["upstream"] = upstream
    return api.post(body)


def stored_upstream(api: Api, connection_id: str) -> object:
    """The item's upstream attribute as DynamoDB holds it, or None when absent."""
    return api.item(connection_id).get(schema.UPSTREAM)


# --- 202: stored in its stored form ---------------------------------------------------------


def test_start_with_an_upstream_is_202_and_stores_exactly_its_non_default_keys(api):
    status, body = start(api, "feed-1", {**UPSTREAM, "resume": "open_message", "data_pointer": "/payload"})

    assert (status, body["outcome"]) == (202, "created")
    assert stored_upstream(api, "feed-1") == marshal({"u": UPSTREAM})["u"]


def test_default_valued_keys_are_not_stored_and_an_all_default_upstream_stores_no_attribute(api):
    assert start(api, "feed-1", {"seq_pointer": "/seq", "data_pointer": "/data", "resume": "query"})[0] == 202
    assert stored_upstream(api, "feed-1") is None
    assert start(api, "feed-2", {"resume": "none", "seq_pointer": "/seq"})[0] == 202
    assert stored_upstream(api, "feed-2") == {"M": {"resume": {"S": "none"}}}


def test_an_empty_header_value_and_a_whole_frame_data_pointer_are_stored_as_given(api):
    assert start(api, "feed-1", {"headers": {"X-Empty": ""}, "data_pointer": ""})[0] == 202
    assert api.get("feed-1")[1]["upstream"] == {"headers": {"X-Empty": ""}, "data_pointer": ""}


def test_get_returns_the_upstream_with_arns_and_no_error_when_the_owner_wrote_none(api):
    start(api, "feed-1", UPSTREAM)

    status, body = api.get("feed-1")

    assert status == 200
    assert body["upstream"] == UPSTREAM
    assert (body["last_error"], body["last_error_at_ms"]) == (None, None)


def test_get_of_a_default_connection_returns_an_empty_upstream(api):
    api.start("feed-1")
    assert api.get("feed-1")[1]["upstream"] == {}


def test_get_returns_the_owners_last_error_and_its_time(api):
    start(api, "feed-1", UPSTREAM)
    note_error(api, "feed-1", "handshake refused: HTTP 403 after re-reading the secrets", 1_700_000_000_000)

    body = api.get("feed-1")[1]

    assert body["last_error"] == "handshake refused: HTTP 403 after re-reading the secrets"
    assert body["last_error_at_ms"] == 1_700_000_000_000
    assert body["upstream"]["secret_headers"] == {"Authorization": ARN + "#token"}


def note_error(api: Api, connection_id: str, text: str, at_ms: int) -> None:
    """What an owner writes when its upstream refuses it (the worker's own write is
    tested with the worker)."""
    api.ddb.update_item(
        TableName=api.config.table_name,
        Key={schema.PK: {"S": schema.connection_pk(connection_id)}},
        UpdateExpression="SET #e = :e, #t = :t",
        ExpressionAttributeNames={"#e": schema.LAST_ERROR, "#t": schema.LAST_ERROR_AT_MS},
        ExpressionAttributeValues={":e": {"S": text}, ":t": {"N": str(at_ms)}},
    )


# --- 200 and 409: compared like ws_url -------------------------------------------------------


def test_start_again_with_the_same_upstream_is_200_and_writes_nothing(api):
    start(api, "feed-1", UPSTREAM)
    api.hold_lease("feed-1", last_seq=5)
    before = api.item("feed-1")

    # The same object, keys in another order and defaults spelled out: the same upstream.
    again = {"seq_pointer": "/meta/sequence", "resume": "open_message", **UPSTREAM, "headers": {"X-Client": "wsfleet"}}
    status, body = start(api, "feed-1", dict(reversed(list(again.items()))))

    assert (status, body["outcome"]) == (200, "unchanged")
    assert api.item("feed-1") == before


@pytest.mark.parametrize(
    "other",
    [
        None,
        {**UPSTREAM, "headers": {"X-Client": "other"}},
        {**UPSTREAM, "secret_headers": {"Authorization": OTHER_ARN + "#token"}},
        {**UPSTREAM, "secret_headers": {"Authorization": ARN}},
        {**UPSTREAM, "subprotocols": ["v2.feed", "v1.feed"]},
        {**UPSTREAM, "resume": "none"},
        {**UPSTREAM, "data_pointer": ""},
    ],
    ids=["default", "header value", "secret arn", "secret json key", "subprotocols", "resume", "data pointer"],
)
def test_start_of_a_started_connection_with_another_upstream_is_409_and_changes_nothing(api, other):
    start(api, "feed-1", UPSTREAM)
    api.hold_lease("feed-1", last_seq=7)
    api.hints()
    before = api.item("feed-1")

    status, body = start(api, "feed-1", other)

    assert_error(status, body, 409, "conflict")
    assert "different upstream;" in body["message"] and "STOP it, then START it again" in body["message"]
    assert api.item("feed-1") == before
    assert api.hints() == []


def test_a_started_default_connection_given_an_upstream_is_409(api):
    api.start("feed-1")
    status, body = start(api, "feed-1", {"resume": "none"})
    assert_error(status, body, 409, "conflict")
    assert "different upstream;" in body["message"]


def test_409_names_both_when_ws_url_and_upstream_differ(api):
    start(api, "feed-1", UPSTREAM)
    status, body = start(api, "feed-1", {"resume": "none"}, ws_url="wss://us.feeds.example.com/other")
    assert_error(status, body, 409, "conflict")
    assert "different ws_url and upstream;" in body["message"]


def test_stop_then_start_with_a_new_upstream_is_202_and_applies_it(api):
    start(api, "feed-1", UPSTREAM)
    api.hold_lease("feed-1", last_seq=12)
    note_error(api, "feed-1", "handshake refused: HTTP 401", 1_700_000_000_000)
    api.stop("feed-1")

    status, body = start(api, "feed-1", {"resume": "none", "seq_pointer": "/u", "data_pointer": ""})

    assert (status, body["outcome"]) == (202, "restarted")
    got = api.get("feed-1")[1]
    assert got["upstream"] == {"resume": "none", "seq_pointer": "/u", "data_pointer": ""}
    assert (got["last_error"], got["last_error_at_ms"]) == (None, None)  # it was about the old settings
    assert (got["desired_state"], got["last_seq"], got["fence_token"]) == ("STARTED", 12, 1)


def test_stop_then_start_without_an_upstream_removes_the_attribute(api):
    start(api, "feed-1", UPSTREAM)
    api.stop("feed-1")

    assert start(api, "feed-1")[0] == 202

    assert stored_upstream(api, "feed-1") is None
    assert api.get("feed-1")[1]["upstream"] == {}
    assert start(api, "feed-1")[0] == 200


def test_a_restart_whose_write_lost_its_answer_reads_its_own_upstream_and_is_200(aws_env, ddb, sqs, lose_first_answer):
    config = RouterConfig.from_env({**aws_env, "ALLOWED_WS_HOSTS": ALLOWED, "UPSTREAM_SECRET_PREFIX": PREFIX})
    router_ddb = make_client("dynamodb", config)  # the production retry policy
    api = Api(aws_env, ddb, sqs, ddb_for_router=router_ddb, UPSTREAM_SECRET_PREFIX=PREFIX)
    start(api, "feed-1", UPSTREAM)
    api.stop("feed-1")
    lost = lose_first_answer(router_ddb, {"UpdateItem": 1.0})

    status, body = start(api, "feed-1", {"resume": "none"})

    assert lost == ["UpdateItem"]
    assert (status, body["outcome"]) == (200, "unchanged")  # the retry met the first try's item
    assert api.get("feed-1")[1]["upstream"] == {"resume": "none"}


def test_a_create_whose_write_lost_its_answer_reads_its_own_upstream_and_is_200(aws_env, ddb, sqs, lose_first_answer):
    config = RouterConfig.from_env({**aws_env, "ALLOWED_WS_HOSTS": ALLOWED, "UPSTREAM_SECRET_PREFIX": PREFIX})
    router_ddb = make_client("dynamodb", config)
    api = Api(aws_env, ddb, sqs, ddb_for_router=router_ddb, UPSTREAM_SECRET_PREFIX=PREFIX)
    lost = lose_first_answer(router_ddb, {"PutItem": 1.0})

    status, body = start(api, "feed-1", UPSTREAM)

    assert lost == ["PutItem"]
    assert (status, body["outcome"]) == (200, "unchanged")
    assert api.get("feed-1")[1]["upstream"] == UPSTREAM


def race(api: Api, connection_id: str, upstreams: list[object]) -> list[tuple[int, object]]:
    """START the connection once per upstream, all at once; (status, upstream) of each."""
    barrier = threading.Barrier(len(upstreams))
    results: list[tuple[int, object]] = []
    lock = threading.Lock()

    def one(upstream: object) -> None:
        barrier.wait()
        status, _ = start(api, connection_id, upstream)
        with lock:
            results.append((status, upstream))

    threads = [threading.Thread(target=one, args=(u,)) for u in upstreams]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(results) == len(upstreams)
    return results


def assert_one_winner(api: Api, connection_id: str, results: list[tuple[int, object]], won: int) -> None:
    """Exactly one START won (``won``); the others found its upstream: 200 when they
    asked for the same, 409 otherwise. The item holds the winner's upstream."""
    [at] = [i for i, (status, _) in enumerate(results) if status == won]
    winner = results[at][1]
    others = results[:at] + results[at + 1 :]
    assert [status for status, _ in others] == [200 if upstream == winner else 409 for _, upstream in others]
    assert api.get(connection_id)[1]["upstream"] == winner


def test_concurrent_starts_of_a_new_connection_with_different_upstreams_store_exactly_one(api):
    a, b = {"resume": "none"}, {"seq_pointer": "/u"}
    results = race(api, "feed-race", [a, b, dict(a), dict(b), a, b])
    assert_one_winner(api, "feed-race", results, 202)
    assert len(api.items()) == 1


def test_concurrent_restarts_with_different_upstreams_apply_exactly_one(api):
    start(api, "feed-race", UPSTREAM)
    api.stop("feed-race")
    a, b = {"resume": "none"}, {"seq_pointer": "/u"}
    results = race(api, "feed-race", [a, b, dict(a), dict(b)])
    assert_one_winner(api, "feed-race", results, 202)


# --- 400: refused before any write ------------------------------------------------------------

BAD_UPSTREAMS = {
    "not an object": (["resume", "none"], "invalid_upstream"),
    "unknown key": ({"reconnect": "always"}, "invalid_upstream"),
    "header name not a token": ({"headers": {"X Client": "a"}}, "invalid_upstream"),
    "CR LF in a header value": ({"headers": {"X-Client": "a\r\nX-Injected: 1"}}, "invalid_upstream"),
    "reserved header": ({"headers": {"Sec-WebSocket-Protocol": "v2"}}, "invalid_upstream"),
    "header given twice across keys": (
        {"headers": {"authorization": "a"}, "secret_headers": {"Authorization": ARN}},
        "invalid_upstream",
    ),
    "secret outside the prefix": (
        {"secret_headers": {"Authorization": ARN.replace("wsfleet/test/", "prod/")}},
        "secret_not_allowed",
    ),
    "secret in another region than the workers'": (
        {"secret_headers": {"Authorization": ARN.replace(":us-east-1:", ":eu-west-1:")}},
        "secret_not_allowed",
    ),
    "secret not an ARN": ({"secret_headers": {"Authorization": "Bearer abc"}}, "invalid_upstream"),
    "bad seq pointer": ({"seq_pointer": "seq"}, "invalid_upstream"),
    "bad pointer escape": ({"data_pointer": "/~2"}, "invalid_upstream"),
    "whole-frame seq pointer": ({"seq_pointer": ""}, "invalid_upstream"),
    "unknown resume mode": ({"resume": "replay"}, "invalid_upstream"),
    "open_message resume without from_seq": (
        {"resume": "open_message", "open_message": '{"op":"subscribe"}'},
        "invalid_upstream",
    ),
    "subprotocols not a list": ({"subprotocols": "v2"}, "invalid_upstream"),
    "text with upstream seqs": ({"format": "text", "seq": "upstream"}, "invalid_upstream"),
    "binary with no seq mode": ({"format": "binary"}, "invalid_upstream"),
    "unknown format": ({"format": "protobuf", "seq": "assigned"}, "invalid_upstream"),
    "unknown seq mode": ({"seq": "auto"}, "invalid_upstream"),
    "assigned seqs with a seq pointer": ({"seq": "assigned", "seq_pointer": "/u"}, "invalid_upstream"),
}


@pytest.mark.parametrize("upstream, code", list(BAD_UPSTREAMS.values()), ids=list(BAD_UPSTREAMS))
def test_a_bad_upstream_is_400_naming_the_key_and_writes_nothing(api, upstream, code):
    status, body = start(api, "feed-1", upstream)

    assert_error(status, body, 400, code)
    assert body["message"].startswith("upstream")
    assert api.items() == []
    assert api.hints() == []


def test_a_bad_upstream_leaves_an_existing_connection_untouched(api):
    start(api, "feed-1", UPSTREAM)
    api.stop("feed-1")
    before = api.item("feed-1")

    status, body = start(api, "feed-1", {"seq_pointer": "/a/~"})

    assert_error(status, body, 400, "invalid_upstream")
    assert api.item("feed-1") == before


def test_a_secret_value_given_instead_of_an_arn_is_never_repeated_in_the_answer_or_the_log(api):
    status, body = start(api, "feed-1", {"secret_headers": {"X-Api-Key": "sk-live-7f3a9c"}})

    assert_error(status, body, 400, "invalid_upstream")
    assert "X-Api-Key" in body["message"]
    assert "sk-live-7f3a9c" not in json.dumps(body) and "sk-live-7f3a9c" not in api.logs.getvalue()


def test_with_no_secret_prefix_configured_every_secret_header_is_refused(aws_env, ddb, sqs):
    api = Api(aws_env, ddb, sqs, UPSTREAM_SECRET_PREFIX="")

    status, body = start(api, "feed-1", {"secret_headers": {"Authorization": ARN}})

    assert_error(status, body, 400, "secret_not_allowed")
    assert "UPSTREAM_SECRET_PREFIX is empty" in body["message"]
    assert api.items() == []
    assert start(api, "feed-1", {"headers": {"X-Client": "wsfleet"}})[0] == 202  # plain headers need no prefix


def test_a_null_upstream_is_the_default(api):
    assert start(api, "feed-1", None)[0] == 202
    status, body = api.post({"event_type": "START", "connection_id": "feed-1", "ws_url": URL, "upstream": None})
    assert (status, body["outcome"]) == (200, "unchanged")


def test_an_upstream_that_takes_the_body_over_16_kib_is_400_and_writes_nothing(api):
    base = json.dumps({"event_type": "START", "connection_id": "feed-1", "ws_url": URL, "upstream": {"open_message": ""}})
    fits = {"open_message": "x" * (MAX_BODY_BYTES - len(base))}
    over = {"open_message": "x" * (MAX_BODY_BYTES - len(base) + 1)}

    status, body = start(api, "feed-1", over)
    assert_error(status, body, 400, "body_too_large")
    assert api.items() == []

    # One byte less fits the body; the open_message itself is then over its own limit.
    status, body = start(api, "feed-1", fits)
    assert_error(status, body, 400, "invalid_upstream")
    assert api.items() == []


def test_a_stop_ignores_an_upstream_in_its_body(api):
    start(api, "feed-1", UPSTREAM)
    status, _ = api.post({"event_type": "STOP", "connection_id": "feed-1", "upstream": {"resume": "none"}})
    assert status == 202
    assert api.get("feed-1")[1]["upstream"] == UPSTREAM


def test_a_text_or_binary_feed_is_202_and_get_returns_its_format_and_seq_mode(api):
    for cid, upstream in (("feed-text", {"format": "text", "seq": "assigned"}), ("feed-json", {"seq": "assigned"})):
        assert start(api, cid, upstream)[0] == 202
        assert api.get(cid)[1]["upstream"] == upstream
    assert start(api, "feed-text", {"format": "binary", "seq": "assigned"})[0] == 409
