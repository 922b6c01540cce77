"""The event router against the emulator, driven by hand-built API Gateway REST proxy
events. Each status row of CONTRACT section 2 has a test here."""

from __future__ import annotations

import base64
import io
import json
import threading
from typing import Any

import boto3
import pytest
from aws_xray_sdk import global_sdk_config
from aws_xray_sdk.core import xray_recorder
from botocore.awsrequest import AWSResponse
from botocore.config import Config

from wsfleet import router as router_module
from wsfleet import schema, tracing
from wsfleet.config import RouterConfig
from wsfleet.logs import JsonLogger
from wsfleet.router import MAX_BODY_BYTES, Router, make_client
from wsfleet.checkpoint import Tally, Uncounted
from wsfleet.store import CheckpointEntry, ConnectionsStore, SessionsStore

ALLOWED = "127.0.0.1,*.feeds.example.com"
URL = "wss://eu.feeds.example.com/stream?topic=prices"
OTHER_URL = "wss://us.feeds.example.com/stream?topic=prices"


# --- helpers -----------------------------------------------------------------------------


class Api:
    """A router on fresh tables, with its log lines captured, and ways to look behind it."""

    def __init__(self, env: dict[str, str], ddb: Any, sqs: Any, *, ddb_for_router: Any = None, **overrides: str) -> None:
        self.config = RouterConfig.from_env({**env, "ALLOWED_WS_HOSTS": ALLOWED, **overrides})
        self.ddb = ddb
        self.sqs = sqs
        self.logs = io.StringIO()
        self.router = Router(self.config, ddb_for_router or ddb, sqs, logger=JsonLogger(self.logs))
        self.store = ConnectionsStore(
            ddb, self.config.table_name, state_shards=self.config.state_shards, sessions_table_name=self.config.sessions_table_name
        )
        self.sessions = SessionsStore(ddb, self.config.sessions_table_name)

    def call(self, event: dict) -> tuple[int, dict]:
        resp = self.router.handle(event)
        assert resp["headers"]["Content-Type"] == "application/json"
        return resp["statusCode"], json.loads(resp["body"])

    def post(self, body: Any, **event: Any) -> tuple[int, dict]:
        raw = body if isinstance(body, str) else json.dumps(body)
        return self.call(post_event(raw, **event))

    def start(self, connection_id: str, ws_url: str = URL) -> tuple[int, dict]:
        return self.post({"event_type": "START", "connection_id": connection_id, "ws_url": ws_url})

    def stop(self, connection_id: str) -> tuple[int, dict]:
        return self.post({"event_type": "STOP", "connection_id": connection_id})

    def get(self, connection_id: str) -> tuple[int, dict]:
        return self.call(get_event(connection_id))

    def items(self) -> list[dict]:
        return self.ddb.scan(TableName=self.config.table_name, ConsistentRead=True)["Items"]

    def item(self, connection_id: str) -> dict:
        return self.ddb.get_item(
            TableName=self.config.table_name,
            Key={schema.PK: {"S": schema.connection_pk(connection_id)}},
            ConsistentRead=True,
        )["Item"]

    def hints(self) -> list[dict]:
        resp = self.sqs.receive_message(QueueUrl=self.config.queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=0)
        return [json.loads(m["Body"]) for m in resp.get("Messages", [])]

    def log_lines(self) -> list[dict]:
        return [json.loads(line) for line in self.logs.getvalue().splitlines()]

    def hold_lease(self, connection_id: str, *, last_seq: int, session_id: str = "worker-a#1") -> dict:
        """A worker's live session owns the connection, checkpointed up to last_seq;
        returns the session item."""
        session = self.sessions.get(session_id) or self.sessions.open(
            session_id, worker_id="worker-a", lease_ms=20_000, max_connections=10
        )
        acquired = self.store.acquire(connection_id, session_id=session_id, worker_id="worker-a")
        assert self.store.checkpoint(
            connection_id, session_id=session_id, fence_token=acquired.item[schema.FENCE_TOKEN], last_seq=last_seq
        )
        return session


def post_event(body: str | None, *, base64_encoded: bool = False, **overrides: Any) -> dict:
    event = {
        "resource": "/events",
        "path": "/events",
        "httpMethod": "POST",
        "headers": {"Content-Type": "application/json"},
        "pathParameters": None,
        "body": body,
        "isBase64Encoded": base64_encoded,
        "requestContext": {"requestId": "req-1"},
    }
    event.update(overrides)
    return event


