"""START refusals that keep secrets where they belong (CONTRACT section 2, issue 36):
``cleartext_secret``, ``secret_in_plain``, ids made only of dots; each a 400 with a
sentence that writes nothing, sends no hint and never repeats a credential."""

from __future__ import annotations

import json

import pytest

from tests.test_router import Api, assert_error
from wsfleet.store import marshal

PREFIX = "wsfleet/test/"
ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:wsfleet/test/feed-key-AbCdEf"
CREDENTIAL = "sk-live-7f3a9c2b"


@pytest.fixture
def api(aws_env, ddb, sqs) -> Api:
    return Api(aws_env, ddb, sqs, UPSTREAM_SECRET_PREFIX=PREFIX, ALLOWED_WS_HOSTS="127.0.0.1,localhost,*.feeds.example.com")


def start(api: Api, ws_url: str, upstream: object = None, connection_id: str = "feed-1") -> tuple[int, dict]:
    body = {"event_type": "START", "connection_id": connection_id, "ws_url": ws_url}
    if upstream is not None:
        body["upstream"] = upstream
    return api.post(body)


def assert_refused_and_nothing_written(api: Api, status: int, body: dict, code: str) -> None:
    assert_error(status, body, 400, code)
    assert api.items() == [] and api.hints() == []
    assert CREDENTIAL not in json.dumps(body) and CREDENTIAL not in api.logs.getvalue()


REFUSED = {
    "secret header over ws://": ("ws://eu.feeds.example.com/s", {"secret_headers": {"X-Key": ARN}}, "cleartext_secret"),
    "secret query over ws://": ("ws://eu.feeds.example.com/s", {"secret_query": {"api_key": ARN}}, "cleartext_secret"),
    "token in the query": (f"wss://eu.feeds.example.com/s?token={CREDENTIAL}", None, "secret_in_plain"),
    "TOKEN in the query, any case": (f"wss://eu.feeds.example.com/s?topic=a&ToKeN={CREDENTIAL}", None, "secret_in_plain"),
    "a presigned URL's signature": (
        f"wss://eu.feeds.example.com/s?X-Amz-Credential=AKIA&X-Amz-Signature={CREDENTIAL}", None, "secret_in_plain"
    ),
    "percent-encoded name": (f"wss://eu.feeds.example.com/s?%61pi_key={CREDENTIAL}", None, "secret_in_plain"),
    "Authorization in plain headers": (
        "wss://eu.feeds.example.com/s", {"headers": {"Authorization": f"Bearer {CREDENTIAL}"}}, "secret_in_plain"
    ),
    "cookie in plain headers": ("wss://eu.feeds.example.com/s", {"headers": {"cookie": f"sid={CREDENTIAL}"}}, "secret_in_plain"),
    "X-Api-Key in plain headers": ("wss://eu.feeds.example.com/s", {"headers": {"x-api-key": CREDENTIAL}}, "secret_in_plain"),
    "secret query already in ws_url": (
        "wss://eu.feeds.example.com/s?topic=a", {"secret_query": {"topic": ARN}}, "invalid_upstream"
    ),
}


@pytest.mark.parametrize("ws_url, upstream, code", list(REFUSED.values()), ids=list(REFUSED))
def test_a_secret_that_would_leak_is_400_and_writes_nothing(api, ws_url, upstream, code):
    status, body = start(api, ws_url, upstream)
    assert_refused_and_nothing_written(api, status, body, code)


def test_secret_in_plain_says_where_the_credential_goes_instead(api):
    _, body = start(api, f"wss://eu.feeds.example.com/s?access_token={CREDENTIAL}")
    assert "secret_query" in body["message"] and "Secrets Manager" in body["message"]
    _, body = start(api, "wss://eu.feeds.example.com/s", {"headers": {"Authorization": CREDENTIAL}})
    assert "secret_headers" in body["message"]


def test_a_400_on_a_stopped_connection_leaves_its_item_untouched(api):
    assert start(api, "wss://eu.feeds.example.com/s")[0] == 202
    api.stop("feed-1")
    before = api.item("feed-1")
    status, body = start(api, "ws://eu.feeds.example.com/s", {"secret_headers": {"X-Key": ARN}})
    assert_error(status, body, 400, "cleartext_secret")
    assert api.item("feed-1") == before


@pytest.mark.parametrize("url", ["ws://127.0.0.1:9001/s", "ws://localhost:9001/s"])
def test_secrets_over_ws_to_loopback_are_allowed_for_local_runs(api, url):
    assert start(api, url, {"secret_headers": {"X-Key": ARN}, "secret_query": {"api_key": ARN}})[0] == 202


def test_a_secret_query_is_stored_and_returned_as_its_arn_only(api):
    upstream = {"secret_query": {"api_key": ARN + "#key"}}
    assert start(api, "wss://eu.feeds.example.com/s?topic=a", upstream)[0] == 202
    assert api.item("feed-1")["upstream"] == marshal({"u": upstream})["u"]
    assert api.get("feed-1")[1]["upstream"] == upstream


@pytest.mark.parametrize("connection_id", [".", "..", "..."])
def test_a_connection_id_made_only_of_dots_is_400_and_writes_nothing(api, connection_id):
    status, body = start(api, "wss://eu.feeds.example.com/s", connection_id=connection_id)
    assert_error(status, body, 400, "invalid_connection_id")
    assert api.items() == [] and api.hints() == []
    status, body = api.get(connection_id)
    assert_error(status, body, 400, "invalid_connection_id")
