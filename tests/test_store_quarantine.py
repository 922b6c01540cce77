"""The crash-loop breaker's writes against the emulator: a session renewal stores its
prime suspect and the end of a dead session returns it; strikes count once per
ownership; the quarantining strike sets the connection aside; no acquisition takes a
quarantined connection (a condition of the store's, not only the taker's read); a START
clears it."""

from __future__ import annotations

import time

import pytest

from wsfleet import schema
from wsfleet.crash_loop import Suspect
from wsfleet.leases import AcquireFailure, unreachable
from wsfleet.store import Acquired, ConnectionsStore, NotAcquired, SessionsStore, StartOutcome

LEASE_MS = 10_000
SKEW_MS = 1_000


class Clock:
    def __init__(self) -> None:
        self.ms = int(time.time() * 1000)

    def __call__(self) -> int:
        return self.ms


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def sessions(ddb, aws_env, clock):
    s = SessionsStore(ddb, aws_env["SESSIONS_TABLE_NAME"], clock_ms=clock)
    for name in ("a#1", "b#1", "c#1"):
        s.open(name, worker_id=name.split("#")[0], lease_ms=LEASE_MS, max_connections=10)
    return s


@pytest.fixture
def store(ddb, aws_env, clock, sessions):
    return ConnectionsStore(
        ddb, aws_env["TABLE_NAME"], state_shards=4, sessions_table_name=aws_env["SESSIONS_TABLE_NAME"], clock_ms=clock
    )


def held_by(store, cid: str, session: str, expected: str = "") -> int:
    got = store.acquire(cid, session_id=session, worker_id=session.split("#")[0], expected_session=expected)
    assert isinstance(got, Acquired), got
    return int(got.item[schema.FENCE_TOKEN])


def test_a_renewal_stores_the_suspect_and_the_end_of_the_dead_session_returns_it(sessions, clock):
    suspect = Suspect("c1", 4, "most bytes received")
    assert sessions.renew("a#1", lease_ms=LEASE_MS, active=1, max_connections=10, suspect=suspect.item())
    clock.ms += LEASE_MS + SKEW_MS + 1
    ended = sessions.end_expired("a#1", ended_by="b#1", max_clock_skew_ms=SKEW_MS)
    assert Suspect.from_item(ended[schema.SUSPECT]) == suspect


def test_a_renewal_with_nothing_remarkable_removes_the_suspect(sessions):
    sessions.renew("a#1", lease_ms=LEASE_MS, active=1, max_connections=10, suspect=Suspect("c1", 1, "w").item())
    assert schema.SUSPECT not in sessions.renew("a#1", lease_ms=LEASE_MS, active=1, max_connections=10)


def test_three_consecutive_strikes_quarantine_the_suspect_and_set_it_aside(store):
    store.start("c1", "ws://127.0.0.1:9/s")
    owners = ["a#1", "b#1", "c#1"]
    previous = ""
    for n, owner in enumerate(owners, start=1):
        fence = held_by(store, "c1", owner, previous)
        struck = store.strike("c1", Suspect("c1", fence, "w"), dead_session=owner, quarantine_after=3)
        assert struck.strikes == n and (struck.quarantined is not None) == (n == 3)
        previous = owner
    item = store.get("c1")
    assert item[schema.QUARANTINED]["reason"].startswith("crash_loop:")
    assert item[schema.LEASE_SESSION] == "" and schema.OWNER_KEY not in item  # in no partition a taker reads
    assert item[schema.DESIRED_STATE] == schema.STARTED
    assert unreachable(item, None) is None  # out of the pool on purpose, not lost


def test_a_strike_written_again_for_the_same_ownership_counts_nothing(store):
    store.start("c1", "ws://127.0.0.1:9/s")
    fence = held_by(store, "c1", "a#1")
    suspect = Suspect("c1", fence, "w")
    assert store.strike("c1", suspect, dead_session="a#1", quarantine_after=3).strikes == 1
    assert store.strike("c1", suspect, dead_session="a#1", quarantine_after=3) is None  # an answer lost, retried
    assert store.get("c1")[schema.STRIKES] == 1


def test_a_quarantined_connection_is_refused_by_the_stores_condition_even_to_a_stale_read(store):
    store.start("c1", "ws://127.0.0.1:9/s")
    fence = held_by(store, "c1", "a#1")
    stale = store.get("c1")  # read before the quarantine: a taker that trusts it is still refused
    store.strike("c1", Suspect("c1", fence, "w"), dead_session="a#1", quarantine_after=1)
    got = store.acquire_many([("c1", "a#1")], session_id="b#1", worker_id="b", known={"c1": stale})
    assert isinstance(got[0], NotAcquired) and got[0].reason is AcquireFailure.QUARANTINED
    fresh = store.acquire("c1", session_id="b#1", worker_id="b")
    assert isinstance(fresh, NotAcquired) and fresh.reason is AcquireFailure.QUARANTINED
    assert "c1" not in store.free_ids(schema.shard_for("c1", 4))


def test_a_quarantine_of_a_connection_another_session_holds_leaves_it_to_that_owner(store):
    store.start("c1", "ws://127.0.0.1:9/s")
    fence = held_by(store, "c1", "a#1")
    held_by(store, "c1", "b#1", "a#1")  # taken by b before the strike for a's death landed
    struck = store.strike("c1", Suspect("c1", fence, "w"), dead_session="a#1", quarantine_after=1)
    assert struck.quarantined is not None
    item = store.get("c1")
    assert item[schema.LEASE_SESSION] == "b#1" and schema.QUARANTINED in item  # b's socket runs on
    assert not store.set_aside("c1", holder="a#1")  # nobody but b lets it go
    assert store.set_aside("c1", holder="b#1") and store.get("c1")[schema.LEASE_SESSION] == ""


def test_a_start_clears_the_quarantine_and_the_strikes_and_puts_it_back_in_the_free_pool(store):
    store.start("c1", "ws://127.0.0.1:9/s")
    fence = held_by(store, "c1", "a#1")
    store.strike("c1", Suspect("c1", fence, "w"), dead_session="a#1", quarantine_after=1)
    started = store.start("c1", "ws://127.0.0.1:9/s")
    assert started.outcome is StartOutcome.RESTARTED and started.unowned
    item = store.get("c1")
    assert not {schema.QUARANTINED, schema.STRIKES, schema.STRIKE_FENCE, schema.STRIKES_SINCE_MS} & set(item)
    assert item[schema.OWNER_KEY].startswith(schema.OWNER_KEY_FREE_PREFIX)
    assert store.start("c1", "ws://127.0.0.1:9/s").outcome is StartOutcome.UNCHANGED  # a retry of it
    assert isinstance(store.acquire("c1", session_id="b#1", worker_id="b"), Acquired)


def test_a_stop_then_start_of_a_quarantined_connection_clears_it_too(store, sessions):
    store.start("c1", "ws://127.0.0.1:9/s")
    fence = held_by(store, "c1", "a#1")
    store.strike("c1", Suspect("c1", fence, "w"), dead_session="a#1", quarantine_after=1)
    store.stop("c1", sessions=sessions)
    assert store.start("c1", "ws://127.0.0.1:9/s").outcome is StartOutcome.RESTARTED
    assert schema.QUARANTINED not in store.get("c1")