def get_event(connection_id: str, **overrides: Any) -> dict:
    event = {
        "resource": "/connections/{connection_id}",
        "path": f"/connections/{connection_id}",
        "httpMethod": "GET",
        "headers": {},
        "pathParameters": {"connection_id": connection_id},
        "body": None,
        "isBase64Encoded": False,
    }
    event.update(overrides)
    return event


class _Body:
    def __init__(self, data: bytes) -> None:
        self._data = data

    def stream(self, **_: Any):
        yield self._data


def inject_dynamodb_error(client: Any, operation: str, *, status: int, code: str) -> list[str]:
    """Answer every ``operation`` call of this client with an AWS error, before it is
    sent; returns the list of attempts made."""
    attempts: list[str] = []

    def respond(request: Any, **_: Any) -> AWSResponse:
        attempts.append(operation)
        body = json.dumps({"__type": f"com.amazonaws.dynamodb.v20120810#{code}", "message": "injected"})
        return AWSResponse(request.url, status, {"x-amzn-RequestId": "injected"}, _Body(body.encode()))

    client.meta.events.register(f"before-send.dynamodb.{operation}", respond)
    return attempts


def assert_error(status: int, body: dict, expected_status: int, code: str) -> None:
    assert (status, body["error"]) == (expected_status, code)
    assert set(body) == {"error", "message"}
    assert body["message"].endswith(".") and len(body["message"]) > 20


@pytest.fixture
def api(aws_env, ddb, sqs) -> Api:
    return Api(aws_env, ddb, sqs)


# --- START -------------------------------------------------------------------------------


def test_start_of_a_new_connection_is_202_and_stores_it_started_and_unowned(api):
    status, body = api.start("feed-1")
    assert status == 202
    assert body == {"connection_id": "feed-1", "desired_state": "STARTED", "outcome": "created"}
    _, state = api.get("feed-1")
    assert state["desired_state"] == "STARTED"
    assert state["ws_url"] == URL
    assert (state["lease_owner"], state["lease_expires_at_ms"], state["fence_token"], state["last_seq"]) == ("", 0, 0, 0)
    assert api.item("feed-1")[schema.OWNER_KEY]["S"] == schema.owner_key_free("feed-1", api.config.state_shards)
    assert api.item("feed-1")[schema.LEASE_SESSION]["S"] == ""


def test_start_of_a_new_connection_sends_one_hint_naming_it(api):
    api.start("feed-1")
    assert api.hints() == [{schema.HINT_CONNECTION_ID: "feed-1"}]


def test_start_again_with_the_same_url_is_200_and_leaves_lease_fence_and_checkpoint_untouched(api):
    api.start("feed-1")
    api.hints()
    api.hold_lease("feed-1", last_seq=41)
    before = api.item("feed-1")

    status, body = api.start("feed-1")

    assert status == 200
    assert body["outcome"] == "unchanged"
    after = api.item("feed-1")
    assert after == before
    assert (after["lease_owner"]["S"], after["fence_token"]["N"], after["last_seq"]["N"]) == ("worker-a", "1", "41")
    assert api.hints() == []


def test_start_of_a_started_connection_with_another_url_is_409_and_changes_nothing(api):
    api.start("feed-1")
    api.hints()
    api.hold_lease("feed-1", last_seq=7)
    before = api.item("feed-1")

    status, body = api.start("feed-1", OTHER_URL)

    assert_error(status, body, 409, "conflict")
    assert api.item("feed-1") == before
    assert api.hints() == []


def test_start_of_a_stopped_connection_is_202_and_resumes_from_its_checkpoint(api):
    api.start("feed-1")
    api.hold_lease("feed-1", last_seq=120)
    api.stop("feed-1")
    api.hints()

    status, body = api.start("feed-1")

    assert status == 202
    assert body["outcome"] == "restarted"
    _, state = api.get("feed-1")
    assert state["desired_state"] == "STARTED"
    assert state["last_seq"] == 120
    assert state["fence_token"] == 1  # the next acquisition bumps it; a START never does
    # Its owner had not released it yet: it stays attached to that session, which keeps it
    # and hints it when it releases it (a hint now would find it held).
    assert api.item("feed-1")[schema.OWNER_KEY]["S"] == schema.owner_key_session("worker-a#1")
    assert api.hints() == []


