"""A connection's frame rules without a socket: what a received frame asks for, given
what the connection has in hand, and when it asks for its checkpoint."""

import json

from wsfleet.checkpoint import Checkpoint, StoredEnd, Tally, Uncounted
from wsfleet.stream import DEFAULT_SHAPE, Frame, Problem, SeqTracker
from wsfleet.worker.frames import CheckpointTimer, receive


def frame(seq: int, data: object = 1) -> bytes:
    return json.dumps({"seq": seq, "data": data}).encode()


def got(message: bytes, tracker: SeqTracker, *, fresh: bool = False):
    return receive(message, 9, tracker=tracker, shape=DEFAULT_SHAPE, may_start_fresh=fresh)


def test_the_next_frame_is_queued_as_it_came_and_the_tracker_is_left_to_the_caller():
    t = SeqTracker(4)
    r = got(frame(5, {"a": 1}), t)
    assert list(r.frames) == [Frame(5, '{"a":1}', 9, data_bytes=7)] and r.problem is None and r.gap is None
    assert (r.seq, r.start_at, t.next_seq) == (5, None, 5)  # deciding changes nothing: accept does


def test_a_frame_without_a_usable_seq_is_only_counted():
    r = got(b"not json", SeqTracker(0))
    assert (r.problem, list(r.frames), r.start_at) == (Problem.NOT_JSON, [], None)
    assert r.problem_fields() == {"size": 8, "stored": "nothing"}


def test_a_frame_whose_data_cannot_be_stored_is_a_skip_marker_at_its_seq():
    message = b'{"seq": 1, "data": "\xff"}'
    r = got(message, SeqTracker(0))
    assert r.problem is Problem.INVALID_UTF8 and [f.seq for f in r.frames] == [1] and r.frames[0].is_marker
    assert r.problem_fields() == {"size": len(message), "seq": 1, "stored": "skip_marker"}


def test_a_lone_surrogate_is_stored_escaped_and_still_counted():
    r = got(b'{"seq": 1, "data": "\\ud83d"}', SeqTracker(0))
    assert r.problem is Problem.LONE_SURROGATE and r.frames[0].data_json == '"\\ud83d"'
    assert r.problem_fields()["stored"] == "escaped"


def test_a_replay_of_a_frame_in_hand_stores_nothing():
    t = SeqTracker(10)
    assert not got(frame(10), t).frames and not got(frame(3), t).frames


def test_a_frame_that_jumps_ahead_comes_after_one_gap_marker_for_the_seqs_it_jumped():
    r = got(frame(8), SeqTracker(4))
    assert [(f.seq, f.end, f.problem) for f in r.frames] == [(5, 7, Problem.UPSTREAM_GAP), (8, 8, None)]
    assert r.gap is r.frames[0] and r.problem is None


def test_an_upstream_that_cannot_replay_starts_where_it_is_on_its_first_ownership_only():
    first = got(frame(100), SeqTracker(0), fresh=True)
    assert first.start_at == 99 and [f.seq for f in first.frames] == [100] and first.gap is None
    assert got(frame(100), SeqTracker(0), fresh=False).gap.seq == 1  # a later owner: a gap to mark
    assert got(frame(1), SeqTracker(0), fresh=True).start_at is None  # nothing below it
    in_hand = SeqTracker(0)
    in_hand.accept(1)
    assert got(frame(100), in_hand, fresh=True).gap.seq == 2  # frames in hand: no fresh start


def test_a_checkpoint_is_asked_for_a_gathering_share_early_and_only_when_frames_were_stored():
    timer = CheckpointTimer(every_s=100, gather_share=0.1, written=Checkpoint(5), at=1000)
    assert not timer.due(Checkpoint(9), 1089.9)  # too early
    assert timer.due(Checkpoint(9), 1090) and timer.by == 1100
    assert not timer.due(Checkpoint(5), 2000)  # nothing stored since: a quiet connection writes none
    timer.wrote(Checkpoint(9), 1095)
    assert (timer.written, timer.at, timer.by) == (9, 1095, 1195) and not timer.due(Checkpoint(12), 1100)


def test_the_written_checkpoint_never_goes_back_and_a_start_keeps_the_timing():
    timer = CheckpointTimer(every_s=100, gather_share=0.1, written=Checkpoint(0), at=0)
    timer.started(Checkpoint(41))
    assert (timer.written, timer.at) == (41, 0)
    timer.wrote(Checkpoint(30), 50)  # a stale one
    assert (timer.written, timer.at) == (41, 50)


def test_a_stored_batch_waits_for_its_checkpoint_until_one_may_be_asked_for_a_bursts_last_too():
    timer = CheckpointTimer(every_s=100, gather_share=0.1, written=Checkpoint(5), at=1000)
    assert timer.wait_s(1010) == 80 and timer.wait_s(1095) == 0  # then due(): the checkpointer asks


def test_what_is_stored_is_uncounted_until_a_checkpoint_covers_it_and_a_dead_owners_items_come_first():
    timer = CheckpointTimer.after(100, 0.1, Checkpoint(5), 0, StoredEnd(7, ((7, Tally(2, 20, 70)),)))
    timer.stored(8, Tally(1, 3, 80))
    timer.stored(9, Tally())  # markers only: nothing to count
    assert timer.uncounted() == Uncounted(5, ((7, Tally(2, 20, 70)), (8, Tally(1, 3, 80))))
    timer.wrote(Checkpoint(7), 10)
    assert timer.uncounted() == Uncounted(7, ((8, Tally(1, 3, 80)),))
    assert timer.uncounted().past(7, 8) == Tally(1, 3, 80) and not timer.uncounted().past(8)
