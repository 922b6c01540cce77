"""STOP and START through the router against an in-process worker (the emulator, a local
upstream): a STOP reaches its owner within heartbeat + 1 s whatever happens to the
router's writes (an answer lost, the Lambda dying after its first write), and a START
right after a STOP connects, to the START's ws_url, as soon as the owner has released.

The workers here scan and audit only every minute, so nothing but the STOP notice and
the hints can be what makes them act in time."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from wsfleet.config import RouterConfig
from wsfleet.router import Router, make_client
from wsfleet.worker.connection import EndReason
from tests.test_worker import config, eventually, post, running

pytestmark = pytest.mark.slow  # workers run their loops here

HEARTBEAT_S = 0.4  # FAST
ROOM_S = 1.0  # for a busy 2-core machine
STOP_BOUND_S = HEARTBEAT_S + 1.0 + ROOM_S
START_TARGET_S = 2.0  # locally, from the release
WRITES = ("PutItem", "UpdateItem", "TransactWriteItems")  # what the router writes with


class LambdaDied(BaseException):
    """The function killed mid-request (a timeout, an out-of-memory): nothing in the
    router catches it."""


@pytest.fixture
def lambda_router(aws_env):
    """The router as the Lambda builds it (its own clients, standard retries), and its
    DynamoDB client, to hook into."""
    cfg = RouterConfig.from_env({**aws_env, "ALLOWED_WS_HOSTS": "127.0.0.1"})
    ddb = make_client("dynamodb", cfg)
    return Router(cfg, ddb, make_client("sqs", cfg)), ddb


def slow_scans(aws_env):
    return config(aws_env, RECONCILE_SECONDS="60")


async def held(worker, upstream, cid: str):
    """The runner holding ``cid`` and its socket, once connected."""
    await eventually(lambda: upstream.open_sockets(cid) and cid in worker.holdings.runners, what=f"{cid} held and connected")
    (sock,) = upstream.open_sockets(cid)
    return worker.holdings.runners[cid], sock


async def just_renewed(worker) -> None:
    """Return right after a renewal landed: the next is a heartbeat away, so a STOP sent
    now reaches the owner only after a START sent with it has been hinted."""
    before = worker.keeper.renewals
    await eventually(lambda: worker.keeper.renewals > before, what="a renewal")


async def stopped_in_time(worker, runner, upstream, sock, *, sent_at: float):
    """The owner closed ``sock`` because of the STOP, within the STOP bound of ``sent_at``
    (wall clock), and its runner is done. Returns the socket's record as closed."""

    def closed():
        (now,) = [r for r in upstream.sockets(sock.stream) if r.id == sock.id]
        return now if now.closed_at is not None and worker.holdings.runners.get(runner.connection_id) is not runner else None

    record = await eventually(closed, timeout=8, what="the STOP acted on")
    assert runner.end_reason is EndReason.STOPPED  # not a lost session
    assert record.closed_at - sent_at < STOP_BOUND_S, record.closed_at - sent_at
    return record


def event(body: dict) -> dict:
    return {"httpMethod": "POST", "resource": "/events", "path": "/events", "body": json.dumps(body)}


# --- the STOP notice cannot be lost ------------------------------------------------------


def test_a_stop_whose_write_lost_its_answer_reaches_the_owner_within_heartbeat_plus_1s(
    aws_env, stores, upstream, lambda_router, lose_first_answer
):
    conns, _ = stores
    router, router_ddb = lambda_router
    conns.start("a", upstream.url_for("a"))

    async def scenario():
        async with running(slow_scans(aws_env)) as worker:
            runner, sock = await held(worker, upstream, "a")
            session_id = worker.keeper.session_id
            # the router's first write (the STOP's: an UpdateItem once, now a transaction
            # with its notice) is applied and its answer lost; the SDK's retry is answered
            lost = lose_first_answer(router_ddb, {"UpdateItem": 1.0, "TransactWriteItems": 1.0})
            sent_at = time.time()
            status = await asyncio.to_thread(post, router, {"event_type": "STOP", "connection_id": "a"})
            assert lost, "no write of the router lost its answer"
            assert status in (200, 202), status  # 200: its retry found it STOPPED already
            await stopped_in_time(worker, runner, upstream, sock, sent_at=sent_at)
            assert worker.keeper.session_id == session_id

    asyncio.run(scenario())
    item = conns.get("a")
    assert item["desired_state"] == "STOPPED" and item["lease_session"] == "" and "owner_key" not in item


