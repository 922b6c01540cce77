"""The worker's shared checkpoint writer: checkpoints of many connections leave together
in one transaction, none later than its connection's time, and each learns its own
outcome. Driven with a recording stand-in for ConnectionsStore.checkpoint_many (the
store's own transaction is tested against the emulator in test_store.py)."""

from __future__ import annotations

import asyncio

import pytest
from botocore.exceptions import ClientError

from wsfleet import clock
from wsfleet import metrics_names as names
from wsfleet.logs import JsonLogger
from wsfleet.metrics import Counters
from wsfleet.store import CheckpointEntry, TransientError
from wsfleet.worker.checkpoints import Checkpoints
from wsfleet.worker.retry import LeaseExpired


class RecordingStore:
    """Answers like checkpoint_many: ``gone`` connections fail their condition (and
    cancel the rest of their transaction); ``conflicts`` transactions are cancelled as
    a whole first."""

    def __init__(self, gone: set[str] = frozenset(), conflicts: int = 0, errors: list[Exception] = ()) -> None:
        self.transactions: list[list[CheckpointEntry]] = []
        self.gone = set(gone)
        self.conflicts = conflicts
        self.errors = list(errors)  # raised, one per transaction, before any answer

    def checkpoint_many(self, entries):
        self.transactions.append(list(entries))
        if self.errors:
            raise self.errors.pop(0)
        if self.conflicts:
            self.conflicts -= 1
            raise TransientError("cancelled: TransactionConflict")
        if any(e.connection_id in self.gone for e in entries):
            return [False if e.connection_id in self.gone else None for e in entries]
        return [True] * len(entries)


async def direct_call(fn, /, **kwargs):
    return fn(**kwargs)


def entry(cid: str, seq: int = 7) -> CheckpointEntry:
    return CheckpointEntry(cid, "s#1", 1, seq)


async def started(store: RecordingStore, counters: Counters | None = None, **kw) -> tuple[Checkpoints, asyncio.Task]:
    cp = Checkpoints(connections=store, call=direct_call, counters=counters or Counters(), log=JsonLogger(), **kw)
    return cp, asyncio.create_task(cp.run())


def far() -> float:
    return clock.now() + 60


def test_checkpoints_asked_for_together_leave_in_one_transaction_by_the_earliest_time():
    async def scenario():
        store = RecordingStore()
        cp, task = await started(store)
        now = clock.now()
        asks = [cp.write(entry(f"c{i}"), by=now + 0.3 + i * 0.1, deadline=far) for i in range(5)]
        began = clock.now()
        results = await asyncio.gather(*asks)
        took = clock.now() - began
        task.cancel()
        return store, results, took

    store, results, took = asyncio.run(scenario())
    assert results == [True] * 5
    assert [len(t) for t in store.transactions] == [5]  # one request for five checkpoints
    assert 0.25 <= took < 5.0  # left at the earliest one's time, not before (and not at the last's)


def test_a_full_transaction_leaves_at_once():
    async def scenario():
        store = RecordingStore()
        cp, task = await started(store, batch=4)
        asks = [asyncio.ensure_future(cp.write(entry(f"c{i}"), by=clock.now() + 30, deadline=far)) for i in range(6)]
        await asyncio.wait_for(asyncio.gather(*asks[:4]), timeout=5)
        task.cancel()
        for a in asks[4:]:
            a.cancel()
        return store

    store = asyncio.run(scenario())
    assert [len(t) for t in store.transactions] == [4]  # the other two wait for their time


def due_now(store: RecordingStore, n: int) -> list[bool]:
    """``n`` checkpoints due at once, each awaited; their outcomes in order."""

    async def scenario():
        cp, task = await started(store)
        now = clock.now()
        results = await asyncio.gather(*(cp.write(entry(f"c{i}"), by=now, deadline=far) for i in range(n)))
        task.cancel()
        return results

    return asyncio.run(scenario())


def test_a_connection_no_longer_ours_is_told_and_the_rest_go_again_without_it():
    store = RecordingStore(gone={"c1"})
    results = due_now(store, 3)
    assert results == [True, False, True]
    assert [[e.connection_id for e in t] for t in store.transactions] == [["c0", "c1", "c2"], ["c0", "c2"]]


def test_a_cancelled_transaction_goes_again_whole_after_a_backoff():
    store = RecordingStore(conflicts=2)
    results = due_now(store, 2)
    assert results == [True, True] and [len(t) for t in store.transactions] == [2, 2, 2]


def test_past_the_deadline_a_checkpoint_is_not_written_and_its_writer_hears_so():
    async def scenario():
        store = RecordingStore(conflicts=1000)
        cp, task = await started(store)
        deadline = clock.now() + 0.5
        with pytest.raises(LeaseExpired):
            await cp.write(entry("c0"), by=clock.now(), deadline=lambda: deadline)
        task.cancel()
        return store

    store = asyncio.run(scenario())
    assert store.transactions  # it was tried until then


def test_a_checkpoint_whose_runner_stopped_waiting_is_not_sent():
    async def scenario():
        store = RecordingStore()
        cp, task = await started(store)
        ask = asyncio.ensure_future(cp.write(entry("c0"), by=clock.now() + 0.3, deadline=far))
        await asyncio.sleep(0.05)
        ask.cancel()  # the runner ended (its release writes the final checkpoint)
        done = await cp.write(entry("c1"), by=clock.now() + 0.3, deadline=far)
        task.cancel()
        return store, done

    store, done = asyncio.run(scenario())
    assert done is True
    assert [[e.connection_id for e in t] for t in store.transactions] == [["c1"]]


def test_an_unexpected_error_is_counted_and_the_checkpoints_go_again_and_later_ones_too():
    async def scenario():
        store = RecordingStore(errors=[RuntimeError("a bug in the store")])
        counters = Counters()
        cp, task = await started(store, counters)
        first = await asyncio.wait_for(cp.write(entry("c0"), by=clock.now(), deadline=far), timeout=5)
        later = await asyncio.wait_for(cp.write(entry("c1", 9), by=clock.now(), deadline=far), timeout=5)
        alive = not task.done()
        task.cancel()
        return store, counters, first, later, alive

    store, counters, first, later, alive = asyncio.run(scenario())
    assert (first, later, alive) == (True, True, True)
    assert [[e.connection_id for e in t] for t in store.transactions] == [["c0"], ["c0"], ["c1"]]
    assert counters.total(names.LOOP_ERRORS) == 1


def test_an_error_that_is_not_about_ownership_is_retried_until_the_deadline_then_the_writer_hears_so():
    async def scenario():
        denied = ClientError({"Error": {"Code": "AccessDeniedException", "Message": "deploying"}}, "TransactWriteItems")
        store = RecordingStore(errors=[denied] * 1000)
        cp, task = await started(store)
        deadline = clock.now() + 1.0
        with pytest.raises(LeaseExpired):
            await asyncio.wait_for(cp.write(entry("c0"), by=clock.now(), deadline=lambda: deadline), timeout=5)
        task.cancel()
        return store

    assert len(asyncio.run(scenario()).transactions) > 1  # tried again, with a backoff, until then
