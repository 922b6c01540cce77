"""A socket's budgets (worker.socket_budget): the flood accounting on a clock the test
turns (no sockets), then the unsent-bytes bound with a real peer that pings and never
reads (the local upstream's ``ping_flood`` kind), with and without the receive gate.
The socket tests assert on what the connection measured, waiting on polls with
deadlines; the close after FLOOD_S is the worker's test (tests/test_worker_hostile.py)."""

from __future__ import annotations

import asyncio

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosedError

from sim.upstream import Upstream
from wsfleet.worker import socket_budget
from wsfleet.worker.gate import ReceiveGate, connect_options
from wsfleet.worker.socket_budget import (
    CONTROL_FLOOD,
    CONTROL_RATE,
    FLOOD_S,
    FLOOD_TEXT,
    LOOP_SHARE,
    LOOP_SHARE_BUDGET,
    LOOP_SHARE_S,
    WRITE_LIMIT_BYTES,
    WRITE_RESUME_BYTES,
    BudgetStats,
    ControlFlood,
    LoopShare,
    OverBudget,
    over_budget,
)

READ_CHUNK = 256 * 1024  # the most one asyncio read hands over (selector transports)


def steady(flood: ControlFlood, rate: float, start: float, seconds: float) -> float:
    """Control frames at ``rate`` a second from ``start`` for ``seconds``; the time after."""
    n = int(rate * seconds)
    for i in range(n):
        flood.control(start + i / rate)
    return start + n / rate


def test_more_than_the_rate_sustained_for_flood_s_is_over_and_not_a_moment_sooner():
    flood = ControlFlood(0.0)
    end = steady(flood, 2 * CONTROL_RATE, 0.0, FLOOD_S - 0.1)
    assert not flood.over(end)
    assert flood.deadline() == FLOOD_S
    end = steady(flood, 2 * CONTROL_RATE, end, 0.2)
    assert flood.over(end)


def test_the_rate_itself_is_allowed_for_ever():
    flood = ControlFlood(0.0)
    end = steady(flood, CONTROL_RATE, 0.0, 10 * FLOOD_S)
    assert not flood.over(end)


def test_a_burst_of_up_to_rate_times_flood_s_is_forgiven_one_more_is_not():
    forgiven = ControlFlood(0.0)
    for _ in range(int(CONTROL_RATE * FLOOD_S) - 1):
        forgiven.control(0.0)
    assert not any(forgiven.over(t / 10) for t in range(int(FLOOD_S * 10) + 20))
    assert forgiven.deadline() is None  # drained: no flood going on

    flooded = ControlFlood(0.0)
    for _ in range(int(CONTROL_RATE * FLOOD_S) + 1):
        flooded.control(0.0)
    assert flooded.over(FLOOD_S)


def test_a_flood_that_stops_ends_and_the_next_one_counts_from_its_own_start():
    flood = ControlFlood(0.0)
    end = steady(flood, 2 * CONTROL_RATE, 0.0, 0.8 * FLOOD_S)
    later = end + FLOOD_S  # quiet long enough for the bucket to empty
    assert not flood.over(later) and flood.deadline() is None
    end = steady(flood, 2 * CONTROL_RATE, later, 0.8 * FLOOD_S)
    assert not flood.over(end)
    assert flood.deadline() == later + FLOOD_S


def test_unsent_bytes_that_do_not_drain_for_flood_s_are_over_with_no_frame_arriving():
    flood = ControlFlood(0.0)
    flood.pause(5.0)
    assert flood.deadline() == 5.0 + FLOOD_S  # what the connection's timer waits for
    assert not flood.over(5.0 + FLOOD_S - 0.01)
    assert flood.over(5.0 + FLOOD_S)


def test_unsent_bytes_that_drain_in_time_end_the_flood():
    flood = ControlFlood(0.0)
    flood.pause(1.0)
    flood.resume(1.0 + FLOOD_S - 1)
    assert flood.deadline() is None
    assert not flood.over(1.0 + 2 * FLOOD_S)


def test_the_pause_counts_toward_a_flood_of_frames_before_it():
    """A paused socket sees no more pings: a flood that paused it goes on flooding."""
    flood = ControlFlood(0.0)
    end = steady(flood, 2 * CONTROL_RATE, 0.0, FLOOD_S / 2)
    flood.pause(end)
    assert flood.deadline() == FLOOD_S  # from the first frame, not from the pause
    assert flood.over(FLOOD_S)


def test_a_resume_with_frames_still_owed_does_not_end_the_flood():
    flood = ControlFlood(0.0)
    for _ in range(int(CONTROL_RATE * FLOOD_S)):
        flood.control(0.0)  # owed for FLOOD_S
    flood.pause(1.0)
    flood.resume(2.0)
    assert flood.deadline() == FLOOD_S
    end = steady(flood, 2 * CONTROL_RATE, 2.0, FLOOD_S - 2.0)
    assert flood.over(end)


def test_a_close_over_budget_is_told_from_any_other_close_by_its_cause():
    closed = ConnectionClosedError(None, None)
    assert over_budget(closed) is None
    closed.__cause__ = OverBudget(CONTROL_FLOOD, FLOOD_TEXT)
    assert over_budget(closed) is closed.__cause__
    assert over_budget(OverBudget(CONTROL_FLOOD, FLOOD_TEXT)) is None  # only a socket's close
    assert FLOOD_TEXT.startswith(CONTROL_FLOOD + ": ")


