"""Session lease rules, without AWS: timing, failure classification, the ring, takeover
planning, pacing."""

import random

import pytest

from wsfleet import schema
from wsfleet.leases import (
    AcquireFailure,
    EndFailure,
    HANDOFF_UNREACHABLE_MS,
    RECONCILE_BACKOFF_CAP,
    RenewFailure,
    SessionTiming,
    TimingError,
    Watched,
    acquire_already_landed,
    backoff_s,
    Unreachable,
    acquire_refusal,
    classify_end_failure,
    classify_renew_failure,
    drain_split,
    hint_pause_s,
    move_already_landed,
    new_session_id,
    reconcile_pause_s,
    release_already_landed,
    released_at_fence,
    successors,
    unreachable,
    takeover_jitter_s,
    WATCH_FURTHER_MAX,
    watch_plan,
    watch_reach,
    worker_of,
)

T = SessionTiming(lease_ms=10_000, heartbeat_ms=2_500, max_clock_skew_ms=1_000)
NAMES = {"lease": "LEASE_SECONDS", "heartbeat": "HEARTBEAT_SECONDS", "skew": "MAX_CLOCK_SKEW_MS"}


def test_a_checked_timing_is_the_same_value_in_milliseconds():
    assert SessionTiming.checked(lease_s=10, heartbeat_s=2.5, max_clock_skew_ms=1_000) == T


@pytest.mark.parametrize(
    "lease_s, heartbeat_s, skew_ms, sentence",
    [
        (8, 5, 1_000, "LEASE_SECONDS (8) must be at least twice HEARTBEAT_SECONDS (5)"),
        (10, 2.5, 7_500, "MAX_CLOCK_SKEW_MS (7500) must be less than LEASE_SECONDS minus HEARTBEAT_SECONDS (7500 ms)"),
        (10, 2.5, -1, "MAX_CLOCK_SKEW_MS (-1) must be 0 or more"),
    ],
)
def test_a_timing_that_breaks_the_rule_is_refused_in_the_callers_names(lease_s, heartbeat_s, skew_ms, sentence):
    with pytest.raises(TimingError) as refused:
        SessionTiming.checked(lease_s=lease_s, heartbeat_s=heartbeat_s, max_clock_skew_ms=skew_ms)
    assert refused.value.sentence(**NAMES) == sentence


def test_the_failover_bound_is_lease_skew_watch_window_and_two_reconcile_pauses_rounded_up():
    # 10 s + 1 s + 7.25 s (10 - 2.5 - 1.25 + 1) + 2 x 10 s = 38.25 s
    assert T.failover_bound_s(reconcile_ms=10_000) == 39


def test_the_deadline_counts_from_the_renewals_send_time_less_the_skew():
    assert T.deadline_mono(50.0) == 50.0 + 9.0


def test_a_session_may_be_ended_only_after_its_expiry_plus_the_skew_margin():
    assert T.endable_below_ms(100_000) == 99_000
    assert T.end_at_ms(100_000) == 101_001


def test_a_holder_stops_writing_before_anyone_may_end_its_session_whatever_the_skew():
    # The holder's clock is a whole margin behind the ender's. Its last renewal leaves at
    # true time 0 and stores expiry = lease - skew (by its clock); the ender's clock
    # reads true time, so it ends the session at true time end_at_ms(expiry).
    skew = T.max_clock_skew_ms
    stored_expiry = T.lease_ms - skew
    ended_at = T.end_at_ms(stored_expiry)
    holder_stops_at = T.deadline_mono(0.0) * 1000
    assert ended_at > holder_stops_at


def test_a_freshly_renewed_session_is_not_suspect_but_one_that_missed_a_renewal_is():
    now = 1_000_000
    assert not T.suspect(now + T.lease_ms - T.heartbeat_ms, now)  # renewed one heartbeat ago
    assert T.suspect(now + T.lease_ms - 2 * T.heartbeat_ms, now)


