"""The local API Gateway stand-in: real HTTP in, REST proxy events to the handler, its
proxy responses back out."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
from typing import Any

import pytest

from sim.api import CONNECTION_RESOURCE, EVENTS_RESOURCE, MESSAGES_RESOURCE, LocalApi

pytestmark = pytest.mark.timeout(30)


class Recorder:
    """A handler that keeps each (event, context) and answers with a fixed response."""

    def __init__(self, response: Any = None) -> None:
        self.calls: list[tuple[dict, Any]] = []
        self.response = response or {"statusCode": 200, "headers": {"Content-Type": "application/json"}, "body": "{}"}

    def __call__(self, event: dict, context: Any) -> Any:
        self.calls.append((event, context))
        if isinstance(self.response, Exception):
            raise self.response
        return self.response

    @property
    def event(self) -> dict:
        [(event, _)] = self.calls
        return event


def request(api: LocalApi, method: str, target: str, body: bytes | str | None = None, headers=None):
    """(status, headers, body bytes) of one request on a fresh connection."""
    conn = http.client.HTTPConnection(api.url.removeprefix("http://"), timeout=10)
    try:
        conn.request(method, target, body=body, headers=headers or {})
        reply = conn.getresponse()
        return reply.status, reply.headers, reply.read()
    finally:
        conn.close()


@pytest.fixture
def recorder():
    return Recorder()


@pytest.fixture
def api(recorder):
    with LocalApi(recorder) as running:
        yield running


def test_post_events_becomes_a_proxy_event_for_the_events_resource(api, recorder):
    recorder.response = {"statusCode": 202, "headers": {"Content-Type": "application/json", "X-Ok": "1"}, "body": '{"a":1}'}
    body = '{"event_type": "STOP", "connection_id": "c1"}'
    status, headers, raw = request(api, "POST", "/events", body, {"Content-Type": "application/json"})

    assert (status, headers["X-Ok"], json.loads(raw)) == (202, "1", {"a": 1})
    event = recorder.event
    assert event["httpMethod"] == "POST"
    assert event["resource"] == EVENTS_RESOURCE and event["path"] == "/events"
    assert event["pathParameters"] is None and event["queryStringParameters"] is None
    assert event["body"] == body and event["isBase64Encoded"] is False
    assert event["headers"]["Content-Type"] == "application/json"
    [(_, context)] = recorder.calls
    assert event["requestContext"]["requestId"] == context.aws_request_id != ""
    assert event["requestContext"]["resourcePath"] == EVENTS_RESOURCE


def test_get_connection_carries_the_id_as_a_path_parameter_and_the_query(api, recorder):
    status, _, _ = request(api, "GET", "/connections/c-1:x?v=1&v=2&w=")

    assert status == 200
    event = recorder.event
    assert event["httpMethod"] == "GET" and event["body"] is None
    assert event["resource"] == CONNECTION_RESOURCE and event["path"] == "/connections/c-1:x"
    assert event["pathParameters"] == {"connection_id": "c-1:x"}
    assert event["queryStringParameters"] == {"v": "2", "w": ""}
    assert event["multiValueQueryStringParameters"] == {"v": ["1", "2"], "w": [""]}


def test_get_messages_carries_the_id_as_a_path_parameter_and_the_decoded_query(api, recorder):
    request(api, "GET", "/connections/c-1:x/messages?after_seq=%2D1&limit=5&limit=6")

    event = recorder.event
    assert event["resource"] == MESSAGES_RESOURCE and event["path"] == "/connections/c-1:x/messages"
    assert event["pathParameters"] == {"connection_id": "c-1:x"}
    assert event["requestContext"]["resourcePath"] == MESSAGES_RESOURCE
    assert event["queryStringParameters"] == {"after_seq": "-1", "limit": "6"}
    assert event["multiValueQueryStringParameters"] == {"after_seq": ["-1"], "limit": ["5", "6"]}


@pytest.mark.parametrize(
    "path", ["/nope", "/connections/a/b", "/connections/", "/events/x", "/connections//messages", "/connections/a/b/messages"]
)
def test_unknown_path_reaches_the_handler_with_the_raw_path_as_resource(api, recorder, path):
    recorder.response = {"statusCode": 404, "body": '{"error": "not_found"}'}
    status, _, raw = request(api, "GET", path)

    assert (status, json.loads(raw)) == (404, {"error": "not_found"})
    assert recorder.event["resource"] == path and recorder.event["pathParameters"] is None


def test_a_body_that_is_not_utf8_is_passed_base64_encoded(api, recorder):
    request(api, "POST", "/events", b"\xff\x00")

    assert recorder.event["isBase64Encoded"] is True and recorder.event["body"] == "/wA="


def test_a_base64_response_body_is_decoded_for_the_client(api, recorder):
    recorder.response = {"statusCode": 200, "body": "aGk=", "isBase64Encoded": True}

    assert request(api, "GET", "/events")[2] == b"hi"


@pytest.mark.parametrize("bad", [RuntimeError("boom"), {"body": "no status"}, "not a dict", {"statusCode": 200, "body": 1}])
def test_a_failing_or_malformed_handler_is_answered_502_as_api_gateway_does(api, recorder, bad):
    recorder.response = bad
    status, _, raw = request(api, "GET", "/events")

    assert (status, json.loads(raw)) == (502, {"message": "Internal server error"})


def test_one_keep_alive_connection_carries_several_requests(api, recorder):
    conn = http.client.HTTPConnection(api.url.removeprefix("http://"), timeout=10)
    try:
        for _ in range(3):
            conn.request("POST", "/events", body="{}")
            reply = conn.getresponse()
            assert reply.status == 200 and reply.read() == b"{}"
    finally:
        conn.close()
    assert len(recorder.calls) == 3


# --- the real router behind it, against the emulator --------------------------------


@pytest.fixture
def router_env(aws_env):
    return {**aws_env, "ALLOWED_WS_HOSTS": "127.0.0.1"}


@pytest.fixture
def router_api(router_env):
    from wsfleet.router import Router

    with LocalApi(Router.from_env(router_env).handle) as running:
        yield running


def post_event(api: LocalApi, **body: Any) -> tuple[int, dict]:
    status, _, raw = request(api, "POST", "/events", json.dumps(body), {"Content-Type": "application/json"})
    return status, json.loads(raw)


def test_router_behind_http_answers_start_get_stop_with_the_contract_statuses(router_api):
    url = "ws://127.0.0.1:9/streams/a"
    assert post_event(router_api, event_type="START", connection_id="c1", ws_url=url)[0] == 202
    assert post_event(router_api, event_type="START", connection_id="c1", ws_url=url)[0] == 200
    assert post_event(router_api, event_type="START", connection_id="c1", ws_url=url + "b")[0] == 409

    status, _, raw = request(router_api, "GET", "/connections/c1")
    assert status == 200
    assert json.loads(raw)["desired_state"] == "STARTED" and json.loads(raw)["ws_url"] == url

    assert post_event(router_api, event_type="STOP", connection_id="c1")[0] == 202
    assert post_event(router_api, event_type="STOP", connection_id="c1")[0] == 200


def test_router_behind_http_answers_errors_as_json(router_api):
    assert request(router_api, "GET", "/connections/unknown")[0] == 404
    assert post_event(router_api, event_type="STOP", connection_id="unknown")[0] == 404
    status, _, raw = request(router_api, "POST", "/events", "{not json")
    assert status == 400 and set(json.loads(raw)) == {"error", "message"}
    assert request(router_api, "GET", "/nowhere")[0] == 404


def test_router_behind_http_serves_pages_of_messages(router_api, router_env, ddb):
    from wsfleet.sinks import MessagesStore
    from wsfleet.stream import Frame

    assert post_event(router_api, event_type="START", connection_id="c1", ws_url="ws://127.0.0.1:9/s")[0] == 202
    frames = [Frame(seq, f'{{"v":{seq}}}', 1_700_000_000_000) for seq in range(1, 6)]
    MessagesStore(ddb, router_env["MESSAGES_TABLE_NAME"]).put("c1", frames, fence_token=1, worker_id="w1")

    status, _, raw = request(router_api, "GET", "/connections/c1/messages?after_seq=1&limit=3")
    assert status == 200
    assert json.loads(raw) == {"messages": [{"seq": s, "data": {"v": s}} for s in (2, 3, 4)], "next_after_seq": 4}
    status, _, raw = request(router_api, "GET", "/connections/c1/messages?after_seq=4")
    assert (status, json.loads(raw)) == (200, {"messages": [{"seq": 5, "data": {"v": 5}}], "next_after_seq": None})
    status, _, raw = request(router_api, "GET", "/connections/c1/messages?limit=3&limit=4")
    assert (status, json.loads(raw)["error"]) == (400, "repeated_parameter")
    assert request(router_api, "GET", "/connections/nobody/messages")[0] == 404


@pytest.mark.slow
def test_process_prints_ready_and_serves_the_router(python_env, router_env):
    proc = subprocess.Popen(
        [sys.executable, "-m", "sim.api", "--port", "0"],
        env={**python_env, **router_env},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline().strip()
        assert line.startswith("READY http://127.0.0.1:")
        host = line.split()[1].removeprefix("http://")
        conn = http.client.HTTPConnection(host, timeout=10)
        conn.request("POST", "/events", body=json.dumps({"event_type": "START", "connection_id": "p1", "ws_url": "ws://127.0.0.1:9/s"}))
        assert conn.getresponse().status == 202
        conn.close()
    finally:
        proc.terminate()
        assert proc.wait(10) == 0


@pytest.mark.slow
def test_process_with_a_bad_setting_exits_at_start_up_naming_the_variable(python_env, router_env):
    env = {k: v for k, v in {**python_env, **router_env}.items() if k != "TABLE_NAME"}
    done = subprocess.run(
        [sys.executable, "-m", "sim.api", "--port", "0"], env=env, capture_output=True, text=True, timeout=20
    )
    assert done.returncode == 2 and "TABLE_NAME" in done.stderr and "READY" not in done.stdout
