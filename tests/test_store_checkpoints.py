"""The store refuses a checkpoint that goes backwards (store.conditions.CHECKPOINT_NOT_BEHIND),
against the emulator: a refusal while still holding the connection is nothing to do,
never a lost race, costs the other checkpoints of its transaction nothing, and a release
behind the stored checkpoint still lands, without moving it back. What a checkpoint
covers is counted (frames, bytes, last_frame_at_ms) once, whatever is retried."""

from __future__ import annotations

import boto3
import pytest
from botocore.config import Config

from wsfleet import schema
from wsfleet.checkpoint import Checkpoint, Tally, Uncounted
from wsfleet.sinks import MessagesStore
from wsfleet.store import Acquired, CheckpointEntry, ConnectionsStore, Released, SessionsStore
from wsfleet.stream import Frame
from wsfleet.worker.frames import CheckpointTimer

from tests.conftest import open_sessions

URL = "ws://127.0.0.1:9/s"


@pytest.fixture
def store(ddb, aws_env):
    open_sessions(ddb, aws_env, "a#1", "b#1")
    return ConnectionsStore(ddb, aws_env["TABLE_NAME"], state_shards=4, sessions_table_name=aws_env["SESSIONS_TABLE_NAME"])


def held(store: ConnectionsStore, *ids: str, last_seq: int = 0) -> None:
    """Connections started and taken by a#1 (fence 1), checkpointed at ``last_seq``."""
    for cid in ids:
        store.start(cid, URL)
        assert isinstance(store.acquire(cid, session_id="a#1", worker_id="a"), Acquired)
        assert store.checkpoint(cid, session_id="a#1", fence_token=1, last_seq=last_seq)


def test_a_checkpoint_behind_the_stored_one_is_refused_as_nothing_to_do(store):
    held(store, "c1", last_seq=10)
    assert store.checkpoint("c1", session_id="a#1", fence_token=1, last_seq=5)  # ours: not a lost race
    assert store.get("c1")["last_seq"] == 10
    assert store.checkpoint("c1", session_id="a#1", fence_token=1, last_seq=10)  # the same again lands (a retry)
    assert store.checkpoint("c1", session_id="a#1", fence_token=1, last_seq=11)
    assert store.get("c1")["last_seq"] == 11
    assert not store.checkpoint("c1", session_id="b#1", fence_token=1, last_seq=3)  # not ours: lost, as before


def test_a_checkpoint_refused_as_behind_costs_the_others_in_its_transaction_nothing(store):
    ids = ["k0", "k1", "k2"]
    held(store, *ids)
    assert store.checkpoint("k1", session_id="a#1", fence_token=1, last_seq=50)
    entries = [CheckpointEntry(cid, "a#1", 1, 20 + n) for n, cid in enumerate(ids)]
    assert store.checkpoint_many(entries) == [True, True, True]
    assert [store.get(c)["last_seq"] for c in ids] == [20, 50, 22]


def test_behind_and_lost_in_one_transaction_are_told_apart_and_the_rest_go_again(store):
    ids = ["k0", "k1", "k2"]
    held(store, *ids, last_seq=30)
    store.release("k2", session_id="a#1", fence_token=1, last_seq=30)
    entries = [CheckpointEntry("k0", "a#1", 1, 40), CheckpointEntry("k1", "a#1", 1, 10), CheckpointEntry("k2", "a#1", 1, 40)]
    # k1 is behind (nothing to do), k2 is no longer ours, k0 was not written because of k2.
    assert store.checkpoint_many(entries) == [None, True, False]
    assert [store.get(c)["last_seq"] for c in ids] == [30, 30, 30]
    assert store.checkpoint_many([entries[0]]) == [True]


def test_a_release_behind_the_stored_checkpoint_lands_without_moving_it_back(store, ddb, aws_env):
    held(store, "c1", last_seq=9)
    assert store.release("c1", session_id="a#1", fence_token=1, last_seq=7) is Released.FREE
    item = store.get("c1")
    assert item["lease_session"] == "" and item["owner_key"] == schema.owner_key_free("c1", 4)
    assert item["last_seq"] == 9 and schema.CHECKPOINT_IS_END not in item  # 9 is not ours to call the end
    taken = store.acquire("c1", session_id="b#1", worker_id="b")
    assert isinstance(taken, Acquired) and not taken.checkpoint_is_end  # the taker reads past it
    store.stop("c1", sessions=SessionsStore(ddb, aws_env["SESSIONS_TABLE_NAME"]))
    assert store.release("c1", session_id="b#1", fence_token=2, last_seq=3, stopped=True) is Released.STOPPED
    assert store.get("c1")["last_seq"] == 9


