"""Moves to a named worker with real workers in-process (against the emulator, whose
START queue has the stack's dead-letter rule, and a local upstream): a join's sheds are
assigned to the newcomer's session and picked up at its next renewal; no hint names a
worker, none reaches the dead-letter queue, and a moved stream never has two sockets."""

from __future__ import annotations

import asyncio

import pytest

from sim.emulator import dead_letters
from sim.upstream import ThreadedUpstream
from wsfleet.worker import balancer
from tests.test_worker import config, eventually, running, seqs  # noqa: F401 - shared fixtures below

pytestmark = pytest.mark.slow

STEADY = {"LEASE_SECONDS": "4", "HEARTBEAT_SECONDS": "0.8", "MAX_CONNECTIONS": "20"}


@pytest.fixture
def upstream():
    with ThreadedUpstream(rate=5.0) as up:
        yield up


@pytest.fixture(autouse=True)
def short_hold(monkeypatch):
    monkeypatch.setattr(balancer, "MIN_HOLD_S", 0.5)  # a minute in production


def gaps_s(upstream: ThreadedUpstream, cid: str) -> list[float]:
    """Between each socket's close and the next one's open, for one stream."""
    socks = sorted(upstream.sockets(cid), key=lambda s: s.opened_at)
    return [b.opened_at - a.closed_at for a, b in zip(socks, socks[1:], strict=False) if a.closed_at is not None]


def test_a_join_moves_the_excess_to_the_newcomers_session_with_no_named_hint_and_no_dead_letter(
    aws_env, stores, upstream, sqs
):
    conns, msgs = stores
    cids = [f"c{i:02d}" for i in range(12)]
    for cid in cids:
        conns.start(cid, upstream.url_for(cid))
    cfg = config(aws_env, **STEADY)

    async def scenario():
        async with running(cfg, "w1") as w1:
            await eventually(lambda: len(w1.holdings.runners) == 12 and all(upstream.open_sockets(c) for c in cids), what="all on w1")
            async with running(cfg, "w2") as w2:
                await eventually(lambda: len(w2.holdings.runners) >= 5 and len(w1.holdings.runners) <= 7, timeout=60, what="balanced")
                # Moved by w1 to w2's session (w2 picks each up at its next renewal, or
                # its audit, which reads the owner index, finds it first: both write nothing).
                assert w1.mover.moved >= 5, w1.mover.moved
                await eventually(lambda: all(upstream.open_sockets(c) for c in cids), what="all connected")
                for cid in cids:
                    await eventually(lambda c=cid: len(seqs(msgs, c)) >= 5, what="frames stored")

    asyncio.run(scenario())
    assert dead_letters(sqs, aws_env["QUEUE_URL"]) == 0
    # Each moved stream's first gap (the second is w2's exit handing it back).
    gaps = [gaps_s(upstream, cid)[0] for cid in cids if gaps_s(upstream, cid)]
    print(f"moves: {len(gaps)}, gap max {max(gaps):.2f} s, mean {sum(gaps) / len(gaps):.2f} s")
    # Release, move, the target's next renewal (0.8 s here), its read and connect; on a
    # loaded 2-core machine, with room.
    assert max(gaps) < 5.0, gaps
    for cid in cids:
        stored = seqs(msgs, cid)
        assert stored == list(range(1, len(stored) + 1)), cid
        assert upstream.max_concurrent(cid) == 1, upstream.overlaps(cid)


def test_a_sheds_move_refused_at_a_full_inbox_is_tried_again_before_it_goes_to_anyone(monkeypatch):
    import asyncio
    from types import SimpleNamespace

    from wsfleet.logs import JsonLogger
    from wsfleet.store import Moved
    from wsfleet.worker import moves

    monkeypatch.setattr(moves, "REFUSED_WAIT_S", 0.0)

    def mover(answers: list) -> tuple[moves.Mover, list, list]:
        hinted, handed = [], []

        async def call(fn, *a, **k):
            return fn(*a, **k)

        async def hint(cid, **_):
            hinted.append(cid)

        connections = SimpleNamespace(move=lambda cid, **_: answers.pop(0))
        return moves.Mover(connections=connections, call=call, hints=SimpleNamespace(hint=hint),
                           handoffs=SimpleNamespace(moved=handed.append), log=JsonLogger()), hinted, handed

    m, hinted, handed = mover([Moved.REFUSED, Moved.MOVED])  # the target's renewal emptied its inbox
    assert asyncio.run(m.move_handed("c1", session_id="a#1", fence_token=3, to="b#1", released={}, trace=None)) is Moved.MOVED
    assert (hinted, handed) == ([], ["c1"])
    m, hinted, handed = mover([Moved.REFUSED] * moves.REFUSED_TRIES)  # refused every time: to anyone
    assert asyncio.run(m.move_handed("c2", session_id="a#1", fence_token=3, to="b#1", released={}, trace=None)) is Moved.REFUSED
    assert (hinted, handed) == (["c2"], [])
