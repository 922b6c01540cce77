"""The emulator's own paths: the fault switch (throttling, latency, outages, ambiguous
requests), the request ledger and the write journal. Each test runs an emulator of its
own, so that faults never reach the shared one other tests use (moto's tables are shared
within a process: the names are fresh per test)."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from sim.emulator import faults, freeze_survivors, journal, record_journal, request_ledger, set_faults
from sim.emulator_faults import FAULTS_PATH, HARNESS_MARK
from wsfleet.sinks import MessagesStore
from wsfleet.store import CheckpointEntry, ConnectionsStore, SessionsStore, TransientError, is_transient
from wsfleet.stream import Frame

from tests.conftest import open_sessions, own_emulator


@pytest.fixture
def own():
    yield from own_emulator("dynamodb")


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
    connections = ConnectionsStore(client, env["TABLE_NAME"], state_shards=4, sessions_table_name=env["SESSIONS_TABLE_NAME"])
    open_sessions(client, env, "s#1")
    connections.start("a", "ws://127.0.0.1/a")
    list(connections.free(0))
    list(connections.free(0))
    connections.count_free(1)
    client.batch_get_item(RequestItems={env["SESSIONS_TABLE_NAME"]: {"Keys": [{"session_id": {"S": "x"}}, {"session_id": {"S": "y"}}]}})
    connections.start("b", "ws://127.0.0.1/b")
    connections.acquire("a", session_id="s#1", worker_id="s")
    connections.acquire("b", session_id="s#1", worker_id="s")
    assert connections.checkpoint_many([CheckpointEntry(c, "s#1", 1, 3) for c in ("a", "b")]) == [True, True]

    rows = {(r["op"], r["table"], r["index"], r["partition"], r["select"]): (r["n"], r["items"]) for r in request_ledger(url)}

    assert rows[("PutItem", env["TABLE_NAME"], "", "", "")] == (2, 2)
    assert rows[("Query", env["TABLE_NAME"], "by_owner", "FREE#0", "")] == (2, 2)
    assert rows[("Query", env["TABLE_NAME"], "by_owner", "FREE#1", "COUNT")] == (1, 1)
    assert rows[("BatchGetItem", env["SESSIONS_TABLE_NAME"], "", "", "")] == (1, 2)
    # Two acquisitions (one connection and its session's LIVE check each), then one
    # request for two checkpoints.
    assert rows[("TransactWriteItems", env["TABLE_NAME"], "", "", "")] == (3, 4)
    assert rows[("TransactWriteItems", env["SESSIONS_TABLE_NAME"], "", "", "")] == (2, 2)
    assert rows[("BatchGetItem", env["TABLE_NAME"], "", "", "")] == (2, 2)  # each acquisition's read


def test_added_latency_delays_only_the_chosen_operation_and_does_not_hold_the_others_up(own):
    url, env, client = own
    set_faults(url, latency_ms={"GetItem": 800})
    key = {"pk": {"S": "CONN#a"}}

    slow = threading.Thread(target=lambda: client.get_item(TableName=env["TABLE_NAME"], Key=key))
    started = time.monotonic()
    slow.start()
    time.sleep(0.1)
    client.put_item(TableName=env["TABLE_NAME"], Item=key)  # while the GetItem sleeps
    put_took = time.monotonic() - started
    slow.join()

    assert put_took < 0.6  # the delayed request sleeps before the DynamoDB lock, not inside it
    assert time.monotonic() - started >= 0.8
    assert faults(url)["delayed"] == {"GetItem": 1} and faults(url)["passed"] == {"PutItem": 1}


def test_a_dynamodb_outage_fails_every_request_as_a_transient_500_until_its_window_ends(own):
    url, env, client = own
    set_faults(url, outage={"dynamodb": 1.0})
    connections = ConnectionsStore(client, env["TABLE_NAME"], state_shards=4)

    with pytest.raises(ClientError) as caught:
        client.get_item(TableName=env["TABLE_NAME"], Key={"pk": {"S": "CONN#a"}})
    assert caught.value.response["Error"]["Code"] == "InternalServerError"
    assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 500
    assert is_transient(caught.value)
    with pytest.raises(TransientError):
        connections.get("a")
    assert 0 < faults(url)["outage_left_s"]["dynamodb"] <= 1.0

    time.sleep(1.1)
    assert connections.get("a") is None  # answered again, with nothing written meanwhile
    assert faults(url)["outage_left_s"] == {}


def test_a_hanging_outage_holds_each_request_until_the_window_ends_then_fails_it(own):
    url, env, client = own
    set_faults(url, outage={"dynamodb": 0.8}, outage_mode="hang")
    started = time.monotonic()

    with pytest.raises(ClientError) as caught:
        client.get_item(TableName=env["TABLE_NAME"], Key={"pk": {"S": "CONN#a"}})

    assert caught.value.response["Error"]["Code"] == "InternalServerError"
    assert 0.6 <= time.monotonic() - started < 3


def test_an_sqs_outage_fails_sqs_with_service_unavailable_and_leaves_dynamodb_alone(own):
    url, env, client = own
    sqs = boto3.client("sqs", endpoint_url=url, region_name=env["AWS_REGION"], config=Config(retries={"total_max_attempts": 1}))
    set_faults(url, outage={"sqs": 5})

    with pytest.raises(ClientError) as caught:
        sqs.send_message(QueueUrl=env["QUEUE_URL"], MessageBody="{}")
    assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
    client.get_item(TableName=env["TABLE_NAME"], Key={"pk": {"S": "CONN#a"}})

    set_faults(url)
    sqs.send_message(QueueUrl=env["QUEUE_URL"], MessageBody="{}")
    assert faults(url)["outage"] == {}


def test_the_harness_mark_exempts_a_client_from_every_fault(own):
    url, env, client = own
    harness = boto3.client(
        "dynamodb", endpoint_url=url, region_name=env["AWS_REGION"],
        config=Config(retries={"total_max_attempts": 1}, user_agent_extra=HARNESS_MARK),
    )
    set_faults(url, throttle=1.0, outage={"dynamodb": 5}, ambiguous=1.0)

    harness.get_item(TableName=env["TABLE_NAME"], Key={"pk": {"S": "CONN#a"}})
    harness.put_item(TableName=env["TABLE_NAME"], Item={"pk": {"S": "CONN#h"}})  # answered, not made ambiguous
    with pytest.raises(ClientError):
        client.get_item(TableName=env["TABLE_NAME"], Key={"pk": {"S": "CONN#a"}})
    assert faults(url)["failed"] == {"GetItem": 1} and faults(url)["ambiguous"] == {}


# --- ambiguous requests: applied, then answered 500 ---------------------------------------


def test_an_ambiguous_write_is_applied_then_answered_with_a_transient_500(own):
    url, env, client = own
    set_faults(url, ambiguous={"PutItem": 1.0})
    sessions = SessionsStore(client, env["SESSIONS_TABLE_NAME"])

    with pytest.raises(ClientError) as caught:
        client.put_item(TableName=env["TABLE_NAME"], Item={"pk": {"S": "CONN#a"}})
    assert caught.value.response["Error"]["Code"] == "InternalServerError"
    assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 500
    assert is_transient(caught.value)
    with pytest.raises(TransientError):
        sessions.open("s1", worker_id="w", lease_ms=1000, max_connections=1)

    set_faults(url)
    assert "Item" in client.get_item(TableName=env["TABLE_NAME"], Key={"pk": {"S": "CONN#a"}})  # it was written
    assert sessions.get("s1")["worker_id"] == "w"


def test_an_sdk_retry_of_an_ambiguous_conditional_write_meets_its_own_write(own):
    url, env, _ = own
    retrying = boto3.client(
        "dynamodb", endpoint_url=url, region_name=env["AWS_REGION"],
        config=Config(retries={"mode": "standard", "total_max_attempts": 3}),
    )
    set_faults(url, ambiguous={"PutItem": 1.0})

    with pytest.raises(ClientError) as caught:
        retrying.put_item(
            TableName=env["TABLE_NAME"], Item={"pk": {"S": "CONN#a"}}, ConditionExpression="attribute_not_exists(pk)"
        )

    # the first try landed and lost its answer; the retry was refused by the first try's
    # write, and a refused request keeps its own answer
    assert caught.value.response["Error"]["Code"] == "ConditionalCheckFailedException"
    assert faults(url)["ambiguous"] == {"PutItem": 1} and faults(url)["passed"] == {"PutItem": 1}


def test_ambiguous_shares_follow_the_setting_per_operation_and_a_seed_replays_them(own):
    url, env, client = own

    def run(seed: int) -> list[bool]:
        set_faults(url, ambiguous={"GetItem": 0.5}, seed=seed)
        outcomes = []
        for _ in range(100):
            try:
                client.get_item(TableName=env["TABLE_NAME"], Key={"pk": {"S": "CONN#a"}})
                outcomes.append(False)
            except ClientError:
                outcomes.append(True)
        client.query(  # another operation: untouched
            TableName=env["TABLE_NAME"], KeyConditionExpression="pk = :k", ExpressionAttributeValues={":k": {"S": "x"}}
        )
        return outcomes

    first = run(seed=3)

    assert 25 <= sum(first) <= 75
    assert faults(url)["ambiguous"] == {"GetItem": sum(first)}
    assert faults(url)["passed"] == {"GetItem": 100 - sum(first), "Query": 1}
    assert run(seed=3) == first


def test_an_ambiguous_sqs_send_is_sent_then_answered_500(own):
    url, env, _ = own
    sqs = boto3.client("sqs", endpoint_url=url, region_name=env["AWS_REGION"], config=Config(retries={"total_max_attempts": 1}))
    set_faults(url, ambiguous={"SendMessage": 1.0})

    with pytest.raises(ClientError) as caught:
        sqs.send_message(QueueUrl=env["QUEUE_URL"], MessageBody="hint")
    assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 500
    assert is_transient(caught.value)

    set_faults(url)
    received = sqs.receive_message(QueueUrl=env["QUEUE_URL"], WaitTimeSeconds=0)["Messages"]
    assert [m["Body"] for m in received] == ["hint"]


def test_an_ambiguous_write_is_journaled_as_applied(own):
    url, env, client = own
    connections = ConnectionsStore(client, env["TABLE_NAME"], state_shards=4, sessions_table_name=env["SESSIONS_TABLE_NAME"])
    connections.start("a", "ws://127.0.0.1/a")
    open_sessions(client, env, "s1")
    record_journal(url)
    set_faults(url, ambiguous={"TransactWriteItems": 1.0})

    with pytest.raises(TransientError):
        connections.acquire("a", session_id="s1", worker_id="w1")

    assert [(e["op"], e["pk"], e["fence"], e["session"]) for e in journal(url)] == [("update", "CONN#a", 1, "s1")]


def test_an_ambiguous_share_outside_0_to_1_is_refused(own):
    url, _, _ = own
    req = urllib.request.Request(url + FAULTS_PATH, data=json.dumps({"ambiguous": {"PutItem": 1.5}}).encode(), method="POST")

    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(req, timeout=5)

    assert refused.value.code == 400 and "ambiguous share" in refused.value.read().decode()


def test_the_journal_records_message_writes_and_acquisitions_in_the_order_they_were_applied(own):
    url, env, client = own
    connections = ConnectionsStore(client, env["TABLE_NAME"], state_shards=4, sessions_table_name=env["SESSIONS_TABLE_NAME"])
    messages = MessagesStore(client, env["MESSAGES_TABLE_NAME"])
    connections.start("a", "ws://127.0.0.1/a")
    messages.put_many([("a", 0, Frame(1, "{}", 5))], worker_id="before")  # not recording yet
    open_sessions(client, env, "s1", "s2")
    record_journal(url)

    connections.acquire("a", session_id="s1", worker_id="w1")
    messages.put_many([("a", 1, Frame(1, "{}", 5)), ("a", 1, Frame(2, "{}", 5))], worker_id="w1")
    connections.acquire("a", session_id="s2", worker_id="w2", expected_session="s1")
    messages.put_many([("a", 1, Frame(3, "{}", 5))], worker_id="w1")

    entries = [(e["op"], e["pk"], e.get("sk"), e["fence"], e["worker"], e.get("session")) for e in journal(url)]
    assert [e[:5] for e in entries] == [
        ("update", "CONN#a", None, 1, "w1"),
        ("put", "CONN#a", 1, 1, "w1"),
        ("put", "CONN#a", 2, 1, "w1"),
        ("update", "CONN#a", None, 2, "w2"),
        ("put", "CONN#a", 3, 1, "w1"),  # a write the checker calls stale
    ]
    assert [e[5] for e in entries if e[0] == "update"] == ["s1", "s2"]  # each acquirer's session
    assert [e["n"] for e in journal(url)] == [0, 1, 2, 3, 4]

    # Checkpoints and releases move last_seq: what a takeover resumes from (the stream audit's evidence).
    assert not connections.checkpoint("a", session_id="s1", fence_token=1, last_seq=5)  # refused: not journaled
    assert connections.checkpoint("a", session_id="s2", fence_token=2, last_seq=7)
    connections.release("a", session_id="s2", fence_token=2, last_seq=9)
    assert [(e["op"], e["pk"], e["last_seq"], e["fence"]) for e in journal(url)[5:]] == [
        ("checkpoint", "CONN#a", 7, 2), ("release", "CONN#a", 9, 2),
    ]
    record_journal(url, False)
    messages.put_many([("a", 2, Frame(4, "{}", 5))], worker_id="w2")
    assert len(journal(url)) == 7


def test_the_journal_records_who_ended_a_session(own):
    url, env, client = own
    sessions = SessionsStore(client, env["SESSIONS_TABLE_NAME"])
    sessions.open("w1#1", worker_id="w1", lease_ms=1, max_connections=1)
    sessions.open("w2#1", worker_id="w2", lease_ms=60_000, max_connections=1)
    record_journal(url)
    time.sleep(0.01)

    sessions.end_expired("w1#1", ended_by="w2#1", max_clock_skew_ms=0)
    sessions.end_own("w2#1", worker_id="w2")

    assert [(e["op"], e["session"], e["by"], e["worker"]) for e in journal(url)] == [
        ("ended", "w1#1", "w2#1", "w1"),
        ("ended", "w2#1", "w2", "w2"),
    ]


def test_a_query_on_the_tables_own_key_reads_only_its_partition_and_answers_as_before(own, monkeypatch):
    from moto.dynamodb.models.table import Table

    url, env, client = own
    messages = MessagesStore(client, env["MESSAGES_TABLE_NAME"])
    for cid in ("a", "b"):
        messages.put_many([(cid, 1, Frame(s, "{}", 5)) for s in range(1, 31)], worker_id="w")
    listed = []
    all_items = Table.all_items
    monkeypatch.setattr(Table, "all_items", lambda self: listed.append(self.name) or all_items(self))
    table = env["MESSAGES_TABLE_NAME"]
    key = {"KeyConditionExpression": "pk = :p", "ExpressionAttributeValues": {":p": {"S": "CONN#a"}}}

    pages, kwargs = [], {"TableName": table, "Limit": 12, **key}
    while True:
        resp = client.query(**kwargs)
        pages.append([int(i["sk"]["N"]) for i in resp["Items"]])
        if "LastEvaluatedKey" not in resp:
            break
        kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]
    newest = client.query(TableName=table, ScanIndexForward=False, Limit=1, **key)["Items"]
    above = client.query(
        TableName=table, KeyConditionExpression="pk = :p AND sk > :s",
        ExpressionAttributeValues={":p": {"S": "CONN#a"}, ":s": {"N": "25"}},
    )["Items"]

    assert sum(pages, []) == list(range(1, 31)) and [len(p) for p in pages[:2]] == [12, 12]
    assert [int(i["sk"]["N"]) for i in newest] == [30]
    assert [int(i["sk"]["N"]) for i in above] == [26, 27, 28, 29, 30]
    assert table not in listed  # never every item of the table
    assert messages.stored_end("a", 0) == 30


def test_a_message_put_back_at_once_wakes_a_waiting_long_poll_as_sqs_does(own):
    """A hint one worker leaves for another (visibility 0) must reach a poll already
    waiting, not wait for moto's next look at the queue a second later."""
    url, env, _ = own
    sqs = boto3.client("sqs", endpoint_url=url, region_name=env["AWS_REGION"])
    queue = env["QUEUE_URL"]
    sqs.send_message(QueueUrl=queue, MessageBody="hint")
    (taken,) = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=1, WaitTimeSeconds=0)["Messages"]
    got: dict = {}

    def wait() -> None:
        resp = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=1, WaitTimeSeconds=10)
        got["at"], got["messages"] = time.monotonic(), resp.get("Messages", [])

    poller = threading.Thread(target=wait)
    poller.start()
    time.sleep(1.1)  # the poll is waiting (moto looks again every second: next at about 2.0 s)
    put_back = time.monotonic()
    sqs.change_message_visibility(QueueUrl=queue, ReceiptHandle=taken["ReceiptHandle"], VisibilityTimeout=0)
    poller.join(timeout=15)
    assert [m["Body"] for m in got["messages"]] == ["hint"]
    assert got["at"] - put_back < 0.4  # at once; it was about 0.9 s here before


