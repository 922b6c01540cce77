"""Fair share, without AWS: the fleet summary, when to shed and how much, which hints a
worker leaves for others."""

from wsfleet import schema
import random
from collections import Counter

from wsfleet.balance import (
    SHED_ANYONE_AFTER_S,
    SHED_TARGET_WAIT_S,
    FleetLoad,
    declines_shed_hint,
    hints_per_poll,
    is_summarizer,
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


def test_a_worker_within_the_tolerance_band_of_its_share_sheds_nothing():
    f = fleet(100, 500)  # share 20 per 100-connection worker
    assert shed_count(active=22, max_connections=100, fleet=f, tolerance=0.1, max_moves=10, recovering=False) == 0
    assert shed_count(active=23, max_connections=100, fleet=f, tolerance=0.1, max_moves=10, recovering=False) == 3


def test_a_worker_within_its_band_still_sheds_while_others_have_more_room_than_the_band():
    # 12 over three 20-connection workers: shares 4. Two at 5 (within the band of 1) and a
    # newcomer at 2: the newcomer has 2 of room, more than the band.
    f = FleetLoad(3, 12, 60, below_share=2, suspects=0, at_ms=NOW)
    assert shed_count(active=5, max_connections=20, fleet=f, tolerance=0.1, max_moves=2, recovering=False) == 1
    settled = FleetLoad(3, 12, 60, below_share=1, suspects=0, at_ms=NOW)
    assert shed_count(active=5, max_connections=20, fleet=settled, tolerance=0.1, max_moves=2, recovering=False) == 0
    # A balanced fleet (shares rounded up) moves nothing: 101 over five, 21/20/20/20/20.
    even = FleetLoad(5, 101, 500, below_share=4, suspects=0, at_ms=NOW)
    assert shed_count(active=21, max_connections=100, fleet=even, tolerance=0.1, max_moves=10, recovering=False) == 0


def test_shedding_never_goes_below_the_share_and_is_capped_per_pass():
    f = fleet(100, 800)  # share 12.5 -> 13
    assert shed_count(active=25, max_connections=100, fleet=f, tolerance=0.1, max_moves=10, recovering=False) == 10
    assert shed_count(active=16, max_connections=100, fleet=f, tolerance=0.1, max_moves=10, recovering=False) == 3
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


def test_a_shed_hint_naming_its_target_is_left_to_that_worker_for_a_moment_then_to_any_under_share():
    f = fleet(100, 500, below=20)
    kw = dict(max_connections=100, fleet=f, shed_by_me=False, shed_to="new#1")
    assert not declines_shed_hint(active=0, me="new#1", age_s=0, **kw)  # the target takes it
    assert declines_shed_hint(active=20, me="new#1", age_s=0, **kw)  # ... unless already at its share
    assert not declines_shed_hint(active=20, me="new#1", age_s=SHED_ANYONE_AFTER_S, **kw)
    assert declines_shed_hint(active=5, me="other#1", age_s=0, **kw)  # under share, but not named
    assert declines_shed_hint(active=0, me="other#1", age_s=SHED_TARGET_WAIT_S - 0.1, **kw)
    assert not declines_shed_hint(active=5, me="other#1", age_s=SHED_TARGET_WAIT_S, **kw)  # then: any under share
    assert declines_shed_hint(active=20, me="other#1", age_s=SHED_TARGET_WAIT_S, **kw)
    assert not declines_shed_hint(active=20, me="other#1", age_s=SHED_ANYONE_AFTER_S, **kw)  # then: anyone


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

    now = int(time.time() * 1000)
    runners = {f"c{i}": SimpleNamespace(connection_id=f"c{i}", end_reason=None, acquired_mono=0.0, shed=False) for i in range(8)}
    for r in runners.values():
        r.request_shed = lambda to="", r=r: setattr(r, "shed", True)
    acquired = {"ms": now - 1_000}

    def balancer(summary: FleetLoad) -> Balancer:
        b = Balancer(
            sessions=None, keeper=SimpleNamespace(live=lambda: True, session_id="me#1"), timing=T, max_connections=100,
            enabled=True, tolerance=0.1, call=None, log=JsonLogger(), successors=lambda: [], recovering=lambda: False,
            runners=lambda: runners, last_acquired_ms=lambda: acquired["ms"], clock_ms=lambda: now,
        )
        b.fleet = summary
        return b

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
