"""The emulator's own paths: the throttling switch (fault injection) and the request
ledger. Each test runs an emulator of its own, so that throttling never reaches the
shared one other tests use (moto's tables are shared within a process: the names are
fresh per test)."""

from __future__ import annotations

import json
import urllib.error
import uuid
import urllib.request

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from wsfleet.local.emulator import FAULTS_PATH, Emulator, create_resources, faults, request_ledger, set_faults
from wsfleet.store import ConnectionsStore, SessionsStore, TransientError, is_transient


@pytest.fixture
def own():
    with Emulator() as emu:
        suffix = uuid.uuid4().hex[:8]
        env = create_resources(
            emu.endpoint_url, table_name=f"c-{suffix}", sessions_table_name=f"s-{suffix}",
            messages_table_name=f"m-{suffix}", queue_name=f"q-{suffix}",
        )
        client = boto3.client(
            "dynamodb", endpoint_url=emu.endpoint_url, region_name=env["AWS_REGION"],
            config=Config(retries={"mode": "standard", "total_max_attempts": 1}),
        )
        yield emu.endpoint_url, env, client


def test_a_throttled_request_is_dynamodbs_own_throttling_error_and_a_transient_fault(own):
    url, env, client = own
    set_faults(url, throttle=1.0)

    with pytest.raises(ClientError) as caught:
        client.get_item(TableName=env["TABLE_NAME"], Key={"pk": {"S": "CONN#a"}})

    assert caught.value.response["Error"]["Code"] == "ThrottlingException"
    assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert is_transient(caught.value)
    with pytest.raises(TransientError):
        ConnectionsStore(client, env["TABLE_NAME"], state_shards=4).get("a")


def test_the_share_throttled_follows_the_setting_and_a_seed_replays_the_same_choices(own):
    url, env, client = own

    def run(seed: int) -> list[bool]:
        set_faults(url, throttle=0.5, seed=seed)
        outcomes = []
        for _ in range(200):
            try:
                client.get_item(TableName=env["TABLE_NAME"], Key={"pk": {"S": "CONN#a"}})
                outcomes.append(False)
            except ClientError:
                outcomes.append(True)
        return outcomes

    first = run(seed=7)

    assert 70 <= sum(first) <= 130
    assert faults(url)["throttled"] == {"GetItem": sum(first)}
    assert faults(url)["passed"] == {"GetItem": 200 - sum(first)}
    assert run(seed=7) == first


def test_shares_can_be_set_per_operation_and_switched_off(own):
    url, env, client = own
    sessions = SessionsStore(client, env["SESSIONS_TABLE_NAME"])
    set_faults(url, throttle={"PutItem": 1.0})

    with pytest.raises(TransientError):
        sessions.open("s1", worker_id="w", lease_ms=1000, max_connections=1)
    assert sessions.get("s1") is None  # reads pass; the throttled put wrote nothing

    set_faults(url, throttle=0)
    sessions.open("s1", worker_id="w", lease_ms=1000, max_connections=1)
    assert sessions.get("s1") is not None
    assert faults(url)["throttle"] == {}


def test_a_bad_setting_is_refused_and_changes_nothing(own):
    url, _, _ = own
    set_faults(url, throttle=0.25)
    req = urllib.request.Request(url + FAULTS_PATH, data=json.dumps({"throttle": 2}).encode(), method="POST")

    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(req, timeout=5)

    assert refused.value.code == 400
    assert faults(url)["throttle"] == {"*": 0.25}


def test_the_ledger_counts_requests_per_table_index_and_queried_partition(own):
    url, env, client = own
    connections = ConnectionsStore(client, env["TABLE_NAME"], state_shards=4)
    connections.start("a", "ws://127.0.0.1/a")
    list(connections.free(0))
    list(connections.free(0))
    connections.count_free(1)
    client.batch_get_item(RequestItems={env["SESSIONS_TABLE_NAME"]: {"Keys": [{"session_id": {"S": "x"}}, {"session_id": {"S": "y"}}]}})

    rows = {(r["op"], r["table"], r["index"], r["partition"], r["select"]): (r["n"], r["items"]) for r in request_ledger(url)}

    assert rows[("PutItem", env["TABLE_NAME"], "", "", "")] == (1, 1)
    assert rows[("Query", env["TABLE_NAME"], "by_owner", "FREE#0", "")] == (2, 2)
    assert rows[("Query", env["TABLE_NAME"], "by_owner", "FREE#1", "COUNT")] == (1, 1)
    assert rows[("BatchGetItem", env["SESSIONS_TABLE_NAME"], "", "", "")] == (1, 2)