def test_start_of_a_stopped_connection_nobody_holds_is_202_and_hinted(api):
    api.start("feed-1")
    api.stop("feed-1")
    api.hints()

    assert api.start("feed-1")[0] == 202

    assert api.item("feed-1")[schema.OWNER_KEY]["S"] == schema.owner_key_free("feed-1", api.config.state_shards)
    assert api.hints() == [{schema.HINT_CONNECTION_ID: "feed-1"}]


def test_a_start_whose_write_lost_its_answer_is_200_and_still_hints_the_connection(aws_env, ddb, sqs, lose_first_answer):
    config = RouterConfig.from_env({**aws_env, "ALLOWED_WS_HOSTS": ALLOWED})
    router_ddb = make_client("dynamodb", config)  # the production retry policy
    api = Api(aws_env, ddb, sqs, ddb_for_router=router_ddb)
    lost = lose_first_answer(router_ddb, {"PutItem": 1.0})

    status, body = api.start("feed-1")

    assert lost == ["PutItem"]
    assert (status, body["outcome"]) == (200, "unchanged")  # the retry met the first try's item
    assert api.hints() == [{schema.HINT_CONNECTION_ID: "feed-1"}]  # nobody owns it yet: hinted all the same


def test_start_again_of_a_connection_already_owned_sends_no_hint(api):
    api.start("feed-1")
    api.hold_lease("feed-1", last_seq=0)
    api.hints()

    assert api.start("feed-1")[0] == 200

    assert api.hints() == []


def test_concurrent_starts_of_one_new_connection_create_it_once(api):
    barrier = threading.Barrier(10)
    statuses: list[int] = []
    lock = threading.Lock()

    def start() -> None:
        barrier.wait()
        status, _ = api.start("feed-race")
        with lock:
            statuses.append(status)

    threads = [threading.Thread(target=start) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)

    assert sorted(statuses) == [200] * 9 + [202]
    assert len(api.items()) == 1
    assert api.item("feed-race")[schema.FENCE_TOKEN]["N"] == "0"
    # every START found it unowned, so each hinted it: a hint more is cheaper than a START
    # whose own hint was lost waiting for a scan
    assert {h[schema.HINT_CONNECTION_ID] for h in api.hints()} == {"feed-race"}


def test_start_still_succeeds_when_the_hint_cannot_be_sent_and_logs_why(aws_env, ddb, sqs):
    api = Api(aws_env, ddb, sqs, QUEUE_URL=aws_env["QUEUE_URL"] + "-deleted")

    status, body = api.start("feed-1")

    assert status == 202
    assert api.item("feed-1")[schema.DESIRED_STATE]["S"] == "STARTED"
    warnings = [line for line in api.log_lines() if line["event"] == "start_hint_failed"]
    assert len(warnings) == 1 and warnings[0]["connection_id"] == "feed-1"


# --- STOP --------------------------------------------------------------------------------


def test_stop_of_an_owned_connection_is_202_and_posts_it_to_the_owning_sessions_inbox(api):
    api.start("feed-1")
    api.hold_lease("feed-1", last_seq=5)

    status, body = api.stop("feed-1")

    assert status == 202
    assert body == {"connection_id": "feed-1", "desired_state": "STOPPED", "outcome": "stopped"}
    item = api.item("feed-1")
    assert item[schema.DESIRED_STATE]["S"] == "STOPPED"
    assert item[schema.LEASE_OWNER]["S"] == "worker-a"  # the owner releases it, not the router
    assert item[schema.OWNER_KEY]["S"] == schema.owner_key_session("worker-a#1")
    assert api.sessions.get("worker-a#1")[schema.STOP_INBOX] == {schema.stop_entry("feed-1", 1)}


