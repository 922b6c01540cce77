"""The fleet's reachability sweep, against the emulator: every connection that no worker
would ever take is found, confirmed, counted and repaired; nothing else is touched; only
the summarizer sweeps, and a pass starts at most every SWEEP_SECONDS."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from wsfleet import metrics_names as names
from wsfleet import schema
from wsfleet.leases import Unreachable, unreachable
from wsfleet.logs import JsonLogger
from wsfleet.metrics import Counters
from wsfleet.worker.sweep import Sweeper


class Keeper:
    def __init__(self, session_id: str) -> None:
        self.session_id = session_id

    def live(self) -> bool:
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def direct(fn, *args, **kwargs):
    return fn(*args, **kwargs)


@pytest.fixture
def fleet(stores, sessions, ddb, aws_env):
    """Every kind of connection the invariant names, reachable and not."""
    conns, _ = stores
    url = "ws://127.0.0.1:9/s"
    for name in ("live#1", "ended#1", "left#1", "gone#1", "unwatched#1"):
        sessions.open(name, worker_id=name.split("#")[0], lease_ms=600_000, max_connections=10)
    for cid, session in [
        ("free", ""), ("no-key", ""), ("held", "live#1"), ("ended-in-ring", "ended#1"),
        ("left", "left#1"), ("stopped-left", "left#1"), ("gone", "gone#1"), ("unwatched", "unwatched#1"),
    ]:
        conns.start(cid, url)
        if session:
            conns.acquire(cid, session_id=session, worker_id=session.split("#")[0])
    conns.stop("stopped-left", sessions=sessions)
    table = aws_env["TABLE_NAME"]
    ddb.update_item(TableName=table, Key={"pk": {"S": "CONN#no-key"}}, UpdateExpression="REMOVE owner_key")
    for name in ("ended#1", "left#1", "gone#1"):
        sessions.end_own(name, worker_id=name.split("#")[0])
    assert sessions.leave_ring("left#1")
    ddb.delete_item(TableName=aws_env["SESSIONS_TABLE_NAME"], Key={"session_id": {"S": "gone#1"}})
    ddb.update_item(
        TableName=aws_env["SESSIONS_TABLE_NAME"], Key={"session_id": {"S": "unwatched#1"}}, UpdateExpression="REMOVE ring"
    )
    return conns


def sweeper(fleet, sessions, *, successors=(), clock=None, hints=None, counters=None, known=0) -> Sweeper:
    async def hint(cid, **_):
        hints.append(cid)

    return Sweeper(
        connections=fleet,
        sessions=sessions,
        keeper=Keeper("zz#1"),
        takeover=SimpleNamespace(successors=lambda: list(successors)),
        call=direct,
        hints=SimpleNamespace(hint=hint),
        counters=counters or Counters(),
        log=JsonLogger(),
        sweep_s=600,
        page_items=3,  # several pages per pass
        first_pass_s=0,
        clock=clock or Clock(),
        connections_known=lambda: known,
    )


def reasons(conns, sessions) -> dict[str, Unreachable | None]:
    out = {}
    for item in conns.get_many(["free", "no-key", "held", "ended-in-ring", "left", "stopped-left", "gone", "unwatched"]).values():
        session_id = item.get(schema.LEASE_SESSION, "")
        out[schema.connection_id_from_pk(item["pk"])] = unreachable(item, sessions.get(session_id) if session_id else None)
    return out


def test_a_pass_finds_confirms_counts_and_repairs_every_unreachable_connection_and_touches_nothing_else(fleet, sessions):
    assert reasons(fleet, sessions) == {
        "free": None,
        "no-key": Unreachable.NOT_IN_FREE_POOL,
        "held": None,
        "ended-in-ring": None,  # its watchers drain it
        "left": Unreachable.SESSION_LEFT_RING,
        "stopped-left": Unreachable.SESSION_LEFT_RING,
        "gone": Unreachable.SESSION_GONE,
        "unwatched": Unreachable.SESSION_LEFT_RING,
    }
    untouched = {cid: fleet.get(cid) for cid in ("free", "held", "ended-in-ring")}
    hints, counters = [], Counters()
    # Sized for 2,000 connections: 3 pages of 3 a second in each segment pass 900 in
    # half of SWEEP_SECONDS, so three segments, each paging on its own.
    sweep = sweeper(fleet, sessions, hints=hints, counters=counters, known=2_000)

    found = asyncio.run(_one_pass(sweep))

    assert found == 5 and counters.total(names.UNREACHABLE_CONNECTIONS) == 5 and sweep.passes == 1
    assert sweep.segments == 3 and sweep.scanned == 8  # every connection read once
    assert all(why is None for why in reasons(fleet, sessions).values())
    assert {cid: fleet.get(cid) for cid in untouched} == untouched
    for cid in ("no-key", "left", "gone"):  # back in the free pool, where a scan finds them
        assert fleet.get(cid)[schema.OWNER_KEY] == schema.owner_key_free(cid, 4)
    assert fleet.get("stopped-left")[schema.LEASE_SESSION] == "" and schema.OWNER_KEY not in fleet.get("stopped-left")
    assert fleet.get("unwatched")[schema.LEASE_SESSION] == "unwatched#1"  # LIVE: its worker holds it
    assert sessions.get("unwatched#1")["ring"] == schema.RING_VALUE  # ... and it is watched again
    assert sorted(hints) == ["gone", "left"]  # the STARTED ones freed from a dead session, for a taker now
    assert asyncio.run(_one_pass(sweep, clock_step=600)) == 0  # the next pass finds nothing


async def _one_pass(sweep: Sweeper, *, clock_step: float = 0) -> int:
    sweep._clock.now += clock_step
    found = 0
    passes = sweep.passes
    for _ in range(20):
        found += await sweep.step()
        if sweep.passes > passes:
            return found
    raise AssertionError("the pass did not end")


def test_only_the_summarizer_sweeps_and_a_pass_starts_at_most_every_sweep_seconds(fleet, sessions):
    clock = Clock()
    follower = sweeper(fleet, sessions, successors=["zz#2"], clock=clock, hints=[])  # not the last in the ring
    assert asyncio.run(follower.step()) == 0 and follower.passes == 0
    assert reasons(fleet, sessions)["left"] is Unreachable.SESSION_LEFT_RING  # untouched

    last = sweeper(fleet, sessions, successors=["aa#1"], clock=clock, hints=[])  # wraps: the summarizer
    asyncio.run(_one_pass(last))
    clock.now += 599
    assert asyncio.run(last.step()) == 0 and last.passes == 1  # not due yet: nothing read
    clock.now += 1
    asyncio.run(_one_pass(last))
    assert last.passes == 2


def test_a_connection_that_moved_on_since_the_page_was_read_is_not_counted(fleet, sessions):
    counters = Counters()
    sweep = sweeper(fleet, sessions, hints=[], counters=counters)
    stale = fleet.get("left")
    assert fleet.free_orphan("left", dead_session="left#1")  # a drainer got there first

    assert asyncio.run(sweep.check([stale])) == 0
    assert counters.total(names.UNREACHABLE_CONNECTIONS) == 0


def test_a_segment_whose_page_fails_reads_it_again_and_the_pass_reads_every_connection_once(fleet, sessions):
    failing = {"left": 1}

    class Flaky:
        def __getattr__(self, name):
            return getattr(fleet, name)

        def sweep_page(self, start, *, limit, segment=0, segments=1):
            if segment == 1 and failing["left"]:
                failing["left"] -= 1
                raise RuntimeError("throttled")
            return fleet.sweep_page(start, limit=limit, segment=segment, segments=segments)

    counters = Counters()
    sweep = sweeper(Flaky(), sessions, hints=[], counters=counters, known=2_000)
    with pytest.raises(RuntimeError, match="throttled"):
        asyncio.run(sweep.step())  # segments 0 and 2 read their first page all the same
    asyncio.run(_one_pass(sweep))
    assert sweep.scanned == 8 and counters.total(names.UNREACHABLE_CONNECTIONS) == 5