def test_watching_at_the_pause_it_picks_always_sees_a_death_before_the_session_is_endable():
    rng = random.Random(1)
    assert all(T.watch_pause_s(rng) * 1000 < T.watch_window_ms() for _ in range(1000))


def test_a_failed_renewal_is_retried_about_eight_times_a_second():
    rng = random.Random(2)
    pauses = [T.renew_retry_s(rng) for _ in range(1000)]
    assert 0.08 <= min(pauses) and max(pauses) <= 0.16


def test_session_ids_are_unique_per_run_and_name_the_worker():
    a, b = new_session_id("w1", 5), new_session_id("w1", 5)
    assert a != b and a.startswith("w1#5-")


def test_a_session_id_names_its_worker_even_when_the_worker_id_has_a_hash():
    assert worker_of(new_session_id("w1", 5)) == "w1"
    assert worker_of(new_session_id("task#7", 5)) == "task#7"


def test_a_retried_move_recognises_its_own_landing_and_nothing_else():
    moved = {"desired_state": "STARTED", "lease_session": "b#1", "fence_token": 4}
    assert move_already_landed(moved, to_session="b#1", fence_token=3)
    assert not move_already_landed(moved, to_session="b#1", fence_token=4)  # another move, later
    assert not move_already_landed(moved, to_session="c#1", fence_token=3)  # taken by another
    assert not move_already_landed(None, to_session="b#1", fence_token=3)


def test_failures_say_why():
    assert classify_renew_failure(None) is RenewFailure.GONE
    assert classify_renew_failure({"state": "ENDED"}) is RenewFailure.ENDED
    assert classify_end_failure(None) is EndFailure.GONE
    assert classify_end_failure({"state": "ENDED"}) is EndFailure.ALREADY_ENDED
    assert classify_end_failure({"state": "LIVE"}) is EndFailure.RENEWED
    assert acquire_refusal(None, expected_session="") is AcquireFailure.NOT_FOUND
    assert acquire_refusal({"desired_state": "STOPPED", "lease_session": ""}, expected_session="") is AcquireFailure.STOPPED
    started = {"desired_state": "STARTED", "lease_session": "b#1"}
    assert acquire_refusal(started, expected_session="") is AcquireFailure.HELD
    assert acquire_refusal(started, expected_session="a#1") is AcquireFailure.HELD
    assert acquire_refusal(started, expected_session="b#1") is None  # taken as the ENDED session it is attached to
    assert acquire_refusal({"desired_state": "STARTED", "lease_session": ""}, expected_session="") is None


def test_retries_of_writes_that_already_landed_are_recognised():
    assert acquire_already_landed({"desired_state": "STARTED", "lease_session": "me#1"}, "me#1")
    assert not acquire_already_landed({"desired_state": "STARTED", "lease_session": "you#1"}, "me#1")
    assert not acquire_already_landed({"desired_state": "STOPPED", "lease_session": "me#1"}, "me#1")
    assert release_already_landed({"lease_session": "", "fence_token": 3}, 3)
    assert not release_already_landed({"lease_session": "", "fence_token": 4}, 3)
    assert not release_already_landed({"lease_session": "b#1", "fence_token": 3}, 3)


def test_each_session_watches_its_successors_in_the_ring_wrapping_around():
    ring = ["a", "b", "c", "d"]
    assert successors(ring, "b", 2) == ["c", "d"]
    assert successors(ring, "d", 2) == ["a", "b"]
    assert successors(["a"], "a", 2) == []
    assert successors(["a", "z"], "m", 2) == ["z", "a"]  # a new session not yet listed


def test_every_session_is_watched_by_k_others_so_watching_grows_linearly():
    ring = [f"s{i:03d}" for i in range(50)]
    watchers: dict[str, int] = {}
    for me in ring:
        for s in successors(ring, me, 2):
            watchers[s] = watchers.get(s, 0) + 1
    assert set(watchers.values()) == {2} and len(watchers) == 50


