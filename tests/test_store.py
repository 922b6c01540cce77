"""The DynamoDB adapter against the emulator: sessions (open, renew, end, the ring, the
STOP inbox), connections attached to sessions (acquire, release, checkpoint, the owner
index); the messages table's writes are in test_messages.py."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from botocore.config import Config
from botocore.exceptions import ClientError

from wsfleet import schema
from wsfleet import store as store_mod
from wsfleet.leases import AcquireFailure, EndFailure, RenewFailure
from sim.emulator import set_faults
from wsfleet.store import (
    Acquired,
    CheckpointEntry,
    ConnectionsStore,
    NotAcquired,
    Released,
    SessionsStore,
    Started,
    StartOutcome,
    Stopped,
    StopOutcome,
    TransientError,
)
from sim.emulator import journal, record_journal

from tests.conftest import open_sessions

LEASE_MS = 10_000
SKEW_MS = 1_000


class Clock:
    """An injected wall clock, so expiry is tested without waiting for it."""

    def __init__(self) -> None:
        self.ms = int(time.time() * 1000)

    def __call__(self) -> int:
        return self.ms


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def store(ddb, aws_env, clock):
    # The acquirers below, LIVE by the test's clock (a renewal never moves an expiry back).
    opener = SessionsStore(ddb, aws_env["SESSIONS_TABLE_NAME"], clock_ms=clock)
    for name in ("a#1", "b#1", "c#1", "d#1"):
        opener.open(name, worker_id=name.split("#")[0], lease_ms=LEASE_MS, max_connections=10)
    return ConnectionsStore(
        ddb, aws_env["TABLE_NAME"], state_shards=4, sessions_table_name=aws_env["SESSIONS_TABLE_NAME"], clock_ms=clock
    )


@pytest.fixture
def sessions(ddb, aws_env, clock):
    return SessionsStore(ddb, aws_env["SESSIONS_TABLE_NAME"], clock_ms=clock)


@pytest.fixture
def started(store):
    store.start("c1", "ws://127.0.0.1:9/s")
    return "c1"


def _open(sessions, name: str) -> str:
    sessions.open(name, worker_id=name.split("#")[0], lease_ms=LEASE_MS, max_connections=10)
    return name


def _client(emulator):
    return boto3.client("dynamodb", endpoint_url=emulator.endpoint_url, region_name="us-east-1")


# --- sessions ------------------------------------------------------------------------------


def test_twenty_racing_workers_end_a_dead_session_exactly_once(emulator, aws_env, sessions, clock):
    _open(sessions, "dead#1")
    late = clock.ms + LEASE_MS + SKEW_MS + 1

    def racer(i: int):
        s = SessionsStore(_client(emulator), aws_env["SESSIONS_TABLE_NAME"], clock_ms=lambda: late)
        barrier.wait()
        return s.end_expired("dead#1", ended_by=f"w{i}", max_clock_skew_ms=SKEW_MS)

    barrier = threading.Barrier(20)
    with ThreadPoolExecutor(20) as pool:
        results = list(pool.map(racer, range(20)))
    winners = [r for r in results if isinstance(r, dict)]
    assert len(winners) == 1
    assert all(r is EndFailure.ALREADY_ENDED for r in results if not isinstance(r, dict))
    item = sessions.get("dead#1")
    assert item["state"] == schema.ENDED and item["ended_by"] == winners[0]["ended_by"]


def test_a_session_is_not_ended_before_its_expiry_plus_the_skew_margin(sessions, clock):
    _open(sessions, "w#1")
    clock.ms += LEASE_MS + SKEW_MS - 1
    assert sessions.end_expired("w#1", ended_by="x", max_clock_skew_ms=SKEW_MS) is EndFailure.RENEWED
    clock.ms += 2
    assert isinstance(sessions.end_expired("w#1", ended_by="x", max_clock_skew_ms=SKEW_MS), dict)


def test_renew_extends_the_session_and_reports_its_load(sessions, clock):
    _open(sessions, "w#1")
    clock.ms += 2_500
    item = sessions.renew("w#1", lease_ms=LEASE_MS, active=7, max_connections=10)
    assert item["expires_at_ms"] == clock.ms + LEASE_MS
    assert item["heartbeat_at_ms"] == clock.ms and item["active"] == 7 and item["max_connections"] == 10


def test_a_renewal_of_an_ended_session_fails_and_says_ended(sessions, clock):
    _open(sessions, "w#1")
    clock.ms += LEASE_MS + SKEW_MS + 1
    assert isinstance(sessions.end_expired("w#1", ended_by="x", max_clock_skew_ms=SKEW_MS), dict)
    assert sessions.renew("w#1", lease_ms=LEASE_MS, active=0, max_connections=10) is RenewFailure.ENDED
    assert sessions.renew("nobody#1", lease_ms=LEASE_MS, active=0, max_connections=10) is RenewFailure.GONE


def test_a_slow_renewal_never_moves_the_expiry_back(sessions, clock):
    _open(sessions, "w#1")
    clock.ms += 5_000
    sessions.renew("w#1", lease_ms=LEASE_MS, active=0, max_connections=10)
    clock.ms -= 3_000  # an older request, built before the one that landed
    with pytest.raises(TransientError):
        sessions.renew("w#1", lease_ms=LEASE_MS, active=0, max_connections=10)
    assert sessions.get("w#1")["expires_at_ms"] == clock.ms + 3_000 + LEASE_MS


def test_stops_posted_to_a_session_come_back_with_its_renewal_until_handled(sessions):
    _open(sessions, "w#1")
    assert sessions.post_stop("w#1", "c1", 3) and sessions.post_stop("w#1", "c2", 1)
    assert sessions.renew("w#1", lease_ms=LEASE_MS, active=2, max_connections=10)["stops"] == {"c1#3", "c2#1"}
    # c1 restarted, taken again (fence 4) and stopped again before the first was acknowledged.
    assert sessions.post_stop("w#1", "c1", 4)
    item = sessions.renew("w#1", lease_ms=LEASE_MS, active=0, max_connections=10, stops_done={"c1#3"})
    assert item["stops"] == {"c1#4", "c2#1"}
    done = {"c1#4", "c2#1"}
    assert "stops" not in sessions.renew("w#1", lease_ms=LEASE_MS, active=0, max_connections=10, stops_done=done)


def test_a_stop_is_not_posted_to_an_ended_session(sessions):
    _open(sessions, "w#1")
    sessions.end_own("w#1", worker_id="w")
    assert not sessions.post_stop("w#1", "c1", 1)


def test_the_ring_lists_successors_wrapping_around_and_leaves_out_drained_sessions(sessions):
    for name in ("a#1", "b#1", "c#1", "d#1"):
        _open(sessions, name)
    assert sessions.ring_after("b#1", limit=2) == ["c#1", "d#1"]
    assert sessions.ring_after("d#1", limit=2) == ["a#1", "b#1"]
    sessions.end_own("c#1", worker_id="c")
    assert sessions.ring_after("b#1", limit=1) == ["c#1"]  # ENDED but not drained: still watched
    assert sessions.leave_ring("c#1")
    assert sessions.ring_after("b#1", limit=2) == ["d#1", "a#1"]
    assert not sessions.leave_ring("d#1")  # a LIVE session never leaves the ring


def test_a_newcomer_finds_its_watchers_and_their_next_renewal_says_the_ring_changed(sessions):
    for name in ("a#1", "b#1", "c#1"):
        _open(sessions, name)
    assert sessions.ring_before("c#1", limit=2) == ["b#1", "a#1"]
    assert sessions.ring_before("a#1", limit=2) == ["c#1", "b#1"]  # wraps to the end
    assert sessions.announce("b#1")
    assert sessions.renew("b#1", lease_ms=LEASE_MS, active=0, max_connections=10)["ring_changes"] == 1
    sessions.end_own("a#1", worker_id="a")
    assert not sessions.announce("a#1")  # an ended session watches nothing


def test_watched_sessions_are_read_in_one_batch(sessions):
    for name in ("a#1", "b#1"):
        _open(sessions, name)
    got = {i["session_id"]: i for i in sessions.get_many(["a#1", "b#1", "gone#1"])}
    assert set(got) == {"a#1", "b#1"} and got["a#1"]["state"] == schema.LIVE


def test_the_ring_carries_each_sessions_load_a_page_at_a_time(sessions):
    """The summarizer's one read: ``by_ring`` projects state, load and capacity (never the
    expiry, which a renewal changes every heartbeat), in pages it bounds."""
    for name in ("a#1", "b#1", "c#1"):
        _open(sessions, name)
    sessions.renew("b#1", lease_ms=LEASE_MS, active=7, max_connections=10, draining=True)
    sessions.end_own("c#1", worker_id="c")
    page, cursor = sessions.ring_page(limit=2)
    assert [i["session_id"] for i in page] == ["a#1", "b#1"] and cursor is not None
    assert page[1] == {"session_id": "b#1", "ring": "RING", "state": schema.LIVE, "active": 7, "max_connections": 10, "draining": True}
    rest, cursor = sessions.ring_page(cursor, limit=2)
    assert [(i["session_id"], i["state"]) for i in rest] == [("c#1", schema.ENDED)] and cursor is None


class _Recording:
    """A DynamoDB client that records each UpdateItem's expression, and can lose the
    answer of the next one (the write lands, the caller sees an error)."""

    def __init__(self, real) -> None:
        self._real, self.updates, self.lose_next = real, [], False

    def __getattr__(self, name):
        return getattr(self._real, name)

    def update_item(self, **kwargs):
        self.updates.append(kwargs["UpdateExpression"])
        resp = self._real.update_item(**kwargs)
        if self.lose_next:
            self.lose_next = False
            raise ClientError({"Error": {"Code": "InternalServerError", "Message": "lost"}}, "UpdateItem")
        return resp


def test_a_renewal_writes_the_load_only_when_it_changed(ddb, aws_env, sessions):
    """The load is projected into the ring index: a renewal that writes it, even
    unchanged, would be an index write at every heartbeat."""
    recording = _Recording(ddb)
    own = SessionsStore(recording, aws_env["SESSIONS_TABLE_NAME"])
    _open(own, "a#1")
    renew = lambda active, draining=False: own.renew("a#1", lease_ms=LEASE_MS, active=active, max_connections=10, draining=draining)  # noqa: E731
    renew(3)
    renew(3)
    renew(4)
    renew(4, draining=True)
    assert ["#a = :active" in u for u in recording.updates[-4:]] == [True, False, True, True]
    recording.lose_next = True
    with pytest.raises(TransientError):
        renew(5)  # landed, answer lost: what is stored is unknown here
    renew(5)
    assert "#a = :active" in recording.updates[-1]
    renew(5)
    assert "#a = :active" not in recording.updates[-1]
    item = sessions.get("a#1")
    assert (item["active"], item["max_connections"], item["draining"]) == (5, 10, False)
    # A count changed at every renewal is written at every other one (the ring's writes
    # bounded by the workers, not by how fast counts move).
    for active in (6, 7, 8, 9):
        renew(active)
    assert ["#a = :active" in u for u in recording.updates[-4:]] == [True, False, True, False]
    renew(9)
    renew(9)
    assert ["#a = :active" in u for u in recording.updates[-2:]] == [True, False]  # caught up, then unchanged
    assert sessions.get("a#1")["active"] == 9


class _Unprocessing:
    """A DynamoDB client whose BatchGetItem leaves keys unprocessed, as throttling does:
    the first ``times`` answers return only the first ``processed`` keys asked for."""

    def __init__(self, real, times: int, processed: int = 1) -> None:
        self._real, self.times, self.processed, self.requests = real, times, processed, 0

    def batch_get_item(self, RequestItems):
        self.requests += 1
        ((table, request),) = RequestItems.items()
        if self.times <= 0:
            return self._real.batch_get_item(RequestItems=RequestItems)
        self.times -= 1
        first, rest = request["Keys"][: self.processed], request["Keys"][self.processed :]
        resp = self._real.batch_get_item(RequestItems={table: {**request, "Keys": first}}) if first else {}
        return {**resp, "UnprocessedKeys": {table: {**request, "Keys": rest}} if rest else {}}


def test_keys_a_batch_read_leaves_unprocessed_are_read_again(ddb, aws_env, sessions, monkeypatch):
    for name in ("a#1", "b#1", "c#1"):
        _open(sessions, name)
    monkeypatch.setattr(store_mod.base, "retry_pause_s", lambda attempt: 0.0)
    flaky = _Unprocessing(ddb, times=2)
    reader = SessionsStore(flaky, aws_env["SESSIONS_TABLE_NAME"])
    assert sorted(i["session_id"] for i in reader.get_many(["a#1", "b#1", "c#1"])) == ["a#1", "b#1", "c#1"]
    assert flaky.requests == 3  # one key a request, then the rest
    stuck = SessionsStore(_Unprocessing(ddb, times=100, processed=0), aws_env["SESSIONS_TABLE_NAME"])
    with pytest.raises(TransientError, match="unprocessed"):
        stuck.get_many(["a#1", "b#1"])


# --- connections ---------------------------------------------------------------------------


def test_the_fleet_summary_comes_back_whole_with_the_watch_read(sessions):
    from wsfleet.balance import FleetLoad

    summary = FleetLoad(
        3, 60, 300, 20, 1, 123, {"w9#1": 15, "w8#1": 5}, {"w1#1": 20},
        loads={"w1#1": (40, 100), "w8#1": (15, 100), "w9#1": (5, 100)}, dead={"w0#1": 12},
    )
    sessions.put_summary(summary.as_item())
    (item,) = sessions.get_many([schema.FLEET_SUMMARY_ID])
    assert FleetLoad.from_item(item) == summary  # the sessions under their share, the loads a drain plans from


def test_twenty_racing_workers_produce_exactly_one_winner(emulator, aws_env, started):
    # Each racer has its own client (own connection pool), as separate workers would.
    open_sessions(_client(emulator), aws_env, *(f"w{i}#1" for i in range(20)))

    def racer(i: int):
        s = ConnectionsStore(
            _client(emulator), aws_env["TABLE_NAME"], state_shards=4, sessions_table_name=aws_env["SESSIONS_TABLE_NAME"]
        )
        barrier.wait()
        return s.acquire(started, session_id=f"w{i}#1", worker_id=f"w{i}")

    barrier = threading.Barrier(20)
    with ThreadPoolExecutor(20) as pool:
        results = list(pool.map(racer, range(20)))
    winners = [r for r in results if isinstance(r, Acquired)]
    assert len(winners) == 1
    assert all(r.reason is AcquireFailure.HELD for r in results if not isinstance(r, Acquired))
    item = ConnectionsStore(_client(emulator), aws_env["TABLE_NAME"], state_shards=4).get(started)
    assert item["fence_token"] == 1
    assert item["lease_owner"] == winners[0].item["lease_owner"]


def test_no_acquire_attaches_a_connection_to_a_session_that_is_not_live(store, sessions, started):
    sessions.end_own("a#1", worker_id="a")
    before = store.get(started)

    ended = store.acquire(started, session_id="a#1", worker_id="a")
    gone = store.acquire(started, session_id="never-opened#1", worker_id="x")

    assert ended.reason is AcquireFailure.NOT_LIVE and gone.reason is AcquireFailure.NOT_LIVE
    assert store.get(started) == before  # still free: nothing written


def test_acquisitions_racing_the_end_of_their_session_all_land_before_it(emulator, aws_env, ddb, store, sessions):
    # The end of a session and its worker's acquisitions race. In the order the table
    # applied them (the emulator's journal), no acquisition for the session comes after
    # its end: a late one is refused by the session's LIVE check, not merely unlikely.
    ids = [f"r{i}" for i in range(12)]
    for cid in ids:
        store.start(cid, "ws://127.0.0.1:9/s")
    sessions.open("late#1", worker_id="late", lease_ms=LEASE_MS, max_connections=100)
    record_journal(emulator.endpoint_url)
    barrier = threading.Barrier(len(ids) + 1)

    def acquire(cid: str):
        s = ConnectionsStore(
            _client(emulator), aws_env["TABLE_NAME"], state_shards=4, sessions_table_name=aws_env["SESSIONS_TABLE_NAME"]
        )
        barrier.wait()
        return s.acquire(cid, session_id="late#1", worker_id="late")

    def end():
        barrier.wait()
        time.sleep(0.02)  # into the middle of the burst
        return SessionsStore(_client(emulator), aws_env["SESSIONS_TABLE_NAME"]).end_own("late#1", worker_id="late")

    try:
        with ThreadPoolExecutor(len(ids) + 1) as pool:
            ended = pool.submit(end)
            results = list(pool.map(acquire, ids))
        entries = journal(emulator.endpoint_url)
    finally:
        record_journal(emulator.endpoint_url, False)
    assert ended.result()
    end_at = next(e["n"] for e in entries if e["op"] == "ended" and e["session"] == "late#1")
    landed = [e for e in entries if e["op"] == "update" and e["session"] == "late#1"]
    assert all(e["n"] < end_at for e in landed)
    answers = dict(zip(ids, results, strict=True))
    won = sorted(f"CONN#{cid}" for cid, r in answers.items() if isinstance(r, Acquired))
    refused = {cid: r for cid, r in answers.items() if not isinstance(r, Acquired)}
    assert sorted(e["pk"] for e in landed) == won
    assert all(r.reason is AcquireFailure.NOT_LIVE for r in refused.values())
    assert all(store.get(cid)["lease_session"] == "" for cid in refused)


def test_several_connections_are_acquired_in_one_transaction_each_answered_for_itself(store, sessions):
    for cid in ("free", "held", "stopped", "mine", "theirs-ended"):
        store.start(cid, "ws://127.0.0.1:9/s")
    store.acquire("held", session_id="b#1", worker_id="b")
    store.stop("stopped", sessions=sessions)
    store.acquire("mine", session_id="a#1", worker_id="a")
    store.acquire("theirs-ended", session_id="c#1", worker_id="c")

    wanted = [("free", ""), ("held", ""), ("stopped", ""), ("mine", ""), ("missing", ""), ("theirs-ended", "c#1")]
    results = dict(zip([cid for cid, _ in wanted], store.acquire_many(wanted, session_id="a#1", worker_id="a"), strict=True))

    got = {cid: (r.item["fence_token"] if isinstance(r, Acquired) else r.reason) for cid, r in results.items()}
    assert got == {
        "free": 1,
        "held": AcquireFailure.HELD,
        "stopped": AcquireFailure.STOPPED,
        "mine": 1,  # already ours: a retry of an acquire that landed
        "missing": AcquireFailure.NOT_FOUND,
        "theirs-ended": 2,
    }
    for cid in ("free", "theirs-ended"):  # what the answer says is what the table holds
        assert store.get(cid) == results[cid].item


def test_a_connection_that_changes_between_the_read_and_the_transaction_is_answered_as_it_became(ddb, aws_env, store):
    for cid in ("x", "y"):
        store.start(cid, "ws://127.0.0.1:9/s")
    racer = ConnectionsStore(ddb, aws_env["TABLE_NAME"], state_shards=4, sessions_table_name=aws_env["SESSIONS_TABLE_NAME"])

    def meanwhile(**_):  # b takes y after a's read, before a's transaction
        ddb.meta.events.unregister("before-call.dynamodb.TransactWriteItems", meanwhile)
        assert isinstance(racer.acquire("y", session_id="b#1", worker_id="b"), Acquired)

    ddb.meta.events.register("before-call.dynamodb.TransactWriteItems", meanwhile)
    try:
        x, y = store.acquire_many([("x", ""), ("y", "")], session_id="a#1", worker_id="a")
    finally:
        ddb.meta.events.unregister("before-call.dynamodb.TransactWriteItems", meanwhile)

    assert isinstance(x, Acquired) and store.get("x")["lease_session"] == "a#1"
    assert y.reason is AcquireFailure.HELD and y.lease_session == "b#1"
    assert store.get("y")["fence_token"] == 1  # b's acquisition only


def test_a_clean_release_hints_state_saves_the_read_and_a_stale_one_is_corrected_by_the_cancellation(ddb, store):
    for cid in ("same", "moved", "new-url"):
        store.start(cid, "ws://127.0.0.1:9/s")
        store.acquire(cid, session_id="a#1", worker_id="a")
        assert store.release(cid, session_id="a#1", fence_token=1, last_seq=7)
    hinted = {cid: schema.item_from_released(cid, schema.released_state(1, "ws://127.0.0.1:9/s", 7))
              for cid in ("same", "moved", "new-url")}
    store.acquire("moved", session_id="c#1", worker_id="c")  # taken and given back since the hint
    assert store.release("moved", session_id="c#1", fence_token=2, last_seq=9)
    store.stop("new-url", sessions=SessionsStore(ddb, store._sessions_table))
    store.start("new-url", "ws://127.0.0.1:9/other")  # STOP, then START elsewhere, while free
    reads = []
    ddb.meta.events.register("before-call.dynamodb.BatchGetItem", lambda **kw: reads.append(1))
    try:
        got = dict(zip(hinted, store.acquire_many([(c, "") for c in hinted], session_id="b#1", worker_id="b", known=hinted),
                       strict=True))
    finally:
        ddb.meta.events.unregister("before-call.dynamodb.BatchGetItem")
    assert reads == []  # every item taken as the hint said, no read first
    assert (got["same"].item["fence_token"], got["same"].checkpoint_is_end, got["same"].item["last_seq"]) == (2, True, 7)
    assert (got["moved"].item["fence_token"], got["moved"].item["last_seq"]) == (3, 9)  # as it really was
    assert got["new-url"].item["ws_url"] == "ws://127.0.0.1:9/other"  # never the hint's old url
    for cid, result in got.items():  # what the answer says is what the table holds
        item = store.get(cid)
        assert {k: item[k] for k in result.item} == result.item


def test_a_hints_released_state_is_taken_only_when_well_formed():
    good = schema.released_state(3, "wss://x/y", 10)
    assert schema.item_from_released("c", good)["checkpoint_is_end"] == 3
    for bad in (None, "x", {}, {**good, "fence_token": "3"}, {**good, "last_seq": -1}, {**good, "ws_url": 5},
                {**good, "fence_token": True}):
        assert schema.item_from_released("c", bad) is None


def test_acquire_attaches_to_the_session_moves_the_owner_key_and_bumps_the_fence(store, started):
    assert store.get(started)["owner_key"] == schema.owner_key_free(started, 4)
    won = store.acquire(started, session_id="a#1", worker_id="a")
    assert isinstance(won, Acquired)
    item = store.get(started)
    assert (item["lease_owner"], item["lease_session"], item["fence_token"]) == ("a", "a#1", 1)
    assert item["owner_key"] == "S#a#1"


def test_an_attached_connection_is_taken_only_as_the_ended_sessions_it_is_attached_to(store, started):
    store.acquire(started, session_id="a#1", worker_id="a")
    held = store.acquire(started, session_id="b#1", worker_id="b")
    assert isinstance(held, NotAcquired) and held.reason is AcquireFailure.HELD and held.lease_session == "a#1"
    assert isinstance(store.acquire(started, session_id="b#1", worker_id="b", expected_session="x#1"), NotAcquired)
    taken = store.acquire(started, session_id="b#1", worker_id="b", expected_session="a#1")
    assert isinstance(taken, Acquired) and taken.item["fence_token"] == 2


def test_acquire_of_unknown_or_stopped_connection_says_why(store, started, sessions):
    assert store.acquire("nope", session_id="a#1", worker_id="a").reason is AcquireFailure.NOT_FOUND
    store.stop(started, sessions=sessions)
    assert store.acquire(started, session_id="a#1", worker_id="a").reason is AcquireFailure.STOPPED


def test_a_retried_acquire_that_already_landed_counts_as_won(store, started):
    first = store.acquire(started, session_id="a#1", worker_id="a")
    again = store.acquire(started, session_id="a#1", worker_id="a")
    assert isinstance(again, Acquired) and again.item["fence_token"] == first.item["fence_token"]


def test_release_frees_with_a_final_checkpoint_only_for_the_owning_session_and_fence(store, started):
    store.acquire(started, session_id="a#1", worker_id="a")
    assert not store.release(started, session_id="b#1", fence_token=1, last_seq=9)
    assert not store.release(started, session_id="a#1", fence_token=2, last_seq=9)
    assert store.release(started, session_id="a#1", fence_token=1, last_seq=42)
    item = store.get(started)
    assert (item["lease_owner"], item["lease_session"], item["last_seq"]) == ("", "", 42)
    assert item["owner_key"] == schema.owner_key_free(started, 4)  # STARTED: back in the free pool
    assert store.release(started, session_id="a#1", fence_token=1, last_seq=42)  # a retry that landed


def test_release_after_stop_leaves_the_index_and_a_restart_before_it_stays_attached(store, started, sessions):
    store.acquire(started, session_id="a#1", worker_id="a")
    assert store.stop(started, sessions=sessions).lease_session == "a#1"
    assert store.get(started)["owner_key"] == "S#a#1"  # still attached until its owner releases
    assert store.release(started, session_id="a#1", fence_token=1, last_seq=3)
    assert "owner_key" not in store.get(started)
    store.start(started, "ws://127.0.0.1:9/s")
    assert store.get(started)["owner_key"] == schema.owner_key_free(started, 4)
    store.acquire(started, session_id="b#1", worker_id="b")
    store.stop(started, sessions=sessions)
    store.start(started, "ws://127.0.0.1:9/s")  # restarted before its owner released
    assert store.get(started)["owner_key"] == "S#b#1"
    assert store.release(started, session_id="b#1", fence_token=2, last_seq=5)
    assert store.get(started)["owner_key"] == schema.owner_key_free(started, 4)


def test_only_a_clean_release_by_the_previous_owner_spares_the_next_one_the_stored_end_read(store, started, sessions):
    first = store.acquire(started, session_id="a#1", worker_id="a")
    assert isinstance(first, Acquired) and not first.checkpoint_is_end  # a new connection: read
    assert store.release(started, session_id="a#1", fence_token=1, last_seq=7)
    handed = store.acquire(started, session_id="b#1", worker_id="b")
    assert handed.checkpoint_is_end and handed.item["last_seq"] == 7  # a handoff: nothing past 7
    # b crashes holding it (its last batch may lie past the checkpoint); the drainer frees it
    store.checkpoint(started, session_id="b#1", fence_token=2, last_seq=9)
    assert store.free_orphan(started, dead_session="b#1")
    after_crash = store.acquire(started, session_id="c#1", worker_id="c")
    assert not after_crash.checkpoint_is_end  # the release flag names fence 1, not b's fence 2
    store.stop(started, sessions=sessions)
    assert store.release(started, session_id="c#1", fence_token=3, last_seq=12, stopped=True)
    store.start(started, "ws://127.0.0.1:9/s")
    restarted = store.acquire(started, session_id="d#1", worker_id="d")
    assert restarted.checkpoint_is_end and restarted.item["last_seq"] == 12  # STOP, then START


def test_checkpoint_is_stored_only_for_the_owning_session_and_fence(store, started):
    store.acquire(started, session_id="a#1", worker_id="a")
    assert store.checkpoint(started, session_id="a#1", fence_token=1, last_seq=17)
    assert not store.checkpoint(started, session_id="b#1", fence_token=1, last_seq=99)
    assert store.get(started)["last_seq"] == 17


def test_checkpoints_of_several_connections_are_one_transaction_all_or_nothing(store):
    ids = ["k0", "k1", "k2"]
    for cid in ids:
        store.start(cid, "ws://127.0.0.1:9/s")
        store.acquire(cid, session_id="a#1", worker_id="a")
    entries = [CheckpointEntry(cid, "a#1", 1, 10 + n) for n, cid in enumerate(ids)]
    assert store.checkpoint_many(entries) == [True, True, True]
    assert [store.get(c)["last_seq"] for c in ids] == [10, 11, 12]
    assert store.checkpoint_many(entries) == [True, True, True]  # a retry of one that landed: the same again

    # k1 changes hands: its entry fails its condition, the others were not written
    # because of it, and the caller learns which is which.
    store.release("k1", session_id="a#1", fence_token=1, last_seq=12)
    later = [CheckpointEntry(cid, "a#1", 1, 20 + n) for n, cid in enumerate(ids)]
    assert store.checkpoint_many(later) == [None, False, None]
    assert [store.get(c)["last_seq"] for c in ids] == [10, 12, 12]  # nothing written
    assert store.checkpoint_many([later[0], later[2]]) == [True, True]
    assert [store.get(c)["last_seq"] for c in ids] == [20, 12, 22]


def test_a_checkpoint_transaction_cancelled_by_a_conflict_is_transient(store, started):
    store.acquire(started, session_id="a#1", worker_id="a")
    conflict = {
        "Error": {"Code": "TransactionCanceledException", "Message": "Transaction cancelled"},
        "CancellationReasons": [{"Code": "TransactionConflict"}],
        "ResponseMetadata": {"HTTPStatusCode": 400},
    }
    invalid = {**conflict, "CancellationReasons": [{"Code": "ValidationError"}]}

    class Cancelling:
        def __init__(self, response):
            self.response = response

        def transact_write_items(self, **_):
            raise ClientError(self.response, "TransactWriteItems")

    entry = CheckpointEntry(started, "a#1", 1, 5)
    with pytest.raises(TransientError):
        ConnectionsStore(Cancelling(conflict), "t", state_shards=4).checkpoint_many([entry])
    with pytest.raises(ClientError):  # a malformed request is a bug, never waited out
        ConnectionsStore(Cancelling(invalid), "t", state_shards=4).checkpoint_many([entry])
    with pytest.raises(ValueError):
        store.checkpoint_many([entry] * 26)


def test_a_dead_sessions_connections_are_freed_for_the_fleet(store, started, sessions):
    store.start("c2", "ws://127.0.0.1:9/s")
    store.acquire(started, session_id="a#1", worker_id="a")
    store.acquire("c2", session_id="a#1", worker_id="a")
    store.stop("c2", sessions=sessions)
    assert not store.free_orphan(started, dead_session="x#1")
    assert store.free_orphan(started, dead_session="a#1") and store.free_orphan("c2", dead_session="a#1")
    assert store.get(started)["owner_key"] == schema.owner_key_free(started, 4)
    assert "owner_key" not in store.get("c2")


def test_the_owner_index_lists_a_sessions_connections_and_the_free_ones(store, sessions):
    for cid in ("c1", "c2", "c3"):
        store.start(cid, "ws://h/x")
    store.acquire("c1", session_id="a#1", worker_id="a")
    store.acquire("c2", session_id="a#1", worker_id="a")
    store.stop("c2", sessions=sessions)
    assert sorted((o.connection_id, o.desired_state) for o in store.owned_by("a#1")) == [
        ("c1", schema.STARTED),
        ("c2", schema.STOPPED),
    ]
    assert store.count_owned_by("a#1") == 2
    assert sorted(c for shard in range(4) for c in store.free(shard)) == ["c3"]
    assert sum(store.count_free(shard) for shard in range(4)) == 1
    assert set().union(*(store.free_ids(shard) for shard in range(4))) == {"c3"}


# --- desired state: the router's writes, each correct when its answer is lost ------------


def _record_calls(client) -> list[str]:
    calls: list[str] = []
    client.meta.events.register("before-call.dynamodb", lambda model, **_: calls.append(model.name))
    return calls


def _answer_once(client, operation: str, status: int, body: dict) -> None:
    """Answer the next ``operation`` call of ``client`` with this error, before it is sent."""
    left = [1]

    class Raw:
        def stream(self, **_):
            yield json.dumps(body).encode()

    def hook(request, **_):
        if left:
            left.pop()
            return AWSResponse(request.url, status, {"x-amzn-RequestId": "injected"}, Raw())
        return None

    client.meta.events.register(f"before-send.dynamodb.{operation}", hook)


def test_stop_of_an_attached_connection_stores_it_and_its_owners_notice_in_one_transaction(
    store, sessions, started, ddb
):
    _open(sessions, "a#1")
    store.acquire(started, session_id="a#1", worker_id="a")
    calls = _record_calls(ddb)

    stopped = store.stop(started, sessions=sessions)

    assert stopped == Stopped(StopOutcome.STOPPED, "a#1", 1, told=True)
    assert calls == ["GetItem", "TransactWriteItems"]  # one write: no crash can come between the two
    item = store.get(started)
    assert (item["desired_state"], item["owner_key"]) == (schema.STOPPED, "S#a#1")  # its owner releases it
    assert sessions.get("a#1")["stops"] == {schema.stop_entry(started, 1)}


def test_stop_of_a_connection_whose_session_is_not_live_stores_the_state_alone(ddb, aws_env, store, sessions, started):
    _open(sessions, "a#1")
    store.acquire(started, session_id="a#1", worker_id="a")
    sessions.end_own("a#1", worker_id="a")
    store.start("c2", "ws://127.0.0.1:9/s")
    _open(sessions, "gone#1")
    store.acquire("c2", session_id="gone#1", worker_id="gone")
    ddb.delete_item(TableName=aws_env["SESSIONS_TABLE_NAME"], Key={"session_id": {"S": "gone#1"}})  # no longer exists

    assert store.stop(started, sessions=sessions) == Stopped(StopOutcome.STOPPED, "a#1", 1, told=False)
    assert store.stop("c2", sessions=sessions) == Stopped(StopOutcome.STOPPED, "gone#1", 1, told=False)
    assert store.get(started)["desired_state"] == store.get("c2")["desired_state"] == schema.STOPPED
    assert "stops" not in sessions.get("a#1")  # its drainers see STOPPED themselves


def test_stop_of_a_stopped_connection_still_attached_to_a_live_session_posts_its_notice_again(store, sessions, started):
    _open(sessions, "a#1")
    store.acquire(started, session_id="a#1", worker_id="a")
    store.stop(started, sessions=sessions)
    entry = schema.stop_entry(started, 1)
    sessions.renew("a#1", lease_ms=LEASE_MS, active=1, max_connections=10, stops_done={entry})  # taken by its worker
    assert "stops" not in sessions.get("a#1")

    again = store.stop(started, sessions=sessions)

    assert again == Stopped(StopOutcome.ALREADY_STOPPED, "a#1", 1, told=True)
    assert sessions.get("a#1")["stops"] == {entry}
    assert store.stop(started, sessions=sessions).told and sessions.get("a#1")["stops"] == {entry}  # one entry
    sessions.end_own("a#1", worker_id="a")
    assert store.stop(started, sessions=sessions) == Stopped(StopOutcome.ALREADY_STOPPED, "a#1", 1, told=False)


def test_a_stop_transaction_that_landed_with_its_answer_lost_is_already_stopped_with_its_notice_posted_once(
    emulator, aws_env, sessions, lose_first_answer
):
    router_ddb = boto3.client(  # the router's retry policy
        "dynamodb", endpoint_url=emulator.endpoint_url, region_name="us-east-1",
        config=Config(retries={"mode": "standard", "total_max_attempts": 3}),
    )
    store = ConnectionsStore(
        router_ddb, aws_env["TABLE_NAME"], state_shards=4, sessions_table_name=aws_env["SESSIONS_TABLE_NAME"]
    )
    store.start("c1", "ws://127.0.0.1:9/s")
    _open(sessions, "a#1")
    store.acquire("c1", session_id="a#1", worker_id="a")
    lost = lose_first_answer(router_ddb, {"TransactWriteItems": 1.0})

    stopped = store.stop("c1", sessions=sessions)

    assert lost == ["TransactWriteItems"]
    # the SDK's retry failed its condition against the first try's write (DynamoDB would
    # answer it from the ClientRequestToken; moto does not): a STOP already made, told again
    assert stopped == Stopped(StopOutcome.ALREADY_STOPPED, "a#1", 1, told=True)
    assert sessions.get("a#1")["stops"] == {"c1#1"}


def test_a_stop_whose_every_try_lost_its_answer_fails_transient_and_its_retry_is_already_stopped(
    emulator, aws_env, sessions, store, started
):
    no_retries = boto3.client(
        "dynamodb", endpoint_url=emulator.endpoint_url, region_name="us-east-1",
        config=Config(retries={"mode": "standard", "total_max_attempts": 1}),
    )
    _open(sessions, "a#1")
    store.acquire(started, session_id="a#1", worker_id="a")
    set_faults(emulator.endpoint_url, ambiguous={"TransactWriteItems": 1.0})
    try:
        with pytest.raises(TransientError):  # the router answers 503: try again
            ConnectionsStore(no_retries, aws_env["TABLE_NAME"], state_shards=4).stop(started, sessions=sessions)
    finally:
        set_faults(emulator.endpoint_url)
    assert sessions.get("a#1")["stops"] == {"c1#1"}  # applied, notice and all

    assert store.stop(started, sessions=sessions) == Stopped(StopOutcome.ALREADY_STOPPED, "a#1", 1, told=True)


def test_a_stop_transaction_cancelled_by_a_conflict_on_the_session_goes_again(store, sessions, started, ddb):
    _open(sessions, "a#1")
    store.acquire(started, session_id="a#1", worker_id="a")
    _answer_once(ddb, "TransactWriteItems", 400, {
        "__type": "com.amazonaws.dynamodb.v20120810#TransactionCanceledException",
        "Message": "Transaction cancelled, please refer cancellation reasons for specific reasons [None, TransactionConflict]",
        "CancellationReasons": [{"Code": "None"}, {"Code": "TransactionConflict", "Message": "Transaction is ongoing for the item"}],
    })
    calls = _record_calls(ddb)

    assert store.stop(started, sessions=sessions) == Stopped(StopOutcome.STOPPED, "a#1", 1, told=True)
    assert calls == ["GetItem", "TransactWriteItems", "TransactWriteItems"]


def test_a_write_refused_while_a_transaction_holds_the_item_is_transient_so_a_renewal_retries(sessions, ddb):
    _open(sessions, "w#1")
    _answer_once(ddb, "UpdateItem", 400, {
        "__type": "com.amazonaws.dynamodb.v20120810#TransactionConflictException",
        "message": "Transaction is ongoing for the item",
    })

    with pytest.raises(TransientError):
        sessions.renew("w#1", lease_ms=LEASE_MS, active=0, max_connections=10)
    assert sessions.renew("w#1", lease_ms=LEASE_MS, active=0, max_connections=10)["state"] == schema.LIVE


def test_start_says_whether_it_left_the_connection_unowned_so_that_every_such_start_hints_it(store, sessions):
    url = "ws://127.0.0.1:9/s"
    assert store.start("c1", url) == Started(StartOutcome.CREATED, unowned=True)
    assert store.start("c1", url) == Started(StartOutcome.UNCHANGED, unowned=True)  # e.g. a retry of a lost answer
    store.acquire("c1", session_id="a#1", worker_id="a")
    assert store.start("c1", url) == Started(StartOutcome.UNCHANGED, unowned=False, fence_token=1)
    assert store.start("c1", url + "2") == Started(StartOutcome.CONFLICT, differs=(schema.WS_URL,))
    store.stop("c1", sessions=sessions)
    assert store.start("c1", url) == Started(StartOutcome.RESTARTED, unowned=False, fence_token=1)  # its owner hints it
    store.stop("c1", sessions=sessions)
    store.release("c1", session_id="a#1", fence_token=1, last_seq=0, stopped=True)
    # the fence as read: what the router's move of an unowned START is conditional on
    assert store.start("c1", url) == Started(StartOutcome.RESTARTED, unowned=True, fence_token=1)


def test_a_start_whose_put_landed_with_its_answer_lost_reads_unchanged_and_unowned(
    emulator, aws_env, lose_first_answer
):
    router_ddb = boto3.client(
        "dynamodb", endpoint_url=emulator.endpoint_url, region_name="us-east-1",
        config=Config(retries={"mode": "standard", "total_max_attempts": 3}),
    )
    store = ConnectionsStore(router_ddb, aws_env["TABLE_NAME"], state_shards=4)
    lost = lose_first_answer(router_ddb, {"PutItem": 1.0})

    assert store.start("c1", "ws://127.0.0.1:9/s") == Started(StartOutcome.UNCHANGED, unowned=True)
    assert lost == ["PutItem"]


def test_release_says_which_form_landed_without_a_read(store, sessions, started, ddb):
    store.acquire(started, session_id="a#1", worker_id="a")
    store.stop(started, sessions=sessions)
    store.start(started, "ws://127.0.0.1:9/s")  # a START came before its owner released it
    calls = _record_calls(ddb)

    released = store.release(started, session_id="a#1", fence_token=1, last_seq=4, stopped=True)

    assert released is Released.FREE and released
    assert calls == ["UpdateItem", "UpdateItem"]  # the STOPPED form, then the STARTED one; no read
    assert store.get(started)["owner_key"] == schema.owner_key_free(started, 4)
    assert store.release(started, session_id="a#1", fence_token=1, last_seq=4) is Released.FREE  # a retry that landed
    store.acquire(started, session_id="b#1", worker_id="b")
    store.stop(started, sessions=sessions)
    assert store.release(started, session_id="b#1", fence_token=2, last_seq=6, stopped=True) is Released.STOPPED
    lost = store.release(started, session_id="b#1", fence_token=1, last_seq=6)
    assert lost is Released.LOST and not lost


def test_the_free_query_follows_pagination(store):
    ids = [f"p{i}" for i in range(7)]
    for cid in ids:
        store.start(cid, "ws://h/x")
    found = [c for shard in range(4) for c in store.free(shard, limit=2)]
    assert sorted(found) == sorted(ids)


def test_start_never_touches_a_started_connection_and_stop_of_unknown_writes_nothing(store, started, sessions):
    store.acquire(started, session_id="a#1", worker_id="a")
    before = store.get(started)
    store.start(started, "ws://127.0.0.1:9/s")
    assert store.get(started) == before
    assert store.stop("nope", sessions=sessions).outcome is StopOutcome.NOT_FOUND and store.get("nope") is None


def _throttling(left: dict):
    """A before-send hook that answers requests with a throttle while ``left["n"] > 0``."""

    class Raw:
        def stream(self, **_):
            yield b'{"__type":"com.amazonaws.dynamodb.v20120810#ThrottlingException","message":"slow down"}'

    def hook(request, **_):
        if left["n"] > 0:
            left["n"] -= 1
            return AWSResponse(request.url, 400, {"x-amzn-RequestId": "t"}, Raw())
        return None

    return hook


def test_throttled_renewals_raise_transient_error_and_do_not_end_the_session(emulator, aws_env, sessions):
    client = boto3.client(
        "dynamodb",
        endpoint_url=emulator.endpoint_url,
        region_name="us-east-1",
        config=Config(retries={"mode": "standard", "max_attempts": 2}),
    )
    throttled = SessionsStore(client, aws_env["SESSIONS_TABLE_NAME"])
    _open(sessions, "w#1")
    left = {"n": 100}
    client.meta.events.register("before-send.dynamodb.UpdateItem", _throttling(left))
    with pytest.raises(TransientError):
        throttled.renew("w#1", lease_ms=LEASE_MS, active=1, max_connections=10)
    assert left["n"] < 100  # the throttles were really served
    assert sessions.get("w#1")["state"] == schema.LIVE
    left["n"] = 0
    assert throttled.renew("w#1", lease_ms=LEASE_MS, active=1, max_connections=10)["active"] == 1


def test_a_sessions_connections_are_listed_in_pages(store, monkeypatch):
    monkeypatch.setattr(store_mod.connection_reads, "OWNER_PAGE_ITEMS", 2)
    ids = [f"p{i}" for i in range(5)]
    for cid in ids:
        store.start(cid, "ws://h/x")
        store.acquire(cid, session_id="a#1", worker_id="a")
    queries = []
    real = store._call

    def counting(op, **kwargs):
        if op == "query":
            queries.append(kwargs.get("Limit"))
        return real(op, **kwargs)

    monkeypatch.setattr(store, "_call", counting)
    assert sorted(o.connection_id for o in store.owned_by("a#1")) == ids
    assert queries == [2, 2, 2]  # 5 rows, 2 per page: every page asked for, none twice
