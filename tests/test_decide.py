"""The worker's decisions about a hint, a drain, a move and a STOP, without AWS, sockets
or a clock: values in, a decision out."""

import json

from wsfleet import schema
from wsfleet.balance import SHED_ANYONE_AFTER_S, FleetLoad
from wsfleet.worker.decide import (
    Held,
    Hint,
    HintAction,
    Standing,
    StopAction,
    choose_hint,
    choose_shed,
    choose_stop,
    hint_age_s,
    parse_hint,
    split_drain,
)

NOW_MS = 1_000_000
# Two workers of 100, 20 connections: a target of 10 each, and someone is under theirs.
FLEET = FleetLoad(workers=2, active=20, capacity=200, below_share=5, suspects=0, at_ms=NOW_MS)


def standing(active: int, fleet: FleetLoad | None = FLEET, me: str = "me#1") -> Standing:
    return Standing(active=active, max_connections=100, fleet=fleet, me=me)


def choose(hint: Hint, *, active: int = 10, age_s: float = 0.0, accepting=True, busy=False, ending=False, fleet=FLEET):
    return choose_hint(hint, age_s=age_s, accepting=accepting, busy=busy, ending=ending, standing=standing(active, fleet))


# --- where the worker stands -----------------------------------------------------------------


def test_a_worker_at_its_target_leaves_peers_sheds_and_its_free_scan_takes_nothing():
    at, under = standing(10), standing(5)
    assert at.declines_shed("peer#1") and not under.declines_shed("peer#1")
    assert at.scan_room() == 0 and under.scan_room() == 95
    assert standing(10, fleet=None).scan_room() == 90  # no fresh summary: the room is all it knows
    assert under.declines_shed("me#1")  # its own shed it never takes back
    assert under.under_target() and not at.under_target()
    assert under.hints_per_poll() == 5 and at.hints_per_poll() == 1


# --- a START hint ------------------------------------------------------------------------------


def test_a_hint_s_body_is_read_leniently_and_its_age_from_when_it_was_sent():
    assert parse_hint("not json") == Hint(None) and parse_hint(json.dumps({schema.HINT_CONNECTION_ID: ""})) == Hint(None)
    body = {schema.HINT_CONNECTION_ID: "c1", schema.HINT_SHED_BY: "a#1", "shed_to": "b#1"}  # an older release's: ignored
    assert parse_hint(json.dumps(body)) == Hint("c1", shed_by="a#1")
    assert hint_age_s({"SentTimestamp": "1000000"}, 1_002.5) == 2.5
    assert hint_age_s({"SentTimestamp": "1003000"}, 1_002.5) == 0.0  # a clock behind the sender's
    assert hint_age_s({"ApproximateReceiveCount": "3"}, 1_002.5) == 2.0  # a second per earlier receive


def test_a_hint_is_taken_when_there_is_room_and_left_to_the_queue_when_there_is_none():
    assert choose(Hint(None)).action is HintAction.BAD
    taken = choose(Hint("c1"))
    assert (taken.action, taken.source) == (HintAction.TAKE, "hint")
    assert choose(Hint("c1"), busy=True).action is HintAction.DONE  # ours already
    for full in (choose(Hint("c1"), active=100), choose(Hint("c1"), accepting=False)):
        assert (full.action, full.visibility_s) == (HintAction.KEEP, 0)  # for a peer, now
    ending = choose(Hint("c1"), busy=True, ending=True)  # a START while we release it for its STOP
    assert (ending.action, ending.visibility_s) == (HintAction.KEEP, 1)


def test_a_shed_connection_is_left_to_workers_under_their_share_then_to_anyone():
    shed = Hint("c1", shed_by="peer#1")
    left = choose(shed, active=10)  # at our share
    assert (left.action, left.visibility_s, left.declined_shed) == (HintAction.KEEP, 2, True)
    assert (choose(shed, active=5).action, choose(shed, active=5).source) == (HintAction.TAKE, "rebalance")
    assert choose(Hint("c1", shed_by="me#1"), active=5).action is HintAction.KEEP  # ours: never taken back
    anyone = choose(shed, active=10, age_s=SHED_ANYONE_AFTER_S)
    assert (anyone.action, anyone.source) == (HintAction.TAKE, "rebalance")
    drained = choose(Hint("c1", from_session="dead#1"), active=10)  # a crash's, for anyone
    assert (drained.action, drained.source) == (HintAction.TAKE, "orphan")


# --- a dead session's connections ------------------------------------------------------------------


def test_the_drain_takes_its_planned_part_as_far_as_its_room_goes_and_names_the_others():
    started = ["c1", "c2", "c3", "c4", "c5"]
    plan = ["me#1", "w2", "me#1", "", "me#1"]
    split = split_drain(started, plan, me="me#1", room=2)
    assert split.mine == ["c1", "c3"] and split.named == [("c2", "w2")] and split.anyone == ["c4", "c5"]
    assert split_drain(started, plan, me="me#1", room=-1).mine == []  # over full: every planned one to anyone