def test_a_handoff_behind_the_stored_checkpoint_is_handed_without_moving_it_back(store):
    held(store, "c1", last_seq=9)
    assert store.release("c1", session_id="a#1", fence_token=1, last_seq=7, handoff=True) is Released.HANDED
    item = store.get("c1")
    assert item["lease_session"] == "a#1" and item[schema.RELEASED_FENCE] == 1
    assert item["last_seq"] == 9 and schema.CHECKPOINT_IS_END not in item
    assert store.release("c1", session_id="a#1", fence_token=1, last_seq=7, handoff=True) is Released.HANDED  # a retry


def test_stop_and_start_keep_the_checkpoint_and_the_next_owner_goes_on_from_it(store, ddb, aws_env):
    held(store, "c1", last_seq=12)
    store.stop("c1", sessions=SessionsStore(ddb, aws_env["SESSIONS_TABLE_NAME"]))
    assert store.release("c1", session_id="a#1", fence_token=1, last_seq=12, stopped=True) is Released.STOPPED
    store.start("c1", URL)
    again = store.acquire("c1", session_id="b#1", worker_id="b")
    assert isinstance(again, Acquired) and again.checkpoint_is_end and again.item["last_seq"] == 12
    assert store.checkpoint("c1", session_id="b#1", fence_token=2, last_seq=12)
    assert store.checkpoint("c1", session_id="b#1", fence_token=2, last_seq=13)
    assert store.get("c1")["last_seq"] == 13


# --- the counts a checkpoint carries (frames, bytes, last_frame_at_ms) ------------------


def counts(store: ConnectionsStore, cid: str) -> tuple:
    item = store.get(cid)
    return tuple(item.get(name, 0) for name in (schema.FRAMES, schema.BYTES, schema.LAST_FRAME_AT_MS))


def batches(*pieces: tuple[int, int, int, int], base: int = 0) -> Uncounted:
    """Stored batches as (last seq, frames, bytes, newest frame's ms), past ``base``."""
    return Uncounted(base, tuple((end, Tally(n, b, at)) for end, n, b, at in pieces))


def test_a_checkpoint_adds_what_it_covers_once_and_its_retry_adds_nothing(store):
    held(store, "c1")
    first = CheckpointEntry("c1", "a#1", 1, 5, batches((3, 3, 30, 1_000), (5, 2, 20, 2_000)))
    assert store.checkpoint_many([first]) == [True]
    assert counts(store, "c1") == (5, 50, 2_000) and store.get("c1")["last_seq"] == 5
    assert store.checkpoint_many([first]) == [True]  # sent again: its own checkpoint is stored, nothing left to add
    assert counts(store, "c1") == (5, 50, 2_000)
    assert store.checkpoint_many([CheckpointEntry("c1", "a#1", 1, 8, batches((8, 1, 7, 3_000), base=5))]) == [True]
    assert counts(store, "c1") == (6, 57, 3_000)


def test_counts_taken_against_a_checkpoint_another_write_moved_are_taken_again_against_the_stored_one(store):
    held(store, "c1", "c2")
    assert store.checkpoint("c1", session_id="a#1", fence_token=1, last_seq=3)  # batches up to 3: counted by that write
    entries = [
        CheckpointEntry("c1", "a#1", 1, 5, batches((3, 3, 30, 1_000), (5, 2, 20, 2_000))),
        CheckpointEntry("c2", "a#1", 1, 4, batches((4, 4, 40, 1_500))),
    ]
    assert store.checkpoint_many(entries) == [True, True]
    assert counts(store, "c1") == (2, 20, 2_000) and counts(store, "c2") == (4, 40, 1_500)


def test_a_counting_checkpoint_applied_with_its_answer_lost_counts_once(emulator, aws_env, store, lose_first_answer):
    retrying = boto3.client(
        "dynamodb", endpoint_url=emulator.endpoint_url, region_name="us-east-1",
        config=Config(retries={"mode": "standard", "total_max_attempts": 3}),
    )
    mine = ConnectionsStore(retrying, aws_env["TABLE_NAME"], state_shards=4, sessions_table_name=aws_env["SESSIONS_TABLE_NAME"])
    held(store, "c1")
    lost = lose_first_answer(retrying, {"TransactWriteItems": 1.0})
    entry = CheckpointEntry("c1", "a#1", 1, 9, batches((9, 9, 90, 4_000)))
    assert mine.checkpoint_many([entry]) == [True]  # the SDK's retry finds 9 stored: refused, nothing added
    assert lost == ["TransactWriteItems"]
    assert counts(store, "c1") == (9, 90, 4_000) and store.get("c1")["last_seq"] == 9


