"""The emulator's Query on a table's own key (sim.moto_patches._partition_queries): one
partition, its sort keys kept in order, read by bisection, with DynamoDB's answers. Each
answer is checked against the partition's items sorted and filtered here, through every
page, in both directions, with and without a Limit, after puts, overwrites and deletes."""

from __future__ import annotations

import random

import boto3
import pytest
from moto import mock_aws

from sim.moto_patches import SortedPartition, _partition_queries

TABLE = "m"


@pytest.fixture
def table():
    _partition_queries()
    with mock_aws():
        ddb = boto3.client("dynamodb", region_name="us-east-1")
        ddb.create_table(
            TableName=TABLE, BillingMode="PAY_PER_REQUEST",
            KeySchema=[{"AttributeName": "c", "KeyType": "HASH"}, {"AttributeName": "s", "KeyType": "RANGE"}],
            AttributeDefinitions=[{"AttributeName": "c", "AttributeType": "S"}, {"AttributeName": "s", "AttributeType": "N"}],
        )
        yield ddb


def _pages(ddb, condition: str, values: dict, **extra) -> list[int]:
    got, start = [], None
    while True:
        page = ddb.query(TableName=TABLE, KeyConditionExpression=condition, ExpressionAttributeValues=values,
                         **extra, **({"ExclusiveStartKey": start} if start else {}))
        got += [int(i["s"]["N"]) for i in page["Items"]]
        start = page.get("LastEvaluatedKey")
        if not start:
            return got


def test_queries_of_a_partition_answer_as_dynamodb_through_every_page(table):
    rng = random.Random(7)
    stored: dict[str, set[int]] = {"a": set(), "b": set()}
    for n in range(300):  # appended in order, then out of order, overwritten and deleted
        c = rng.choice("ab")
        s = n if n < 150 else rng.randrange(-50, 350)
        table.put_item(TableName=TABLE, Item={"c": {"S": c}, "s": {"N": str(s)}, "v": {"N": str(n)}})
        stored[c].add(s)
        if n % 7 == 0 and stored[c]:
            gone = rng.choice(sorted(stored[c]))
            table.delete_item(TableName=TABLE, Key={"c": {"S": c}, "s": {"N": str(gone)}})
            stored[c].discard(gone)
    ops = {"=": lambda s, x, y: s == x, "<": lambda s, x, y: s < x, "<=": lambda s, x, y: s <= x,
           ">": lambda s, x, y: s > x, ">=": lambda s, x, y: s >= x, "BETWEEN": lambda s, x, y: x <= s <= y}
    for _ in range(80):
        c, op = rng.choice("ab"), rng.choice([None, *ops])
        x = rng.randrange(-60, 360)
        y = x + rng.randrange(0, 100)
        values = {":c": {"S": c}, ":x": {"N": str(x)}, ":y": {"N": str(y)}}
        condition = "c = :c" + ("" if op is None else " AND s BETWEEN :x AND :y" if op == "BETWEEN" else f" AND s {op} :x")
        if op is None:
            values = {":c": values[":c"]}
        elif op != "BETWEEN":
            values.pop(":y")
        forward = rng.random() < 0.5
        want = sorted((s for s in stored[c] if op is None or ops[op](s, x, y)), reverse=not forward)
        extra = {"ScanIndexForward": forward}
        if rng.random() < 0.7:
            extra["Limit"] = rng.choice([1, 2, 5, 50])
        assert _pages(table, condition, values, **extra) == want, (c, condition, values, extra)


def test_the_last_message_of_a_partition_is_its_greatest_sort_key(table):
    for s in (5, 1, 9, 3):
        table.put_item(TableName=TABLE, Item={"c": {"S": "x"}, "s": {"N": str(s)}})
    last = table.query(TableName=TABLE, KeyConditionExpression="c = :c", ExpressionAttributeValues={":c": {"S": "x"}},
                       ScanIndexForward=False, Limit=1)
    assert [i["s"]["N"] for i in last["Items"]] == ["9"] and last["LastEvaluatedKey"]["s"] == {"N": "9"}
    assert table.query(TableName=TABLE, KeyConditionExpression="c = :c",
                       ExpressionAttributeValues={":c": {"S": "nobody"}})["Items"] == []


def test_a_sorted_partition_keeps_its_keys_in_order_and_its_copies_sort_again():
    import copy

    p = SortedPartition()
    for k in (3, 1, 2, 5):
        p[k] = str(k)
    assert p.sorted_keys() == [1, 2, 3, 5]
    p[4] = "4"
    p[6] = "6"
    p[4] = "four"  # an overwrite: no second key
    assert p.sorted_keys() == [1, 2, 3, 4, 5, 6]
    p.pop(2)
    del p[6]
    assert p.sorted_keys() == [1, 3, 4, 5]
    twin = copy.deepcopy(p)
    assert isinstance(twin, SortedPartition) and twin.sorted_keys() == [1, 3, 4, 5] and twin[4] == "four"


def test_an_index_on_the_tables_own_partition_key_reads_that_partition_and_answers_as_moto_does():
    # The messages table's sparse markers index: keyed on the table's partition key and an
    # attribute only some items have; a COUNT of one partition, pages and a range condition.
    _partition_queries()
    with mock_aws():
        ddb = boto3.client("dynamodb", region_name="us-east-1")
        ddb.create_table(
            TableName="x", BillingMode="PAY_PER_REQUEST",
            KeySchema=[{"AttributeName": "c", "KeyType": "HASH"}, {"AttributeName": "s", "KeyType": "RANGE"}],
            AttributeDefinitions=[{"AttributeName": "c", "AttributeType": "S"}, {"AttributeName": "s", "AttributeType": "N"},
                                  {"AttributeName": "k", "AttributeType": "S"}],
            GlobalSecondaryIndexes=[{"IndexName": "marks", "Projection": {"ProjectionType": "KEYS_ONLY"},
                                     "KeySchema": [{"AttributeName": "c", "KeyType": "HASH"},
                                                   {"AttributeName": "k", "KeyType": "RANGE"}]}],
        )
        rng = random.Random(5)
        marked = {"a": [], "b": []}
        for s in rng.sample(range(1, 400), 120):
            for c in ("a", "b"):
                item = {"c": {"S": c}, "s": {"N": str(s)}}
                if rng.random() < 0.3:
                    item["k"] = {"S": f"r{s % 7}"}
                    marked[c].append((f"r{s % 7}", s))
                ddb.put_item(TableName="x", Item=item)
        count = ddb.query(TableName="x", IndexName="marks", KeyConditionExpression="c = :c",
                          ExpressionAttributeValues={":c": {"S": "a"}}, Select="COUNT")["Count"]
        assert count == len(marked["a"])
        got, start = [], None
        while True:
            page = ddb.query(TableName="x", IndexName="marks", KeyConditionExpression="c = :c AND k > :k",
                             ExpressionAttributeValues={":c": {"S": "b"}, ":k": {"S": "r2"}}, Limit=7,
                             **({"ExclusiveStartKey": start} if start else {}))
            got += [(i["k"]["S"], int(i["s"]["N"])) for i in page["Items"]]
            start = page.get("LastEvaluatedKey")
            if not start:
                break
        assert sorted(got) == sorted(m for m in marked["b"] if m[0] > "r2")
        assert [k for k, _ in got] == sorted(k for k, _ in got)  # in the index's order
