"""The connections table's side of real upstreams, against the emulator: an acquisition
takes the connection with the upstream it read (pinned to it, so a STOP then START with
another upstream is never taken the old way, from a read or from a hint), and the
owner's last_error (written only by its ownership, only when it changes)."""

from __future__ import annotations

import boto3
import pytest
from botocore.config import Config

from wsfleet import schema
from wsfleet.store import Acquired, ConnectionsStore, SessionsStore, TransientError

from tests.conftest import open_sessions

URL = "ws://127.0.0.1:9/s"
OLD = {"headers": {"X-Plan": "old"}, "resume": "none"}
NEW = {"headers": {"X-Plan": "new"}, "subprotocols": ["v2"], "resume": "none"}


@pytest.fixture
def store(ddb, aws_env):
    open_sessions(ddb, aws_env, "a#1", "b#1", "c#1")
    return ConnectionsStore(
        ddb, aws_env["TABLE_NAME"], state_shards=4, sessions_table_name=aws_env["SESSIONS_TABLE_NAME"]
    )


def released(store: ConnectionsStore, cid: str, upstream: dict | None) -> None:
    """Started with ``upstream``, taken by a#1 and released cleanly at seq 7."""
    store.start(cid, URL, upstream)
    assert isinstance(store.acquire(cid, session_id="a#1", worker_id="a"), Acquired)
    assert store.release(cid, session_id="a#1", fence_token=1, last_seq=7)


def test_an_acquisition_returns_the_upstream_it_read(store):
    released(store, "with", OLD)
    released(store, "without", None)
    got = store.acquire_many([("with", ""), ("without", "")], session_id="b#1", worker_id="b")
    assert got[0].item[schema.UPSTREAM] == OLD
    assert schema.UPSTREAM not in got[1].item


def test_a_hint_carries_the_upstream_and_a_stale_one_is_corrected_by_the_cancellation(ddb, aws_env, store):
    """A STOP then START while free keeps the fence and the url: only the upstream pin
    tells the hinted state from the new one."""
    cases = {  # connection: (upstream at release, upstream the hint carries, upstream now)
        "same": (OLD, OLD, OLD),
        "changed": (OLD, OLD, NEW),
        "added": (None, None, NEW),
        "removed": (OLD, OLD, None),
        "default": (None, None, None),
    }
    hinted = {}
    for cid, (at_release, in_hint, now) in cases.items():
        released(store, cid, at_release)
        hinted[cid] = schema.item_from_released(cid, schema.released_state(1, URL, 7, in_hint))
        if now != at_release:
            store.stop(cid, sessions=SessionsStore(ddb, store._sessions_table))
            store.start(cid, URL, now)  # the router's restart: another upstream, same url and fence
            assert store.get(cid)["fence_token"] == 1  # nothing but the upstream tells them apart
    got = store.acquire_many([(c, "") for c in cases], session_id="b#1", worker_id="b", known=hinted)
    for (cid, (_, _, now)), result in zip(cases.items(), got, strict=True):
        assert isinstance(result, Acquired), cid
        assert result.item.get(schema.UPSTREAM) == now, cid  # never the hint's old one
        item = store.get(cid)
        assert item.get(schema.UPSTREAM) == now and item["fence_token"] == 2 and item["lease_session"] == "b#1"


def test_a_hints_upstream_is_taken_only_when_well_formed():
    good = schema.released_state(3, URL, 10, OLD)
    assert schema.item_from_released("c", good)[schema.UPSTREAM] == OLD
    assert schema.UPSTREAM not in schema.released_state(3, URL, 10, {})  # the default: absent, as stored
    for bad in ({**good, "upstream": "x"}, {**good, "upstream": {}}, {**good, "upstream": [1]}):
        assert schema.item_from_released("c", bad) is None


def test_last_error_is_written_by_its_owner_only_and_only_when_it_changes(store):
    released(store, "c", None)
    assert isinstance(store.acquire("c", session_id="b#1", worker_id="b"), Acquired)
    assert store.note_error("c", session_id="b#1", fence_token=2, text="HTTP 403 from the upstream")
    first = store.get("c")
    assert first[schema.LAST_ERROR] == "HTTP 403 from the upstream"
    # Again with the same text (or a retry of a write whose answer was lost): not rewritten.
    assert store.note_error("c", session_id="b#1", fence_token=2, text="HTTP 403 from the upstream")
    assert store.get("c")[schema.LAST_ERROR_AT_MS] == first[schema.LAST_ERROR_AT_MS]
    assert store.get("c")[schema.UPDATED_AT_MS] == first[schema.UPDATED_AT_MS]
    # Another ownership (an older fence, another session) writes nothing.
    assert not store.note_error("c", session_id="b#1", fence_token=1, text="stale")
    assert not store.note_error("c", session_id="a#1", fence_token=2, text="stale")
    assert not store.clear_error("c", session_id="a#1", fence_token=2)
    assert store.get("c")[schema.LAST_ERROR] == "HTTP 403 from the upstream"
    assert store.note_error("c", session_id="b#1", fence_token=2, text="HTTP 401 from the upstream")
    assert store.get("c")[schema.LAST_ERROR] == "HTTP 401 from the upstream"
    assert store.clear_error("c", session_id="b#1", fence_token=2)
    assert store.clear_error("c", session_id="b#1", fence_token=2)  # already clear: a retry
    item = store.get("c")
    assert schema.LAST_ERROR not in item and schema.LAST_ERROR_AT_MS not in item
    assert not store.note_error("gone", session_id="b#1", fence_token=2, text="x")  # no item: not ours
    assert store.get("gone") is None  # and nothing written


def test_a_hint_carries_the_releasers_last_error_for_the_taker_to_clear():
    hinted = schema.item_from_released("c", schema.released_state(3, URL, 10, OLD, "HTTP 403"))
    assert hinted[schema.LAST_ERROR] == "HTTP 403"
    assert schema.LAST_ERROR not in schema.item_from_released("c", schema.released_state(3, URL, 10, OLD))


def test_last_error_writes_whose_answers_are_lost_read_as_done_when_tried_again(emulator, aws_env, store, lose_first_answer):
    """As the worker calls them: one attempt per call (a lost answer is a TransientError),
    tried again by call_until, which finds the write landed: done, not "no longer ours"."""
    once = boto3.client(
        "dynamodb", endpoint_url=emulator.endpoint_url, region_name="us-east-1",
        config=Config(retries={"mode": "standard", "total_max_attempts": 1}),
    )
    worker_store = ConnectionsStore(once, aws_env["TABLE_NAME"], state_shards=4, sessions_table_name=aws_env["SESSIONS_TABLE_NAME"])
    released(store, "c", None)
    assert isinstance(store.acquire("c", session_id="b#1", worker_id="b"), Acquired)
    for write in (
        lambda: worker_store.note_error("c", session_id="b#1", fence_token=2, text="HTTP 403"),
        lambda: worker_store.clear_error("c", session_id="b#1", fence_token=2),
    ):
        lost = lose_first_answer(once, {"UpdateItem": 1.0})
        with pytest.raises(TransientError):
            write()
        assert lost == ["UpdateItem"]
        assert write()  # landed the first time: the retry says done
    assert schema.LAST_ERROR not in store.get("c")