def test_the_watch_plan_drains_ended_sessions_and_ends_suspect_ones_at_expiry():
    now = 1_000_000
    seen = [
        Watched("healthy", schema.LIVE, now + T.lease_ms - 1_000),
        Watched("missed", schema.LIVE, now + 3_000),
        Watched("expired", schema.LIVE, now - 5_000),
        Watched("ended", schema.ENDED, now - 60_000),
    ]
    drain, end = watch_plan(seen, now_ms=now, timing=T)
    assert drain == ["ended"]
    assert end == [("missed", now + 3_000 + 1_001), ("expired", now - 5_000 + 1_001)]


def test_a_watcher_reads_one_successor_further_past_each_that_looks_dead_up_to_a_bound():
    now = 1_000_000
    healthy = Watched("healthy", schema.LIVE, now + T.lease_ms - 1_000)
    missed = Watched("missed", schema.LIVE, now + 3_000)
    ended = Watched("ended", schema.ENDED, now - 60_000)
    assert watch_reach([healthy, healthy], k=2, now_ms=now, timing=T) == 2
    assert watch_reach([missed, healthy], k=2, now_ms=now, timing=T) == 3
    assert watch_reach([missed, ended], k=2, now_ms=now, timing=T) == 4
    assert watch_reach([missed, ended, missed, ended], k=2, now_ms=now, timing=T) == 6
    assert watch_reach([missed] * 40, k=2, now_ms=now, timing=T) == 2 + WATCH_FURTHER_MAX


def test_a_drainer_keeps_half_its_room_and_frees_the_rest_for_the_fleet():
    assert drain_split(10, 100) == 10
    assert drain_split(100, 30) == 15
    assert drain_split(5, 0) == 0
    assert drain_split(5, 1) == 1


def test_busier_workers_wait_longer_before_racing_for_a_dead_session():
    rng = random.Random(7)
    idle = [takeover_jitter_s(0.0, rng) for _ in range(200)]
    busy = [takeover_jitter_s(1.0, rng) for _ in range(200)]
    assert max(idle) < min(busy)


def test_pacing_is_jittered_within_bounds():
    rng = random.Random(3)
    assert all(7.5 <= reconcile_pause_s(10_000, rng) <= 10.0 for _ in range(100))
    assert hint_pause_s(0.0, rng) == 0.0
    assert all(0 <= hint_pause_s(1.0, rng) <= 0.5 for _ in range(100))
    assert all(0 <= backoff_s(n, rng=rng) <= 5.0 for n in range(40))


def test_a_connection_is_reachable_only_in_the_free_pool_or_attached_to_a_session_in_the_ring():
    live = {"state": "LIVE", "ring": "RING"}
    ended_in_ring = {"state": "ENDED", "ring": "RING"}
    left = {"state": "ENDED"}
    free = {"desired_state": "STARTED", "lease_session": "", "owner_key": "FREE#3"}
    assert unreachable(free, None) is None
    assert unreachable({"desired_state": "STOPPED", "lease_session": ""}, None) is None  # nothing to take
    assert unreachable({"desired_state": "STARTED", "lease_session": ""}, None) is Unreachable.NOT_IN_FREE_POOL
    for state in ("STARTED", "STOPPED"):  # a STOPPED one still waits for its release
        held = {"desired_state": state, "lease_session": "s#1", "owner_key": "S#s#1"}
        assert unreachable(held, live) is None
        assert unreachable(held, ended_in_ring) is None  # its watchers drain it
        assert unreachable(held, left) is Unreachable.SESSION_LEFT_RING
        assert unreachable(held, None) is Unreachable.SESSION_GONE
        assert unreachable(held, {"state": "LIVE"}) is Unreachable.SESSION_LEFT_RING  # LIVE but unwatched