def _fill(client, table: str, n: int) -> None:
    """n leased connections CONN#c0.. (session s1, fence 1, last_seq 0), by batches of 25."""
    items = [{
        "pk": {"S": f"CONN#c{i}"}, "lease_session": {"S": "s1"}, "fence_token": {"N": "1"},
        "last_seq": {"N": "0"}, "owner_key": {"S": "S#s1"}, "desired_state": {"S": "STARTED"},
    } for i in range(n)]
    for start in range(0, n, 25):
        client.batch_write_item(RequestItems={table: [{"PutRequest": {"Item": i}} for i in items[start:start + 25]]})


def _checkpoint(table: str, cid: str, seq: int, *, fence: int = 1, **extra) -> dict:
    """The worker's checkpoint entry: last_seq, conditional on lease_session and fence."""
    return {"Update": {
        "TableName": table, "Key": {"pk": {"S": f"CONN#{cid}"}}, "UpdateExpression": "SET last_seq = :q",
        "ConditionExpression": "lease_session = :s AND fence_token = :f",
        "ExpressionAttributeValues": {":q": {"N": str(seq)}, ":s": {"S": "s1"}, ":f": {"N": str(fence)}}, **extra,
    }}


def _scan(client, table: str) -> dict:
    out, kwargs = {}, {"TableName": table}
    while True:
        resp = client.scan(**kwargs)
        out.update({(i["pk"]["S"], i.get("sk", {}).get("N")): i for i in resp["Items"]})
        if "LastEvaluatedKey" not in resp:
            return out
        kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]


