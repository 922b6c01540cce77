"""Fair share, without AWS: the fleet summary, when to shed and how much, which hints a
worker leaves for others."""

import random
from collections import Counter

import pytest

from wsfleet import schema
from wsfleet.balance import (
    SHED_ANYONE_AFTER_S,
    FleetLoad,
    declines_shed_hint,
    hints_per_poll,
    is_summarizer,
    drain_targets,
    max_moves,
    shed_count,
    shed_targets,
    summarize,
)
from wsfleet.leases import SessionTiming

T = SessionTiming(lease_ms=10_000, heartbeat_ms=2_500, max_clock_skew_ms=1_000)
NOW = 1_000_000


def session(sid, active, max_connections=100, *, state=schema.LIVE, expires=NOW + 8_000, draining=False):
    return {
        schema.SESSION_ID: sid,
        schema.SESSION_STATE: state,
        schema.EXPIRES_AT_MS: expires,
        schema.ACTIVE: active,
        schema.MAX_CONNECTIONS: max_connections,
        schema.DRAINING: draining,
    }


def fleet(active, capacity, *, below=0, suspects=0, workers=2):
    return FleetLoad(workers, active, capacity, below, suspects, NOW)


def test_the_summary_counts_load_of_live_sessions_and_capacity_of_those_taking_connections():
    load = summarize(
        [session("a", 30), session("b", 10), session("c", 20, draining=True), session("d", 0, max_connections=200)],
        now_ms=NOW,
        timing=T,
    )
    assert (load.workers, load.active, load.capacity, load.suspects) == (3, 60, 400, 0)
    # Shares: a 15, b 15, d 30: b is 5 under and d 30 under.
    assert load.below_share == 35
    assert load.under == {"d": 30, "b": 5}  # named, so that shedders can send to them


def test_expired_and_ended_sessions_still_in_the_ring_mean_the_fleet_is_recovering():
    load = summarize([session("a", 5), session("b", 5, expires=NOW - 1), session("c", 0, state=schema.ENDED)], now_ms=NOW, timing=T)
    assert load.suspects == 2 and load.workers == 1


def test_a_session_that_missed_a_renewal_is_not_listed_under_its_share_while_it_expires():
    # A worker killed a moment ago is LIVE and unexpired for up to a lease; listed as
    # under its share, it would have the others leave free connections to it meanwhile.
    missed = NOW + T.lease_ms - T.heartbeat_ms * 2  # its last renewal was two heartbeats ago
    load = summarize([session("a", 30), session("b", 30), session("dead", 0, expires=missed)], now_ms=NOW, timing=T)
    assert "dead" not in load.under and load.workers == 2 and load.capacity == 200
    assert load.below_share == 0  # a and b are at their shares of 60 between them


def test_the_last_session_of_the_ring_writes_the_summary():
    assert is_summarizer("z#1", ["a#1", "b#1"])  # its successors wrap around
    assert not is_summarizer("b#1", ["c#1", "a#1"])
    assert is_summarizer("a#1", [])  # alone
    assert not is_summarizer("a#1", None)  # its ring not read yet: it does not know


def test_a_worker_within_the_tolerance_band_of_its_share_sheds_nothing():
    f = fleet(100, 500)  # share 20 per 100-connection worker
    assert shed_count(active=22, max_connections=100, fleet=f, tolerance=0.1, max_moves=10, recovering=False) == 0
    assert shed_count(active=23, max_connections=100, fleet=f, tolerance=0.1, max_moves=10, recovering=False) == 3


def test_a_worker_within_its_band_still_sheds_while_another_is_more_than_one_under_its_target():
    # 12 over three 20-connection workers: targets 4. Two at 5 (within the band of 1) and a
    # newcomer at 2: two under its target, outside the +-1 every join ends within.
    f = FleetLoad(3, 12, 60, below_share=2, suspects=0, at_ms=NOW, under={"n#1": 2})
    assert shed_count(active=5, max_connections=20, fleet=f, tolerance=0.1, max_moves=2, recovering=False) == 1
    settled = FleetLoad(3, 12, 60, below_share=1, suspects=0, at_ms=NOW, under={"n#1": 1})
    assert shed_count(active=5, max_connections=20, fleet=settled, tolerance=0.1, max_moves=2, recovering=False) == 0
    # A balanced fleet moves nothing: 101 over five, 21/20/20/20/20, and 21 is a target.
    even = summarize([session(f"w{i}", 21 if i == 0 else 20) for i in range(5)], now_ms=NOW, timing=T)
    assert even.target("w0", 100) == 21 and even.below_share == 0
    assert shed_count(active=21, max_connections=100, fleet=even, tolerance=0.1, max_moves=10, recovering=False, me="w0") == 0


