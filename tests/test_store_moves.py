"""A move (assign, then notify): the connection attached to a named session and posted to
its inbox of assignments in one transaction, conditional on both sides, against the
emulator."""

from __future__ import annotations

import boto3
import pytest
from botocore.config import Config

from wsfleet import schema
from wsfleet.leases import AcquireFailure
from wsfleet.store import Acquired, ConnectionsStore, Moved, NotAcquired, Released, SessionsStore

from tests.conftest import open_sessions

URL = "ws://127.0.0.1:9/s"


@pytest.fixture
def store(ddb, aws_env):
    open_sessions(ddb, aws_env, "a#1", "b#1", "c#1")
    return ConnectionsStore(ddb, aws_env["TABLE_NAME"], state_shards=4, sessions_table_name=aws_env["SESSIONS_TABLE_NAME"])


@pytest.fixture
def sessions(ddb, aws_env):
    return SessionsStore(ddb, aws_env["SESSIONS_TABLE_NAME"])


def handed(store: ConnectionsStore, cid: str = "c1") -> None:
    """``cid`` taken by a#1 (fence 1) and handed off with checkpoint 7."""
    store.start(cid, URL)
    store.acquire(cid, session_id="a#1", worker_id="a")
    assert store.release(cid, session_id="a#1", fence_token=1, last_seq=7, handoff=True) is Released.HANDED


def inbox(sessions: SessionsStore, session_id: str) -> set[str]:
    return set(sessions.get(session_id).get(schema.ASSIGNED) or ())


def test_a_handoff_moves_to_the_named_session_at_the_next_fence_and_lands_in_its_inbox(store, sessions):
    handed(store)

    assert store.move("c1", from_session="a#1", fence_token=1, to_session="b#1", released=True) is Moved.MOVED

    item = store.get("c1")
    assert (item["lease_session"], item["lease_owner"], item["fence_token"]) == ("b#1", "b", 2)
    assert item["owner_key"] == schema.owner_key_session("b#1") and schema.RELEASED_FENCE not in item
    assert inbox(sessions, "b#1") == {"c1#2"}
    # The target's acquire reads it as its own (no write) and, the release having flushed
    # everything, needs no read of the stored messages' end.
    taken = store.acquire("c1", session_id="b#1", worker_id="b", expected_session="b#1")
    assert isinstance(taken, Acquired) and taken.checkpoint_is_end and int(taken.item["fence_token"]) == 2
    # The mover's late writes are refused.
    assert not store.checkpoint("c1", session_id="a#1", fence_token=1, last_seq=9)
    assert store.free_released("c1", session_id="a#1", fence_token=1) is Released.LOST


def test_a_move_to_a_session_that_ended_or_is_leaving_writes_nothing(store, sessions):
    handed(store)
    sessions.end_own("b#1", worker_id="b")
    sessions.renew("c#1", lease_ms=700_000, active=0, max_connections=10, draining=True)

    for target in ("b#1", "c#1", "z#1"):
        assert store.move("c1", from_session="a#1", fence_token=1, to_session=target, released=True) is Moved.REFUSED

    item = store.get("c1")
    assert (item["lease_session"], item["fence_token"], item["released_fence"]) == ("a#1", 1, 1)
    assert schema.ASSIGNED not in sessions.get("b#1")


def test_a_move_to_a_session_whose_inbox_is_full_is_refused(store, sessions, ddb, aws_env, monkeypatch):
    monkeypatch.setattr(schema, "ASSIGNED_MAX", 2)
    for cid in ("c1", "c2", "c3"):
        handed(store, cid)

    moved = [store.move(c, from_session="a#1", fence_token=1, to_session="b#1", released=True) for c in ("c1", "c2", "c3")]

    assert moved == [Moved.MOVED, Moved.MOVED, Moved.REFUSED]
    assert inbox(sessions, "b#1") == {"c1#2", "c2#2"}


def test_a_move_of_a_connection_taken_stopped_or_not_at_the_fence_read_is_lost(store, sessions):
    handed(store, "c1")
    store.acquire("c1", session_id="c#1", worker_id="c")  # a taker of the handoff won
    handed(store, "c2")
    store.stop("c2", sessions=sessions)

    assert store.move("c1", from_session="a#1", fence_token=1, to_session="b#1", released=True) is Moved.LOST
    assert store.move("c2", from_session="a#1", fence_token=1, to_session="b#1", released=True) is Moved.LOST
    assert store.move("c1", from_session="c#1", fence_token=1, to_session="b#1", released=False) is Moved.LOST  # fence 2 now
    assert schema.ASSIGNED not in sessions.get("b#1")


def test_a_dead_sessions_connection_moves_without_a_release_mark_and_its_new_owner_reads_the_stored_end(store, sessions):
    store.start("c1", URL)
    store.acquire("c1", session_id="a#1", worker_id="a")
    sessions.end_own("a#1", worker_id="a")  # as a watcher ends a crashed one

    assert store.move("c1", from_session="a#1", fence_token=1, to_session="b#1", released=False) is Moved.MOVED

    taken = store.acquire("c1", session_id="b#1", worker_id="b", expected_session="b#1")
    assert isinstance(taken, Acquired) and not taken.checkpoint_is_end  # a crash: its tail is read


def test_a_target_that_dies_before_its_pickup_is_drained_like_any_dead_session(store, sessions):
    handed(store)
    store.move("c1", from_session="a#1", fence_token=1, to_session="b#1", released=True)
    sessions.end_own("b#1", worker_id="b")

    assert [r.connection_id for r in store.owned_by("b#1")] == ["c1"]
    taken = store.acquire("c1", session_id="c#1", worker_id="c", expected_session="b#1")
    assert isinstance(taken, Acquired) and int(taken.item["fence_token"]) == 3


def test_a_quarantined_connection_is_never_moved(store, ddb, aws_env):
    handed(store)
    ddb.update_item(
        TableName=aws_env["TABLE_NAME"], Key={"pk": {"S": schema.connection_pk("c1")}},
        UpdateExpression="SET #q = :q", ExpressionAttributeNames={"#q": schema.QUARANTINED},
        ExpressionAttributeValues={":q": {"S": "test"}},
    )
    assert store.move("c1", from_session="a#1", fence_token=1, to_session="b#1", released=True) is Moved.LOST
    refused = store.acquire("c1", session_id="b#1", worker_id="b", expected_session="a#1")
    assert isinstance(refused, NotAcquired) and refused.reason is AcquireFailure.QUARANTINED


def test_a_move_applied_with_its_answer_lost_is_moved_when_retried(emulator, aws_env, store, sessions, lose_first_answer):
    retrying = boto3.client(
        "dynamodb", endpoint_url=emulator.endpoint_url, region_name="us-east-1",
        config=Config(retries={"mode": "standard", "total_max_attempts": 3}),
    )
    mine = ConnectionsStore(retrying, aws_env["TABLE_NAME"], state_shards=4, sessions_table_name=aws_env["SESSIONS_TABLE_NAME"])
    handed(store)
    lost = lose_first_answer(retrying, {"TransactWriteItems": 1.0})

    assert mine.move("c1", from_session="a#1", fence_token=1, to_session="b#1", released=True) is Moved.MOVED
    assert lost == ["TransactWriteItems"]
    assert (store.get("c1")["fence_token"], inbox(sessions, "b#1")) == (2, {"c1#2"})