def _moto_table(name: str):
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.dynamodb.models import dynamodb_backends

    return dynamodb_backends[DEFAULT_ACCOUNT_ID]["us-east-1"].tables[name]


def test_a_transaction_of_25_checkpoints_on_a_big_table_applies_them_all_without_copying_the_table(own, monkeypatch):
    """moto deep-copied the whole table per entry (a second for 25 on 1,000 items, in
    the lock); now it copies only the items the transaction names."""
    import copy

    import moto.dynamodb.models as models
    from moto.dynamodb.models.table import Table

    _, env, client = own
    table = env["TABLE_NAME"]
    _fill(client, table, 1000)
    tables_copied = []
    monkeypatch.setattr(Table, "__deepcopy__", lambda self, memo: tables_copied.append(self.name), raising=False)

    client.transact_write_items(TransactItems=[_checkpoint(table, f"c{i}", 7) for i in range(0, 1000, 40)])

    items = _scan(client, table)
    assert {k[0] for k, i in items.items() if i["last_seq"]["N"] == "7"} == {f"CONN#c{i}" for i in range(0, 1000, 40)}
    assert sum(i["last_seq"]["N"] == "0" for i in items.values()) == 975
    assert tables_copied == []
    assert models.copy is copy  # the shim is only in place during the call