def test_the_issue_join_that_ended_15_16_16_13_moves_on_to_15_each():
    """Regression (issue 22): 3 workers at 20/21/19, a fourth joins: target 15 each. The
    fleet ended 15/16/16/13 and stayed so: the two at 16 were within their band (2) and
    the fleet's room under its targets (2) was not more than the band."""
    load = summarize([session("w1", 15), session("w2", 16), session("w3", 16), session("w4", 13)], now_ms=NOW, timing=T)
    assert [load.target(w, 100) for w in ("w1", "w2", "w3", "w4")] == [15, 15, 15, 15]
    shed = {w: shed_count(active=n, max_connections=100, fleet=load, tolerance=0.1, max_moves=20, recovering=False, me=w)
            for w, n in (("w1", 15), ("w2", 16), ("w3", 16), ("w4", 13))}
    assert shed == {"w1": 0, "w2": 1, "w3": 1, "w4": 0}
    assert Counter(shed_targets(load, "w2", 1) + shed_targets(load, "w3", 1)) == {"w4": 2}
    # Within one of every target, nothing moves (the band holds).
    quiet = summarize([session("w1", 16), session("w2", 15), session("w3", 15), session("w4", 14)], now_ms=NOW, timing=T)
    assert all(shed_count(active=n, max_connections=100, fleet=quiet, tolerance=0.1, max_moves=20, recovering=False, me=w) == 0
               for w, n in (("w1", 16), ("w2", 15), ("w3", 15), ("w4", 14)))


def test_exact_targets_add_up_to_the_fleet_and_each_worker_knows_its_own_from_the_cut():
    rng = random.Random(22)
    for _ in range(300):
        n = rng.randint(1, 12)
        loads = [session(f"w{rng.randint(0, 10**6):07d}#{i}", rng.randint(0, 120), rng.choice([50, 100, 100, 200]))
                 for i in range(n)]
        load = summarize(loads, now_ms=NOW, timing=T)
        targets = {s[schema.SESSION_ID]: load.target(s[schema.SESSION_ID], s[schema.MAX_CONNECTIONS]) for s in loads}
        assert sum(targets.values()) == load.active  # exactly: the old ceil overshot
        for s in loads:
            share = load.active * s[schema.MAX_CONNECTIONS] / load.capacity
            assert share - 1 < targets[s[schema.SESSION_ID]] < share + 1
        assert FleetLoad.from_item(load.as_item()) == load  # the cut survives the item


def test_a_join_of_four_into_four_plans_every_worker_to_within_one():
    """100 on four workers, four join: targets 13/13/12/12 twice (largest remainder, ties
    by session id), not 13 each: with ceil the shedders filled 13/13/13 and left 9."""
    old = [session(f"a{i}", 25) for i in range(4)]
    new = [session(f"b{i}", 0) for i in range(4)]
    load = summarize(old + new, now_ms=NOW, timing=T)
    targets = {s[schema.SESSION_ID]: load.target(s[schema.SESSION_ID], 100) for s in old + new}
    assert sum(targets.values()) == 100 and set(targets.values()) == {12, 13}
    ends = {s[schema.SESSION_ID]: s[schema.ACTIVE] for s in old + new}
    for s in old:
        me = s[schema.SESSION_ID]
        n = shed_count(active=25, max_connections=100, fleet=load, tolerance=0.1, max_moves=20, recovering=False, me=me)
        ends[me] -= n
        for to in shed_targets(load, me, n):
            ends[to] += 1
    assert ends == targets  # every worker at its target: within one of 12.5


def plan(ring, dead_session, count):
    return drain_targets(summarize(ring, now_ms=NOW, timing=T), dead_session=dead_session, count=count)


def test_a_crashed_sessions_connections_are_planned_onto_the_survivors_targets_from_the_summary():
    # Five at 20, one crashed: each of four survivors gets 5 (targets 25), none left over.
    ring = [session(f"w{i}", 20) for i in range(1, 5)] + [session("w5", 20, state=schema.ENDED)]
    assert Counter(plan(ring, "w5", 20)) == {"w1": 5, "w2": 5, "w3": 5, "w4": 5}
    # A summary made before the crash (w5 still a taker) plans the same.
    before = [session(f"w{i}", 20) for i in range(1, 6)]
    assert Counter(plan(before, "w5", 20)) == {"w1": 5, "w2": 5, "w3": 5, "w4": 5}
    # Two crashed: each drainer plans its part of one row, the same row.
    ring = [session(f"w{i}", 20) for i in range(1, 4)] + [session("w4", 20, state=schema.ENDED), session("w5", 20, state=schema.ENDED)]
    both = Counter(plan(ring, "w4", 20)) + Counter(plan(ring, "w5", 20))
    assert {w: 20 + n for w, n in both.items()} == {"w1": 34, "w2": 33, "w3": 33}  # 100 over three, exactly
    # A draining survivor takes nothing; with no survivor at all, no plan (the caller splits).
    ring = [session("w1", 10), session("w2", 10, draining=True), session("w3", 5, state=schema.ENDED)]
    assert plan(ring, "w3", 5) == ["w1"] * 5
    assert plan([session("w3", 5, state=schema.ENDED)], "w3", 5) is None
    # A survivor over its target already gets none.
    assert plan([session("w1", 30), session("w2", 0)], "w3", 2) == ["w2", "w2"]


