"""A graceful release that hands its connection to a named peer (no FREE# write), its
takers, its races and its safety nets, against the emulator; and the free scan's random
starting point."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import boto3
import pytest
from botocore.config import Config

from wsfleet import metrics_names as names
from wsfleet import schema
from wsfleet.leases import HANDOFF_UNREACHABLE_MS, AcquireFailure
from wsfleet.logs import JsonLogger
from wsfleet.metrics import Counters
from wsfleet.store import Acquired, CheckpointEntry, ConnectionsStore, NotAcquired, Released, SessionsStore, StopOutcome
from wsfleet.worker.attached import Attachments
from wsfleet.worker.handoffs import Handoffs

from tests.conftest import open_sessions

URL = "ws://127.0.0.1:9/s"


@pytest.fixture
def store(ddb, aws_env):
    open_sessions(ddb, aws_env, "a#1", "b#1", "c#1", "d#1", "e#1", "f#1")
    return ConnectionsStore(ddb, aws_env["TABLE_NAME"], state_shards=4, sessions_table_name=aws_env["SESSIONS_TABLE_NAME"])


@pytest.fixture
def sessions(ddb, aws_env):
    return SessionsStore(ddb, aws_env["SESSIONS_TABLE_NAME"])


def handed(store: ConnectionsStore, cid: str = "c1", *, last_seq: int = 7) -> dict:
    """c1 started, taken by a#1 (fence 1) and handed off; returns the hint's state."""
    store.start(cid, URL)
    store.acquire(cid, session_id="a#1", worker_id="a")
    assert store.release(cid, session_id="a#1", fence_token=1, last_seq=last_seq, handoff=True) is Released.HANDED
    return schema.released_state(1, URL, last_seq, session_id="a#1")


def known(cid: str, released: dict) -> dict:
    return schema.item_from_released(cid, released)


def test_a_handoff_stays_attached_to_its_session_released_at_its_fence_with_no_free_write(store):
    handed(store)
    item = store.get("c1")
    assert item["lease_session"] == "a#1" and item["owner_key"] == schema.owner_key_session("a#1")
    assert item["released_fence"] == item["fence_token"] == item["checkpoint_is_end"] == 1 and item["last_seq"] == 7
    assert list(store.free(schema.shard_for("c1", 4))) == []
    # and the releaser's own audit reads it as attached (a handoff is not taken back)
    assert [o.connection_id for o in store.owned_by("a#1")] == ["c1"]


def test_a_retried_handoff_whose_first_answer_was_lost_is_handed_again(store):
    handed(store)
    assert store.release("c1", session_id="a#1", fence_token=1, last_seq=7, handoff=True) is Released.HANDED
    # once taken it is lost to the releaser, retried or not
    store.acquire("c1", session_id="b#1", worker_id="b")
    assert store.release("c1", session_id="a#1", fence_token=1, last_seq=7, handoff=True) is Released.LOST


def test_a_handoff_of_a_connection_stopped_meanwhile_frees_it_as_for_a_stop(store, sessions):
    store.start("c1", URL)
    store.acquire("c1", session_id="a#1", worker_id="a")
    store.stop("c1", sessions=sessions)
    assert store.release("c1", session_id="a#1", fence_token=1, last_seq=3, handoff=True) is Released.STOPPED
    item = store.get("c1")
    assert item["lease_session"] == "" and "owner_key" not in item and "released_fence" not in item


def test_the_taker_acquires_from_the_hint_alone_pinned_to_session_fence_and_mark(store, ddb):
    released = handed(store)
    calls: list[str] = []
    ddb.meta.events.register("before-call.dynamodb", lambda model, **_: calls.append(model.name))
    (got,) = store.acquire_many([("c1", "")], session_id="b#1", worker_id="b", known={"c1": known("c1", released)})
    assert isinstance(got, Acquired) and got.checkpoint_is_end and got.item["fence_token"] == 2
    assert calls == ["TransactWriteItems"]  # one transaction, no read
    item = store.get("c1")
    assert item["lease_session"] == "b#1" and item["fence_token"] == 2 and "released_fence" not in item


