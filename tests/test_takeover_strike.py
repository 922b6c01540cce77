"""The worker that ends a dead session strikes the prime suspect that session named,
before its drain takes it, and nothing else (worker.takeover, store calls as plain
functions)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from wsfleet import metrics_names as names
from wsfleet import clock, schema
from wsfleet.crash_loop import Strike, Suspect
from wsfleet.leases import SessionTiming
from wsfleet.logs import JsonLogger
from wsfleet.metrics import Counters
from wsfleet.store import Owned
from wsfleet.worker.holdings import Holdings
from wsfleet.worker.summary import FleetSummary
from wsfleet.worker.takeover import Takeover

T = SessionTiming(lease_ms=10_000, heartbeat_ms=2_500, max_clock_skew_ms=1_000)
ROWS = [Owned(cid, schema.STARTED) for cid in ("culprit", "n1", "n2")]


def ender(ended_item: dict, *, quarantines: bool = False, failing_strike=None, troubled_at: float = float("-inf")):
    """A Takeover that ends 'dead' with ``ended_item`` as the ENDED session; returns it,
    the log of store calls in order and its counters. ``failing_strike``: the store's
    strike, in place of one that lands."""
    calls: list[tuple] = []

    async def call(f, *args, **kwargs):
        return f(*args, **kwargs)

    def strike(cid, suspect, *, dead_session, quarantine_after):
        calls.append(("strike", cid, suspect.fence_token, dead_session, quarantine_after))
        return Strike(quarantine_after if quarantines else 1, 0, suspect.fence_token, {"reason": "r", "at_ms": 1} if quarantines else None)

    async def acquire(cid, **kw):
        calls.append(("acquire", cid))

    async def hint(cid, **kw):
        calls.append(("acquire", cid))

    async def no_moves(sid, named):
        return []

    summary = FleetSummary()
    counters = Counters()
    takeover = Takeover(
        sessions=SimpleNamespace(end_expired=lambda *a, **k: ended_item),
        connections=SimpleNamespace(owned_by=lambda sid: ROWS, strike=failing_strike or strike),
        keeper=SimpleNamespace(live=lambda: True, session_id="me#1", troubled_at=troubled_at), timing=T, state_shards=1, call=call,
        log=JsonLogger(), acquisition=SimpleNamespace(try_acquire=acquire), hints=SimpleNamespace(hint=hint),
        mover=SimpleNamespace(move_drained=no_moves), holdings=Holdings(max_connections=100, summary=summary), summary=summary, counters=counters, quarantine_after=3,
    )
    return takeover, calls, counters


def test_ending_a_dead_session_strikes_its_suspect_once_before_the_drain_and_no_neighbour():
    suspect = Suspect("culprit", 7, "most bytes received")
    takeover, calls, counters = ender({schema.SESSION_ID: "dead", schema.SUSPECT: suspect.item()})
    assert asyncio.run(takeover.end_session("dead"))
    assert calls[0] == ("strike", "culprit", 7, "dead", 3)
    assert [c for c in calls if c[0] == "strike"] == [calls[0]]
    assert {c[1] for c in calls[1:]} == {"culprit", "n1", "n2"}  # then drained as ever
    assert counters.total(names.QUARANTINED_CONNECTIONS) == 0


def test_the_strike_that_quarantines_counts_one_quarantined_connection():
    suspect = Suspect("culprit", 7, "most bytes received")
    takeover, _, counters = ender({schema.SESSION_ID: "dead", schema.SUSPECT: suspect.item()}, quarantines=True)
    assert asyncio.run(takeover.end_session("dead"))
    assert counters.total(names.QUARANTINED_CONNECTIONS) == 1


def test_no_strike_while_our_own_renewals_failed_within_a_lease_the_tables_trouble_is_no_connections():
    # A soak's DynamoDB outage (11.2 s, the lease 10 s) expired a session whose suspect then
    # had its third strike in a row, all from deaths the nemesis caused: quarantined.
    suspect = Suspect("culprit", 7, "most bytes received")
    item = {schema.SESSION_ID: "dead", schema.SUSPECT: suspect.item()}
    for troubled_s_ago, struck in ((0.5, False), ((T.lease_ms + T.max_clock_skew_ms) / 1000 - 0.5, False), (12.0, True)):
        takeover, calls, _ = ender(item, troubled_at=clock.now() - troubled_s_ago)
        assert asyncio.run(takeover.end_session("dead"))
        assert bool([c for c in calls if c[0] == "strike"]) is struck, troubled_s_ago
        assert {c[1] for c in calls if c[0] == "acquire"} == {"culprit", "n1", "n2"}  # drained all the same


def test_a_dead_session_that_named_no_suspect_strikes_nothing():
    takeover, calls, _ = ender({schema.SESSION_ID: "dead"})
    assert asyncio.run(takeover.end_session("dead"))
    assert not [c for c in calls if c[0] == "strike"]


def test_a_strike_that_meets_a_transient_fault_is_tried_again_and_the_drain_goes_on_regardless():
    from wsfleet.store import TransientError

    tries = []

    def flaky(cid, s, **kw):
        tries.append(cid)
        raise TransientError("throttled")

    suspect = Suspect("culprit", 7, "most bytes received")
    takeover, calls, _ = ender({schema.SESSION_ID: "dead", schema.SUSPECT: suspect.item()}, failing_strike=flaky)
    assert asyncio.run(takeover.end_session("dead"))
    assert len(tries) == 3 and {c[1] for c in calls} == {"culprit", "n1", "n2"}
