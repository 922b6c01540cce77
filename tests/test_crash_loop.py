"""The crash-loop breaker's rules (wsfleet.crash_loop), without AWS: who is named the
prime suspect, and what each death of its owner counts against it."""

from __future__ import annotations

from wsfleet import schema
from wsfleet.crash_loop import SUSPECT_MIN_BYTES, SUSPECT_MIN_LOOP_S, WINDOW_MS, Suspect, SuspectWatch, strike

NOW = 1_700_000_000_000
BIG = 2 * SUSPECT_MIN_BYTES


def started(**extra):
    return {schema.DESIRED_STATE: schema.STARTED, schema.FENCE_TOKEN: 1, **extra}


def struck(item, s):
    """The item as the strike's write leaves it."""
    out = {**item, schema.STRIKES: s.strikes, schema.STRIKES_SINCE_MS: s.since_ms, schema.STRIKE_FENCE: s.fence_token}
    if s.quarantined:
        out[schema.QUARANTINED] = s.quarantined
    return out


def b(n):
    """Costs of bytes only."""
    return (n, 0.0)


def test_the_suspect_is_the_connection_that_brought_most_bytes_when_that_is_remarkable():
    watch = SuspectWatch()
    assert watch.look({("a", 1): b(0), ("b", 3): b(0)}) is None
    named = watch.look({("a", 1): b(1_000), ("b", 3): b(BIG)})
    assert (named.connection_id, named.fence_token) == ("b", 3) and named.why.startswith(f"most bytes received: {BIG} of")


def test_without_a_remarkable_byte_count_the_suspect_is_the_one_that_took_most_loop_time():
    watch = SuspectWatch()
    watch.look({("a", 1): (0, 0.0), ("b", 1): (0, 0.0)})
    named = watch.look({("a", 1): (1_000, 0.01), ("b", 1): (2_000, 2 * SUSPECT_MIN_LOOP_S)})
    assert named.connection_id == "b" and named.why.startswith("most event-loop seconds: 0.50 of")
    # Bytes come first: a memory death's culprit is named over a loop hog.
    named = watch.look({("a", 1): (BIG, 0.01), ("b", 1): (2_000, 4 * SUSPECT_MIN_LOOP_S)})
    assert named.connection_id == "a"


def test_a_worker_with_nothing_remarkable_names_no_suspect():
    watch = SuspectWatch()
    assert watch.look({}) is None
    assert watch.look({("a", 1): (SUSPECT_MIN_BYTES // 4, SUSPECT_MIN_LOOP_S / 4)}) is None  # too little to matter
    even = {(f"c{i}", 1): (BIG, 2 * SUSPECT_MIN_LOOP_S) for i in range(10)}
    assert SuspectWatch().look(even) is None  # busy but alike: none has a quarter of the bytes or the loop


def test_the_suspect_counts_the_recent_bytes_not_a_connections_whole_life():
    watch = SuspectWatch()
    watch.look({("old", 1): b(0), ("new", 1): b(0)})
    assert watch.look({("old", 1): b(50 * BIG), ("new", 1): b(0)}).connection_id == "old"
    for _ in range(8):  # old goes quiet: its share halves at every renewal
        watch.look({("old", 1): b(50 * BIG), ("new", 1): b(0)})
    assert watch.look({("old", 1): b(50 * BIG), ("new", 1): b(BIG)}).connection_id == "new"


def test_the_suspect_round_trips_through_the_session_item():
    s = Suspect("c1", 7, "why")
    assert Suspect.from_item(s.item()) == s
    assert Suspect.from_item(None) is None and Suspect.from_item({"connection_id": ""}) is None


def test_consecutive_strikes_quarantine_at_the_threshold():
    item = started()
    for fence in (1, 2):
        s = strike(item, Suspect("c1", fence, "w"), now_ms=NOW + fence, quarantine_after=3)
        assert s.strikes == fence and s.quarantined is None
        item = struck(item, s)
    s = strike(item, Suspect("c1", 3, "w"), now_ms=NOW + 3, quarantine_after=3)
    assert s.strikes == 3 and s.quarantined["at_ms"] == NOW + 3
    assert s.quarantined["reason"].startswith("crash_loop: the prime suspect of 3 consecutive deaths")


def test_the_same_ownership_is_struck_once_so_a_retried_write_counts_nothing():
    item = struck(started(), strike(started(), Suspect("c1", 4, "w"), now_ms=NOW, quarantine_after=3))
    assert strike(item, Suspect("c1", 4, "w"), now_ms=NOW + 1, quarantine_after=3) is None
    assert strike(item, Suspect("c1", 3, "w"), now_ms=NOW + 1, quarantine_after=3) is None  # an older one, late


def test_an_ownership_in_between_that_did_not_die_with_it_as_suspect_restarts_the_run():
    item = struck(started(), strike(started(), Suspect("c1", 4, "w"), now_ms=NOW, quarantine_after=3))
    # Fence 5 let it go alive (or died naming another): the strike for fence 6 starts again.
    assert strike(item, Suspect("c1", 6, "w"), now_ms=NOW + 1, quarantine_after=3).strikes == 1


def test_a_strike_past_the_window_of_the_runs_first_restarts_the_run():
    item = struck(started(), strike(started(), Suspect("c1", 1, "w"), now_ms=NOW, quarantine_after=3))
    item = struck(item, strike(item, Suspect("c1", 2, "w"), now_ms=NOW + WINDOW_MS - 1, quarantine_after=3))
    assert item[schema.STRIKES] == 2
    late = strike(item, Suspect("c1", 3, "w"), now_ms=NOW + WINDOW_MS + 1, quarantine_after=3)
    assert late.strikes == 1 and late.since_ms == NOW + WINDOW_MS + 1 and late.quarantined is None


def test_no_strike_against_a_stopped_gone_or_quarantined_connection():
    suspect = Suspect("c1", 2, "w")
    assert strike(None, suspect, now_ms=NOW, quarantine_after=3) is None
    assert strike({schema.DESIRED_STATE: schema.STOPPED}, suspect, now_ms=NOW, quarantine_after=3) is None
    held = started(**{schema.QUARANTINED: {"reason": "r", "at_ms": NOW}})
    assert strike(held, suspect, now_ms=NOW, quarantine_after=3) is None
