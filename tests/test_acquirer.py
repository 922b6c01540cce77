"""Acquisitions asked for in one turn of the event loop leave together: one read and one
transaction per 25 connections, each asker answered for its own connection."""

from __future__ import annotations

import asyncio

import pytest

from wsfleet.leases import AcquireFailure
from wsfleet.store import Acquired, NotAcquired, TransientError
from wsfleet.worker.acquirer import Acquirer


class Store:
    """acquire_many as the table would answer: free ones are taken, "held*" ones are not."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.calls: list[list[tuple[str, str]]] = []
        self.known: list[dict] = []
        self.fail = fail

    def acquire_many(self, wanted, *, session_id, worker_id, known=None):
        self.calls.append(list(wanted))
        self.known.append(dict(known or {}))
        if self.fail is not None:
            raise self.fail
        return [
            NotAcquired(AcquireFailure.HELD, "other#1") if cid.startswith("held") else Acquired({"pk": cid, "s": session_id})
            for cid, _ in wanted
        ]


async def direct(fn, *args, **kwargs):
    return fn(*args, **kwargs)


def test_thirty_asked_together_leave_as_a_transaction_of_25_and_one_of_5_each_answered_for_itself():
    store = Store()
    acquirer = Acquirer(connections=store, call=direct, worker_id="w1")

    async def scenario():
        return await asyncio.gather(
            *(acquirer.acquire(connection_id=f"c{i}", session_id="me#1") for i in range(29)),
            acquirer.acquire(connection_id="held", session_id="me#1"),
        )

    results = asyncio.run(scenario())
    assert [len(c) for c in store.calls] == [25, 5]
    assert [r.item["pk"] for r in results[:29]] == [f"c{i}" for i in range(29)]
    assert results[29].reason is AcquireFailure.HELD


def test_one_connection_asked_twice_in_a_turn_is_sent_once_and_both_askers_get_the_answer():
    store = Store()
    acquirer = Acquirer(connections=store, call=direct, worker_id="w1")

    async def scenario():
        return await asyncio.gather(*(acquirer.acquire(connection_id="c1", session_id="me#1") for _ in range(2)))

    first, second = asyncio.run(scenario())
    assert store.calls == [[("c1", "")]] and first is second


def test_acquisitions_for_different_sessions_or_expected_sessions_are_told_apart():
    store = Store()
    acquirer = Acquirer(connections=store, call=direct, worker_id="w1")

    async def scenario():
        return await asyncio.gather(
            acquirer.acquire(connection_id="a", session_id="me#1"),
            acquirer.acquire(connection_id="b", session_id="me#1", expected_session="dead#1"),
            acquirer.acquire(connection_id="c", session_id="me#2"),
        )

    results = asyncio.run(scenario())
    assert store.calls == [[("a", ""), ("b", "dead#1")], [("c", "")]]
    assert [r.item["s"] for r in results] == ["me#1", "me#1", "me#2"]


def test_what_a_clean_release_hint_says_of_a_connection_goes_with_it():
    store = Store()
    acquirer = Acquirer(connections=store, call=direct, worker_id="w1")
    released = {"pk": "CONN#a", "fence_token": 4}

    async def scenario():
        await asyncio.gather(
            acquirer.acquire(connection_id="a", session_id="me#1", known=released),
            acquirer.acquire(connection_id="b", session_id="me#1"),
        )

    asyncio.run(scenario())
    assert store.known == [{"a": released}]  # "b" is read as usual


def test_a_batch_that_failed_fails_every_asker_with_its_error_and_the_next_turn_is_a_new_batch():
    store = Store(fail=TransientError("throttled"))
    acquirer = Acquirer(connections=store, call=direct, worker_id="w1")

    async def scenario():
        got = await asyncio.gather(
            *(acquirer.acquire(connection_id=f"c{i}", session_id="me#1") for i in range(3)), return_exceptions=True
        )
        store.fail = None
        return got, await acquirer.acquire(connection_id="c0", session_id="me#1")

    failed, retried = asyncio.run(scenario())
    assert all(isinstance(e, TransientError) for e in failed)
    assert isinstance(retried, Acquired) and len(store.calls) == 2


def test_an_asker_cancelled_while_its_batch_is_in_flight_leaves_the_others_answered():
    store = Store()

    async def slow(fn, *args, **kwargs):
        await asyncio.sleep(0.05)
        return fn(*args, **kwargs)

    acquirer = Acquirer(connections=store, call=slow, worker_id="w1")

    async def scenario():
        keep = asyncio.ensure_future(acquirer.acquire(connection_id="a", session_id="me#1"))
        drop = asyncio.ensure_future(acquirer.acquire(connection_id="b", session_id="me#1"))
        await asyncio.sleep(0.01)
        drop.cancel()
        with pytest.raises(asyncio.CancelledError):
            await drop
        return await keep

    assert isinstance(asyncio.run(scenario()), Acquired)