def test_a_connection_of_another_session_is_never_taken_unless_released_at_its_fence(store):
    store.start("c1", URL)
    store.acquire("c1", session_id="a#1", worker_id="a")  # held by a LIVE session, not released
    assert store.acquire("c1", session_id="b#1", worker_id="b") == NotAcquired(AcquireFailure.HELD, "a#1")
    # a hint claiming it was handed off (a stale or forged one) is refused by the pin
    fake = known("c1", schema.released_state(1, URL, 0, session_id="a#1"))
    (got,) = store.acquire_many([("c1", "")], session_id="b#1", worker_id="b", known={"c1": fake})
    assert got == NotAcquired(AcquireFailure.HELD, "a#1")
    # a hint of a handoff at an older fence does not take it from its later owner either
    store.release("c1", session_id="a#1", fence_token=1, last_seq=0, handoff=True)
    store.acquire("c1", session_id="c#1", worker_id="c")
    (got,) = store.acquire_many([("c1", "")], session_id="b#1", worker_id="b", known={"c1": fake})
    assert got == NotAcquired(AcquireFailure.HELD, "c#1")
    assert store.get("c1")["lease_session"] == "c#1"


def test_a_released_connection_is_acquired_by_exactly_one_of_several_racing_takers(emulator, store, aws_env):
    released = handed(store)
    takers = ["b#1", "c#1", "d#1", "e#1", "f#1"]
    barrier = threading.Barrier(len(takers))

    def take(session_id: str):
        mine = ConnectionsStore(  # a client per thread, as each worker has its own
            boto3.client("dynamodb", endpoint_url=emulator.endpoint_url, region_name="us-east-1"),
            aws_env["TABLE_NAME"],
            state_shards=4,
            sessions_table_name=aws_env["SESSIONS_TABLE_NAME"],
        )
        barrier.wait()
        (got,) = mine.acquire_many([("c1", "")], session_id=session_id, worker_id=session_id, known={"c1": known("c1", released)})
        return session_id, got

    with ThreadPoolExecutor(len(takers)) as pool:
        results = dict(pool.map(take, takers))
    winners = [s for s, r in results.items() if isinstance(r, Acquired)]
    assert len(winners) == 1, results
    assert all(r.reason is AcquireFailure.HELD for s, r in results.items() if s not in winners)
    item = store.get("c1")
    assert item["lease_session"] == winners[0] and item["fence_token"] == 2


def test_the_releasers_late_writes_fail_after_the_handoff_and_after_the_takeover(store):
    handed(store)
    late = CheckpointEntry("c1", "a#1", 1, 99)
    assert store.checkpoint_many([late]) == [False]  # released: this ownership writes nothing more
    assert not store.note_error("c1", session_id="a#1", fence_token=1, text="refused")
    store.acquire("c1", session_id="b#1", worker_id="b")
    assert store.checkpoint_many([late]) == [False]
    assert store.checkpoint("c1", session_id="b#1", fence_token=2, last_seq=9)  # the taker's do land
    assert store.get("c1")["last_seq"] == 9


def test_a_drain_of_the_ended_session_takes_its_handoffs_pinned_to_the_mark(store, sessions):
    handed(store)
    assert sessions.end_own("a#1", worker_id="a")  # its worker left (or died and was ended)
    got = store.acquire("c1", session_id="b#1", worker_id="b", expected_session="a#1")
    assert isinstance(got, Acquired) and got.item["fence_token"] == 2
    assert "released_fence" not in store.get("c1")


def test_free_released_gives_an_unclaimed_handoff_to_the_free_pool_unless_taken(store):
    handed(store)
    assert store.free_released("c1", session_id="a#1", fence_token=1) is Released.FREE
    item = store.get("c1")
    assert item["lease_session"] == "" and item["owner_key"] == schema.owner_key_free("c1", 4)
    assert "released_fence" not in item and item["last_seq"] == 7 and item["checkpoint_is_end"] == 1
    assert store.free_released("c1", session_id="a#1", fence_token=1) is Released.FREE  # a retry: the same
    handed(store, "c2")
    store.acquire("c2", session_id="b#1", worker_id="b")
    assert store.free_released("c2", session_id="a#1", fence_token=1) is Released.LOST
    assert store.get("c2")["lease_session"] == "b#1"


