"""The store refuses a checkpoint that goes backwards (store.conditions.CHECKPOINT_NOT_BEHIND),
against the emulator: a refusal while still holding the connection is nothing to do,
never a lost race, costs the other checkpoints of its transaction nothing, and a release
behind the stored checkpoint still lands, without moving it back."""

from __future__ import annotations

import pytest

from wsfleet import schema
from wsfleet.store import Acquired, CheckpointEntry, ConnectionsStore, Released, SessionsStore

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