def test_stop_of_an_owned_connection_reaches_the_inbox_even_if_the_function_dies_right_after_its_write(aws_env, ddb, sqs):
    config = RouterConfig.from_env({**aws_env, "ALLOWED_WS_HOSTS": ALLOWED})
    router_ddb = make_client("dynamodb", config)
    api = Api(aws_env, ddb, sqs, ddb_for_router=router_ddb)
    api.start("feed-1")
    api.hold_lease("feed-1", last_seq=5)

    class Died(BaseException):
        """The Lambda killed mid-request: nothing in the router catches it."""

    def die_after_a_write(model, **_):
        if model.name != "GetItem":
            raise Died(model.name)

    router_ddb.meta.events.register("after-call.dynamodb", die_after_a_write)

    with pytest.raises(Died):
        api.stop("feed-1")

    assert api.item("feed-1")[schema.DESIRED_STATE]["S"] == "STOPPED"
    assert api.sessions.get("worker-a#1")[schema.STOP_INBOX] == {schema.stop_entry("feed-1", 1)}


def test_stop_again_of_a_stopped_connection_its_owner_still_holds_is_200_and_posts_it_again(api):
    api.start("feed-1")
    api.hold_lease("feed-1", last_seq=5)
    api.stop("feed-1")
    entry = schema.stop_entry("feed-1", 1)
    api.sessions.renew("worker-a#1", lease_ms=20_000, active=1, max_connections=10, stops_done={entry})

    status, body = api.stop("feed-1")

    assert (status, body["outcome"]) == (200, "already_stopped")
    assert api.sessions.get("worker-a#1")[schema.STOP_INBOX] == {entry}


def test_stop_of_an_unowned_connection_takes_it_out_of_the_owner_index(api):
    api.start("feed-1")

    assert api.stop("feed-1")[0] == 202

    assert schema.OWNER_KEY not in api.item("feed-1")


def test_stop_still_succeeds_when_the_owners_session_has_ended_and_logs_nothing_alarming(api):
    api.start("feed-1")
    api.hold_lease("feed-1", last_seq=5)
    api.sessions.end_own("worker-a#1", worker_id="worker-a")

    status, _ = api.stop("feed-1")

    assert status == 202  # whoever takes it from the ended session sees STOPPED itself
    assert api.item("feed-1")[schema.DESIRED_STATE]["S"] == "STOPPED"
    assert {line["level"] for line in api.log_lines()} == {"info"}


def test_stop_of_a_stopped_connection_is_200_and_writes_nothing(api):
    api.start("feed-1")
    api.stop("feed-1")
    before = api.item("feed-1")

    status, body = api.stop("feed-1")

    assert status == 200
    assert body["outcome"] == "already_stopped"
    assert api.item("feed-1") == before


def test_stop_of_an_unknown_connection_is_404_and_writes_nothing(api):
    status, body = api.stop("never-started")
    assert_error(status, body, 404, "connection_not_found")
    assert api.items() == []


# --- DELETE ------------------------------------------------------------------------------


def test_delete_removes_a_stopped_connection_nobody_holds_and_then_it_is_unknown(api):
    api.start("feed-1")
    api.stop("feed-1")
    assert api.call(get_event("feed-1", httpMethod="DELETE")) == (200, {"connection_id": "feed-1", "outcome": "deleted"})
    assert api.items() == []
    status, body = api.call(get_event("feed-1", httpMethod="DELETE"))
    assert_error(status, body, 404, "connection_not_found")
    assert api.start("feed-1")[1]["outcome"] == "created"


def test_delete_of_a_started_connection_or_one_its_owner_still_holds_is_409_and_writes_nothing(api):
    api.start("feed-1")
    status, body = api.call(get_event("feed-1", httpMethod="DELETE"))
    assert_error(status, body, 409, "not_deletable")
    assert body["message"] == "Connection feed-1 cannot be deleted: it is STARTED; STOP it first."

    api.hold_lease("feed-1", last_seq=3)
    api.stop("feed-1")  # the owner has not released it yet
    before = api.item("feed-1")
    status, body = api.call(get_event("feed-1", httpMethod="DELETE"))
    assert_error(status, body, 409, "not_deletable")
    assert "its owner has not released it yet; try again in a few seconds" in body["message"]
    assert api.item("feed-1") == before

    fence = int(before[schema.FENCE_TOKEN]["N"])
    assert api.store.release("feed-1", session_id="worker-a#1", fence_token=fence, last_seq=3, stopped=True)
    assert api.call(get_event("feed-1", httpMethod="DELETE"))[0] == 200


# --- GET ---------------------------------------------------------------------------------


