"""Lease rules, without AWS: timing, failure classification, takeover planning."""

import random

from wsfleet.leases import (
    AcquireFailure,
    Candidate,
    LeaseTiming,
    RenewFailure,
    acquire_already_landed,
    backoff_s,
    classify_acquire_failure,
    classify_renew_failure,
    hint_pause_s,
    reconcile_pause_s,
    release_already_landed,
    takeover_jitter_s,
    takeover_plan,
)

T = LeaseTiming(lease_ms=20_000, heartbeat_ms=5_000, max_clock_skew_ms=1_000)


def test_a_lease_is_acquirable_only_after_expiry_plus_the_skew_margin():
    assert T.acquirable_below_ms(100_000) == 99_000


def test_local_deadline_counts_from_the_send_time_less_the_skew():
    assert T.local_deadline_mono(50.0) == 50.0 + 19.0


def test_a_freshly_renewed_lease_is_not_suspect_but_one_that_missed_a_renewal_is():
    now = 1_000_000
    healthy_worst = now + T.lease_ms - T.heartbeat_ms  # renewed one heartbeat ago
    assert healthy_worst >= T.suspect_below_ms(now)
    missed_one = now + T.lease_ms - 2 * T.heartbeat_ms
    assert missed_one < T.suspect_below_ms(now)


def test_acquire_failure_says_why():
    assert classify_acquire_failure(None) is AcquireFailure.NOT_FOUND
    assert classify_acquire_failure({"desired_state": "STOPPED"}) is AcquireFailure.STOPPED
    assert classify_acquire_failure({"desired_state": "STARTED", "lease_owner": "b"}) is AcquireFailure.HELD


def test_an_acquire_retry_that_already_landed_is_recognised():
    assert acquire_already_landed({"desired_state": "STARTED", "lease_owner": "me"}, "me")
    assert not acquire_already_landed({"desired_state": "STARTED", "lease_owner": "you"}, "me")
    assert not acquire_already_landed({"desired_state": "STOPPED", "lease_owner": "me"}, "me")


def test_renew_failure_tells_lost_from_stopped_from_deleted():
    assert classify_renew_failure(None, "me", 3) is RenewFailure.DELETED
    assert classify_renew_failure({"lease_owner": "you", "fence_token": 4}, "me", 3) is RenewFailure.LOST
    # Re-acquired by ourselves after expiry: our old fence is stale, so it is lost too.
    assert classify_renew_failure({"lease_owner": "me", "fence_token": 4}, "me", 3) is RenewFailure.LOST
    assert (
        classify_renew_failure({"lease_owner": "me", "fence_token": 3, "desired_state": "STOPPED"}, "me", 3)
        is RenewFailure.STOPPED
    )


def test_a_release_retry_that_already_landed_is_recognised():
    assert release_already_landed({"lease_owner": "", "fence_token": 3}, "me", 3)
    assert not release_already_landed({"lease_owner": "", "fence_token": 4}, "me", 3)
    assert not release_already_landed({"lease_owner": "you", "fence_token": 3}, "me", 3)


def test_takeover_plan_tries_each_orphan_the_moment_it_expires_soonest_first():
    now = 1_000_000
    cands = [Candidate("late", now + 9_000), Candidate("free", 0), Candidate("mine", 5), Candidate("soon", now + 1_000)]
    plan = takeover_plan(cands, now_ms=now, timing=T, managed={"mine"}, capacity=10)
    assert plan == [("free", now), ("soon", now + 1_000 + 1_001), ("late", now + 9_000 + 1_001)]


def test_takeover_plan_stops_at_capacity():
    cands = [Candidate(f"c{i}", 0) for i in range(10)]
    assert len(takeover_plan(cands, now_ms=5, timing=T, managed=set(), capacity=3)) == 3


def test_a_busier_worker_waits_longer_before_racing_for_an_orphan():
    idle = [takeover_jitter_s(0.0, random.Random(i)) for i in range(50)]
    busy = [takeover_jitter_s(1.0, random.Random(i)) for i in range(50)]
    assert max(idle) < min(busy)


def test_backoff_grows_and_is_capped():
    rng = random.Random(1)
    assert all(0 <= backoff_s(0, base=0.1, rng=rng) <= 0.1 for _ in range(20))
    assert all(0 <= backoff_s(50, cap=5.0, rng=rng) <= 5.0 for _ in range(20))


def test_an_idle_worker_polls_for_the_next_hint_at_once_and_a_full_one_waits():
    assert hint_pause_s(0.0, random.Random(1)) == 0.0
    assert all(0.0 <= hint_pause_s(1.0, random.Random(i)) <= 0.5 for i in range(20))
    assert max(hint_pause_s(0.2, random.Random(i)) for i in range(20)) <= 0.1


def test_orphan_scans_come_often_enough_to_see_a_dead_lease_before_it_expires():
    pauses = [reconcile_pause_s(60_000, T, random.Random(i)) for i in range(50)]
    # A lease that missed its renewal is a suspect 1.5 heartbeats after it, 12.5 s before
    # it expires with the defaults: no pause may be longer than the 10 s cap.
    assert all(5.0 <= p <= 10.0 for p in pauses)
    assert all(2.0 <= reconcile_pause_s(4_000, T, random.Random(i)) <= 4.0 for i in range(20))
