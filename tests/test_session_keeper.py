"""The session keeper while the sessions table does not answer: hedged tries, at most
RENEW_IN_FLIGHT of them, one renew_slow line per hedge, and no busy loop.

Seed 672278 with the hostile kinds (30 minutes): while the emulator answered renewals in
more than 3 s, each worker's renewal loop, its three tries out, waited 0 s and logged
renew_slow at every turn (1.6 million lines, four workers spinning on two cores), which
slowed the table further: recoveries came 1-2 s late."""

from __future__ import annotations

import asyncio
import io
import json

from wsfleet.leases import SessionTiming
from wsfleet.logs import JsonLogger
from wsfleet.worker import session as session_mod
from wsfleet.worker.session import Lost, SessionKeeper


class NeverAnswers:
    def __init__(self) -> None:
        self.tries = 0

    def renew(self, *args, **kwargs):  # called through ``call`` below
        raise AssertionError("not reached")


def test_renewals_that_are_never_answered_are_hedged_three_times_and_the_loop_sleeps_until_the_deadline():
    store = NeverAnswers()
    out = io.StringIO()
    waits = 0

    async def call(fn, *args, **kwargs):
        store.tries += 1
        await asyncio.Event().wait()  # no answer, ever

    keeper = SessionKeeper(
        sessions=store, worker_id="w", timing=SessionTiming(4_000, 1_000, 500), max_connections=1, call=call,
        log=JsonLogger(out), active=lambda: 0, on_stops=lambda s: set(),
    )

    real_wait = asyncio.wait

    async def counted_wait(*args, **kwargs):
        nonlocal waits
        waits += 1
        return await real_wait(*args, **kwargs)

    async def scenario() -> bool:
        keeper.session_id = "w#1"
        keeper.deadline_mono = session_mod.clock.now() + 2.2
        session_mod.asyncio.wait = counted_wait
        try:
            return await keeper.renew_once()
        finally:
            session_mod.asyncio.wait = real_wait

    assert asyncio.run(scenario()) is False
    assert keeper.lost_reason is Lost.EXPIRED
    assert store.tries == session_mod.RENEW_IN_FLIGHT
    events = [json.loads(line)["event"] for line in out.getvalue().splitlines()]
    # one line per hedge sent (two), then the loss; a wait per second until the deadline
    assert events.count("renew_slow") == session_mod.RENEW_IN_FLIGHT - 1, events
    assert waits <= 2.2 / session_mod.RENEW_TIMEOUT_S + 2, waits


def test_a_failed_renewal_and_a_lost_session_mark_the_keeper_troubled():
    # What the ender of a dead session asks before it strikes that session's suspect
    # (worker.takeover): our own renewals failing too means the table, not a connection.
    from wsfleet.store import TransientError

    async def call(fn, *args, **kwargs):
        raise TransientError("throttled")

    keeper = SessionKeeper(
        sessions=NeverAnswers(), worker_id="w", timing=SessionTiming(4_000, 1_000, 500), max_connections=1, call=call,
        log=JsonLogger(io.StringIO()), active=lambda: 0, on_stops=lambda s: set(),
    )
    assert keeper.troubled_at == float("-inf")

    async def scenario() -> None:
        keeper.session_id = "w#1"
        keeper.deadline_mono = session_mod.clock.now() + 0.3
        await keeper.renew_once()

    before = session_mod.clock.now()
    asyncio.run(scenario())
    assert keeper.lost_reason is Lost.EXPIRED and before <= keeper.troubled_at <= session_mod.clock.now()
