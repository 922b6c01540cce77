"""The messages table sink (:mod:`wsfleet.sinks.messages`) against the emulator: items keyed
by seq, skip markers and ranges, the stored end a new owner resumes after, and the items
the table refuses."""

from __future__ import annotations

import pytest

from wsfleet import schema
from wsfleet.checkpoint import Tally
from wsfleet.sinks import InvalidItem, MessagesStore
from wsfleet.stream import Frame, Problem, upstream_gap


def test_the_stored_end_past_a_checkpoint_stops_at_the_first_hole(ddb, aws_env):
    msgs = MessagesStore(ddb, aws_env["MESSAGES_TABLE_NAME"])
    seqs = [*range(1, 31), 32, 33]  # 31 was left unprocessed by a crashed owner's last batch
    msgs.put("c1", [Frame(s, "{}", 1) for s in seqs], fence_token=1, worker_id="a")
    assert msgs.stored_end("c1", 10) == 30
    assert msgs.stored_end("c1", 31) == 33
    assert msgs.stored_end("c1", 40) == 40
    assert msgs.stored_end("other", 0) == 0


def test_the_stored_end_brings_what_its_items_add_to_the_counts_markers_and_items_past_the_hole_none(ddb, aws_env):
    msgs = MessagesStore(ddb, aws_env["MESSAGES_TABLE_NAME"])
    stored = [Frame(1, '"ab"', 100), upstream_gap(2, 4, 150), Frame(5, '"é"', 200), Frame(7, "{}", 300)]
    msgs.put("c1", stored, fence_token=1, worker_id="a")
    end = msgs.stored_end("c1", 0)
    assert end == 5 and end.pieces == ((1, Tally(1, 4, 100)), (5, Tally(1, 4, 200)))  # 7 is past the hole at 6
    assert msgs.stored_end("c1", 1).pieces == ((5, Tally(1, 4, 200)),)


def test_messages_are_keyed_by_seq_so_a_replay_rewrites_not_duplicates(ddb, aws_env):
    msgs = MessagesStore(ddb, aws_env["MESSAGES_TABLE_NAME"], ttl_days=1)
    frames = [Frame(seq, f'{{"v":{seq}}}', 1_000_000) for seq in range(1, 61)]
    msgs.put("c1", frames, fence_token=1, worker_id="a")
    msgs.put("c1", frames[40:], fence_token=2, worker_id="b")  # replay after a takeover
    rows = msgs.read_all("c1")
    assert [r["sk"] for r in rows] == list(range(1, 61))
    assert rows[0]["message_data"] == '{"v":1}' and rows[0]["worker_id"] == "a"
    assert rows[-1]["fence_token"] == 2 and rows[-1]["expires_at"] == 1_000 + 86_400


def test_a_skip_marker_is_an_item_with_no_data_that_says_why(ddb, aws_env):
    msgs = MessagesStore(ddb, aws_env["MESSAGES_TABLE_NAME"])
    msgs.put("c1", [Frame(1, "{}", 1), Frame(2, None, 1, data_bytes=500_000), Frame(3, None, 1)], fence_token=1, worker_id="a")
    rows = {r["sk"]: r for r in msgs.read_all("c1")}
    assert rows[2]["skipped"] == schema.SKIPPED_MALFORMED and rows[2]["data_bytes"] == 500_000
    assert "message_data" not in rows[2] and "data_bytes" not in rows[3]
    assert msgs.stored_end("c1", 0) == 3  # a marker counts as stored: no owner stops at it


def test_every_marker_is_stored_with_its_reason_and_a_gap_with_its_range(ddb, aws_env):
    msgs = MessagesStore(ddb, aws_env["MESSAGES_TABLE_NAME"])
    msgs.put(
        "c1",
        [
            Frame(1, None, 1, Problem.TOO_DEEP),
            Frame(2, None, 1, Problem.STORE_REFUSED, data_bytes=9),
            upstream_gap(3, 10**18, 1),
            Frame(10**18 + 1, None, 1, Problem.OVER_FRAME_LIMIT, data_bytes=2_000_000),
            Frame(10**18 + 2, "{}", 1),
        ],
        fence_token=1,
        worker_id="a",
    )
    rows = msgs.read_all("c1")
    assert [(r["sk"], r.get("skipped"), r.get("skip_to"), r.get("data_bytes")) for r in rows] == [
        (1, schema.SKIPPED_MALFORMED, None, None),
        (2, schema.SKIPPED_MALFORMED, None, 9),
        (3, schema.SKIPPED_UPSTREAM_GAP, 10**18, None),
        (10**18 + 1, schema.SKIPPED_OVER_FRAME_LIMIT, None, 2_000_000),
        (10**18 + 2, None, None, None),
    ]
    assert msgs.stored_end("c1", 0) == 10**18 + 2  # one range item stands for 10^18 seqs


def test_the_stored_end_goes_through_a_range_and_stops_at_the_hole_after_it(ddb, aws_env):
    msgs = MessagesStore(ddb, aws_env["MESSAGES_TABLE_NAME"])
    msgs.put("c1", [Frame(1, "{}", 1), upstream_gap(2, 40, 1), Frame(41, "{}", 1), Frame(43, "{}", 1)], fence_token=1, worker_id="a")
    assert msgs.stored_end("c1", 0) == 41
    assert msgs.stored_end("c1", 1) == 41
    assert msgs.stored_end("c1", 40) == 41  # a checkpoint at the range's end
    msgs.put("c1", [upstream_gap(42, 42, 1)], fence_token=2, worker_id="b")
    assert msgs.stored_end("c1", 0) == 43


@pytest.mark.parametrize(
    ("connection_id", "frame"),
    # A seq beyond 38 digits; a partition key over 2,048 bytes (large data never reaches
    # the table: it goes to its object first, see test_objects.py).
    [("c1", Frame(10**40, "{}", 1)), ("c" * 3000, Frame(1, "{}", 1))],
    ids=["client refuses", "table refuses"],
)
def test_an_item_the_store_refuses_is_invalid_not_transient(ddb, aws_env, connection_id, frame):
    msgs = MessagesStore(ddb, aws_env["MESSAGES_TABLE_NAME"], sleep=lambda _: None)
    with pytest.raises(InvalidItem):
        msgs.put(connection_id, [Frame(2, "{}", 1), frame], fence_token=1, worker_id="a")