def _handoffs(store, hints, counters=None, claim_s=0.0):
    async def hint(connection_id, **kwargs):
        hints.append((connection_id, kwargs))

    async def call(fn, *args, **kwargs):
        return await asyncio.to_thread(fn, *args, **kwargs)

    hinting = SimpleNamespace(hint=hint)
    attachments = Attachments(connections=store, sessions=None, call=call, hints=hinting, log=JsonLogger())
    return Handoffs(
        connections=store, call=call, hints=hinting, attachments=attachments, counters=counters or Counters(),
        log=JsonLogger(), claim_s=claim_s,
    )


def test_the_releaser_frees_and_hints_what_nobody_claimed_and_forgets_what_was_taken(store):
    hints: list = []
    counters = Counters()
    handoffs = _handoffs(store, hints, counters)
    for cid in ("c1", "c2"):
        released = handed(store, cid)
        handoffs.handed(cid, session_id="a#1", fence_token=1, released=released)
    store.acquire_many([("c2", "")], session_id="b#1", worker_id="b", known={"c2": known("c2", released)})

    assert asyncio.run(handoffs.check_once()) == 1
    assert store.get("c1")["owner_key"] == schema.owner_key_free("c1", 4)
    assert store.get("c2")["lease_session"] == "b#1"
    assert counters.total(names.HANDOFFS_UNCLAIMED) == 1 and len(handoffs) == 0
    # hinted as free, with the state the free left it in: the next taker needs no read
    ((cid, kwargs),) = hints
    assert cid == "c1" and schema.LEASE_SESSION not in kwargs["released"]
    (got,) = store.acquire_many(
        [("c1", "")], session_id="c#1", worker_id="c", known={"c1": known("c1", kwargs["released"])}
    )
    assert isinstance(got, Acquired) and got.checkpoint_is_end


def test_nothing_is_freed_before_the_claim_time(store):
    hints: list = []
    handoffs = _handoffs(store, hints, claim_s=60.0)
    handoffs.handed("c1", session_id="a#1", fence_token=1, released=handed(store))
    assert asyncio.run(handoffs.check_once()) == 0
    assert store.get("c1")["released_fence"] == 1 and handoffs.pending("c1") and not hints


def _race_stop_and_take(emulator, aws_env, store, sessions, cid: str, released: dict, delay: float):
    """The router's STOP and a taker's acquire from the hint, started together; the
    taker ``delay`` s later. Returns (the STOP's answer, the acquire's)."""
    barrier = threading.Barrier(2)
    taker = ConnectionsStore(
        boto3.client("dynamodb", endpoint_url=emulator.endpoint_url, region_name="us-east-1"),
        aws_env["TABLE_NAME"],
        state_shards=4,
        sessions_table_name=aws_env["SESSIONS_TABLE_NAME"],
    )

    def stop():
        barrier.wait()
        return store.stop(cid, sessions=sessions)

    def take():
        barrier.wait()
        time.sleep(delay)
        return taker.acquire_many([(cid, "")], session_id="b#1", worker_id="b", known={cid: known(cid, released)})[0]

    with ThreadPoolExecutor(2) as pool:
        stopped, taken = pool.submit(stop), pool.submit(take)
        return stopped.result(), taken.result()


def test_a_stop_racing_the_handoff_leaves_it_stopped_and_free(emulator, store, sessions, aws_env):
    """The router's STOP, a taker's acquire and (if the STOP won) the releaser freeing it
    from its inbox notice: whatever the order, it ends STOPPED and attached to nobody."""
    # The taker starts a little later each time (a STOP reads before it writes): either
    # may land first.
    for attempt, delay in enumerate((0.0, 0.002, 0.005, 0.01, 0.05, 0.3)):
        cid = f"s{attempt}"
        released = handed(store, cid)
        hints: list = []
        handoffs = _handoffs(store, hints, claim_s=60.0)
        handoffs.handed(cid, session_id="a#1", fence_token=1, released=released)
        stopped, taken = _race_stop_and_take(emulator, aws_env, store, sessions, cid, released, delay)
        assert stopped.outcome is StopOutcome.STOPPED
        if isinstance(taken, Acquired):  # the taker first: the STOP went to its inbox, it releases
            assert stopped.lease_session == "b#1" and f"{cid}#2" in sessions.get("b#1")["stops"]
            assert store.release(cid, session_id="b#1", fence_token=2, last_seq=7, stopped=True) is Released.STOPPED
        else:  # the STOP first: it went to the releaser's inbox, which frees it
            assert taken.reason is AcquireFailure.STOPPED
            assert stopped.lease_session == "a#1" and f"{cid}#1" in sessions.get("a#1")["stops"]
            assert asyncio.run(handoffs.stop(cid, 1))
        item = store.get(cid)
        assert item["desired_state"] == schema.STOPPED and item["lease_session"] == ""
        assert "owner_key" not in item and "released_fence" not in item
        assert not hints


