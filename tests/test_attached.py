"""A clean exit never leaves a connection where nothing watches it: the worker ends its
session (no acquisition can land on it after that), frees whatever is still attached with
no runner of its own, and only then takes the session out of the watch ring."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from wsfleet import schema
from wsfleet.leases import unreachable

from tests.test_worker import config, eventually, running

pytestmark = pytest.mark.slow  # workers run their loops here


def reachable(conns, sessions_store, cid: str) -> bool:
    item = conns.get(cid)
    session_id = item.get(schema.LEASE_SESSION, "")
    return unreachable(item, sessions_store.get(session_id) if session_id else None) is None


def test_an_acquisition_answered_only_after_the_session_ended_is_freed_before_the_session_leaves_the_ring(
    aws_env, stores, sessions, upstream
):
    # SIGTERM arrives while an acquisition is in flight: the write lands, its answer comes
    # back only after the worker ended its session, so no runner ever holds it.
    conns, _ = stores
    conns.start("late", upstream.url_for("late"))
    landed, answer = threading.Event(), threading.Event()

    def hold_the_answer(**_):
        landed.set()
        answer.wait(10)

    async def scenario():
        cfg = config(aws_env, RECONCILE_SECONDS="60")  # no free scan, no audit: only the hint brings it
        async with running(cfg) as worker:
            worker.aws.dynamodb.meta.events.register("after-call.dynamodb.TransactWriteItems", hold_the_answer)
            await worker.takeover.reconcile_once()  # there is no hint: the free scan is asked once, by hand
            await asyncio.to_thread(landed.wait, 10)
            session_id = worker.keeper.session_id
            assert conns.get("late")[schema.LEASE_SESSION] == session_id and "late" not in worker.holdings.runners
            worker.request_shutdown()
            await eventually(lambda: sessions.get(session_id)["state"] == schema.ENDED, what="the session ended")
            answer.set()
            return session_id

    session_id = asyncio.run(scenario())
    item = conns.get("late")
    assert item[schema.LEASE_SESSION] == "" and item[schema.OWNER_KEY] == schema.owner_key_free("late", 4)
    assert "ring" not in sessions.get(session_id)  # left the ring only once nothing was attached
    assert reachable(conns, sessions, "late")


def test_a_connection_attached_without_the_workers_knowledge_is_found_through_the_owner_index_at_exit(
    aws_env, stores, sessions, upstream
):
    conns, _ = stores
    conns.start("stray", upstream.url_for("stray"))
    sessions.open("other#1", worker_id="other", lease_ms=60_000, max_connections=10)
    conns.acquire("stray", session_id="other#1", worker_id="other")  # never free: no scan of ours takes it

    async def scenario():
        async with running(config(aws_env, RECONCILE_SECONDS="60")) as worker:
            await eventually(lambda: worker.keeper.live(), what="a session")
            session_id = worker.keeper.session_id
            # As if an earlier acquisition's answer had been lost and nothing tracked it.
            await asyncio.to_thread(
                conns.acquire, "stray", session_id=session_id, worker_id="w1", expected_session="other#1"
            )
            await eventually(lambda: any(r.connection_id == "stray" for r in conns.owned_by(session_id)), what="indexed")
            return session_id

    session_id = asyncio.run(scenario())
    assert conns.get("stray")[schema.LEASE_SESSION] == ""
    assert "ring" not in sessions.get(session_id)
    assert reachable(conns, sessions, "stray")


def test_a_session_with_a_connection_still_held_at_the_end_of_the_budget_stays_in_the_ring(
    aws_env, stores, sessions, upstream
):
    conns, _ = stores
    conns.start("slow", upstream.url_for("slow"))

    async def scenario():
        async with running(config(aws_env, SHUTDOWN_SECONDS="2")) as worker:
            await eventually(lambda: "slow" in worker.holdings.runners and worker.holdings.runners["slow"].connected.is_set(), what="held")
            runner = worker.holdings.runners["slow"]

            async def never_flushes() -> None:
                await asyncio.sleep(30)

            runner.flush = never_flushes  # its handover outlasts the budget
            return worker.keeper.session_id

    started = time.monotonic()
    session_id = asyncio.run(scenario())
    assert time.monotonic() - started < 15
    assert sessions.get(session_id)["state"] == schema.ENDED
    assert sessions.get(session_id).get("ring") == schema.RING_VALUE  # still watched: its watchers drain it
    assert reachable(conns, sessions, "slow")


def test_a_stopped_connection_attached_with_no_runner_is_freed_by_the_audit(aws_env, stores, sessions, upstream):
    # An acquisition whose answer was lost, then the connection's STOP: its notice finds
    # no runner, and nothing would ever release it while the worker lives.
    conns, _ = stores
    conns.start("quiet", upstream.url_for("quiet"))
    sessions.open("other#1", worker_id="other", lease_ms=60_000, max_connections=10)
    conns.acquire("quiet", session_id="other#1", worker_id="other")  # never free: no scan of ours takes it

    async def scenario():
        async with running(config(aws_env, RECONCILE_SECONDS="60")) as worker:
            await eventually(lambda: worker.keeper.live(), what="a session")
            session_id = worker.keeper.session_id
            await asyncio.to_thread(
                conns.acquire, "quiet", session_id=session_id, worker_id="w1", expected_session="other#1"
            )
            await asyncio.to_thread(conns.stop, "quiet", sessions=sessions)
            await eventually(lambda: any(r.connection_id == "quiet" for r in conns.owned_by(session_id)), what="indexed")
            assert await worker.acquisition.audit_once() == 1
            item = conns.get("quiet")
            assert item[schema.LEASE_SESSION] == "" and schema.OWNER_KEY not in item

    asyncio.run(scenario())


def test_at_shutdown_what_no_runner_holds_is_freed_at_once_not_after_a_runner_slow_to_hand_over(
    aws_env, stores, sessions, upstream
):
    # A runner whose handover takes long (a peer faster than its partition takes: its
    # flush cannot finish) held up once what a drain had attached and never ran: it was
    # freed only after the budget, with the rest at the end. Now at once, the session LIVE.
    conns, _ = stores
    conns.start("slow", upstream.url_for("slow"))
    conns.start("stray", upstream.url_for("stray"))
    sessions.open("other#1", worker_id="other", lease_ms=60_000, max_connections=10)
    conns.acquire("stray", session_id="other#1", worker_id="other")  # never free: no scan of ours takes it
    hold, held = threading.Event(), threading.Event()

    def hold_the_slow_release(params, **_):
        if "slow" in repr(params):
            held.set()
            hold.wait(15)

    async def scenario():
        cfg = config(aws_env, RECONCILE_SECONDS="60", SHUTDOWN_SECONDS="20")
        async with running(cfg) as worker:
            await eventually(lambda: "slow" in worker.holdings.runners, what="slow held")
            session_id = worker.keeper.session_id
            await asyncio.to_thread(
                conns.acquire, "stray", session_id=session_id, worker_id="w1", expected_session="other#1"
            )
            for op in ("UpdateItem", "TransactWriteItems"):
                worker.aws.dynamodb.meta.events.register(f"before-call.dynamodb.{op}", hold_the_slow_release)
            worker.request_shutdown()
            try:
                await asyncio.to_thread(held.wait, 10)
                await eventually(lambda: conns.get("stray")[schema.LEASE_SESSION] == "", what="stray freed")
                assert sessions.get(session_id)["state"] == schema.LIVE  # the slow handover still going
                assert conns.get("slow")[schema.LEASE_SESSION] == session_id
            finally:
                hold.set()
            return session_id

    asyncio.run(scenario())
    assert reachable(conns, sessions, "stray")