def test_a_summary_lists_loads_only_for_a_small_fleet_and_stays_one_read_unit():
    """A drain reads nothing but the summary it holds: in a fleet too large for the
    summary to list every taker there is no plan (half the drainer's room, the rest to
    anyone), and the #fleet item stays under 8 KB (one eventually consistent read unit)."""
    from wsfleet.balance import LOADS_LISTED

    sid = "ip-10-0-123-45.eu-west-1.compute.internal#1796585632180-{:08x}"  # a long worker id
    ring = [session(sid.format(i), 200, max_connections=350) for i in range(LOADS_LISTED)]
    ring += [session(sid.format(100 + i), 250 + i, max_connections=350, state=schema.ENDED) for i in range(LOADS_LISTED + 5)]
    load = summarize(ring, now_ms=NOW, timing=T)
    assert len(load.loads) == LOADS_LISTED and len(load.dead) == LOADS_LISTED
    assert plan(ring, sid.format(100), 250) is not None
    big = summarize(ring + [session(sid.format(999), 0, max_connections=350)], now_ms=NOW, timing=T)
    assert big.loads == {} and drain_targets(big, dead_session=sid.format(100), count=250) is None
    assert FleetLoad.from_item(load.as_item()) == load
    load = FleetLoad(**{**load.__dict__, "under": dict.fromkeys(map(sid.format, range(25)), 99), "over": dict.fromkeys(map(sid.format, range(25, 50)), 99)})
    assert _item_bytes(load.as_item()) < 8 * 1024


def test_in_a_fleet_too_large_to_list_a_drainer_takes_its_own_part_and_hints_the_rest():
    """2,000 workers at 250 of 350: a drainer of one dead session's 250 takes what
    brings it to its target with that session's connections spread over the fleet (one
    here), not half its room (50: in a crash of 200 it would end 22 over its target)."""
    from wsfleet.balance import drain_share

    fleet = FleetLoad(2_000, 500_000, 700_000, 0, 0, NOW)
    assert drain_share(fleet, count=250, active=250, max_connections=350) == 1
    assert drain_share(fleet, count=250, active=200, max_connections=350) == 51  # under its target: up to it
    assert drain_share(fleet, count=250, active=300, max_connections=350) == 0
    assert drain_share(FleetLoad(0, 0, 0, 0, 0, NOW), count=5, active=0, max_connections=10) == 0