@pytest.mark.parametrize("gated", [False, True], ids=["alone", "behind-the-gate"])
def test_a_peer_that_pings_and_never_reads_pauses_our_reading_and_our_unsent_bytes_stay_bounded(gated):
    async def scenario():
        stats = BudgetStats()
        options = connect_options(ReceiveGate(slots=1, allowance=64 * 1024) if gated else None)
        factory = socket_budget.connection_factory(options.pop("create_connection", None), stats)
        async with Upstream(rate=None) as up:
            url = up.url_for("f") + "?ping_flood=20000"
            async with connect(url, compression=None, create_connection=factory, **socket_budget.connect_options(),
                               **options) as ws:
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 60
                while not stats.write_pauses:
                    assert loop.time() < deadline, f"never paused: {stats}"
                    await asyncio.sleep(0.05)
                # Paused: the peer's pings wait in the kernel, so it soon can send no more.
                sent = up.sockets("f")[0].pings_sent
                while True:
                    await asyncio.sleep(0.5)
                    before, sent = sent, up.sockets("f")[0].pings_sent
                    if sent == before:
                        break
                    assert loop.time() < deadline, "the peer kept sending while we did not read"
                assert ws.transport.get_write_buffer_size() > WRITE_RESUME_BYTES  # not drained: still paused
                ws.transport.abort()
        # The mark, and the answers to the one read that crossed it (a pong of a
        # 125-byte ping is 131 bytes: masked, its ping's size and a little).
        assert WRITE_LIMIT_BYTES < stats.unsent_max <= WRITE_LIMIT_BYTES + 2 * READ_CHUNK
        assert stats.write_pauses == 1 and stats.flood_closes == 0

    asyncio.run(scenario())


def busy(share: LoopShare, fraction: float, start: float, seconds: float) -> float:
    """Frames taking ``fraction`` of the loop, 10 ms apart, for ``seconds``; the time after."""
    n = int(seconds * 100)
    for i in range(n):
        share.add(start + (i + 1) / 100, fraction / 100)
    return start + n / 100


def test_more_than_the_loop_share_sustained_is_over_after_loop_share_s_and_the_share_itself_never():
    hog = LoopShare(0.0)
    end = busy(hog, LOOP_SHARE + 0.1, 0.0, LOOP_SHARE_S - 0.5)
    assert not hog.over(end)
    assert hog.over(busy(hog, LOOP_SHARE + 0.1, end, 1.0))
    fair = LoopShare(0.0)
    assert not fair.over(busy(fair, LOOP_SHARE - 0.05, 0.0, 6 * LOOP_SHARE_S))


def test_a_burst_of_loop_time_is_forgiven_up_to_share_times_the_limit():
    forgiven = LoopShare(0.0)
    forgiven.add(0.0, LOOP_SHARE * LOOP_SHARE_S * 0.9)  # a backlog parsed at once after a reconnect
    assert not any(forgiven.over(t / 10) for t in range(int(LOOP_SHARE_S * 10) + 20))
    taken = LoopShare(0.0)
    taken.add(0.0, LOOP_SHARE * LOOP_SHARE_S * 1.1)
    assert taken.over(LOOP_SHARE_S)


def test_a_socket_over_its_loop_share_is_closed_naming_the_budget():
    async def scenario():
        stats = BudgetStats()
        factory = socket_budget.connection_factory(None, stats)
        async with Upstream(rate=None) as up:
            async with connect(up.url_for("hog"), compression=None, create_connection=factory) as ws:
                ws.charge_loop(0.001)  # its frames' share so far: nothing near the budget
                assert not ws.transport.is_closing() and stats.share_closes == 0
                # As if its frames had held the loop more than half the time since LOOP_SHARE_S ago.
                began = ws.loop.time() - LOOP_SHARE_S - 0.1
                ws._share = LoopShare(began)
                ws._share.add(began, LOOP_SHARE * LOOP_SHARE_S + 1.0)
                ws.charge_loop(0.001)
                with pytest.raises(ConnectionClosedError) as closed:
                    while True:
                        await ws.recv()
        why = over_budget(closed.value)
        assert why is not None and why.budget == LOOP_SHARE_BUDGET and why.text.startswith(LOOP_SHARE_BUDGET + ": ")
        assert stats.share_closes == 1 and stats.loop_s > 0

    asyncio.run(scenario())


def test_unsent_bytes_count_in_the_gate_a_second_flooder_without_a_slot_stops_reading_at_the_allowance():
    allowance = 64 * 1024

    async def scenario():
        gate = ReceiveGate(slots=1, allowance=allowance)
        first, second = BudgetStats(), BudgetStats()
        async with Upstream(rate=None) as up:
            def dial(name, stats):
                options = connect_options(gate)
                factory = socket_budget.connection_factory(options.pop("create_connection"), stats)
                return connect(up.url_for(name) + "?ping_flood=20000", compression=None, create_connection=factory,
                               **socket_budget.connect_options(), **options)

            loop = asyncio.get_running_loop()
            deadline = loop.time() + 60
            async with dial("a", first) as a:
                while not a.has_slot:  # its unsent bytes passed the allowance: it took the slot
                    assert loop.time() < deadline, f"never took the slot: {first}"
                    await asyncio.sleep(0.02)
                assert gate.holding() == 1
                async with dial("b", second) as b:
                    while not b._gate_wait:
                        assert loop.time() < deadline, "the second flooder never queued for the slot"
                        await asyncio.sleep(0.05)
                    await asyncio.sleep(0.5)  # it reads nothing more, so it answers nothing more
                    assert second.unsent_max <= allowance + 3 * READ_CHUNK and second.write_pauses == 0
                    a.transport.abort()  # the slot's holder goes: the waiter gets the slot
                    while not b.has_slot:
                        assert loop.time() < deadline, "the slot never went to the waiter"
                        await asyncio.sleep(0.05)
                    b.transport.abort()

    asyncio.run(scenario())