def test_get_returns_exactly_the_public_state_with_the_owning_sessions_expiry(api):
    api.start("feed-1")
    session = api.hold_lease("feed-1", last_seq=9)

    status, body = api.get("feed-1")

    assert status == 200
    assert set(body) == {"connection_id", *schema.PUBLIC_FIELDS}
    assert body["connection_id"] == "feed-1"
    assert (body["lease_owner"], body["fence_token"], body["last_seq"]) == ("worker-a", 1, 9)
    assert body["lease_expires_at_ms"] == session[schema.EXPIRES_AT_MS]


def test_get_shows_frames_bytes_and_the_newest_frames_time_as_checkpoints_counted_them_zero_before_the_first(api):
    api.start("feed-1")
    body = api.get("feed-1")[1]
    assert (body["frames"], body["bytes"], body["last_frame_at_ms"]) == (0, 0, 0)
    api.hold_lease("feed-1", last_seq=0)
    counted = Uncounted(0, ((4, Tally(3, 1_200, 1_700_000_000_000)),))
    assert api.store.checkpoint_many([CheckpointEntry("feed-1", "worker-a#1", 1, 4, counted)]) == [True]
    body = api.get("feed-1")[1]
    assert (body["frames"], body["bytes"], body["last_frame_at_ms"], body["last_seq"]) == (3, 1_200, 1_700_000_000_000, 4)


def test_get_of_a_free_connection_reports_expiry_zero(api):
    api.start("feed-1")
    assert api.get("feed-1")[1]["lease_expires_at_ms"] == 0


def test_get_of_a_connection_handed_off_and_not_yet_taken_shows_it_free(api):
    api.start("feed-1")
    api.hold_lease("feed-1", last_seq=9)
    assert api.store.release("feed-1", session_id="worker-a#1", fence_token=1, last_seq=9, handoff=True)
    body = api.get("feed-1")[1]
    assert (body["lease_owner"], body["lease_expires_at_ms"], body["fence_token"], body["last_seq"]) == ("", 0, 1, 9)


def test_get_of_an_unknown_connection_is_404_and_writes_nothing(api):
    status, body = api.get("never-started")
    assert_error(status, body, 404, "connection_not_found")
    assert api.items() == []


def test_get_accepts_a_percent_encoded_colon_in_the_path(api):
    api.start("tenant:7")
    status, body = api.call(get_event("tenant%3A7"))
    assert status == 200 and body["connection_id"] == "tenant:7"


def test_get_with_a_bad_connection_id_is_400(api):
    status, body = api.get("bad id")
    assert_error(status, body, 400, "invalid_connection_id")


# --- 400: every refusal writes nothing ------------------------------------------------------

START = {"event_type": "START", "connection_id": "feed-1", "ws_url": URL}

BAD_REQUESTS = {
    "not json": ("{not json", "invalid_json"),
    "truncated json": ('{"event_type": "START"', "invalid_json"),
    "json array": (json.dumps([START]), "invalid_json"),
    "json string": (json.dumps("START"), "invalid_json"),
    "NaN constant": ('{"event_type": "START", "connection_id": "a", "ws_url": "wss://x.feeds.example.com", "n": NaN}', "invalid_json"),
    "deeply nested": ("[" * 8000 + "]" * 8000, "invalid_json"),
    "empty body": ("", "invalid_json"),
    "unknown event_type": ({**START, "event_type": "RESTART"}, "unknown_event_type"),
    "lower-case event_type": ({**START, "event_type": "start"}, "unknown_event_type"),
    "event_type not a string": ({**START, "event_type": 1}, "unknown_event_type"),
    "missing event_type": ({"connection_id": "feed-1", "ws_url": URL}, "missing_field"),
    "missing connection_id": ({"event_type": "START", "ws_url": URL}, "missing_field"),
    "null connection_id": ({**START, "connection_id": None}, "missing_field"),
    "START without ws_url": ({"event_type": "START", "connection_id": "feed-1"}, "missing_field"),
    "STOP without connection_id": ({"event_type": "STOP"}, "missing_field"),
    "connection_id with a slash": ({**START, "connection_id": "a/b"}, "invalid_connection_id"),
    "connection_id too long": ({**START, "connection_id": "x" * 129}, "invalid_connection_id"),
    "empty connection_id": ({**START, "connection_id": ""}, "invalid_connection_id"),
    "numeric connection_id": ({**START, "connection_id": 7}, "invalid_connection_id"),
    "STOP with bad connection_id": ({"event_type": "STOP", "connection_id": "a b"}, "invalid_connection_id"),
    "https url": ({**START, "ws_url": "https://eu.feeds.example.com/"}, "invalid_ws_url"),
    "url with credentials": ({**START, "ws_url": "wss://u:p@eu.feeds.example.com/"}, "invalid_ws_url"),
    "host not allowed": ({**START, "ws_url": "wss://evil.example.net/"}, "ws_host_not_allowed"),
    "bare wildcard domain": ({**START, "ws_url": "wss://feeds.example.com/"}, "ws_host_not_allowed"),
    "metadata address": ({**START, "ws_url": "ws://169.254.169.254/latest"}, "ws_host_not_allowed"),
    "private address": ({**START, "ws_url": "ws://10.0.0.8:8080/"}, "ws_host_not_allowed"),
    "loopback other than the listed one": ({**START, "ws_url": "ws://127.0.0.2/"}, "ws_host_not_allowed"),
    "mapped loopback": ({**START, "ws_url": "ws://[::ffff:127.0.0.1]/"}, "ws_host_not_allowed"),
    "decimal loopback": ({**START, "ws_url": "ws://2130706433/"}, "invalid_ws_url"),
    "body one byte over 16 KiB": ({**START, "pad": "x" * (MAX_BODY_BYTES - len(json.dumps({**START, "pad": ""})) + 1)}, "body_too_large"),
}