def _item_bytes(value) -> int:
    """DynamoDB's item size, about: names and strings by their UTF-8 length, numbers ~
    their digits, 3 bytes a map or list entry."""
    if isinstance(value, dict):
        return 3 + sum(len(str(k).encode()) + 1 + _item_bytes(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return 3 + sum(1 + _item_bytes(v) for v in value)
    return len(str(value).encode())


def test_a_count_is_written_to_the_ring_at_most_every_other_renewal():
    from wsfleet.balance import ring_lag_ms, ring_write_due

    assert ring_write_due(None, (5, 100, False), renewals_since=0)  # unknown: written
    assert not ring_write_due((5, 100, False), (5, 100, False), renewals_since=9)  # unchanged: never
    assert not ring_write_due((5, 100, False), (6, 100, False), renewals_since=0)  # the last renewal wrote it
    assert ring_write_due((5, 100, False), (6, 100, False), renewals_since=1)
    assert ring_write_due((5, 100, False), (6, 100, True), renewals_since=0)  # leaving: at once
    assert ring_write_due((5, 100, False), (5, 200, False), renewals_since=0)
    assert ring_lag_ms(2_500) == 5_000


def test_shedding_never_goes_below_the_share_and_is_capped_per_pass():
    f = fleet(100, 800)  # share 12.5 -> 13
    assert shed_count(active=25, max_connections=100, fleet=f, tolerance=0.1, max_moves=10, recovering=False) == 10
    assert shed_count(active=16, max_connections=100, fleet=f, tolerance=0.1, max_moves=10, recovering=False) == 3
    exact = FleetLoad(8, 100, 800, 0, 0, NOW, cut_rem=400, cut_id="m")  # 12.5: 13 up to id "m", 12 after
    assert shed_count(active=16, max_connections=100, fleet=exact, tolerance=0.1, max_moves=10, recovering=False, me="a") == 3
    assert shed_count(active=16, max_connections=100, fleet=exact, tolerance=0.1, max_moves=10, recovering=False, me="z") == 4
    assert max_moves(100) == 20 and max_moves(5) == 1


def test_nothing_is_shed_while_the_fleet_recovers_from_a_crash():
    assert shed_count(active=50, max_connections=100, fleet=fleet(100, 500, suspects=1), tolerance=0.1, max_moves=10, recovering=False) == 0
    assert shed_count(active=50, max_connections=100, fleet=fleet(100, 500), tolerance=0.1, max_moves=10, recovering=True) == 0


def test_shed_hints_go_to_workers_under_their_share():
    f = fleet(100, 500, below=20)
    assert declines_shed_hint(active=0, max_connections=100, fleet=f, shed_by_me=True, age_s=0)  # never take back
    assert declines_shed_hint(active=20, max_connections=100, fleet=f, shed_by_me=False, age_s=0)  # at share
    assert not declines_shed_hint(active=5, max_connections=100, fleet=f, shed_by_me=False, age_s=0)
    assert not declines_shed_hint(active=20, max_connections=100, fleet=fleet(100, 500), shed_by_me=False, age_s=0)
    late = SHED_ANYONE_AFTER_S
    assert not declines_shed_hint(active=20, max_connections=100, fleet=f, shed_by_me=True, age_s=late)  # no bouncing
    assert not declines_shed_hint(active=20, max_connections=100, fleet=None, shed_by_me=False, age_s=0)


def test_shedders_working_from_one_summary_fill_each_session_under_share_exactly():
    load = summarize(
        [session("o1", 30), session("o2", 26), session("o3", 24), session("n1", 0), session("n2", 0)],
        now_ms=NOW,
        timing=T,
    )  # 80 on 5: shares of 16
    assert load.under == {"n1": 16, "n2": 16} and load.over == {"o1": 14, "o2": 10, "o3": 8}
    plan = Counter()
    for me, n in load.over.items():
        plan.update(shed_targets(load, me, n))
    assert plan == {"n1": 16, "n2": 16}  # together: each filled to its share, none more
    # a shedder capped per pass sheds the head of its part; the next summary plans the rest
    assert shed_targets(load, "o2", 3) == shed_targets(load, "o2", 10)[:3]


def test_a_shedder_missing_from_the_summary_picks_in_proportion_to_the_deficits():
    rng = random.Random(7)
    f = FleetLoad(3, 60, 300, 4, 0, NOW, {"a": 3, "b": 1})
    assert sorted(shed_targets(f, "me", 4, rng)) == ["a", "a", "a", "b"]  # exactly the deficits
    assert shed_targets(FleetLoad(3, 60, 300, 1, 0, NOW, {"a": 1}), "me", 3, rng) == ["a", "", ""]  # beyond: anyone
    assert shed_targets(FleetLoad(3, 60, 300, 0, 0, NOW), "me", 2, rng) == ["", ""]


def test_the_summary_survives_its_round_trip_through_the_sessions_table_item():
    f = FleetLoad(3, 60, 300, 10, 0, NOW, {"w9#1": 10}, {"w1#1": 4})
    assert FleetLoad.from_item(f.as_item()) == f


def test_a_worker_never_sheds_on_a_summary_older_than_its_own_latest_acquisition():
    """Regression: two workers started together read a summary from before they took
    anything (fleet 0, share 0) and shed what they had just taken."""
    import asyncio
    import time
    from types import SimpleNamespace

    from wsfleet.logs import JsonLogger
    from wsfleet.worker.balancer import Balancer
    from wsfleet.worker.holdings import Holdings
    from wsfleet.worker.summary import FleetSummary

    now = int(time.time() * 1000)
    runners = {f"c{i}": SimpleNamespace(connection_id=f"c{i}", end_reason=None, acquired_mono=0.0, shed=False) for i in range(8)}
    for r in runners.values():
        r.request_shed = lambda to="", r=r: setattr(r, "shed", True)
    acquired = {"ms": now - 1_000}

    def balancer(fleet: FleetLoad) -> Balancer:
        summary = FleetSummary(clock_ms=lambda: now)
        summary.known(fleet)
        holdings = Holdings(max_connections=100, summary=summary)
        holdings.runners.update(runners)
        holdings.last_acquired_ms = acquired["ms"]
        return Balancer(
            sessions=None, keeper=SimpleNamespace(live=lambda: True, session_id="me#1"), timing=T, enabled=True,
            tolerance=0.1, call=None, log=JsonLogger(), holdings=holdings, summary=summary,
            takeover=SimpleNamespace(successors=lambda: [], recovering=lambda: False, watched={}), clock_ms=lambda: now,
        )

    stale = FleetLoad(workers=2, active=0, capacity=200, below_share=0, suspects=0, at_ms=now - 5_000)
    assert asyncio.run(balancer(stale).balance_once()) == 0
    # The same worker holding 8 of a fleet's 8 on two workers, summarized after it took them: shares are 4.
    fresh = FleetLoad(workers=2, active=8, capacity=200, below_share=4, suspects=0, at_ms=now)
    acquired["ms"] = now - 2 * T.heartbeat_ms - 1
    assert asyncio.run(balancer(fresh).balance_once()) == 4  # down to its share of 4 (max 10 moves per pass)


def test_a_worker_under_its_share_takes_hints_by_the_ten_and_one_at_its_share_one_at_a_time():
    f = fleet(100, 400)  # shares of 25
    assert hints_per_poll(active=0, max_connections=100, room=100, fleet=f) == 10  # a replacement
    assert hints_per_poll(active=20, max_connections=100, room=80, fleet=f) == 5
    assert hints_per_poll(active=25, max_connections=100, room=75, fleet=f) == 1
    assert hints_per_poll(active=0, max_connections=100, room=3, fleet=f) == 3  # never past its room
    assert hints_per_poll(active=0, max_connections=100, room=100, fleet=fleet(0, 400)) == 1  # an idle fleet
    assert hints_per_poll(active=0, max_connections=100, room=100, fleet=None) == 1


class _Ring:
    """The sessions store as the summarizer reads it: ring pages, and the summary item."""

    def __init__(self, items, fail_at=()):
        self.items, self.fail_at, self.queries, self.written = items, set(fail_at), 0, []

    def ring_page(self, start=None, *, limit):
        self.queries += 1
        if self.queries in self.fail_at:
            raise RuntimeError("throttled")
        at = start["n"] if start else 0
        return self.items[at : at + limit], ({"n": at + limit} if at + limit < len(self.items) else None)

    def put_summary(self, item):
        self.written.append(item)

    def get_many(self, ids):
        last = self.written[-1:] if schema.FLEET_SUMMARY_ID in ids else []
        return [{schema.SESSION_ID: schema.FLEET_SUMMARY_ID, **item} for item in last]


def _projected(item):
    """A session as ``by_ring`` projects it: no expiry."""
    return {k: v for k, v in item.items() if k != schema.EXPIRES_AT_MS}


def _summarizer(ring, clock, monkeypatch):
    """A summarizer over ``ring``, and where its summaries go."""
    from types import SimpleNamespace

    from wsfleet.logs import JsonLogger
    from wsfleet.worker import balancer
    from wsfleet.worker.balancer import Balancer
    from wsfleet.worker.holdings import Holdings
    from wsfleet.worker.summary import FleetSummary

    monkeypatch.setattr(balancer, "SUMMARY_PAGE_ITEMS", 2)
    monkeypatch.setattr(balancer, "SUMMARY_PAGES", 1)

    async def call(f, *args, **kwargs):
        return f(*args, **kwargs)

    summary = FleetSummary(clock_ms=lambda: clock["ms"])
    return summary, Balancer(
        sessions=ring, keeper=SimpleNamespace(live=lambda: True, session_id="z#9"), timing=T, enabled=True,
        tolerance=0.1, call=call, log=JsonLogger(), holdings=Holdings(max_connections=100, summary=summary),
        summary=summary, takeover=SimpleNamespace(successors=lambda: ["a#1"], recovering=lambda: False, watched={}),
        clock_ms=lambda: clock["ms"],
    )


def test_the_summarizer_reads_a_bounded_part_of_the_ring_a_pass_and_writes_only_what_changed(monkeypatch):
    import asyncio

    from wsfleet.worker.balancer import SUMMARY_REFRESH_MS

    ring = _Ring([_projected(session(f"w{i}#1", 10)) for i in range(5)], fail_at={2})
    clock = {"ms": NOW}
    summary, b = _summarizer(ring, clock, monkeypatch)
    assert asyncio.run(b.summarize_once()) is None and ring.queries == 1  # two of five sessions read
    assert not summary.arrived.is_set()
    with pytest.raises(RuntimeError):
        asyncio.run(b.summarize_once())  # a failed page: the pass ends, the cursor stays
    assert asyncio.run(b.summarize_once()) is None and ring.queries == 3  # sessions 3-4
    fleet = asyncio.run(b.summarize_once())  # session 5: a whole ring, one page a pass
    assert ring.queries == 4 and (fleet.workers, fleet.active) == (5, 50) and len(ring.written) == 1
    assert summary.arrived.is_set()  # the summarizer's own balance pass follows (it reads no summary item)
    for _ in range(3):  # the same figures: read again, not written again
        clock["ms"] += 2_000
        for _ in range(3):
            asyncio.run(b.summarize_once())
    assert len(ring.written) == 1 and summary.fleet.at_ms == clock["ms"]
    clock["ms"] = NOW + SUMMARY_REFRESH_MS  # ... until it is old enough to look stale
    for _ in range(3):
        asyncio.run(b.summarize_once())
    assert len(ring.written) == 2
    ring.items[0] = _projected(session("w0#1", 11))  # a changed figure is written at the next whole read
    for _ in range(3):
        asyncio.run(b.summarize_once())
    assert len(ring.written) == 3 and ring.written[-1][schema.FLEET_ACTIVE] == 51


def test_the_summary_counts_a_session_its_own_watch_saw_expire_as_a_suspect():
    from wsfleet.leases import Watched

    ring = [_projected(session(n, 10)) for n in "abc"]
    expired = {"b": Watched("b", schema.LIVE, NOW - T.heartbeat_ms - 1)}  # past a heartbeat's grace
    load = summarize(ring, now_ms=NOW, timing=T, watched=expired)
    assert (load.workers, load.active, load.suspects) == (2, 20, 1)


def test_a_watch_read_a_pause_old_does_not_make_healthy_sessions_look_gone():
    # The summarizer's watch read is up to a watch pause (~7 s) old: a session renewed
    # just before it, healthy, shows an expiry only a few seconds ahead by now. Taking
    # that for a missed renewal left every watched session out of the takers (a join of
    # one into four waited 90 s with the targets of three workers).
    from wsfleet.leases import Watched

    ring = [_projected(session(n, 10)) for n in "abcd"]
    read_ago = {n: Watched(n, schema.LIVE, NOW - 7_000 + T.lease_ms) for n in "ab"}  # 3 s ahead now
    load = summarize(ring, now_ms=NOW, timing=T, watched=read_ago)
    assert (load.workers, load.capacity, load.suspects) == (4, sum(int(s[schema.MAX_CONNECTIONS]) for s in ring), 0)
    nearly = {"b": Watched("b", schema.LIVE, NOW - T.heartbeat_ms // 2)}  # expired, within the grace
    assert summarize(ring, now_ms=NOW, timing=T, watched=nearly).suspects == 0


def _drainer(fleet, room=100):
    """A Takeover whose store calls are plain functions, recording what it acquires and
    hints."""
    from types import SimpleNamespace

    from wsfleet.logs import JsonLogger
    from wsfleet.metrics import Counters
    from wsfleet.store import Owned
    from wsfleet.worker.holdings import Holdings
    from wsfleet.worker.summary import FleetSummary
    from wsfleet.worker.takeover import Takeover

    done = {"acquired": [], "hinted": []}

    async def call(f, *args, **kwargs):
        return f(*args, **kwargs)

    async def acquire(cid, **kw):
        done["acquired"].append(cid)
        return object()

    async def hint(cid, **kw):
        done["hinted"].append((cid, "", kw.get("from_session", "")))

    async def move_drained(sid, named):  # every named one moved to its survivor (worker.moves)
        done["hinted"].extend((cid, to, sid) for cid, to in named)
        return []

    rows = [Owned(f"c{i:02d}", schema.STARTED) for i in range(20)]
    summary = FleetSummary(clock_ms=lambda: NOW)
    if fleet is not None:
        summary.known(fleet)
    takeover = Takeover(
        sessions=SimpleNamespace(), connections=SimpleNamespace(owned_by=lambda sid: rows),
        keeper=SimpleNamespace(live=lambda: True, session_id="w2"), timing=T, state_shards=1, call=call,
        log=JsonLogger(), acquisition=SimpleNamespace(try_acquire=acquire), hints=SimpleNamespace(hint=hint),
        mover=SimpleNamespace(move_drained=move_drained), holdings=Holdings(max_connections=room, summary=summary), summary=summary, counters=Counters(), quarantine_after=3,
    )
    return takeover, done


def test_the_drainer_takes_its_own_deficit_and_names_a_survivor_for_each_of_the_rest():
    import asyncio

    ring = [session(f"w{i}", 20) for i in range(1, 5)] + [session("w5", 20, state=schema.ENDED)]
    fleet = summarize(ring, now_ms=NOW, timing=T)
    takeover, done = _drainer(fleet)
    assert asyncio.run(takeover.drain("w5")) == 5  # its deficit: 25 - 20, not half its room
    assert Counter(to for _, to, _ in done["hinted"]) == {"w1": 5, "w3": 5, "w4": 5}
    assert {sid for _, _, sid in done["hinted"]} == {"w5"}  # every take conditional on the dead session
    # With no room for its part, what it cannot take goes to anyone.
    takeover, done = _drainer(fleet, room=2)
    assert asyncio.run(takeover.drain("w5")) == 2
    assert Counter(to for _, to, _ in done["hinted"]) == {"w1": 5, "w3": 5, "w4": 5, "": 3}


def test_a_drainer_in_a_fleet_the_summary_cannot_list_takes_its_own_part():
    import asyncio

    fleet = FleetLoad(100, 1_000, 10_000, 0, 0, NOW)  # shares of 10 at 100 each: no loads listed
    takeover, done = _drainer(fleet, room=100)  # it holds none
    assert asyncio.run(takeover.drain("w5")) == 11  # its target 10, plus its part of the 20: 1
    assert [to for _, to, _ in done["hinted"]] == [""] * 9  # the rest for anyone


def test_without_a_fresh_summary_the_drainer_falls_back_to_half_its_room():
    import asyncio

    takeover, done = _drainer(None, room=10)
    assert asyncio.run(takeover.drain("w5")) == 5
    assert [to for _, to, _ in done["hinted"]] == [""] * 15
    stale = summarize([session("w2", 20)], now_ms=NOW - 60_001, timing=T)
    takeover, done = _drainer(stale, room=10)
    assert asyncio.run(takeover.drain("w5")) == 5


def test_a_ring_read_while_connections_move_does_not_lower_the_targets(monkeypatch):
    # A shedder's count falls at its release; the taker's rises at its next renewal. A
    # ring read between the two misses the moving connections: targets from it are too
    # low, and a worker at its target sheds (seen: 6 shed for a target of 19 on a count of
    # 95 of 100). The summarizer counts at least its highest count of IN_TRANSIT_S.
    import asyncio

    from wsfleet.balance import IN_TRANSIT_S

    ring = _Ring([_projected(session(f"w{i}#1", 20)) for i in range(5)])
    clock = {"ms": NOW}
    summary, b = _summarizer(ring, clock, monkeypatch)
    for _ in range(3):
        fleet = asyncio.run(b.summarize_once())
    assert fleet.active == 100 and fleet.target("w4#1", 100) == 20
    ring.items[3] = _projected(session("w3#1", 15))  # w3 released 5; nobody has reported them yet
    clock["ms"] += 3_000
    for _ in range(3):
        fleet = asyncio.run(b.summarize_once())
    assert fleet.active == 100 and fleet.target("w4#1", 100) == 20 and not fleet.over
    clock["ms"] += int(IN_TRANSIT_S * 1000)  # still 95 much later: a real fall (STOPs)
    for _ in range(3):
        fleet = asyncio.run(b.summarize_once())
    assert fleet.active == 95 and fleet.target("w4#1", 100) == 19


@pytest.mark.parametrize("age_s, counted", [(2.0, 100), (11.0, 95)])
def test_a_new_summarizer_counts_at_least_its_predecessors_recent_count(monkeypatch, age_s, counted):
    # A join's newcomer is the ring's new last session: it summarizes from the moment
    # shedders move connections to it, with no count of its own yet. Its first read,
    # missing those in transit, counted 12 as 8 on two workers (test_balancer saw a
    # shedder at its share shed two more, which came back).
    import asyncio

    ring = _Ring([_projected(session(f"w{i}#1", 20 if i != 3 else 15)) for i in range(5)])
    clock = {"ms": NOW}
    ring.written.append(summarize([session(f"w{i}#1", 20) for i in range(5)], now_ms=NOW - int(age_s * 1000), timing=T).as_item())
    _, b = _summarizer(ring, clock, monkeypatch)
    for _ in range(3):
        fleet = asyncio.run(b.summarize_once())
    assert fleet.active == counted


def test_a_rebalance_under_way_ends_with_every_worker_within_one_of_its_target():
    # 100 over 4 workers of 100: targets 25. One at 27 while the others are within one of
    # theirs (the worst 1 under): the band of 0.1 lets it stay; while settling it sheds 2.
    f = FleetLoad(4, 100, 400, 2, 0, NOW, under={"b": 1, "c": 1})
    assert shed_count(active=27, max_connections=100, fleet=f, tolerance=0.1, max_moves=10, recovering=False) == 0
    assert shed_count(active=27, max_connections=100, fleet=f, tolerance=0.1, max_moves=10, recovering=False,
                      settling=True) == 2
    assert shed_count(active=26, max_connections=100, fleet=f, tolerance=0.1, max_moves=10, recovering=False,
                      settling=True) == 0  # one over: within one


def test_a_large_join_is_paced_to_what_the_named_inboxes_take():
    from wsfleet.balance import UNDER_LISTED, pass_room, paced

    room = pass_room(T)  # six renewals between two summaries a shedder reads: 3/4 of 6 x 48
    assert room == 0.75 * 6 * schema.ASSIGNED_MAX == 216
    # 200 newcomers into 2,000 workers of 250: targets 227, each old one 23 over; the
    # summary names 128 newcomers (227 under each) of the 45,400 under.
    assert UNDER_LISTED == 128
    under = {f"n{i:03d}": 227 for i in range(UNDER_LISTED)}
    join = FleetLoad(2200, 500_000, 2200 * 350, 45_400, 0, NOW, under=under)
    rng = random.Random(1)
    sheds = [paced(23, join, rng, room=room) for _ in range(2000)]
    # each sheds 23 x 0.75 x (128 x 216) / 45,400 = 10.5 a pass: 10 or 11, 21,010 in all
    # (about three quarters of the 216 each named newcomer may be sent a pass)
    assert set(sheds) == {10, 11} and sum(sheds) == pytest.approx(2000 * 23 * 0.75 * 128 * 216 / 45_400, rel=0.01)
    # every one under named and under by no more than the room: all at once, as before
    small = FleetLoad(66, 600, 66 * 350, 54, 0, NOW, under={f"n{i}": 9 for i in range(6)})
    assert paced(1, small, rng, room=room) == 1 and paced(9, small, rng, room=room) == 9
    # a summary naming nobody: its sheds are hinted for anyone
    assert paced(7, FleetLoad(2, 8, 200, 4, 0, NOW), rng, room=room) == 7


def test_with_more_shedders_than_the_summary_lists_each_picks_named_sessions_at_random():
    from wsfleet.balance import OVER_LISTED

    over = {f"o{i:03d}": 23 for i in range(OVER_LISTED)}  # the list is full: more shedders than it names
    f = FleetLoad(100, 10_000, 35_000, 500, 0, NOW, under={"a": 400, "b": 100}, over=over)
    picks = shed_targets(f, "o000", 30, random.Random(1), room=10)  # listed, yet at random: none has its part
    assert len(picks) == 30 and Counter(picks) == {"a": 10, "b": 10, "": 10}  # at most the room a session
    # fewer shedders than the list holds: each its own part of one plan, as before
    few = FleetLoad(4, 100, 400, 6, 0, NOW, under={"a": 4, "b": 2}, over={"x": 3, "y": 3})
    assert shed_targets(few, "x", 3) + shed_targets(few, "y", 3) == ["a", "a", "a", "a", "b", "b"]
    # ... paced too: one newcomer 600 under, more than its room of 288 between two passes;
    # each of two shedders 300 over sheds 0.75 x 288 / 600 of it, 108, facing its own part
    from wsfleet.balance import paced

    one = FleetLoad(3, 1200, 1200, 600, 0, NOW, under={"a": 600}, over={"x": 300, "y": 300})
    parts = [paced(300, one, room=288, me=me) for me in ("x", "y")]
    assert parts == [108, 108]
    assert shed_targets(one, "x", 108, room=288) + shed_targets(one, "y", 108, room=288) == ["a"] * 216


def test_a_worker_that_saw_a_rebalance_begin_settles_it_for_two_minutes(monkeypatch):
    import asyncio
    import time
    from types import SimpleNamespace

    from wsfleet import clock
    from wsfleet.balance import SETTLE_S
    from wsfleet.logs import JsonLogger
    from wsfleet.worker.balancer import Balancer
    from wsfleet.worker.holdings import Holdings
    from wsfleet.worker.summary import FleetSummary

    now, mono = int(time.time() * 1000), [1_000.0]
    monkeypatch.setattr(clock, "now", lambda: mono[0])

    def balancer() -> tuple[Balancer, FleetSummary]:
        runners = {f"c{i}": SimpleNamespace(connection_id=f"c{i}", end_reason=None, acquired_mono=0.0, shed=False)
                   for i in range(22)}
        for r in runners.values():
            r.request_shed = lambda to="", r=r: setattr(r, "shed", True)
        summary = FleetSummary(clock_ms=lambda: now)
        holdings = Holdings(max_connections=100, summary=summary)
        holdings.runners.update(runners)
        holdings.last_acquired_ms = now - 60_000
        return Balancer(
            sessions=None, keeper=SimpleNamespace(live=lambda: True, session_id="me#1"), timing=T, enabled=True,
            tolerance=0.1, call=None, log=JsonLogger(), holdings=holdings, summary=summary,
            takeover=SimpleNamespace(successors=lambda: [], recovering=lambda: False, watched={}), clock_ms=lambda: now,
        ), summary

    # 80 over 4 workers: targets 20; we hold 22, in the band (2) while the worst is 1 under
    quiet = FleetLoad(4, 80, 400, 2, 0, now, under={"b#1": 1, "c#1": 1}, over={"me#1": 2})
    begun = FleetLoad(4, 80, 400, 3, 1, now, under={"n#1": 3})  # one 3 under (a suspect: nothing moves yet)
    b, summary = balancer()
    summary.known(quiet)
    assert asyncio.run(b.balance_once()) == 0
    b, summary = balancer()
    summary.known(begun)
    assert asyncio.run(b.balance_once()) == 0
    mono[0] += SETTLE_S - 1
    summary.known(quiet)
    assert asyncio.run(b.balance_once()) == 2  # the rebalance it saw begin ends within one: down to 20
    b, summary = balancer()
    summary.known(begun)
    asyncio.run(b.balance_once())
    mono[0] += SETTLE_S
    summary.known(quiet)
    assert asyncio.run(b.balance_once()) == 0  # two minutes on: the band again


def test_a_shedder_sends_a_third_of_an_inbox_at_once_and_the_rest_a_heartbeat_apart(monkeypatch):
    import asyncio
    import time
    from types import SimpleNamespace

    from wsfleet.logs import JsonLogger
    from wsfleet.worker import balancer as balancer_module
    from wsfleet.worker.balancer import SHED_BURST, Balancer
    from wsfleet.worker.holdings import Holdings
    from wsfleet.worker.summary import FleetSummary

    now = int(time.time() * 1000)
    runners = {f"c{i:02d}": SimpleNamespace(connection_id=f"c{i:02d}", end_reason=None, acquired_mono=0.0, shed=False)
               for i in range(40)}
    for r in runners.values():
        r.request_shed = lambda to="", r=r: setattr(r, "shed", True)
    summary = FleetSummary(clock_ms=lambda: now)
    summary.known(FleetLoad(2, 40, 200, 20, 0, now, under={"b#1": 20}, over={"me#1": 20}))
    holdings = Holdings(max_connections=100, summary=summary)
    holdings.runners.update(runners)
    holdings.last_acquired_ms = now - 60_000
    seen = []

    async def sleep(s):
        seen.append((s, sum(r.shed for r in runners.values())))

    monkeypatch.setattr(balancer_module, "asyncio", SimpleNamespace(sleep=sleep))
    b = Balancer(
        sessions=None, keeper=SimpleNamespace(live=lambda: True, session_id="me#1"), timing=T, enabled=True,
        tolerance=0.1, call=None, log=JsonLogger(), holdings=holdings, summary=summary,
        takeover=SimpleNamespace(successors=lambda: [], recovering=lambda: False, watched={}), clock_ms=lambda: now,
    )
    assert asyncio.run(b.balance_once()) == 20  # down to its 20
    assert SHED_BURST == 16 and seen == [(2.5, 16)]  # 16 at once, the other 4 a heartbeat on