def test_a_connection_released_at_its_fence_may_be_taken_from_any_session_and_no_other_may():
    handed = {"desired_state": "STARTED", "lease_session": "a#1", "fence_token": 4, "released_fence": 4}
    assert released_at_fence(handed)
    assert acquire_refusal(handed, expected_session="") is None  # a named peer, from the hint
    assert acquire_refusal(handed, expected_session="a#1") is None  # the ENDED session's drain
    older = {**handed, "fence_token": 5}  # a mark left from an older ownership is no mark
    assert not released_at_fence(older) and not released_at_fence({k: v for k, v in handed.items() if k != "released_fence"})
    assert acquire_refusal(older, expected_session="") is AcquireFailure.HELD
    held = {"desired_state": "STARTED", "lease_session": "a#1", "fence_token": 4}
    assert acquire_refusal(held, expected_session="") is AcquireFailure.HELD
    assert acquire_refusal({**handed, "desired_state": "STOPPED"}, expected_session="") is AcquireFailure.STOPPED


def test_a_handoff_is_never_read_as_our_acquire_landed_and_its_retried_release_is():
    handed = {"desired_state": "STARTED", "lease_session": "me#1", "fence_token": 4, "released_fence": 4}
    assert not acquire_already_landed(handed, "me#1")  # our audit does not take back what we handed off
    assert release_already_landed(handed, 4, "me#1")
    assert not release_already_landed(handed, 4)  # a release that frees: not this form
    assert not release_already_landed(handed, 4, "you#1")
    assert not release_already_landed({**handed, "released_fence": 3}, 4, "me#1")


def test_a_live_sessions_handoff_is_reachable_only_for_a_bounded_time():
    live = {"state": "LIVE", "ring": "RING"}
    ended = {"state": "ENDED", "ring": "RING"}
    at = 1_000_000
    handed = {
        "desired_state": "STARTED", "lease_session": "a#1", "fence_token": 2, "released_fence": 2, "updated_at_ms": at,
    }
    assert unreachable(handed, live, now_ms=at + HANDOFF_UNREACHABLE_MS) is None
    assert unreachable(handed, live, now_ms=at + HANDOFF_UNREACHABLE_MS + 1) is Unreachable.HANDOFF_UNCLAIMED
    assert unreachable(handed, ended, now_ms=at + 10 * HANDOFF_UNREACHABLE_MS) is None  # its watchers drain it
    assert unreachable(handed, live) is None  # no clock, no judgement of age (the chaos checker's view)
    held = {k: v for k, v in handed.items() if k != "released_fence"}
    assert unreachable(held, live, now_ms=at + 10 * HANDOFF_UNREACHABLE_MS) is None


def test_the_free_scan_pause_doubles_while_scans_find_nothing_up_to_the_cap_and_stays_jittered():
    rng = random.Random(5)
    for idle, factor in ((0, 1), (1, 2), (2, 4), (3, 8), (4, 8), (60, 8)):
        pauses = [reconcile_pause_s(10_000, rng, idle_scans=idle) for _ in range(100)]
        assert all(factor * 7.5 <= p <= factor * 10.0 for p in pauses), (idle, min(pauses), max(pauses))
        assert max(pauses) - min(pauses) > factor * 1.0  # still jittered
    # The worst case for a lost hint: the longest pause, then one scan.
    assert max(reconcile_pause_s(10_000, rng, idle_scans=99) for _ in range(100)) <= RECONCILE_BACKOFF_CAP * 10.0


def test_a_sweep_pass_is_split_into_as_many_segments_as_fit_it_in_half_of_sweep_seconds():
    from wsfleet.leases import SWEEP_MAX_SEGMENTS, sweep_segments

    assert sweep_segments(0, sweep_s=600) == 1
    assert sweep_segments(60_000, sweep_s=600) == 1  # 200 a second for 300 s
    assert sweep_segments(500_000, sweep_s=600) == 9  # 1,800 a second: about 280 s
    assert sweep_segments(10_000_000, sweep_s=600) == SWEEP_MAX_SEGMENTS