@pytest.mark.parametrize("body, code", list(BAD_REQUESTS.values()), ids=list(BAD_REQUESTS))
def test_bad_request_is_400_with_a_code_and_writes_nothing(api, body, code):
    status, resp = api.post(body)
    assert_error(status, resp, 400, code)
    assert api.items() == []
    assert api.hints() == []


def test_bad_request_against_an_existing_connection_leaves_it_untouched(api):
    api.start("feed-1")
    before = api.item("feed-1")
    status, body = api.start("feed-1", "ws://169.254.169.254/")
    assert_error(status, body, 400, "ws_host_not_allowed")
    assert api.item("feed-1") == before


def test_body_of_exactly_16_kib_is_accepted(api):
    body = json.dumps({**START, "pad": ""})
    body = json.dumps({**START, "pad": "x" * (MAX_BODY_BYTES - len(body))})
    assert len(body.encode()) == MAX_BODY_BYTES
    status, _ = api.post(body)
    assert status == 202


def test_body_size_counts_utf8_bytes_not_characters(api):
    pad = "é" * ((MAX_BODY_BYTES - len(json.dumps({**START, "pad": ""}, ensure_ascii=False))) // 2 + 1)
    body = json.dumps({**START, "pad": pad}, ensure_ascii=False)
    assert len(body) <= MAX_BODY_BYTES < len(body.encode())
    status, resp = api.post(body)
    assert_error(status, resp, 400, "body_too_large")


def test_base64_body_is_decoded_and_measured_after_decoding(api):
    raw = json.dumps({**START, "pad": "x" * 15_000}).encode()
    encoded = base64.b64encode(raw).decode()
    assert len(encoded) > MAX_BODY_BYTES >= len(raw)
    status, _ = api.call(post_event(encoded, base64_encoded=True))
    assert status == 202


def test_base64_body_over_16_kib_after_decoding_is_400(api):
    raw = json.dumps({**START, "pad": "x" * MAX_BODY_BYTES}).encode()
    status, body = api.call(post_event(base64.b64encode(raw).decode(), base64_encoded=True))
    assert_error(status, body, 400, "body_too_large")
    assert api.items() == []


def test_body_marked_base64_that_is_not_is_400(api):
    status, body = api.call(post_event(json.dumps(START), base64_encoded=True))
    assert_error(status, body, 400, "invalid_body")
    assert api.items() == []


# --- routing -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "event",
    [
        post_event("{}", resource="/nope", path="/nope"),
        post_event("{}", resource="/{proxy+}", path="/events/extra"),
        get_event("x", resource="/{proxy+}", path="/connections"),
        get_event("x", resource="/{proxy+}", path="/connections/a/b"),
        get_event("x", resource=None, path=None),
    ],
    ids=["unknown resource", "below /events", "no id", "nested id", "no path at all"],
)
def test_unknown_route_is_404_json(api, event):
    status, body = api.call(event)
    assert_error(status, body, 404, "not_found")


