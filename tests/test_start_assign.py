"""A START whose hint the queue did not take: the router names a worker through the table
(wsfleet.start_assign), and a worker's renewal brings it back as an assignment."""

from __future__ import annotations

import time

from wsfleet import schema
from wsfleet.balance import FleetLoad

from tests.conftest import open_sessions
from tests.test_router import Api

LIVE_SESSION = "worker-a#1"


def summary(now_ms: int, **fields) -> dict:
    base = dict(workers=2, active=10, capacity=200, below_share=0, suspects=0, at_ms=now_ms)
    return FleetLoad(**{**base, **fields}).as_item()


def unreachable_queue(aws_env, ddb, sqs) -> Api:
    return Api(aws_env, ddb, sqs, QUEUE_URL=aws_env["QUEUE_URL"] + "-deleted")


def test_with_the_queue_out_of_reach_a_start_is_moved_to_the_live_session_most_under_its_share(aws_env, ddb, sqs, stores, sessions):
    conns, _ = stores
    open_sessions(ddb, aws_env, LIVE_SESSION, "worker-b#1")
    now = int(time.time() * 1000)
    sessions.put_summary(summary(now, under={"worker-b#1": 1, LIVE_SESSION: 4}))
    api = unreachable_queue(aws_env, ddb, sqs)

    status, _ = api.start("feed-1")

    assert status == 202
    item = conns.get("feed-1")
    assert item[schema.LEASE_SESSION] == LIVE_SESSION and item[schema.FENCE_TOKEN] == 1
    assert item[schema.OWNER_KEY] == schema.owner_key_session(LIVE_SESSION)
    assert sessions.get(LIVE_SESSION)[schema.ASSIGNED] == {schema.assigned_entry("feed-1", 1)}
    (line,) = [line for line in api.log_lines() if line["event"] == "request"]
    assert line["hint_sent"] is False and line["assigned_to"] == LIVE_SESSION


def test_a_session_not_renewed_lately_is_passed_over_and_with_no_fresh_summary_the_free_scan_keeps_it(aws_env, ddb, sqs, stores, sessions):
    conns, _ = stores
    open_sessions(ddb, aws_env, LIVE_SESSION)
    sessions.open("worker-z#1", worker_id="worker-z", lease_ms=10_000, max_connections=100)
    # worker-z's last renewal 8 s into a 10 s lease: a worker that died since the summary
    ddb.update_item(
        TableName=aws_env["SESSIONS_TABLE_NAME"], Key={schema.SESSION_ID: {"S": "worker-z#1"}},
        UpdateExpression="SET #h = :h, #e = :e",
        ExpressionAttributeNames={"#h": schema.HEARTBEAT_AT_MS, "#e": schema.EXPIRES_AT_MS},
        ExpressionAttributeValues={":h": {"N": str(int(time.time() * 1000) - 8_000)},
                                   ":e": {"N": str(int(time.time() * 1000) + 2_000)}},
    )
    now = int(time.time() * 1000)
    sessions.put_summary(summary(now, under={"worker-z#1": 9, LIVE_SESSION: 1}))
    api = unreachable_queue(aws_env, ddb, sqs)

    api.start("feed-1")
    assert conns.get("feed-1")[schema.LEASE_SESSION] == LIVE_SESSION

    sessions.put_summary(summary(now - 61_000, under={LIVE_SESSION: 1}))  # too old to act on
    api.start("feed-2")
    item = conns.get("feed-2")
    assert item[schema.LEASE_SESSION] == "" and item[schema.OWNER_KEY].startswith(schema.OWNER_KEY_FREE_PREFIX)
    assert [line["assigned_to"] for line in api.log_lines() if line["event"] == "request"] == [LIVE_SESSION, ""]


def test_a_balanced_small_fleet_is_named_by_its_listed_loads_most_room_first(aws_env, ddb, sqs, stores, sessions):
    conns, _ = stores
    open_sessions(ddb, aws_env, LIVE_SESSION, "worker-b#1")
    sessions.put_summary(summary(int(time.time() * 1000), loads={LIVE_SESSION: (5, 100), "worker-b#1": (100, 100)}))
    api = unreachable_queue(aws_env, ddb, sqs)

    api.start("feed-1")

    assert conns.get("feed-1")[schema.LEASE_SESSION] == LIVE_SESSION


def test_the_renewal_of_the_named_session_brings_the_start_back_as_an_assignment(aws_env, ddb, sqs, sessions):
    open_sessions(ddb, aws_env, LIVE_SESSION)
    sessions.put_summary(summary(int(time.time() * 1000), under={LIVE_SESSION: 3}))
    unreachable_queue(aws_env, ddb, sqs).start("feed-1")

    renewed = sessions.renew(LIVE_SESSION, lease_ms=600_000, active=0, max_connections=100)

    assert renewed[schema.ASSIGNED] == {schema.assigned_entry("feed-1", 1)}