def test_a_stop_for_another_fence_or_a_connection_not_handed_off_writes_nothing(store):
    handoffs = _handoffs(store, [], claim_s=60.0)
    handoffs.handed("c1", session_id="a#1", fence_token=1, released=handed(store))
    assert not asyncio.run(handoffs.stop("c1", 2)) and not asyncio.run(handoffs.stop("zz", 1))
    assert store.get("c1")["released_fence"] == 1


def test_the_sweep_repairs_a_live_sessions_handoff_only_once_it_is_old(store, sessions, ddb, aws_env):
    from wsfleet.worker.sweep import Sweeper

    handed(store)
    sessions_store = SessionsStore(ddb, aws_env["SESSIONS_TABLE_NAME"])
    released_at = store.get("c1")["updated_at_ms"]
    hints: list = []

    async def hint(connection_id, **kwargs):
        hints.append(connection_id)

    async def call(fn, *args, **kwargs):
        return await asyncio.to_thread(fn, *args, **kwargs)

    class Keeper:
        session_id = "z#9"

        def live(self):
            return True

    now = [released_at + 1_000]
    sweeper = Sweeper(
        connections=store, sessions=sessions_store, keeper=Keeper(), takeover=SimpleNamespace(successors=lambda: []),
        call=call, hints=SimpleNamespace(hint=hint), counters=Counters(), log=JsonLogger(), sweep_s=0.0,
        clock_ms=lambda: now[0],
    )
    items, _ = store.sweep_page(None, limit=10)
    assert asyncio.run(sweeper.check(items)) == 0  # young: its taker or releaser still comes
    now[0] = released_at + HANDOFF_UNREACHABLE_MS + 1
    assert asyncio.run(sweeper.check(items)) == 1
    item = store.get("c1")
    assert item["lease_session"] == "" and item["owner_key"] == schema.owner_key_free("c1", 4) and hints == ["c1"]