@pytest.mark.parametrize("how", ["free", "stop", "handoff"])
def test_a_release_counts_what_its_last_seq_covers_once_even_retried(store, ddb, aws_env, how):
    held(store, "c1")
    kwargs = dict(session_id="a#1", fence_token=1, last_seq=6, uncounted=batches((4, 4, 40, 1_000), (6, 1, 5, 2_000)))
    if how == "stop":
        store.stop("c1", sessions=SessionsStore(ddb, aws_env["SESSIONS_TABLE_NAME"]))
    assert store.release("c1", **kwargs, stopped=how == "stop", handoff=how == "handoff")
    assert store.release("c1", **kwargs, stopped=how == "stop", handoff=how == "handoff")  # a retry: already so
    assert counts(store, "c1") == (5, 45, 2_000) and store.get("c1")["last_seq"] == 6


def test_a_checkpoint_with_nothing_to_count_leaves_the_counts_absent(store):
    held(store, "c1", last_seq=4)
    assert counts(store, "c1") == (0, 0, 0) and schema.FRAMES not in store.get("c1")


def test_what_a_dead_owner_stored_past_its_checkpoint_is_counted_by_the_next_owners_first_checkpoint_once(
    store, ddb, aws_env
):
    msgs = MessagesStore(ddb, aws_env["MESSAGES_TABLE_NAME"])
    held(store, "c1")
    data = [Frame(s, '"abc"', 1_000 + s) for s in range(1, 7)]
    msgs.put("c1", data, fence_token=1, worker_id="a")
    counted = Uncounted(0, tuple((f.seq, Tally(1, 5, f.received_at_ms)) for f in data[:2]))
    assert store.checkpoint_many([CheckpointEntry("c1", "a#1", 1, 2, counted)]) == [True]
    SessionsStore(ddb, aws_env["SESSIONS_TABLE_NAME"]).end_own("a#1", worker_id="a")  # dies with 3..6 uncounted

    taken = store.acquire("c1", session_id="b#1", worker_id="b", expected_session="a#1")
    assert isinstance(taken, Acquired) and not taken.checkpoint_is_end
    end = msgs.stored_end("c1", taken.item["last_seq"])
    timer = CheckpointTimer.after(120.0, 0.1, Checkpoint(2), 0.0, end)
    timer.stored(7, Tally(1, 5, 1_007))  # the new owner's own first frame
    assert store.checkpoint_many([CheckpointEntry("c1", "b#1", 2, 7, timer.uncounted())]) == [True]
    assert end == 6 and counts(store, "c1") == (7, 35, 1_007)


@pytest.mark.parametrize("handoff", [False, True])
def test_a_release_applied_with_its_answer_lost_counts_once(emulator, aws_env, store, lose_first_answer, handoff):
    retrying = boto3.client(
        "dynamodb", endpoint_url=emulator.endpoint_url, region_name="us-east-1",
        config=Config(retries={"mode": "standard", "total_max_attempts": 3}),
    )
    mine = ConnectionsStore(retrying, aws_env["TABLE_NAME"], state_shards=4, sessions_table_name=aws_env["SESSIONS_TABLE_NAME"])
    held(store, "c1")
    lost = lose_first_answer(retrying, {"UpdateItem": 1.0})
    assert mine.release("c1", session_id="a#1", fence_token=1, last_seq=3, handoff=handoff, uncounted=batches((3, 3, 9, 500)))
    assert lost == ["UpdateItem"]  # the counts rode on the release's own write, and its retry added nothing
    assert counts(store, "c1") == (3, 9, 500) and store.get("c1")["last_seq"] == 3


def test_a_release_after_a_checkpoint_it_did_not_hear_of_counts_only_what_lies_past_it(store):
    held(store, "c1")
    in_flight = CheckpointEntry("c1", "a#1", 1, 4, batches((4, 4, 40, 1_000)))
    assert store.checkpoint_many([in_flight]) == [True]  # landed while its runner had stopped waiting
    uncounted = batches((4, 4, 40, 1_000), (6, 2, 20, 2_000))
    assert store.release("c1", session_id="a#1", fence_token=1, last_seq=6, uncounted=uncounted) is Released.FREE
    assert counts(store, "c1") == (6, 60, 2_000) and store.get("c1")["last_seq"] == 6