def test_a_router_that_dies_right_after_its_first_write_still_gets_the_stop_to_the_owner(
    aws_env, stores, upstream, lambda_router
):
    conns, _ = stores
    router, router_ddb = lambda_router
    conns.start("a", upstream.url_for("a"))

    def die_after_a_write(model, **_):
        if model.name in WRITES:
            raise LambdaDied(model.name)

    router_ddb.meta.events.register("after-call.dynamodb", die_after_a_write)

    async def scenario():
        async with running(slow_scans(aws_env)) as worker:
            runner, sock = await held(worker, upstream, "a")
            sent_at = time.time()
            with pytest.raises(LambdaDied):
                await asyncio.to_thread(router.handle, event({"event_type": "STOP", "connection_id": "a"}))
            await stopped_in_time(worker, runner, upstream, sock, sent_at=sent_at)

    asyncio.run(scenario())
    assert conns.get("a")["desired_state"] == "STOPPED"


# --- a START right after a STOP -----------------------------------------------------------


def test_stop_then_start_with_a_new_url_within_100ms_moves_the_stream_to_the_new_url_at_the_release(
    aws_env, stores, upstream, lambda_router
):
    conns, _ = stores
    router, _ = lambda_router
    old_url, new_url = upstream.url_for("a"), upstream.url_for("a-v2")
    conns.start("a", old_url)

    async def scenario():
        async with running(slow_scans(aws_env)) as worker:
            runner, sock = await held(worker, upstream, "a")
            await just_renewed(worker)
            sent_at = time.time()
            assert await asyncio.to_thread(post, router, {"event_type": "STOP", "connection_id": "a"}) == 202
            start = {"event_type": "START", "connection_id": "a", "ws_url": new_url}
            assert await asyncio.to_thread(post, router, start) == 202
            closed = await stopped_in_time(worker, runner, upstream, sock, sent_at=sent_at)
            await eventually(lambda: upstream.open_sockets("a-v2"), timeout=8, what="a socket to the new url")
            (new,) = upstream.sockets("a-v2")
            assert new.opened_at - closed.closed_at < START_TARGET_S, new.opened_at - closed.closed_at
            assert worker.holdings.runners["a"].ws_url == new_url

    asyncio.run(scenario())
    assert len(upstream.sockets("a")) == 1  # the old url never got another socket
    assert conns.get("a")["ws_url"] == new_url


def test_a_start_right_after_a_stop_connects_within_the_start_target_of_the_release(
    aws_env, stores, upstream, lambda_router
):
    conns, _ = stores
    router, _ = lambda_router
    conns.start("a", upstream.url_for("a"))

    async def scenario():
        async with running(slow_scans(aws_env)) as worker:
            runner, sock = await held(worker, upstream, "a")
            await just_renewed(worker)
            sent_at = time.time()
            assert await asyncio.to_thread(post, router, {"event_type": "STOP", "connection_id": "a"}) == 202
            start = {"event_type": "START", "connection_id": "a", "ws_url": upstream.url_for("a")}
            assert await asyncio.to_thread(post, router, start) == 202
            closed = await stopped_in_time(worker, runner, upstream, sock, sent_at=sent_at)
            await eventually(lambda: len(upstream.sockets("a")) == 2, timeout=8, what="connected again")
            new = upstream.sockets("a")[1]
            assert new.opened_at - closed.closed_at < START_TARGET_S, new.opened_at - closed.closed_at

    asyncio.run(scenario())
    assert upstream.max_concurrent("a") == 1