def test_without_a_plan_the_drain_takes_half_its_room_and_leaves_the_rest_to_anyone():
    split = split_drain(["c1", "c2", "c3", "c4", "c5"], None, me="me#1", room=4)
    assert split.mine == ["c1", "c2"] and split.named == [] and split.anyone == ["c3", "c4", "c5"]


# --- a move ------------------------------------------------------------------------------------------


def shed(held: list[Held], fleet: FleetLoad, *, last_acquired_ms: int = 0, now: float = 1_000.0) -> list[tuple[str, str]]:
    return choose_shed(
        held,
        fleet=fleet,
        me="me#1",
        max_connections=100,
        tolerance=0.1,
        max_moves=20,
        recovering=False,
        last_acquired_ms=last_acquired_ms,
        heartbeat_ms=2_500,
        now=now,
        min_hold_s=60.0,
    )


def test_the_balancer_sheds_its_oldest_movable_connections_down_to_its_share():
    # 14 here of a fleet of 20 on two workers: 4 over our target of 10; two ask for them.
    fleet = FleetLoad(2, 20, 200, 4, 0, NOW_MS, under={"w2#1": 4}, over={"me#1": 4})
    held = [Held(f"c{i:02d}", acquired_at=float(i), ending=False) for i in range(14)]
    held[13] = Held("c13", acquired_at=999.0, ending=False)  # held for less than the minimum
    assert shed(held, fleet) == [("c00", "w2#1"), ("c01", "w2#1"), ("c02", "w2#1"), ("c03", "w2#1")]


def test_connections_being_released_already_do_not_count_toward_what_is_shed():
    # A balance pass while the previous pass's sheds are still handing off (a summary's
    # arrival starts one at once; on a loaded machine a handoff takes longer): counting
    # them shed the excess twice (a join's shedder of 12 with a share of 6 shed 8).
    fleet = FleetLoad(2, 20, 200, 4, 0, NOW_MS, under={"w2#1": 4}, over={"me#1": 4})
    held = [Held(f"c{i:02d}", acquired_at=float(i), ending=i < 3) for i in range(14)]  # 3 on their way out
    assert shed(held, fleet) == [("c03", "w2#1")]


def test_the_balancer_sheds_nothing_on_a_summary_that_cannot_count_us_yet():
    fleet = FleetLoad(2, 20, 200, 4, 0, NOW_MS, under={"w2#1": 4}, over={"me#1": 4})
    held = [Held(f"c{i:02d}", acquired_at=0.0, ending=False) for i in range(14)]
    # Our latest acquisition may not be in it: the ring index is up to two heartbeats behind.
    assert shed(held, fleet, last_acquired_ms=NOW_MS - 5_000) == []
    assert shed(held, FleetLoad(2, 10, 200, 4, 0, NOW_MS)) == []  # it counts fewer than we hold
    assert len(shed(held, fleet, last_acquired_ms=NOW_MS - 5_001)) == 4


# --- a STOP -------------------------------------------------------------------------------------------


def test_a_stop_is_for_the_ownership_it_names_and_waits_while_the_connection_is_on_the_move():
    assert choose_stop(acquiring=True, held_fence=None, handing_off=False, handed=False, fence=3) is StopAction.WAIT
    assert choose_stop(acquiring=False, held_fence=3, handing_off=False, handed=False, fence=3) is StopAction.STOP
    assert choose_stop(acquiring=False, held_fence=3, handing_off=True, handed=False, fence=3) is StopAction.WAIT
    assert choose_stop(acquiring=False, held_fence=4, handing_off=False, handed=False, fence=3) is StopAction.IGNORE
    assert choose_stop(acquiring=False, held_fence=None, handing_off=False, handed=True, fence=3) is StopAction.STOP_HANDED
    assert choose_stop(acquiring=False, held_fence=None, handing_off=False, handed=False, fence=3) is StopAction.IGNORE


def test_a_drainer_hints_a_dead_sessions_connection_again_only_after_a_while():
    from wsfleet.worker.decide import REHINT_S, fresh_hints

    hinted: dict[str, float] = {}
    assert fresh_hints(["a", "b", "a"], hinted, 100.0) == ["a", "b"]
    assert fresh_hints(["a", "b", "c"], hinted, 105.0) == ["c"]  # the next watch read's drain: only the new one
    assert fresh_hints(["a", "c"], hinted, 100.0 + REHINT_S) == ["a"]  # a's hint may be lost: again
    assert set(hinted) == {"a", "c"}  # b, taken meanwhile, is forgotten