def test_a_free_scan_from_a_point_reads_to_the_end_then_round_to_that_point(store):
    cids = [f"k{i:02d}" for i in range(40)]
    for cid in cids:
        store.start(cid, URL)
    shard = schema.shard_for("k05", 4)
    mine = sorted(c for c in cids if schema.shard_for(c, 4) == shard)
    assert len(mine) >= 4
    point = mine[len(mine) // 2]
    read = list(store.free(shard, limit=3, start_after=point))
    assert sorted(read) == mine and len(read) == len(mine)  # every entry once
    assert read[0] != mine[0]  # not from the partition's first entry
    assert list(store.free(shard, limit=3, start_after="zzz")) == mine  # past the end: from the start
    assert list(store.free(shard, limit=3)) == mine


def test_a_retried_release_of_a_handoff_through_lost_answers_is_idempotent(emulator, aws_env, store, lose_first_answer):
    retrying = boto3.client(
        "dynamodb", endpoint_url=emulator.endpoint_url, region_name="us-east-1",
        config=Config(retries={"mode": "standard", "total_max_attempts": 3}),
    )
    mine = ConnectionsStore(retrying, aws_env["TABLE_NAME"], state_shards=4, sessions_table_name=aws_env["SESSIONS_TABLE_NAME"])
    store.start("c1", URL)
    store.acquire("c1", session_id="a#1", worker_id="a")
    lost = lose_first_answer(retrying, {"UpdateItem": 1.0})
    assert mine.release("c1", session_id="a#1", fence_token=1, last_seq=5, handoff=True) is Released.HANDED
    assert lost == ["UpdateItem"]
    assert store.get("c1")["released_fence"] == 1


def test_a_leaving_worker_hints_again_only_what_is_still_unclaimed(store):
    hints: list = []
    handoffs = _handoffs(store, hints, claim_s=60.0)
    for cid in ("c1", "c2"):
        released = handed(store, cid)
        handoffs.handed(cid, session_id="a#1", fence_token=1, released=released)
    store.acquire_many([("c2", "")], session_id="b#1", worker_id="b", known={"c2": known("c2", released)})

    assert asyncio.run(handoffs.hint_again()) == 1
    ((cid, kwargs),) = hints
    assert cid == "c1" and kwargs["released"] == schema.released_state(1, URL, 7, session_id="a#1")
    assert store.get("c1")["released_fence"] == 1  # hinted as handed off, not freed
    assert handoffs.pending("c1") and not handoffs.pending("c2")


def test_a_start_point_the_table_refuses_costs_the_scan_its_random_start_not_the_scan(store, ddb):
    from tests.test_store import _answer_once

    for cid in ("k1", "k2", "k3"):
        store.start(cid, URL)
    shard = schema.shard_for("k1", 4)
    mine = sorted(c for c in ("k1", "k2", "k3") if schema.shard_for(c, 4) == shard)
    _answer_once(ddb, "Query", 400, {"__type": "ValidationException", "message": "The provided starting key is invalid"})
    assert list(store.free(shard, start_after="k0")) == mine  # from the start


def test_a_give_up_whose_hint_was_not_sent_is_hinted_as_free_by_the_next_check_or_the_leaving_worker(store):
    """The free of an unclaimed handoff lands, then its hint fails (SQS) or is cancelled
    (SIGTERM cancels the handoffs loop mid-step): nobody else hints a free it made, so
    the next check, or the leaving worker's last step, hints it as free."""
    for check in ("check_once", "hint_again"):
        cid = f"c-{check}"
        hints: list = []
        handoffs = _handoffs(store, hints)
        handoffs.handed(cid, session_id="a#1", fence_token=1, released=handed(store, cid))
        sent = handoffs._hints.hint

        async def lost(connection_id, **kwargs):
            raise TimeoutError("SQS send timed out")

        handoffs._hints.hint = lost
        with pytest.raises(TimeoutError):
            asyncio.run(handoffs.check_once())
        assert store.get(cid)["owner_key"] == schema.owner_key_free(cid, 4) and not hints  # freed, not hinted
        handoffs._hints.hint = sent
        asyncio.run(getattr(handoffs, check)())
        ((hinted, kwargs),) = hints
        assert hinted == cid and schema.LEASE_SESSION not in kwargs["released"]  # as free: the taker needs no read
        assert not len(handoffs)

    # cancelled while its hint was being sent: the same
    hints = []
    handoffs = _handoffs(store, hints)
    handoffs.handed("c-cancel", session_id="a#1", fence_token=1, released=handed(store, "c-cancel"))
    sent = handoffs._hints.hint

    async def cancelled_in_flight():
        async def hangs(connection_id, **kwargs):
            await asyncio.Event().wait()

        handoffs._hints.hint = hangs
        step = asyncio.create_task(handoffs.check_once())
        while store.get("c-cancel")["lease_session"]:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        step.cancel()
        handoffs._hints.hint = sent
        await handoffs.hint_again()

    asyncio.run(cancelled_in_flight())
    assert [h[0] for h in hints] == ["c-cancel"]


def test_a_stopped_then_started_handoff_whose_free_hint_was_lost_is_hinted_by_the_next_check(store, sessions):
    hints: list = []
    handoffs = _handoffs(store, hints)
    handoffs.handed("c1", session_id="a#1", fence_token=1, released=handed(store))
    store.stop("c1", sessions=sessions)
    assert store.start("c1", URL).unowned is False  # still attached: the START hints nothing
    sent = handoffs._hints.hint

    async def lost(connection_id, **kwargs):
        raise TimeoutError("SQS send timed out")

    handoffs._hints.hint = lost
    with pytest.raises(TimeoutError):
        asyncio.run(handoffs.stop("c1", 1))
    assert store.get("c1")["owner_key"] == schema.owner_key_free("c1", 4) and not hints
    handoffs._hints.hint = sent
    asyncio.run(handoffs.check_once())
    assert [h[0] for h in hints] == ["c1"] and not len(handoffs)