@pytest.mark.parametrize(
    "event, allow",
    [
        (post_event(None, httpMethod="GET"), "POST"),
        (post_event(json.dumps(START), httpMethod="PUT"), "POST"),
        (get_event("feed-1", httpMethod="PUT"), "GET, DELETE"),
        (get_event("feed-1", httpMethod="POST", body=json.dumps(START)), "GET, DELETE"),
    ],
)
def test_wrong_method_is_405_with_allow_header_and_writes_nothing(api, event, allow):
    resp = api.router.handle(event)
    assert resp["statusCode"] == 405
    assert resp["headers"]["Allow"] == allow
    assert json.loads(resp["body"])["error"] == "method_not_allowed"
    assert api.items() == []


def test_greedy_proxy_resource_is_routed_by_path(api):
    status, _ = api.call(post_event(json.dumps(START), resource="/{proxy+}"))
    assert status == 202
    status, body = api.call(get_event("feed-1", resource="/{proxy+}", pathParameters={"proxy": "connections/feed-1"}))
    assert status == 200 and body["connection_id"] == "feed-1"


# --- failures of the backend ---------------------------------------------------------------


def test_dynamodb_5xx_is_retried_then_answered_503_with_nothing_written(aws_env, ddb, sqs):
    config = RouterConfig.from_env({**aws_env, "ALLOWED_WS_HOSTS": ALLOWED})
    router_ddb = make_client("dynamodb", config)  # the production retry policy
    attempts = inject_dynamodb_error(router_ddb, "PutItem", status=500, code="InternalServerError")
    api = Api(aws_env, ddb, sqs, ddb_for_router=router_ddb)

    resp = api.router.handle(post_event(json.dumps(START)))

    assert resp["statusCode"] == 503
    assert resp["headers"]["Retry-After"] == "1"
    assert_error(503, json.loads(resp["body"]), 503, "service_unavailable")
    assert "Traceback" not in resp["body"] and "injected" not in resp["body"]
    assert len(attempts) == 3
    assert api.items() == []
    assert api.hints() == []
    assert [line["level"] for line in api.log_lines()] == ["error"]


def test_throttled_restart_is_503_and_leaves_the_stopped_item_as_it_was(aws_env, ddb, sqs, emulator):
    no_retries = boto3.client(
        "dynamodb",
        endpoint_url=emulator.endpoint_url,
        region_name=aws_env["AWS_REGION"],
        config=Config(retries={"mode": "standard", "total_max_attempts": 1}),
    )
    api = Api(aws_env, ddb, sqs, ddb_for_router=no_retries)
    api.start("feed-1")
    api.hold_lease("feed-1", last_seq=3)
    api.stop("feed-1")
    api.hints()
    before = api.item("feed-1")
    # The conditional put goes through (and fails its condition); the flip is throttled.
    inject_dynamodb_error(no_retries, "UpdateItem", status=400, code="ProvisionedThroughputExceededException")

    status, body = api.start("feed-1")

    assert_error(status, body, 503, "service_unavailable")
    assert api.item("feed-1") == before
    assert api.hints() == []


def test_unexpected_failure_is_500_json_and_logged_with_its_traceback(aws_env, ddb, sqs):
    api = Api(aws_env, ddb, sqs, TABLE_NAME="no-such-table")

    status, body = api.start("feed-1")

    assert_error(status, body, 500, "internal_error")
    (line,) = api.log_lines()
    assert line["level"] == "error" and line["status"] == 500
    assert "ResourceNotFoundException" in line["detail"]
    assert "Traceback" in line["traceback"]


# --- logs ----------------------------------------------------------------------------------


def test_each_request_logs_one_json_line_with_event_type_connection_outcome_and_status(api):
    api.start("feed-1")
    api.start("feed-1", OTHER_URL)
    api.stop("feed-1")
    api.get("feed-1")
    api.post("{oops")

    lines = api.log_lines()
    assert [line["event"] for line in lines] == ["request"] * 5
    summary = [(line.get("event_type"), line.get("connection_id"), line["outcome"], line["status"]) for line in lines]
    assert summary == [
        ("START", "feed-1", "created", 202),
        ("START", "feed-1", "conflict", 409),
        ("STOP", "feed-1", "stopped", 202),
        (None, "feed-1", "found", 200),
        (None, None, "invalid_json", 400),
    ]
    assert all(line["route"] in ("/events", "/connections/{connection_id}") for line in lines)