def test_one_failed_condition_cancels_the_whole_transaction_and_changes_no_item(own):
    _, env, client = own
    table, messages = env["TABLE_NAME"], env["MESSAGES_TABLE_NAME"]
    _fill(client, table, 1000)
    client.put_item(TableName=messages, Item={"pk": {"S": "CONN#c1"}, "sk": {"N": "1"}, "writer": {"S": "w"}})
    before = {table: _scan(client, table), messages: _scan(client, messages)}
    entries = [_checkpoint(table, f"c{i}", 9) for i in range(12)]
    entries.append(_checkpoint(table, "c12", 9, fence=2, ReturnValuesOnConditionCheckFailure="ALL_OLD"))  # stale fence
    entries += [
        {"Put": {"TableName": table, "Item": {"pk": {"S": "CONN#new"}, "last_seq": {"N": "1"}},
                 "ConditionExpression": "attribute_not_exists(pk)"}},
        {"Delete": {"TableName": table, "Key": {"pk": {"S": "CONN#c500"}}}},
        {"Put": {"TableName": messages, "Item": {"pk": {"S": "CONN#fresh"}, "sk": {"N": "1"}}}},
        {"Update": {"TableName": messages, "Key": {"pk": {"S": "CONN#c1"}, "sk": {"N": "1"}},
                    "UpdateExpression": "SET writer = :w", "ExpressionAttributeValues": {":w": {"S": "x"}}}},
        {"Delete": {"TableName": messages, "Key": {"pk": {"S": "CONN#c1"}, "sk": {"N": "2"}}}},
        {"ConditionCheck": {"TableName": table, "Key": {"pk": {"S": "CONN#c600"}},
                            "ConditionExpression": "attribute_exists(pk)"}},
    ]
    entries += [_checkpoint(table, f"c{i}", 9) for i in range(13, 19)]
    assert len(entries) == 25

    with pytest.raises(ClientError) as caught:
        client.transact_write_items(TransactItems=entries)

    assert caught.value.response["Error"]["Code"] == "TransactionCanceledException"
    reasons = caught.value.response["CancellationReasons"]
    assert [r["Code"] for r in reasons] == ["None"] * 12 + ["ConditionalCheckFailed"] + ["None"] * 12
    assert reasons[12]["Item"]["pk"] == {"S": "CONN#c12"} and reasons[12]["Item"]["fence_token"] == {"N": "1"}
    after = {table: _scan(client, table), messages: _scan(client, messages)}
    assert after == before
    assert ("CONN#new", None) not in after[table] and ("CONN#c500", None) in after[table]
    assert {k.value for k in _moto_table(messages).items} == {"CONN#c1"}  # no empty partition left behind
    client.transact_write_items(TransactItems=[_checkpoint(table, "c12", 10)])  # the stored items still work
    assert client.get_item(TableName=table, Key={"pk": {"S": "CONN#c12"}})["Item"]["last_seq"] == {"N": "10"}


def test_two_operations_on_one_item_are_still_refused_and_undo_what_the_first_did(own):
    _, env, client = own
    table = env["TABLE_NAME"]
    _fill(client, table, 3)
    before = _scan(client, table)

    for entries in (
        [_checkpoint(table, "c0", 5), _checkpoint(table, "c1", 5), _checkpoint(table, "c0", 6)],
        [{"Put": {"TableName": table, "Item": {"pk": {"S": "CONN#new"}}}},
         {"Delete": {"TableName": table, "Key": {"pk": {"S": "CONN#new"}}}}],
    ):
        with pytest.raises(ClientError) as caught:
            client.transact_write_items(TransactItems=entries)
        assert caught.value.response["Error"]["Code"] == "ValidationException"
        assert "multiple operations on one item" in caught.value.response["Error"]["Message"]
        assert _scan(client, table) == before
    with pytest.raises(ClientError) as unknown:
        client.transact_write_items(TransactItems=[_checkpoint("no-such-table", "c0", 5)])
    assert unknown.value.response["Error"]["Code"] == "ResourceNotFoundException"  # moto's own, unchanged


def test_the_transaction_patch_is_idempotent(own):
    from moto.dynamodb.models import DynamoDBBackend

    from sim.emulator import _transactions_copy_items_not_tables

    patched = DynamoDBBackend.transact_write_items
    _transactions_copy_items_not_tables()
    _transactions_copy_items_not_tables()

    assert DynamoDBBackend.transact_write_items is patched
    assert patched._wsfleet_item_copies
    _, env, client = own
    _fill(client, env["TABLE_NAME"], 2)
    client.transact_write_items(TransactItems=[_checkpoint(env["TABLE_NAME"], "c0", 3), _checkpoint(env["TABLE_NAME"], "c1", 3)])
    assert client.get_item(TableName=env["TABLE_NAME"], Key={"pk": {"S": "CONN#c1"}})["Item"]["last_seq"] == {"N": "3"}


def test_the_standalone_servers_collector_leaves_what_survived_alone():
    import gc

    stop = threading.Event()
    freezer = threading.Thread(target=freeze_survivors, args=(stop, 0.05), daemon=True)
    try:
        gc.unfreeze()
        kept = [object() for _ in range(1000)]  # alive now: frozen at the next pass
        freezer.start()
        deadline = time.monotonic() + 10
        while gc.get_freeze_count() < len(kept) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert gc.get_freeze_count() >= len(kept)  # a full collection no longer walks them
    finally:
        stop.set()
        freezer.join(timeout=5)
        gc.unfreeze()  # this test process's collector back as it was
    assert not freezer.is_alive()