# --- the Lambda entry point ------------------------------------------------------------------


@pytest.fixture
def lambda_env(monkeypatch, aws_env):
    """The process environment as the stack sets it, and no router built yet."""
    monkeypatch.setattr(router_module, "_router", None)
    for name, value in {**aws_env, "ALLOWED_WS_HOSTS": ALLOWED}.items():
        monkeypatch.setenv(name, value)
    return monkeypatch


def test_handler_builds_its_router_from_the_environment_once(lambda_env, capsys):
    resp = router_module.handler(post_event(json.dumps(START)), None)
    built = router_module._router
    resp_again = router_module.handler(get_event("feed-1"), None)

    assert (resp["statusCode"], resp_again["statusCode"]) == (202, 200)
    assert router_module._router is built
    logged = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(line["event"], line["status"]) for line in logged] == [("request", 202), ("request", 200)]


def test_handler_with_a_bad_configuration_answers_500_naming_the_variable(lambda_env, capsys):
    lambda_env.delenv("TABLE_NAME")

    resp = router_module.handler(post_event(json.dumps(START)), None)

    assert resp["statusCode"] == 500
    assert resp["headers"]["Content-Type"] == "application/json"
    body = json.loads(resp["body"])
    assert body["error"] == "misconfigured" and "TABLE_NAME" in body["message"]
    (line,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert line["level"] == "error" and "TABLE_NAME" in line["detail"]
    assert router_module._router is None  # tried again on the next call


def test_handler_with_a_bad_state_shards_names_it(lambda_env):
    lambda_env.setenv("STATE_SHARDS", "zero")
    body = json.loads(router_module.handler(get_event("feed-1"), None)["body"])
    assert body["error"] == "misconfigured" and "STATE_SHARDS" in body["message"]


def test_router_clients_use_standard_retries():
    config = RouterConfig.from_env({"TABLE_NAME": "t", "SESSIONS_TABLE_NAME": "s", "MESSAGES_TABLE_NAME": "m", "MESSAGES_BUCKET_NAME": "b", "QUEUE_URL": "q", "AWS_REGION": "us-east-1"})
    for service in ("dynamodb", "sqs"):
        retries = make_client(service, config).meta.config.retries
        assert (retries["mode"], retries["total_max_attempts"]) == ("standard", 3)


# --- tracing -------------------------------------------------------------------------------


@pytest.fixture
def xray_sdk():
    tracing.reset()
    tracing.configure("xray-sdk", "wsfleet-router")
    yield
    tracing.reset()


def test_subsegment_without_an_open_segment_does_nothing_and_logs_nothing(xray_sdk, caplog):
    xray_recorder.clear_trace_entities()
    with caplog.at_level("DEBUG", logger="aws_xray_sdk"):
        with tracing.invocation("router", connection_id="feed-1") as span:
            span.annotate(status=200)
    assert not span.recording
    assert [r for r in caplog.records if r.levelno >= 30] == []


@pytest.mark.skipif(not global_sdk_config.sdk_enabled(), reason="AWS_XRAY_SDK_ENABLED=false in this process")
def test_router_records_a_subsegment_with_its_outcome_inside_a_segment(xray_sdk, api, sqs, aws_env):
    segment = xray_recorder.begin_segment("test", sampling=1)
    try:
        api.start("feed-1")
    finally:
        xray_recorder.clear_trace_entities()
    (sub,) = [s for s in segment.subsegments if s.name == "router"]
    assert sub.annotations == {
        "method": "POST",
        "event_type": "START",
        "connection_id": "feed-1",
        "outcome": "created",
        "status": 202,
    }
    # The START's hint carries the router's subsegment as its trace: the taker continues it.
    (hint,) = sqs.receive_message(QueueUrl=aws_env["QUEUE_URL"], MessageSystemAttributeNames=["AWSTraceHeader"])["Messages"]
    assert hint["Attributes"]["AWSTraceHeader"] == f"Root={segment.trace_id};Parent={sub.id};Sampled=1"
